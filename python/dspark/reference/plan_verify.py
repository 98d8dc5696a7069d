# SPDX-License-Identifier: Apache-2.0
"""Reference of ``dspark::plan_verify``: the paper's Algorithm 1 and the lagged top-K, written plainly."""

from __future__ import annotations

import torch
from torch import Tensor


def sps_ceil_ref(tokens: list[int], rate: list[float], batch_tokens: int) -> float:
    """SPS at ``batch_tokens``, priced at the smallest probe >= it; past the last probe, constant tokens/s."""
    for t, s in zip(tokens, rate, strict=True):
        if t >= batch_tokens:
            return s
    return rate[-1] * tokens[-1] / batch_tokens


FIXED_ONE = 2**32  # tau is summed in units of 2^-32: exact integer sums, the same in any order


def survival_fixed(a: float) -> int:
    """Survival ``a`` in [0, 1] rounded down to a multiple of 2^-32 (``a * 2**32`` is exact for a float32)."""
    return int(a * FIXED_ONE)


def theta_ref(tau_fixed: int, tokens: list[int], rate: list[float], batch_tokens: int) -> float:
    """Θ = τ · SPS(B) for τ in units of 2^-32 (int -> float rounds to nearest; the scaling is exact)."""
    return float(tau_fixed) / FIXED_ONE * sps_ceil_ref(tokens, rate, batch_tokens)


def _candidates(survival: list[list[float]]) -> list[tuple[float, int, int]]:
    """(a, j, r) for every a > 0, in the planner's order: a desc, j asc, r asc."""
    cands = [(a, j, r) for r, row in enumerate(survival) for j, a in enumerate(row) if a > 0]
    return sorted(cands, key=lambda c: (-c[0], c[1], c[2]))


def _algorithm1(survival: list[list[float]], tokens: list[int], rate: list[float]) -> list[int]:
    """Paper Algorithm 1: returns the per-request number of admitted drafts l*_r."""
    R = len(survival)
    lengths = [0] * R
    best_lengths = [0] * R
    B = R
    tau = R * FIXED_ONE
    theta_best = theta_ref(tau, tokens, rate, B)
    for a, j, r in _candidates(survival):
        lengths[r] = j + 1
        B += 1
        tau += survival_fixed(a)
        theta = theta_ref(tau, tokens, rate, B)
        if theta > theta_best:
            theta_best = theta
            best_lengths = list(lengths)
        else:
            break
    return best_lengths


def _argmax_budget(survival: list[list[float]], tokens: list[int], rate: list[float]) -> int:
    R = len(survival)
    tau = R * FIXED_ONE
    best, budget = theta_ref(tau, tokens, rate, R), 0
    for k, (a, _, _) in enumerate(_candidates(survival), start=1):
        tau += survival_fixed(a)
        theta = theta_ref(tau, tokens, rate, R + k)
        if theta > best:
            best, budget = theta, k
    return budget


def plan_verify_ref(
    survival: Tensor,
    sps_tokens: Tensor,
    sps_rate: Tensor,
    mode: str = "early_stop",
    lagged_survival: Tensor | None = None,
    threshold: float = 0.0,
) -> tuple[Tensor, Tensor]:
    """survival ``(R, g)`` f32, sps ``(n,)`` -> verify_len ``(R,)`` int32 in [1, g + 1], budget ``()`` int64."""
    s = survival.float().tolist()
    R, G = survival.shape
    tokens = [int(t) for t in sps_tokens.tolist()]
    rate = [float(x) for x in sps_rate.tolist()]
    if mode == "full":
        admitted, budget = [G] * R, R * G
    elif mode == "threshold":
        admitted = []
        for row in survival.float():
            n = G
            if threshold > 0:
                prev = torch.tensor(1.0)
                for j in range(G):
                    if float(row[j] / prev) < threshold:  # fp32 division, as the op does it
                        n = j
                        break
                    prev = row[j]
            admitted.append(n)
        budget = sum(admitted)
    elif mode == "early_stop":
        admitted = _algorithm1(s, tokens, rate)
        budget = sum(admitted)
    elif mode == "lagged_topk":
        if lagged_survival is None:
            raise ValueError("lagged_topk needs lagged_survival")
        budget = _argmax_budget(lagged_survival.float().tolist(), tokens, rate)
        admitted = [0] * R
        for _, _, r in _candidates(s)[:budget]:
            admitted[r] += 1
    else:
        raise ValueError(f"unknown mode {mode!r}")
    verify_len = torch.tensor([1 + n for n in admitted], dtype=torch.int32)
    return verify_len, torch.tensor(budget, dtype=torch.int64)


def plan_verify_anticipating_ref(survival: Tensor, sps_tokens: Tensor, sps_rate: Tensor) -> Tensor:
    """NOT exact — kept only to show the tests can fail: a global argmax of Theta over this round's own
    survival (Algorithm 1 without its early stop). Admission of x_k then depends on x_k itself through
    deeper survivals (paper, Appendix A)."""
    s = survival.float().tolist()
    R = len(s)
    tokens = [int(t) for t in sps_tokens.tolist()]
    rate = [float(x) for x in sps_rate.tolist()]
    budget = _argmax_budget(s, tokens, rate)
    admitted = [0] * R
    for _, _, r in _candidates(s)[:budget]:
        admitted[r] += 1
    return torch.tensor([1 + n for n in admitted], dtype=torch.int32)
