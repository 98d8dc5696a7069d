# SPDX-License-Identifier: Apache-2.0
"""Reference of ``dspark::few_row_linear``."""

from __future__ import annotations

from torch import Tensor


def few_row_linear_ref(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """x ``(M, K)``, weight ``(N, K)``, bias ``(N,)`` or None -> ``(M, N)``: ``x · weightᵀ + bias`` in float64,
    returned as float32 (the op's fp32 sums are compared to it with a tolerance)."""
    y = x.double() @ weight.double().T
    if bias is not None:
        y = y + bias.double()
    return y.float()
