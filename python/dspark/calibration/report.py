# SPDX-License-Identifier: Apache-2.0
"""Fit STS on collected data, measure calibration before and after, and write the outputs.

Every metric is per draft position ``k`` and about the *cumulative* survival
``S_k = Π_{i≤k} σ(c_i / T_i + b_i)`` (what the planner uses; ``b = 0`` for temperature-only STS):

* ECE (equal-width bins) and Brier score against the cumulative label ``Π_{i≤k} label_i``;
* AUROC against a binary outcome (:meth:`CalibrationData.binary_outcome`): the realised prefix-accept event of
  the collection run for ``label="prob"``, the cumulative greedy match for ``label="greedy"``.

"After" is measured on the rows the fit saw (as SGLang reports it); "held out" cross-fits by request
(:func:`cross_fitted_survival`): every row is scored with STS fitted on the other requests only.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from dspark.calibration.data import CalibrationData
from dspark.calibration.metrics import auroc, brier, ece, reliability_bins
from dspark.calibration.sts import (
    DEFAULT_BIAS_GRID,
    check_pair,
    cross_fitted_survival,
    cumulative_survival,
    fit_sts,
)

METRICS = ("ece", "auroc", "brier")
_LABEL_TEXT = {
    "prob": "accept probability prod_{i<=k} sum_v min(p_i, q_i)",
    "greedy": "greedy match prod_{i<=k} 1[x_i == argmax p_i]",
}


def calibration_metrics(
    conf_logit: Any,
    cumulative_label: Any,
    outcome: Any,
    temperatures: Sequence[float] | None = None,
    n_bins: int = 20,
    biases: Sequence[float] | None = None,
    survival: Any = None,
) -> dict[str, list[float]]:
    """Per-position ECE, AUROC and Brier of the cumulative survival, plus its mean and the mean label.

    Parameters
    ----------
    conf_logit : Tensor or array-like
        ``(N, γ)`` raw confidence logits.
    cumulative_label : Tensor or array-like
        ``(N, γ)`` cumulative labels in ``[0, 1]`` (ECE and Brier).
    outcome : Tensor or array-like
        ``(N, γ)`` binary outcomes (AUROC).
    temperatures : sequence of float, optional
        STS temperatures (``T = 1`` when not given).
    n_bins : int
        Equal-width bins of the ECE.
    biases : sequence of float, optional
        Affine STS offsets (``b = 0`` when not given).
    survival : array-like, optional
        ``(N, γ)`` survival to score instead of the one STS gives (e.g. :func:`cross_fitted_survival`).

    Returns
    -------
    dict
        ``ece``, ``auroc``, ``brier``, ``mean_survival``, ``mean_label``: one value per position (AUROC is NaN
        at a position whose outcome has a single class).
    """
    c, y = check_pair(conf_logit, cumulative_label)
    o = np.asarray(outcome.cpu() if hasattr(outcome, "cpu") else outcome, dtype=np.float64)
    if o.shape != c.shape:
        raise ValueError(f"outcome: shape {o.shape} does not match conf_logit shape {c.shape}")
    if survival is None:
        s = cumulative_survival(c, temperatures, biases)
    else:
        s = np.asarray(survival, dtype=np.float64)
        if s.shape != c.shape:
            raise ValueError(f"survival: shape {s.shape} does not match conf_logit shape {c.shape}")
    out: dict[str, list[float]] = {k: [] for k in (*METRICS, "mean_survival", "mean_label")}
    for k in range(c.shape[1]):
        out["ece"].append(ece(s[:, k], y[:, k], n_bins))
        out["auroc"].append(auroc(s[:, k], o[:, k]))
        out["brier"].append(brier(s[:, k], y[:, k]))
        out["mean_survival"].append(float(s[:, k].mean()))
        out["mean_label"].append(float(y[:, k].mean()))
    return out


@dataclass
class CalibrationReport:
    """STS fitted on a :class:`CalibrationData` and per-position metrics before (T = 1, b = 0), after (on the
    fitted rows) and held out (cross-fitted by request; None when not measured)."""

    temperatures: list[float]
    before: dict[str, list[float]]
    after: dict[str, list[float]]
    num_samples: int
    label: str
    temperature: float
    n_bins: int
    dataset: str = ""
    biases: list[float] | None = None
    heldout: dict[str, list[float]] | None = None
    folds: int = 0

    @property
    def mode(self) -> str:
        """``"affine"`` (temperatures and offsets) or ``"temperature"`` (SGLang's STS)."""
        return "temperature" if self.biases is None else "affine"

    @property
    def auroc_label(self) -> str:
        """Which binary outcome the AUROC is measured against."""
        if self.label == "greedy":
            return "cumulative greedy match"
        return "realised prefix-accept event (rejection sampling)"

    def sts_json(self) -> dict[str, Any]:
        """SGLang's STS JSON (``temperatures``, ``dataset``, ``num_samples``, ``ece_before``, ``ece_after``) with
        the other metrics in extra keys; affine STS adds ``biases`` (SGLang reads the temperatures only)."""
        extra: dict[str, Any] = {} if self.biases is None else {"biases": list(self.biases)}
        if self.heldout is not None:
            extra["ece_heldout"] = self.heldout["ece"]
        return {
            "temperatures": list(self.temperatures),
            **extra,
            "sts": self.mode,
            "dataset": self.dataset,
            "num_samples": self.num_samples,
            "ece_before": self.before["ece"],
            "ece_after": self.after["ece"],
            "auroc_before": self.before["auroc"],
            "auroc_after": self.after["auroc"],
            "brier_before": self.before["brier"],
            "brier_after": self.after["brier"],
            "label": self.label,
            "temperature": self.temperature,
            "num_bins": self.n_bins,
        }

    def metrics_json(self) -> dict[str, Any]:
        """Everything measured, per position, with what each number is computed against."""
        return {
            "temperatures": list(self.temperatures),
            "biases": self.biases,
            "sts": self.mode,
            "num_samples": self.num_samples,
            "gamma": len(self.temperatures),
            "dataset": self.dataset,
            "label": self.label,
            "sampling_temperature": self.temperature,
            "num_bins": self.n_bins,
            "predicted": "cumulative survival S_k = prod_{i<=k} sigmoid(c_i / T_i + b_i)",
            "ece_brier_label": "cumulative " + _LABEL_TEXT[self.label],
            "auroc_label": self.auroc_label,
            "before": self.before,
            "after": self.after,
            "heldout": self.heldout,
            "heldout_folds": self.folds,
            # expected accepted drafts per round: Σ_k S_k against the observed Σ_k label
            "expected_accepted_before": float(sum(self.before["mean_survival"])),
            "expected_accepted_after": float(sum(self.after["mean_survival"])),
            "expected_accepted_heldout": (
                None if self.heldout is None else float(sum(self.heldout["mean_survival"]))
            ),
            "observed_accepted": float(sum(self.after["mean_label"])),
        }

    def table(self) -> str:
        """Per-position table: T (and b), then ECE / AUROC / Brier before -> after, and the held-out ECE."""
        head = f"{'pos':>3}  {'T':>6}  " + ("" if self.biases is None else f"{'b':>5}  ")
        head += f"{'ECE':>17}  {'AUROC':>17}  {'Brier':>17}"
        if self.heldout is not None:
            head += f"  {'ECE held out':>12}"
        lines = [head]
        for k, t in enumerate(self.temperatures):
            row = f"{k:>3}  {t:6.3f}  " + ("" if self.biases is None else f"{self.biases[k]:5.1f}  ")
            row += "  ".join(f"{self.before[m][k]:7.4f} -> {self.after[m][k]:6.4f}" for m in METRICS)
            if self.heldout is not None:
                row += f"  {self.heldout['ece'][k]:12.4f}"
            lines.append(row)
        return "\n".join(lines)


def calibrate(
    data: CalibrationData,
    *,
    mode: str = "affine",
    grid: Sequence[float] | None = None,
    bias_grid: Sequence[float] | None = None,
    n_bins: int = 20,
    folds: int = 2,
) -> CalibrationReport:
    """Fit STS on ``data`` (:func:`fit_sts`) and measure each position before, after and held out.

    Parameters
    ----------
    data : CalibrationData
        Collected logits and labels (the fit uses ``data.cumulative_labels()``).
    mode : {"affine", "temperature"}
        ``"affine"`` fits a temperature and an offset per position; ``"temperature"`` is SGLang's STS.
    grid : sequence of float, optional
        Candidate temperatures (default: SGLang's 41 log-spaced values in ``[0.1, 10]``).
    bias_grid : sequence of float, optional
        Candidate offsets for ``mode="affine"`` (default :data:`DEFAULT_BIAS_GRID`, ``-4 .. 4`` by 0.1).
    n_bins : int
        Equal-width bins of the ECE (fit and report).
    folds : int
        Request folds of the held-out metrics (0 = skip them; skipped too when there are fewer requests).

    Returns
    -------
    CalibrationReport
    """
    if mode not in ("affine", "temperature"):
        raise ValueError(f"mode: expected 'affine' or 'temperature', got {mode!r}")
    if mode == "temperature" and bias_grid is not None:
        raise ValueError("bias_grid: only used with mode='affine'")
    if int(folds) < 0 or int(folds) == 1:
        raise ValueError(f"folds: expected 0 (no held-out metrics) or >= 2, got {folds}")
    cum = data.cumulative_labels()
    outcome = data.binary_outcome().float()
    fit_kw: dict[str, Any] = {"grid": grid, "n_bins": n_bins}
    if mode == "affine":
        fit_kw["bias_grid"] = DEFAULT_BIAS_GRID if bias_grid is None else bias_grid
    fit = fit_sts(data.conf_logit, cum, **fit_kw)
    biases = fit.biases if mode == "affine" else None
    before = calibration_metrics(data.conf_logit, cum, outcome, None, n_bins)
    after = calibration_metrics(data.conf_logit, cum, outcome, fit.temperatures, n_bins, biases)
    heldout = None
    folds = int(folds)
    if folds >= 2 and len(set(data.request_ids.tolist())) >= folds:
        s = cross_fitted_survival(data.conf_logit, cum, data.request_ids, folds=folds, **fit_kw)
        heldout = calibration_metrics(data.conf_logit, cum, outcome, n_bins=n_bins, survival=s)
    else:
        folds = 0
    return CalibrationReport(
        biases=biases,
        heldout=heldout,
        folds=folds,
        temperatures=fit.temperatures,
        before=before,
        after=after,
        num_samples=data.num_samples,
        label=data.label,
        temperature=data.temperature,
        n_bins=int(n_bins),
        dataset=str(data.meta.get("dataset", "")),
    )


def reliability_diagram(
    path: str | os.PathLike,
    data: CalibrationData,
    temperatures: Sequence[float],
    n_bins: int = 20,
    biases: Sequence[float] | None = None,
) -> None:
    """Save a PNG with one panel per draft position: observed against predicted cumulative survival, per bin,
    before (T = 1, b = 0) and after STS, with the diagonal of perfect calibration."""
    import matplotlib

    matplotlib.use("Agg")  # files only, never a window
    import matplotlib.pyplot as plt

    cum = data.cumulative_labels().double().numpy()
    before = cumulative_survival(data.conf_logit)
    after = cumulative_survival(data.conf_logit, temperatures, biases)
    g = data.gamma
    cols = min(g, 4)
    rows = (g + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(3.2 * cols, 3.2 * rows), squeeze=False)
    for k in range(rows * cols):
        ax = axes[k // cols][k % cols]
        if k >= g:
            ax.axis("off")
            continue
        ax.plot([0, 1], [0, 1], color="0.6", lw=1, ls="--")
        for s, name, color in ((before, "before", "tab:orange"), (after, "after", "tab:blue")):
            b = reliability_bins(s[:, k], cum[:, k], n_bins)
            keep = b["count"] > 0
            e = ece(s[:, k], cum[:, k], n_bins)
            ax.plot(
                b["mean_pred"][keep],
                b["mean_label"][keep],
                marker="o",
                ms=3,
                color=color,
                label=f"{name} (ECE {e:.3f})",
            )
        sts = f"T = {temperatures[k]:.3g}" + ("" if biases is None else f", b = {biases[k]:.1f}")
        ax.set_title(f"position {k}  {sts}", fontsize=9)
        ax.set_xlim(0, 1)
        ax.set_ylim(0, 1)
        ax.set_xlabel("predicted survival", fontsize=8)
        ax.set_ylabel("observed", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.legend(fontsize=7, loc="lower right")
    fig.suptitle(
        f"Cumulative survival reliability ({data.num_samples} rows, label {data.label})", fontsize=10
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_calibration_outputs(
    out_dir: str | os.PathLike, data: CalibrationData, report: CalibrationReport
) -> dict[str, Path]:
    """Write ``sts.json`` (SGLang's STS JSON), ``calibration_metrics.json`` and ``reliability.png`` to ``out_dir``.

    Returns
    -------
    dict
        ``{"sts": path, "metrics": path, "reliability": path}``.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {
        "sts": out / "sts.json",
        "metrics": out / "calibration_metrics.json",
        "reliability": out / "reliability.png",
    }
    # NaN (an AUROC without both classes) is written as null so that strict JSON readers accept the files
    paths["sts"].write_text(json.dumps(_nan_to_none(report.sts_json()), indent=2) + "\n")
    paths["metrics"].write_text(json.dumps(_nan_to_none(report.metrics_json()), indent=2) + "\n")
    reliability_diagram(paths["reliability"], data, report.temperatures, report.n_bins, report.biases)
    return paths


def _nan_to_none(x: Any) -> Any:
    if isinstance(x, float) and x != x:
        return None
    if isinstance(x, dict):
        return {k: _nan_to_none(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_nan_to_none(v) for v in x]
    return x
