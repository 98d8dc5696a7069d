# SPDX-License-Identifier: Apache-2.0
"""The copy channel's inputs at training anchors: what the serving round's lookup index would hand the drafter.

At serving time a request's history is its prompt plus its committed tokens, the anchor (the last committed
token) included, and the copy continuation is ``LookupIndex.propose(γ)`` over it
(``dspark.models.block_inputs``). At a training anchor ``a`` the history is ``x[0 .. a]``; the same index,
extended token by token, gives the same continuation, so the training forward still equals the serving one.
"""

from __future__ import annotations

import torch
from torch import Tensor

from dspark.decoding.sources import copy_proposal, new_copy_index
from dspark.models.block_inputs import copy_inputs
from dspark.models.config import DrafterConfig


def anchor_continuations(
    input_ids: Tensor, anchors: Tensor, config: DrafterConfig
) -> tuple[list[list[int]], list[int]]:
    """Per anchor, the lookup continuation (up to ``γ`` tokens) of the history ``x[0 .. a]`` and its copy class
    (0: none; ``dspark.decoding.sources.copy_proposal``); ``input_ids`` ``(S,)``, ``anchors`` ``(A,)`` sorted."""
    index = new_copy_index(config, [])
    ids = input_ids.tolist()
    conts, matches, done = [], [], 0
    for a in anchors.tolist():
        index.extend(ids[done : a + 1])
        done = a + 1
        cont, cls = copy_proposal(index, config.block_size)
        conts.append(cont)
        matches.append(cls)
    return conts, matches


def anchor_copy_inputs(input_ids: Tensor, anchors: Tensor, config: DrafterConfig) -> tuple[Tensor, Tensor]:
    """:func:`anchor_continuations` as the ``copy_tokens`` ``(A, γ)`` (-1 padded) and ``copy_match`` ``(A,)``
    int64 tensors of ``block_embeddings`` (host), built as serving builds them (``block_inputs.copy_inputs``)."""
    conts, matches = anchor_continuations(input_ids, anchors, config)
    return copy_inputs(conts, matches, config.block_size, torch.device("cpu"))
