# SPDX-License-Identifier: Apache-2.0
"""``dspark::plan_verify``: how many draft tokens each request verifies this round."""

from __future__ import annotations

import torch
from torch import Tensor

PLAN_MODES = ("full", "threshold", "early_stop", "lagged_topk")


def plan_verify(
    survival: Tensor,
    sps_tokens: Tensor,
    sps_rate: Tensor,
    mode: str = "early_stop",
    lagged_survival: Tensor | None = None,
    threshold: float = 0.0,
) -> tuple[Tensor, Tensor]:
    """Per-request verify lengths maximising ``Theta = tau * SPS(B)`` without anticipating any draw.

    ``B = sum_r verify_len[r]`` packed target tokens and ``tau = sum_r (1 + sum_{j < verify_len[r]-1} a[r, j])``
    expected emitted tokens. ``SPS(B)`` is priced at the ceiling probe (the smallest profiled ``B' >= B``).

    Modes
    -----
    ``full``
        Verify every draft (``gamma + 1`` rows per request).
    ``threshold``
        DeepSpec's static rule: the longest prefix whose per-position confidence ``a_j / a_{j-1}`` is
        ``>= threshold`` (``threshold <= 0`` verifies everything).
    ``early_stop``
        The paper's Algorithm 1 on this round's survival: candidates in one global order (survival descending,
        position ascending, request ascending), admitted while ``Theta`` strictly improves, stopping at the first
        non-improvement.
    ``lagged_topk``
        Budget ``K = argmax Theta`` over ``lagged_survival`` (an earlier round's survival, so it cannot depend on
        this round's draws), then the first ``K`` candidates of this round in the same global order.

    Parameters
    ----------
    survival : Tensor
        Shape ``(R, gamma)`` float32 in [0, 1], non-increasing along each row.
    sps_tokens : Tensor
        Shape ``(n,)`` int64, strictly increasing packed-token probes.
    sps_rate : Tensor
        Shape ``(n,)`` float64 > 0: target steps per second at each probe.
    mode : str
        One of :data:`PLAN_MODES`.
    lagged_survival : Tensor, optional
        Shape ``(R, gamma)`` float32; required for ``lagged_topk``.
    threshold : float
        Per-position confidence threshold for ``threshold`` mode.

    Returns
    -------
    verify_len : Tensor
        Shape ``(R,)`` int32 in ``[1, gamma + 1]``: target rows to verify (the anchor plus admitted drafts).
    budget : Tensor
        Shape ``()`` int64: drafts admitted (for ``lagged_topk`` the budget ``K`` itself).

    Examples
    --------
    >>> import torch, dspark
    >>> surv = torch.tensor([[0.9, 0.5, 0.1]])
    >>> tok, rate = torch.tensor([1, 2, 4]), torch.tensor([100.0, 95.0, 60.0], dtype=torch.float64)
    >>> dspark.ops.plan_verify(surv, tok, rate, "early_stop")[0]
    tensor([2], dtype=torch.int32)
    """
    return torch.ops.dspark.plan_verify.default(
        survival, lagged_survival, sps_tokens, sps_rate, mode, float(threshold)
    )


@torch.library.register_fake("dspark::plan_verify")
def _plan_verify_fake(survival, lagged_survival, sps_tokens, sps_rate, mode, threshold):
    return (
        survival.new_empty((survival.shape[0],), dtype=torch.int32),
        survival.new_empty((), dtype=torch.int64),
    )
