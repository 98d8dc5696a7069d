# SPDX-License-Identifier: Apache-2.0
"""Sequential temperature scaling (STS) of the confidence head.

Draft position ``k`` gets its own temperature ``T_k``; the calibrated confidence is ``σ(c_k / T_k)`` and the
survival ``S_k = Π_{i≤k} σ(c_i / T_i)`` predicts that drafts ``1..k`` are all accepted. The temperatures are
fitted left to right: with ``T_0 .. T_{k−1}`` fixed, ``T_k`` is the grid value that minimises the ECE of
``S_k`` against the cumulative label (SGLang's procedure; the survival is what the planner consumes).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from dspark.calibration.metrics import _bin_index

#: SGLang's grid: 41 log-spaced temperatures from 0.1 to 10 (1.0 is on it).
DEFAULT_GRID: tuple[float, ...] = tuple(float(t) for t in np.logspace(-1.0, 1.0, 41))


def _as_2d(x: Any, name: str) -> np.ndarray:
    try:
        a = x.detach().cpu().double().numpy() if hasattr(x, "detach") else np.asarray(x, dtype=np.float64)
    except (TypeError, ValueError) as e:
        raise ValueError(f"{name}: expected numbers, got {type(x).__name__} ({e})") from None
    if a.ndim != 2 or a.shape[0] == 0 or a.shape[1] == 0:
        raise ValueError(f"{name}: expected a non-empty [N, gamma] array, got shape {a.shape}")
    if not np.isfinite(a).all():
        raise ValueError(f"{name}: contains NaN or inf")
    return a


def check_pair(conf_logit: Any, cumulative_label: Any) -> tuple[np.ndarray, np.ndarray]:
    """Validate ``conf_logit`` ``[N, γ]`` and ``cumulative_label`` ``[N, γ]`` in ``[0, 1]``; float64 arrays."""
    c = _as_2d(conf_logit, "conf_logit")
    y = _as_2d(cumulative_label, "cumulative_label")
    if y.shape != c.shape:
        raise ValueError(f"cumulative_label: shape {y.shape} does not match conf_logit shape {c.shape}")
    if (y < 0).any() or (y > 1).any():
        raise ValueError("cumulative_label: values must lie in [0, 1]")
    return c, y


def _check_temperatures(temperatures: Any, gamma: int) -> np.ndarray:
    t = np.asarray(temperatures, dtype=np.float64).reshape(-1)
    if t.size != gamma:
        raise ValueError(f"temperatures: {t.size} values for {gamma} draft positions")
    if not np.isfinite(t).all() or (t <= 0).any():
        raise ValueError("temperatures: must be finite and > 0")
    return t


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.tanh(0.5 * x))  # no overflow for large |x|


def cumulative_survival(conf_logit: Any, temperatures: Sequence[float] | None = None) -> np.ndarray:
    """``S[n, k] = Π_{i≤k} σ(conf_logit[n, i] / T_i)`` (float64 ``[N, γ]``; ``T = 1`` when not given).

    Parameters
    ----------
    conf_logit : Tensor or array-like
        ``(N, γ)`` raw confidence logits.
    temperatures : sequence of float, optional
        ``γ`` positive STS temperatures.
    """
    c = _as_2d(conf_logit, "conf_logit")
    t = np.ones(c.shape[1]) if temperatures is None else _check_temperatures(temperatures, c.shape[1])
    return np.cumprod(_sigmoid(c / t), axis=1)


def _ece(pred: np.ndarray, label: np.ndarray, n_bins: int) -> float:
    gap = np.bincount(_bin_index(pred, n_bins), weights=pred - label, minlength=n_bins)
    return float(np.abs(gap).sum() / pred.size)


@dataclass
class StsFit:
    """Fitted STS temperatures and the per-position ECE of the cumulative survival before (T = 1) and after."""

    temperatures: list[float]
    ece_before: list[float]
    ece_after: list[float]


def fit_sts(
    conf_logit: Any,
    cumulative_label: Any,
    *,
    grid: Sequence[float] | None = None,
    n_bins: int = 20,
) -> StsFit:
    """Fit per-position temperatures left to right by grid search on the ECE of the cumulative survival.

    At position ``k`` the survival through ``k − 1`` is held at its fitted value and ``T_k`` is the grid value
    minimising ``ECE(S_{k−1} · σ(c_k / T), cumulative_label[:, k])``; only a strict improvement replaces the
    current best, so ties keep the smallest temperature.

    Parameters
    ----------
    conf_logit : Tensor or array-like
        ``(N, γ)`` raw confidence logits (before any STS).
    cumulative_label : Tensor or array-like
        ``(N, γ)`` in ``[0, 1]``: the event (0/1) or probability that drafts ``1..k`` are all accepted.
    grid : sequence of float, optional
        Candidate temperatures (> 0); default :data:`DEFAULT_GRID` (41 log-spaced values in ``[0.1, 10]``).
    n_bins : int
        Equal-width bins of the ECE.

    Returns
    -------
    StsFit
    """
    c, y = check_pair(conf_logit, cumulative_label)
    g = np.asarray(DEFAULT_GRID if grid is None else grid, dtype=np.float64).reshape(-1)
    if g.size == 0 or not np.isfinite(g).all() or (g <= 0).any():
        raise ValueError("grid: must be a non-empty list of finite temperatures > 0")
    if int(n_bins) < 1:
        raise ValueError(f"n_bins: must be >= 1, got {n_bins}")
    n_bins = int(n_bins)
    g = np.sort(g)
    before = np.cumprod(_sigmoid(c), axis=1)
    prev = np.ones(c.shape[0])
    temps, ece_after = [], []
    for k in range(c.shape[1]):
        best_t, best_e = float(g[0]), float("inf")
        for t in g:
            e = _ece(prev * _sigmoid(c[:, k] / t), y[:, k], n_bins)
            if e < best_e:
                best_t, best_e = float(t), e
        prev = prev * _sigmoid(c[:, k] / best_t)
        temps.append(best_t)
        ece_after.append(best_e)
    ece_before = [_ece(before[:, k], y[:, k], n_bins) for k in range(c.shape[1])]
    return StsFit(temps, ece_before, ece_after)
