# SPDX-License-Identifier: Apache-2.0
"""Calibration metrics of predicted probabilities: ECE (equal-width bins), exact AUROC, Brier score.

All functions take 1-D tensors or array-likes of the same length and compute in float64.
"""

from __future__ import annotations

from typing import Any

import numpy as np


def _as_1d(x: Any, name: str) -> np.ndarray:
    try:
        a = x.detach().cpu().double().numpy() if hasattr(x, "detach") else np.asarray(x, dtype=np.float64)
    except (TypeError, ValueError) as e:
        raise ValueError(f"{name}: expected numbers, got {type(x).__name__} ({e})") from None
    if a.ndim != 1:
        raise ValueError(f"{name}: expected a 1-D array, got shape {a.shape}")
    if not np.isfinite(a).all():
        raise ValueError(f"{name}: contains NaN or inf")
    return a


def _pair(pred: Any, label: Any, pred_name: str, label_name: str) -> tuple[np.ndarray, np.ndarray]:
    p = _as_1d(pred, pred_name)
    y = _as_1d(label, label_name)
    if p.shape != y.shape:
        raise ValueError(f"{label_name}: shape {y.shape} does not match {pred_name} shape {p.shape}")
    if p.size == 0:
        raise ValueError(f"{pred_name}: is empty")
    return p, y


def _check_unit(a: np.ndarray, name: str) -> None:
    if (a < 0).any() or (a > 1).any():
        raise ValueError(f"{name}: values must lie in [0, 1]")


def bin_index(pred: np.ndarray, n_bins: int) -> np.ndarray:
    """The equal-width bin of each prediction in ``[0, 1]``: bin ``b`` holds ``[b/n, (b+1)/n)``.

    1.0 goes to the last bin. Shared by the reliability bins and the STS fit so both bin alike.
    """
    return np.minimum((pred * n_bins).astype(np.int64), n_bins - 1)


def reliability_bins(pred: Any, label: Any, n_bins: int = 20) -> dict[str, np.ndarray]:
    """Per-bin counts, mean prediction and mean label over ``n_bins`` equal-width bins of ``[0, 1]``.

    Parameters
    ----------
    pred : array-like
        ``(N,)`` predicted probabilities in ``[0, 1]``.
    label : array-like
        ``(N,)`` observed outcomes or probabilities in ``[0, 1]``.
    n_bins : int
        Number of equal-width bins.

    Returns
    -------
    dict
        ``count``, ``mean_pred`` and ``mean_label`` (each ``(n_bins,)``; the means are NaN in empty bins).
    """
    p, y, idx = _binned(pred, label, n_bins)
    count = np.bincount(idx, minlength=n_bins).astype(np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean_pred = np.bincount(idx, weights=p, minlength=n_bins) / count
        mean_label = np.bincount(idx, weights=y, minlength=n_bins) / count
    return {"count": count, "mean_pred": mean_pred, "mean_label": mean_label}


def _binned(pred: Any, label: Any, n_bins: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Checked ``(pred, label)`` as float64 arrays and each prediction's bin index."""
    p, y = _pair(pred, label, "pred", "label")
    _check_unit(p, "pred")
    _check_unit(y, "label")
    if int(n_bins) < 1:
        raise ValueError(f"n_bins: must be >= 1, got {n_bins}")
    return p, y, bin_index(p, int(n_bins))


def ece(pred: Any, label: Any, n_bins: int = 20) -> float:
    """Expected calibration error over ``n_bins`` equal-width bins: ``Σ_b (n_b / N) |mean pred_b − mean label_b|``.

    Parameters
    ----------
    pred : array-like
        ``(N,)`` predicted probabilities in ``[0, 1]``.
    label : array-like
        ``(N,)`` outcomes (0/1) or target probabilities in ``[0, 1]``.
    n_bins : int
        Number of equal-width bins of ``[0, 1]`` (bin ``b`` is ``[b/n, (b+1)/n)``, the last one closed).

    Examples
    --------
    >>> ece([0.1, 0.1, 0.9, 0.9], [0, 1, 1, 1], n_bins=10)
    0.25
    """
    p, y, idx = _binned(pred, label, n_bins)
    gap = np.bincount(idx, weights=p - y, minlength=n_bins)  # Σ_b (pred − label) per bin
    return float(np.abs(gap).sum() / p.size)


def brier(pred: Any, label: Any) -> float:
    """Brier score ``mean((pred − label)²)``.

    Parameters
    ----------
    pred : array-like
        ``(N,)`` predicted probabilities in ``[0, 1]``.
    label : array-like
        ``(N,)`` outcomes (0/1) or target probabilities in ``[0, 1]``.
    """
    p, y = _pair(pred, label, "pred", "label")
    _check_unit(p, "pred")
    _check_unit(y, "label")
    return float(np.mean((p - y) ** 2))


def auroc(score: Any, label: Any) -> float:
    """Exact area under the ROC curve from ranks (Mann–Whitney U); tied scores count one half.

    Equals the fraction of (positive, negative) pairs the score orders correctly.

    Parameters
    ----------
    score : array-like
        ``(N,)`` scores (any finite values; higher means "more likely positive").
    label : array-like
        ``(N,)`` binary outcomes (0/1 or bool).

    Returns
    -------
    float
        The AUROC, or NaN when ``label`` has only one class.

    Examples
    --------
    >>> auroc([0.1, 0.4, 0.35, 0.8], [0, 0, 1, 1])
    0.75
    """
    s, y = _pair(score, label, "score", "label")
    if not np.isin(y, (0.0, 1.0)).all():
        raise ValueError("label: AUROC needs binary labels (0/1)")
    pos = y == 1.0
    n_pos = int(pos.sum())
    n_neg = y.size - n_pos
    if n_pos == 0 or n_neg == 0:
        return float("nan")
    order = np.argsort(s, kind="mergesort")
    sorted_s = s[order]
    starts = np.r_[0, np.flatnonzero(np.diff(sorted_s)) + 1]
    ends = np.r_[starts[1:], s.size]
    ranks = np.empty(s.size, dtype=np.float64)
    # every member of a tie group gets the group's average 1-based rank
    ranks[order] = np.repeat((starts + ends + 1) / 2.0, ends - starts)
    u = ranks[pos].sum() - n_pos * (n_pos + 1) / 2.0
    return float(u / (n_pos * n_neg))
