# SPDX-License-Identifier: Apache-2.0
"""``dspark::confidence``: the calibrated confidence head and prefix survival."""

from __future__ import annotations

import torch
from torch import Tensor


def confidence(
    hidden: Tensor,
    prev_emb: Tensor,
    weight: Tensor,
    bias: Tensor,
    sts_temperature: Tensor,
    sts_bias: Tensor | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """Confidence ``c_k = sigmoid((w·[h_k; e_k] + b) / T_k + o_k)`` and survival ``a_k = prod_{i<=k} c_i``.

    ``e_k = W1[x_{k-1}]`` is the Markov embedding of the previous token (``x_0`` = the anchor), so ``c_k`` and
    ``a_k`` depend only on draws before ``x_k`` — admitting ``x_k`` by ``a_k`` never looks at ``x_k``.

    Parameters
    ----------
    hidden : Tensor
        Shape ``(R, gamma, H)``, float32/bfloat16/float16: the drafter's final hidden per draft slot.
    prev_emb : Tensor
        Shape ``(R, gamma, r)``, same dtypes: ``W1[x_{k-1}]`` (``r = 0`` for a head without the Markov feature).
    weight : Tensor
        Shape ``(H + r,)`` float32: the head's ``Linear(H + r, 1)`` weight.
    bias : Tensor
        One float32 value (shape ``()`` or ``(1,)``).
    sts_temperature : Tensor
        Shape ``(gamma,)`` float32, > 0: per-position STS temperatures (ones when uncalibrated).
    sts_bias : Tensor, optional
        Shape ``(gamma,)`` float32: per-position offsets ``o_k`` of affine STS (zeros when None, which is
        SGLang's temperature-only STS).

    Returns
    -------
    logit, conf, survival : Tensor
        Each ``(R, gamma)`` float32: the raw logit (before STS), the calibrated confidence and its cumulative
        product along the block.

    Examples
    --------
    >>> import torch, dspark
    >>> h, e = torch.randn(2, 4, 8), torch.randn(2, 4, 3)
    >>> w, b, t = torch.randn(11), torch.zeros(()), torch.ones(4)
    >>> logit, conf, surv = dspark.ops.confidence(h, e, w, b, t)
    >>> surv.shape
    torch.Size([2, 4])
    """
    return torch.ops.dspark.confidence.default(hidden, prev_emb, weight, bias, sts_temperature, sts_bias)


@torch.library.register_fake("dspark::confidence")
def _confidence_fake(hidden, prev_emb, weight, bias, sts_temperature, sts_bias=None):
    shape = (hidden.shape[0], hidden.shape[1])
    return tuple(hidden.new_empty(shape, dtype=torch.float32) for _ in range(3))
