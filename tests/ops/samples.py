# SPDX-License-Identifier: Apache-2.0
"""Random but valid inputs for the ops, shared by the op tests, the build test and the benchmarks."""

from __future__ import annotations

import torch


def survival_batch(R: int, gamma: int, seed: int = 0, zero_frac: float = 0.1) -> torch.Tensor:
    """Survival rows: cumulative products of confidences in [0, 1] (some exactly 0, some exactly 1)."""
    g = torch.Generator().manual_seed(seed)
    conf = torch.rand(R, gamma, generator=g) ** 0.3
    conf[torch.rand(R, gamma, generator=g) < zero_frac] = 0.0
    conf[torch.rand(R, gamma, generator=g) < 0.05] = 1.0
    return torch.cumprod(conf, dim=1)


def sps_table(kind: str = "decaying", n: int = 12, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """(tokens int64, rates float64): 'decaying' (typical), 'jagged' (non-monotone), 'flat', 'steep'."""
    g = torch.Generator().manual_seed(seed)
    tokens = torch.unique(torch.cat([torch.tensor([1, 2, 4, 8]), torch.randint(1, 2048, (n,), generator=g)]))
    t = tokens.double()
    if kind == "decaying":
        rate = 100.0 / (1.0 + t / 64.0)
    elif kind == "jagged":
        rate = 100.0 / (1.0 + t / 64.0) * (1.0 + 0.3 * torch.rand(len(t), generator=g, dtype=torch.float64))
    elif kind == "flat":
        rate = torch.full_like(t, 50.0)
    elif kind == "steep":
        rate = 1e6 * 1e-4 ** (t - 1)
        rate = rate.clamp_min(1e-300)
    else:
        raise ValueError(kind)
    return tokens.to(torch.int64), rate.to(torch.float64)


def confidence_inputs(R: int, gamma: int, H: int = 64, r: int = 8, dtype=torch.float32, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(R, gamma, H, generator=g).to(dtype)
    prev_emb = torch.randn(R, gamma, r, generator=g).to(dtype)
    weight = torch.randn(H + r, generator=g) / (H + r) ** 0.5
    bias = torch.randn((), generator=g)
    sts = 0.5 + torch.rand(gamma, generator=g) * 1.5
    return hidden, prev_emb, weight, bias, sts
