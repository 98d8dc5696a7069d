# SPDX-License-Identifier: Apache-2.0
"""``dspark::few_row_linear``: ``x · weightᵀ + bias`` for a few rows, reading the weight once (CPU, CUDA)."""

from __future__ import annotations

import torch
from torch import Tensor


def few_row_linear(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """``F.linear(x, weight, bias)`` for a few rows of fp32 ``x`` on CPU, streaming the weight once.

    Each thread owns a run of the weight's rows and multiplies every row of ``x`` against them while they
    are in L1, so the time stays near that of one row (the weight's read from memory) up to ~16 rows, where
    BLAS few-row GEMMs grow with the rows. AVX-512 and AVX2 + FMA paths, a scalar one elsewhere (or with
    ``DSPARK_CPU_SIMD=0``). fp32 sums with fused multiply-adds: equal to ``F.linear`` to float rounding, and
    the same for any thread count. On CUDA one warp streams each weight row in 16-byte loads against up to 8
    rows of ``x`` at a time (fixed-order sums: the same floats on every run); the models route only their CPU
    linears to the op (:mod:`dspark.models.cpu_linear`), CUDA linears stay with cuBLAS.

    Parameters
    ----------
    x : Tensor
        Shape ``(M, K)``, float32.
    weight : Tensor
        Shape ``(N, K)``, float32.
    bias : Tensor, optional
        Shape ``(N,)``, float32.

    Returns
    -------
    Tensor
        ``(M, N)`` float32, contiguous.

    Examples
    --------
    >>> import torch, dspark
    >>> x, w = torch.randn(4, 64), torch.randn(96, 64)
    >>> torch.allclose(dspark.ops.few_row_linear(x, w), x @ w.T, atol=1e-4)
    True
    """
    return torch.ops.dspark.few_row_linear.default(x, weight, bias)


@torch.library.register_fake("dspark::few_row_linear")
def _few_row_linear_fake(x, weight, bias=None):
    return x.new_empty((x.shape[0], weight.shape[0]))
