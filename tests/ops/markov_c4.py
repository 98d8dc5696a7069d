# SPDX-License-Identifier: Apache-2.0
"""Contract C4 for a markov_sample whose bias is summed in another order than the CPU op's (the CUDA
tensor-core kernel): z within the fp32 dot-product error bound of the CPU's, tokens equal except where the
CPU's decision margin lies inside that bound (the request's later steps then follow another prefix and are
not compared)."""

from __future__ import annotations

import torch
from torch import Tensor

from dspark.reference.markov_sample import _gumbel

U32 = 2.0**-24  # fp32 unit roundoff


def u_tolerance(hidden: Tensor, lm_head: Tensor) -> Tensor:
    """``(R, g, V)``: how far two fp32 sums of ``U = hidden · lm_headᵀ`` (either order, either side rounded
    once more) may lie apart: twice ``H·u·Σ|h_j w_ij|`` each, plus the final roundings."""
    s = hidden.double().abs() @ lm_head.double().abs().T
    return 4 * hidden.shape[-1] * U32 * s + 2 * U32 * (hidden.double() @ lm_head.double().T).abs()


def z_tolerance(w2_abs: Tensor, e: Tensor, z: Tensor) -> Tensor:
    """Per vocabulary id ``(V,)``, from ``w2_abs`` = ``|W2|`` in float64: twice the fp32 bound of a rank-``r``
    dot product (``r·u·Σ|w2_ij e_j|``, doubled again for accumulators that truncate) plus the rounding of
    ``U + bias``, for either side."""
    s = w2_abs @ e.double().abs()
    return 4 * w2_abs.shape[1] * U32 * s + 4 * U32 * z.double().abs()


def assert_c4(
    args: tuple,
    cpu: tuple,
    other: tuple,
    seed: int,
    offset: int,
    request_ids: Tensor,
    u_tol: Tensor | None = None,
) -> int:
    """Check ``other`` = (tokens, z, prev_emb) against the CPU op's ``cpu`` for inputs ``args`` =
    (U, anchor, w1, w2, temperature); returns how many requests diverged at a near-tie. ``u_tol``
    ``(R, g, V)``: how far the two sides' ``U`` may differ (zero when both read the same ``U``)."""
    _, _, _, w2, temperature = args
    tok_c, z_c, e_c = cpu
    tok_o, z_o, e_o = (t.cpu() for t in other)
    R, G, _ = z_c.shape
    w2_abs = w2.double().abs()  # once, not per (request, step)
    diverged = 0
    for r in range(R):
        T = float(temperature[r])
        for k in range(G):
            assert torch.equal(e_c[r, k], e_o[r, k]), f"prev_emb differs at request {r}, step {k}"
            tol = z_tolerance(w2_abs, e_c[r, k], z_c[r, k])
            if u_tol is not None:
                tol = tol + u_tol[r, k]
            err = (z_o[r, k].double() - z_c[r, k].double()).abs()
            worst = int((err - tol).argmax())
            assert bool((err <= tol).all()), (
                f"z off by {float(err[worst]):.3g} > {float(tol[worst]):.3g} at request {r}, step {k}, id {worst}"
            )
            a, b = int(tok_c[r, k]), int(tok_o[r, k])
            if a == b:
                continue
            zc = z_c[r, k].double()
            if T == 0.0:
                margin, allowed = zc[a] - zc[b], tol[a] + tol[b]
            else:
                g = _gumbel(seed, offset, int(request_ids[r]), k, zc.shape[0]).double()
                key_a, key_b = zc[a] / T + g[a], zc[b] / T + g[b]
                margin = key_a - key_b
                allowed = (tol[a] + tol[b]) / T + 4 * U32 * (key_a.abs() + key_b.abs())
            assert float(margin) <= float(allowed), (
                f"token {b} instead of {a} at request {r}, step {k}: the CPU's margin {float(margin):.3g} is "
                f"outside the tolerance {float(allowed):.3g}"
            )
            diverged += 1
            break  # later steps of this request follow another token
    return diverged
