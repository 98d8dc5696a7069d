# SPDX-License-Identifier: Apache-2.0
"""Random but valid op inputs for the microbenchmarks (seeded, built on the CPU, then moved to ``device``)."""

from __future__ import annotations

import torch
from torch import Tensor


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(int(seed))


def _offsets(lengths: list[int]) -> Tensor:
    """``[0, l0, l0 + l1, ...]`` as int32: the indptr of a ragged batch."""
    return torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)


def survival_rows(R: int, gamma: int, seed: int = 0, zero_frac: float = 0.02) -> Tensor:
    """``(R, γ)`` survival probabilities: running products of confidences, a few exactly 0 or exactly 1."""
    g = _gen(seed)
    conf = torch.rand(R, gamma, generator=g) ** 0.3  # skewed towards 1, as a trained head's are
    conf[torch.rand(R, gamma, generator=g) < zero_frac] = 0.0
    conf[torch.rand(R, gamma, generator=g) < 0.05] = 1.0
    return conf.cumprod(1)


def decaying_cost_table(seed: int = 0, points: int = 12, max_tokens: int = 2048) -> tuple[Tensor, Tensor]:
    """An SPS-like table: sorted distinct batch-token counts (int64) and a falling rate per token (float64)."""
    extra = torch.randint(1, max_tokens, (points,), generator=_gen(seed))
    tokens = torch.unique(torch.cat([torch.tensor([1, 2, 4, 8]), extra]))
    return tokens, 100.0 / (1.0 + tokens.double() / 64.0)


def confidence_inputs(
    R: int, gamma: int, hidden: int, rank: int, dtype: torch.dtype, seed: int = 0
) -> tuple[Tensor, ...]:
    """``(hidden (R, γ, H), prev_emb (R, γ, r), weight (H + r,), bias (), sts (γ,))`` of the confidence head."""
    g = _gen(seed)
    h = torch.randn(R, gamma, hidden, generator=g).to(dtype)
    prev = torch.randn(R, gamma, rank, generator=g).to(dtype)
    weight = torch.randn(hidden + rank, generator=g) * (hidden + rank) ** -0.5  # logits of order 1
    bias = torch.randn((), generator=g)
    sts = 0.5 + 1.5 * torch.rand(gamma, generator=g)
    return h, prev, weight, bias, sts


def paged_inputs(
    n_q: list[int],
    n_kv: list[int],
    heads: tuple[int, int, int],
    page_size: int,
    dtype: torch.dtype,
    seed: int = 0,
    device: str = "cpu",
) -> tuple[Tensor, ...]:
    """Queries and a paged KV cache, request ``r`` with ``n_q[r]`` query rows and ``n_kv[r]`` keys.

    ``heads`` is ``(Hq, Hkv, D)``. Pages are handed out in a shuffled order (with a spare page) so the op reads
    them through the index, as it does after requests came and went. Returns ``(q, k_cache, v_cache,
    qo_indptr, kv_indptr, kv_indices, kv_last_page_len)``.
    """
    Hq, Hkv, D = heads
    g = _gen(seed)
    pages = [-(-n // page_size) for n in n_kv]
    total = sum(pages) + 1
    k_cache = torch.randn(total, page_size, Hkv, D, generator=g).to(dtype)
    v_cache = torch.randn(total, page_size, Hkv, D, generator=g).to(dtype)
    q = torch.randn(sum(n_q), Hq, D, generator=g).to(dtype)
    indices = torch.randperm(total, generator=g)[: sum(pages)].to(torch.int32)
    last = torch.tensor(
        [n - (p - 1) * page_size if p else 0 for n, p in zip(n_kv, pages, strict=True)], dtype=torch.int32
    )
    out = (q, k_cache, v_cache, _offsets(n_q), _offsets(pages), indices, last)
    return tuple(t.to(device) for t in out)


def verify_inputs(
    R: int, V: int, gamma: int, dtype: torch.dtype, device: str = "cpu", seed: int = 0
) -> list[Tensor]:
    """A full verify round for ``rejection_sample``: every request verifies all ``γ`` drafts plus the bonus row.

    Target logits are the draft logits plus noise, so drafts are accepted some of the time. Returns
    ``[target_logits, qo_indptr, draft_logits, draft_tokens, verify_len, temperature]`` (temperature 1).
    """
    g = _gen(seed)
    z = torch.randn(R, gamma, V, generator=g)
    tl = torch.cat([z, torch.randn(R, 1, V, generator=g)], 1)
    tl = (tl + 0.3 * torch.randn(R, gamma + 1, V, generator=g)).reshape(-1, V).to(dtype)
    drafts = torch.multinomial(torch.softmax(z.reshape(-1, V), -1), 1, generator=g).reshape(R, gamma)
    vl = torch.full((R,), gamma + 1, dtype=torch.int32)
    qo = _offsets(vl.tolist())
    return [t.to(device) for t in (tl, qo, z, drafts, vl, torch.ones(R))]


def ragged_verify_inputs(R: int = 6, gamma: int = 4, V: int = 300, seed: int = 1) -> list[Tensor]:
    """A small ragged round for the bit-exactness check: verify lengths ``1 .. γ + 1``, greedy and sampled rows."""
    g = _gen(seed)
    vl = torch.randint(1, gamma + 2, (R,), generator=g).to(torch.int32)
    vl[0] = gamma + 1  # at least one request verifies every draft
    qo = _offsets(vl.tolist())
    tl = 0.7 * torch.randn(int(qo[-1]), V, generator=g)
    z = torch.randn(R, gamma, V, generator=g)
    drafts = torch.randint(0, V, (R, gamma), generator=g)
    temp = torch.tensor([0.0, 1.0, 0.7, 1.3, 1.0, 0.5]).repeat(-(-R // 6))[:R]
    return [tl, qo, z, drafts, vl, temp]
