# SPDX-License-Identifier: Apache-2.0
"""Sequential temperature scaling (STS) of the confidence head, optionally affine.

Draft position ``k`` gets its own temperature ``T_k`` (and, for affine STS, an offset ``b_k``); the calibrated
confidence is ``σ(c_k / T_k + b_k)`` and the survival ``S_k = Π_{i≤k} σ(c_i / T_i + b_i)`` predicts that
drafts ``1..k`` are all accepted. The parameters are fitted left to right: with positions ``0 .. k−1`` fixed,
``(T_k, b_k)`` is the grid point that minimises the ECE of ``S_k`` against the cumulative label (SGLang's
procedure; the survival is what the planner consumes). SGLang's STS is the ``b = 0`` case; a temperature alone
cannot remove a bias (a head that is too confident on average at every logit), the offset can.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from dspark.calibration.metrics import bin_index

#: SGLang's grid: 41 log-spaced temperatures from 0.1 to 10 (1.0 is on it).
DEFAULT_GRID: tuple[float, ...] = tuple(float(t) for t in np.logspace(-1.0, 1.0, 41))
#: Offsets of affine STS: -4 to 4 in steps of 0.1 (0 is on it; σ shifts by at most a factor e^4 in odds).
DEFAULT_BIAS_GRID: tuple[float, ...] = tuple(round(0.1 * i, 1) for i in range(-40, 41))


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


def _check_vector(values: Any, gamma: int, name: str, positive: bool) -> np.ndarray:
    t = np.asarray(values, dtype=np.float64).reshape(-1)
    if t.size != gamma:
        raise ValueError(f"{name}: {t.size} values for {gamma} draft positions")
    if not np.isfinite(t).all() or (positive and (t <= 0).any()):
        raise ValueError(f"{name}: must be finite" + (" and > 0" if positive else ""))
    return t


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.tanh(0.5 * x))  # no overflow for large |x|


def cumulative_survival(
    conf_logit: Any, temperatures: Sequence[float] | None = None, biases: Sequence[float] | None = None
) -> np.ndarray:
    """``S[n, k] = Π_{i≤k} σ(conf_logit[n, i] / T_i + b_i)`` (float64 ``[N, γ]``; ``T = 1``, ``b = 0`` when not
    given).

    Parameters
    ----------
    conf_logit : Tensor or array-like
        ``(N, γ)`` raw confidence logits.
    temperatures : sequence of float, optional
        ``γ`` positive STS temperatures.
    biases : sequence of float, optional
        ``γ`` finite offsets of affine STS.
    """
    c = _as_2d(conf_logit, "conf_logit")
    g = c.shape[1]
    t = np.ones(g) if temperatures is None else _check_vector(temperatures, g, "temperatures", True)
    b = np.zeros(g) if biases is None else _check_vector(biases, g, "biases", False)
    return np.cumprod(_sigmoid(c / t + b), axis=1)


def _ece(pred: np.ndarray, label: np.ndarray, n_bins: int) -> float:
    return float(_ece_rows(pred[None, :], label, n_bins)[0])


def _ece_rows(pred: np.ndarray, label: np.ndarray, n_bins: int) -> np.ndarray:
    """:func:`_ece` of every row of ``pred`` ``[M, N]`` against ``label`` ``[N]`` in one bincount."""
    m, n = pred.shape
    idx = bin_index(pred, n_bins) + n_bins * np.arange(m)[:, None]
    gap = np.bincount(idx.ravel(), weights=(pred - label).ravel(), minlength=m * n_bins)
    return np.abs(gap.reshape(m, n_bins)).sum(axis=1) / n


@dataclass
class StsFit:
    """Fitted STS parameters and the per-position ECE of the cumulative survival before (T = 1, b = 0) and after.

    ``biases`` is all zeros for temperature-only STS (SGLang's)."""

    temperatures: list[float]
    biases: list[float]
    ece_before: list[float]
    ece_after: list[float]

    @property
    def affine(self) -> bool:
        """Whether any offset is non-zero (the STS JSON then carries ``biases``)."""
        return any(b != 0.0 for b in self.biases)


def _sorted_grid(values: Sequence[float], name: str, positive: bool) -> np.ndarray:
    g = np.asarray(values, dtype=np.float64).reshape(-1)
    if g.size == 0 or not np.isfinite(g).all() or (positive and (g <= 0).any()):
        raise ValueError(
            f"{name}: must be a non-empty list of finite " + ("values > 0" if positive else "values")
        )
    return np.sort(g)


def fit_sts(
    conf_logit: Any,
    cumulative_label: Any,
    *,
    grid: Sequence[float] | None = None,
    bias_grid: Sequence[float] | None = None,
    n_bins: int = 20,
) -> StsFit:
    """Fit per-position STS left to right by grid search on the ECE of the cumulative survival.

    At position ``k`` the survival through ``k − 1`` is held at its fitted value and ``(T_k, b_k)`` is the grid
    point minimising ``ECE(S_{k−1} · σ(c_k / T + b), cumulative_label[:, k])``; only a strict improvement
    replaces the current best, so ties keep the offset nearest 0, then the smallest temperature.

    Parameters
    ----------
    conf_logit : Tensor or array-like
        ``(N, γ)`` raw confidence logits (before any STS).
    cumulative_label : Tensor or array-like
        ``(N, γ)`` in ``[0, 1]``: the event (0/1) or probability that drafts ``1..k`` are all accepted.
    grid : sequence of float, optional
        Candidate temperatures (> 0); default :data:`DEFAULT_GRID` (41 log-spaced values in ``[0.1, 10]``).
    bias_grid : sequence of float, optional
        Candidate offsets: None fits temperatures only (``b = 0``, SGLang's STS); :data:`DEFAULT_BIAS_GRID` is
        ``-4 .. 4`` in steps of 0.1.
    n_bins : int
        Equal-width bins of the ECE.

    Returns
    -------
    StsFit
    """
    c, y = check_pair(conf_logit, cumulative_label)
    g = _sorted_grid(DEFAULT_GRID if grid is None else grid, "grid", True)
    offsets = np.zeros(1) if bias_grid is None else _sorted_grid(bias_grid, "bias_grid", False)
    offsets = offsets[np.argsort(np.abs(offsets), kind="stable")]  # nearest 0 first: ties keep it
    if int(n_bins) < 1:
        raise ValueError(f"n_bins: must be >= 1, got {n_bins}")
    n_bins = int(n_bins)
    before = np.cumprod(_sigmoid(c), axis=1)
    prev = np.ones(c.shape[0])
    temps, biases, ece_after = [], [], []
    for k in range(c.shape[1]):
        best_t, best_b, best_e = float(g[0]), 0.0, float("inf")
        scaled = c[:, k][None, :] / g[:, None]  # [len(g), N]
        for b in offsets:
            e = _ece_rows(prev * _sigmoid(scaled + b), y[:, k], n_bins)
            i = int(np.argmin(e))  # first minimum: the smallest temperature among ties
            if e[i] < best_e:
                best_t, best_b, best_e = float(g[i]), float(b), float(e[i])
        prev = prev * _sigmoid(c[:, k] / best_t + best_b)
        temps.append(best_t)
        biases.append(best_b)
        ece_after.append(best_e)
    ece_before = [_ece(before[:, k], y[:, k], n_bins) for k in range(c.shape[1])]
    return StsFit(temps, biases, ece_before, ece_after)


def cross_fitted_survival(
    conf_logit: Any, cumulative_label: Any, groups: Any, *, folds: int = 2, **fit_kwargs: Any
) -> np.ndarray:
    """Held-out survival ``[N, γ]``: each row's STS is fitted on the other folds' rows only.

    Rows are split by ``groups`` (request ids: a request's rounds are correlated, so they stay together): the
    sorted distinct ids are dealt round-robin into ``folds`` folds. The ECE of this survival estimates what a
    fit achieves on requests it has not seen.

    Parameters
    ----------
    conf_logit, cumulative_label : Tensor or array-like
        ``(N, γ)``, as for :func:`fit_sts`.
    groups : Tensor or array-like
        ``(N,)`` integer group (request) id per row; at least ``folds`` distinct ids.
    folds : int
        Number of folds (>= 2).
    **fit_kwargs
        ``grid``, ``bias_grid``, ``n_bins`` of :func:`fit_sts`.
    """
    c, y = check_pair(conf_logit, cumulative_label)
    gid = np.asarray(groups.cpu() if hasattr(groups, "cpu") else groups).reshape(-1)
    if gid.shape[0] != c.shape[0]:
        raise ValueError(f"groups: {gid.shape[0]} ids for {c.shape[0]} rows")
    folds = int(folds)
    uniq, inverse = np.unique(gid, return_inverse=True)
    if folds < 2 or uniq.size < folds:
        raise ValueError(f"folds: need 2 <= folds <= number of distinct groups ({uniq.size}), got {folds}")
    fold_of_row = inverse % folds
    out = np.empty_like(c)
    for f in range(folds):
        held = fold_of_row == f
        fit = fit_sts(c[~held], y[~held], **fit_kwargs)
        out[held] = cumulative_survival(c[held], fit.temperatures, fit.biases)
    return out
