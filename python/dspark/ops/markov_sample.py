# SPDX-License-Identifier: Apache-2.0
"""``dspark::markov_sample``: the Markov draft step."""

from __future__ import annotations

import torch
from torch import Tensor


def markov_sample(
    base_logits: Tensor,
    anchor: Tensor,
    w1: Tensor,
    w2: Tensor,
    temperature: Tensor,
    seed: int,
    offset: int,
    request_ids: Tensor | None = None,
    round_offset: Tensor | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """Sample a draft block left to right with the vanilla low-rank Markov head.

    ``z_k = U_k + W2 · W1[x_{k-1}]`` (``x_{-1}`` = anchor), ``x_k ~ softmax(z_k / T)`` by Gumbel-max with keyed
    Philox noise (request = ``request_ids[r]`` or ``r``, position = ``k``, purpose 1, index = vocabulary id),
    ``x_k = argmax z_k`` (ties: lowest id) when ``T = 0``. Bit-identical on CPU and CUDA.

    Parameters
    ----------
    base_logits : Tensor
        ``(R, gamma, V)`` float32/bfloat16/float16: the drafter's logits ``U``. No NaN or +inf; ``-inf`` masks
        a token (never drawn).
    anchor : Tensor
        ``(R,)`` int64: the last committed token of each request.
    w1, w2 : Tensor
        ``(V, r)`` each, same float dtype: ``markov_w1`` (embedding) and ``markov_w2`` (``nn.Linear(r, V)``
        weight).
    temperature : Tensor
        ``(R,)`` float32, finite, ``>= 0`` (0 = greedy).
    seed, offset : int
        Philox key; advance ``offset`` once per decode round.
    request_ids : Tensor, optional
        ``(R,)`` int64 in ``[0, 2^32)``: stable per-request keys (default ``arange(R)``).
    round_offset : Tensor, optional
        ``(1,)`` int64 on the logits' device, added to ``offset`` (modulo 2^64) where the op runs: on CUDA the
        kernels read it, so a CUDA graph that captured the op draws with the counter it refills before each
        replay (the scalar arguments of a captured launch are fixed). The tokens equal those of
        ``offset + round_offset[0]`` passed as ``offset``.

    Returns
    -------
    tokens : Tensor
        ``(R, gamma)`` int64 draft tokens.
    draft_logits : Tensor
        ``(R, gamma, V)`` float32 ``z``; the proposal is exactly ``softmax(z / T)``.
    prev_emb : Tensor
        ``(R, gamma, r)`` float32 ``W1[x_{k-1}]`` (input of the confidence head).

    Examples
    --------
    >>> import torch, dspark
    >>> U, w1, w2 = torch.randn(2, 4, 50), torch.randn(50, 8), torch.randn(50, 8)
    >>> x, z, e = dspark.ops.markov_sample(U, torch.tensor([3, 7]), w1, w2, torch.tensor([0.0, 1.0]), 0, 0)
    >>> x.shape, z.shape, e.shape
    (torch.Size([2, 4]), torch.Size([2, 4, 50]), torch.Size([2, 4, 8]))
    """
    return torch.ops.dspark.markov_sample.default(
        base_logits, anchor, w1, w2, temperature, seed, offset, request_ids, round_offset
    )


@torch.library.register_fake("dspark::markov_sample")
def _markov_sample_fake(
    base_logits, anchor, w1, w2, temperature, seed, offset, request_ids=None, round_offset=None
):
    R, G, V = base_logits.shape
    return (
        base_logits.new_empty((R, G), dtype=torch.int64),
        base_logits.new_empty((R, G, V), dtype=torch.float32),
        base_logits.new_empty((R, G, w1.shape[1]), dtype=torch.float32),
    )
