# SPDX-License-Identifier: Apache-2.0
"""``dspark::rejection_sample``: exact speculative verification of a packed ragged batch."""

from __future__ import annotations

import torch
from torch import Tensor


def rejection_sample(
    target_logits: Tensor,
    qo_indptr: Tensor,
    draft_logits: Tensor | None,
    draft_tokens: Tensor,
    verify_len: Tensor,
    temperature: Tensor,
    seed: int,
    offset: int,
    request_ids: Tensor | None = None,
    top_k: Tensor | None = None,
    top_p: Tensor | None = None,
    repetition_penalty: Tensor | None = None,
    penalty_tokens: Tensor | None = None,
    penalty_indptr: Tensor | None = None,
    draft_one_hot: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """Verify each request's drafts against the target with standard rejection sampling.

    Request ``r`` owns target rows ``qo_indptr[r] .. qo_indptr[r+1]`` (exactly ``verify_len[r]`` of them);
    row ``i`` is the target's logits for the token after ``anchor, x_1..x_i``. With ``p_i`` the processed
    target distribution (repetition penalty over the context and the drafts before row ``i`` on raw logits,
    then ``/ T``, then top-k, then top-p: what plain decoding samples from) and ``q_i = softmax(z_i / T)``:
    accept ``x_{i+1}`` iff ``u_i · q_i(x) < p_i(x)``; at the first rejection emit a draw from
    ``normalize((p_i - q_i)+)`` (``p_i`` if that is all zero); after ``verify_len - 1`` acceptances emit a bonus
    draw from ``p`` at the last row. ``T = 0``: greedy (accept iff the penalised target argmax equals the draft,
    emit that argmax). Philox keys: request = ``request_ids[r]`` or ``r``, position = row ``i``; purpose 2 index
    0 for ``u_i``, purpose 3 index = vocabulary id for the Gumbel-max residual/bonus draws.

    Deterministic proposals (e.g. looked-up tokens): for a request with ``draft_one_hot[r]`` set, or for every
    request when ``draft_logits`` is None, ``q_i`` is one-hot at the draft ``x`` (never materialised): accept
    iff ``u_i < p_i(x)``; at the first rejection emit a Gumbel-max draw from ``p_i`` with ``x`` removed and
    renormalised (``p_i`` if that is all zero); bonus row and greedy rows as above. The keys are the same, so
    such a request gives the same tokens as one whose ``draft_logits`` compute to an exactly one-hot ``q``.

    Parameters
    ----------
    target_logits : Tensor
        ``(T, V)`` float32/bfloat16/float16 packed verify rows; no NaN/+inf in the rows read.
    qo_indptr : Tensor
        ``(R + 1,)`` int32 row offsets, ``qo_indptr[0] = 0``.
    draft_logits : Tensor or None
        ``(R, gamma, V)`` float32: ``z`` from :func:`dspark.ops.markov_sample`; no NaN/+inf in the rows of
        requests without ``draft_one_hot`` (the others are never read and may hold anything). None: every
        request's drafts are deterministic proposals (``R``, ``gamma`` from ``draft_tokens``, ``V`` from
        ``target_logits``).
    draft_tokens : Tensor
        ``(R, gamma)`` int64 in ``[0, V)`` (the entries that are verified).
    verify_len : Tensor
        ``(R,)`` int32 in ``[1, gamma + 1]`` (anchor row + admitted drafts).
    temperature : Tensor
        ``(R,)`` float32 ``>= 0``, the temperature of both the drafts and the target.
    seed, offset : int
        Philox key.
    request_ids : Tensor, optional
        ``(R,)`` int64 in ``[0, 2^32)``.
    top_k : Tensor, optional
        ``(R,)`` int64; ``<= 0`` or ``>= V`` is off. Keeps values ``>=`` the k-th largest (ties kept).
    top_p : Tensor, optional
        ``(R,)`` float32 in ``(0, 1]``; 1 is off. Keeps the value classes whose strictly higher mass is
        ``< top_p`` (ties kept together).
    repetition_penalty : Tensor, optional
        ``(R,)`` float32 ``> 0``; 1 is off.
    penalty_tokens, penalty_indptr : Tensor, optional
        ``(P,)`` int64 tokens already in each request's context and ``(R + 1,)`` int64 offsets.
    draft_one_hot : Tensor, optional
        ``(R,)`` bool: request ``r``'s drafts are deterministic proposals (its ``draft_logits`` rows are not
        read). With ``draft_logits`` None it must be all True (checked on CPU) and changes nothing.

    Returns
    -------
    accepted : Tensor
        ``(R,)`` int32 accepted draft count, in ``[0, verify_len - 1]``.
    out_tokens : Tensor
        ``(R, gamma + 1)`` int64: the accepted drafts, then the correction or bonus token, then ``-1``.

    Examples
    --------
    >>> import torch, dspark
    >>> z = torch.randn(1, 2, 10)
    >>> acc, out = dspark.ops.rejection_sample(
    ...     torch.randn(3, 10), torch.tensor([0, 3], dtype=torch.int32), z, z.argmax(-1),
    ...     torch.tensor([3], dtype=torch.int32), torch.zeros(1), 0, 0)
    >>> out.shape
    torch.Size([1, 3])
    >>> acc, out = dspark.ops.rejection_sample(  # looked-up drafts: no draft logits
    ...     torch.randn(3, 10), torch.tensor([0, 3], dtype=torch.int32), None, torch.tensor([[4, 2]]),
    ...     torch.tensor([3], dtype=torch.int32), torch.ones(1), 0, 0)
    >>> out.shape
    torch.Size([1, 3])
    """
    return torch.ops.dspark.rejection_sample.default(
        target_logits,
        qo_indptr,
        draft_logits,
        draft_tokens,
        verify_len,
        temperature,
        seed,
        offset,
        request_ids,
        top_k,
        top_p,
        repetition_penalty,
        penalty_tokens,
        penalty_indptr,
        draft_one_hot,
    )


@torch.library.register_fake("dspark::rejection_sample")
def _rejection_sample_fake(
    target_logits,
    qo_indptr,
    draft_logits,
    draft_tokens,
    verify_len,
    temperature,
    seed,
    offset,
    request_ids=None,
    top_k=None,
    top_p=None,
    repetition_penalty=None,
    penalty_tokens=None,
    penalty_indptr=None,
    draft_one_hot=None,
):
    R, G = draft_tokens.shape
    return (
        draft_tokens.new_empty((R,), dtype=torch.int32),
        draft_tokens.new_empty((R, G + 1), dtype=torch.int64),
    )
