# SPDX-License-Identifier: Apache-2.0
"""Reference of ``dspark::markov_sample`` (plain loops, same rounding)."""

from __future__ import annotations

import torch
from torch import Tensor

from dspark.reference import sampling_math as sm


def _gumbel(seed: int, offset: int, request: int, position: int, V: int) -> Tensor:
    """Keyed Gumbel noise of every vocabulary id (dspark.ops.philox_draw, checked against pure Python)."""
    idx = torch.arange(V, dtype=torch.int64)
    _, g = torch.ops.dspark.philox_draw.default(
        seed,
        offset,
        torch.full((V,), request, dtype=torch.int64),
        torch.full((V,), position, dtype=torch.int64),
        sm.GUMBEL_PURPOSE_DRAFT,
        idx,
    )
    return g


def markov_sample_ref(
    base_logits: Tensor,
    anchor: Tensor,
    w1: Tensor,
    w2: Tensor,
    temperature: Tensor,
    seed: int,
    offset: int,
    request_ids: Tensor | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """U ``(R, g, V)``, anchor ``(R,)``, w1/w2 ``(V, r)``, temperature ``(R,)`` -> tokens ``(R, g)`` int64,
    z ``(R, g, V)`` float32, prev_emb ``(R, g, r)`` float32."""
    R, G, V = base_logits.shape
    U = base_logits.float()
    W1 = w1.float()
    req = list(range(R)) if request_ids is None else [int(x) for x in request_ids.tolist()]
    tokens = torch.empty(R, G, dtype=torch.int64)
    z_all = torch.empty(R, G, V, dtype=torch.float32)
    prev_emb = torch.empty(R, G, w1.shape[1], dtype=torch.float32)
    prev = anchor.clone().to(torch.int64)
    for k in range(G):
        e = W1[prev]  # [R, r]
        prev_emb[:, k] = e
        z = U[:, k] + sm.markov_dot(w2, e)
        z_all[:, k] = z
        for r in range(R):
            t = float(temperature[r])
            if t == 0.0:
                key = z[r]
            else:
                key = z[r] / sm.f32(t) + _gumbel(seed, offset, req[r], k, V)
            tokens[r, k] = int(torch.argmax(key))  # first maximum = lowest index
        prev = tokens[:, k].clone()
    return tokens, z_all, prev_emb
