# SPDX-License-Identifier: Apache-2.0
"""``dspark::markov_sample_from_hidden``: the drafter's LM head and the Markov draft step in one op."""

from __future__ import annotations

import torch
from torch import Tensor


def markov_sample_from_hidden(
    hidden: Tensor,
    lm_head: Tensor,
    anchor: Tensor,
    w1: Tensor,
    w2: Tensor,
    temperature: Tensor,
    seed: int,
    offset: int,
    request_ids: Tensor | None = None,
    round_offset: Tensor | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """:func:`dspark.ops.markov_sample` on the base logits ``U = hidden · lm_headᵀ``, summed in fp32.

    ``U`` is never rounded to a 16-bit type and never materialised apart from the returned ``z``. On CUDA, for
    bf16 / fp16 operands (``H % 8 == 0``, ``r % 16 == 0``, 16-byte aligned rows) one tensor-core GEMM reads the
    LM head once, computes ``U`` for every slot and the first slot's Markov bias in the same accumulators and
    draws the first slot; the later slots add their bias to ``z`` in place. Sums are in the tensor core's
    order (contract C4: ``z`` within the fp32 dot-product bound over ``H + r`` terms of the exact value). On CPU
    (and as the CUDA fallback) ``U`` is one fp32 matmul, then ``markov_sample``.

    Parameters
    ----------
    hidden : Tensor
        ``(R, gamma, H)`` float32/bfloat16/float16: the drafter's final-normed hidden states of the slots.
    lm_head : Tensor
        ``(V, H)``, ``hidden``'s dtype: the LM head weight (rows of a draft vocabulary, if any).
    anchor, w1, w2, temperature, seed, offset, request_ids, round_offset
        As in :func:`dspark.ops.markov_sample` (``w1`` / ``w2`` ``(V, r)``).

    Returns
    -------
    tokens : Tensor
        ``(R, gamma)`` int64 draft tokens (ids into ``lm_head``'s rows).
    draft_logits : Tensor
        ``(R, gamma, V)`` float32 ``z = U + W2 · W1[x_{k-1}]``; the proposal is exactly ``softmax(z / T)``.
    prev_emb : Tensor
        ``(R, gamma, r)`` float32 ``W1[x_{k-1}]``.

    Examples
    --------
    >>> import torch, dspark
    >>> h, lm = torch.randn(2, 4, 16), torch.randn(50, 16)
    >>> w1, w2 = torch.randn(50, 8), torch.randn(50, 8)
    >>> x, z, e = dspark.ops.markov_sample_from_hidden(h, lm, torch.tensor([3, 7]), w1, w2,
    ...                                                torch.tensor([0.0, 1.0]), 0, 0)
    >>> x.shape, z.shape, e.shape
    (torch.Size([2, 4]), torch.Size([2, 4, 50]), torch.Size([2, 4, 8]))
    """
    return torch.ops.dspark.markov_sample_from_hidden.default(
        hidden, lm_head, anchor, w1, w2, temperature, seed, offset, request_ids, round_offset
    )


@torch.library.register_fake("dspark::markov_sample_from_hidden")
def _markov_sample_from_hidden_fake(
    hidden, lm_head, anchor, w1, w2, temperature, seed, offset, request_ids=None, round_offset=None
):
    R, G, _ = hidden.shape
    V = lm_head.shape[0]
    return (
        hidden.new_empty((R, G), dtype=torch.int64),
        hidden.new_empty((R, G, V), dtype=torch.float32),
        hidden.new_empty((R, G, w1.shape[1]), dtype=torch.float32),
    )
