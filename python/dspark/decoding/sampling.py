# SPDX-License-Identifier: Apache-2.0
"""Drawing from the target: rejection sampling of drafts, and plain next-token draws, through one op.

``p`` is what plain decoding samples from (repetition penalty, temperature, top-k, top-p, in Hugging Face's
order); the processors are applied inside ``dspark.ops.rejection_sample``, so drafted and plain tokens come
from the same code. A plain draw is that op with no drafts: each request's one row gives its next token.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from dspark.decoding.inputs import SamplingConfig
from dspark.host_sync import to_device
from dspark.ops import rejection_sample


def processor_args(sampling: SamplingConfig, histories: Sequence[Sequence[int]], device: Any) -> dict:
    """The op's optional top-k / top-p / repetition-penalty tensors for R requests (only those switched on).

    ``histories[r]``: request ``r``'s prompt and committed tokens (what the repetition penalty looks at).
    """
    R = len(histories)
    kw: dict[str, Tensor] = {}
    if sampling.top_k > 0:
        kw["top_k"] = torch.full((R,), sampling.top_k, dtype=torch.int64, device=device)
    if sampling.top_p < 1.0:
        kw["top_p"] = torch.full((R,), sampling.top_p, dtype=torch.float32, device=device)
    if sampling.repetition_penalty != 1.0:
        kw["repetition_penalty"] = torch.full(
            (R,), sampling.repetition_penalty, dtype=torch.float32, device=device
        )
        kw["penalty_tokens"] = to_device([t for h in histories for t in h], device, torch.int64)
        ptr = [0]
        for h in histories:
            ptr.append(ptr[-1] + len(h))
        kw["penalty_indptr"] = to_device(ptr, device, torch.int64)
    return kw


def accept_drafts(
    logits: Tensor,
    qo_indptr: Sequence[int],
    draft_logits: Tensor | None,
    drafts: Tensor,
    verify_len: Tensor,
    sampling: SamplingConfig,
    offset: int,
    request_ids: Sequence[int],
    histories: Sequence[Sequence[int]],
    one_hot: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """``(accepted (R,) int32, out_tokens (R, g + 1) int64)`` on the logits' device; nothing is read.

    logits ``(N, V)`` packed verify rows (float32 on CPU, finite; on CUDA also bfloat16 / float16, a non-finite
    row spoiling only its own request's tokens), qo_indptr host ``R + 1``, draft_logits ``(R, g, V)``
    float32 (None: every row's drafts are deterministic lookup proposals), drafts ``(R, g)`` int64, verify_len
    host ``(R,)`` int32; ``g`` may be 0 (plain decoding). ``one_hot`` ``(R,)`` bool marks the rows whose drafts
    are deterministic proposals (q one-hot at the draft: accepted with probability p(x)).
    """
    dev = logits.device
    R = len(request_ids)
    return rejection_sample(
        logits,
        to_device(list(qo_indptr), dev, torch.int32),
        draft_logits,
        drafts,
        to_device(verify_len, dev, torch.int32),
        torch.full((R,), sampling.temperature, dtype=torch.float32, device=dev),
        sampling.seed,
        offset,
        to_device(list(request_ids), dev, torch.int64),
        **processor_args(sampling, histories, dev),
        draft_one_hot=one_hot,
    )


def sample_next(
    logits: Tensor,
    sampling: SamplingConfig,
    offset: int,
    request_ids: Sequence[int],
    histories: Sequence[Sequence[int]],
) -> Tensor:
    """One token per request drawn from ``p`` of its row: logits ``(R, V)`` float32 -> ``(R,)`` int64 (device)."""
    R, V = logits.shape
    no_drafts = torch.empty(R, 0, V, dtype=torch.float32, device=logits.device)  # holds no data
    _, tokens = accept_drafts(
        logits,
        list(range(R + 1)),
        no_drafts,
        torch.empty(R, 0, dtype=torch.int64, device=logits.device),
        torch.ones(R, dtype=torch.int32),
        sampling,
        offset,
        request_ids,
        histories,
    )
    return tokens[:, 0]
