# SPDX-License-Identifier: Apache-2.0
"""Confidence calibration: uncensored label collection, STS fit, ECE / AUROC / Brier and reliability plots.

See docs/calibration.md. Typical use::

    data = collect_calibration_data(decoder, prompts, temperature=1.0)
    report = calibrate(data)
    write_calibration_outputs("out/", data, report)   # sts.json, calibration_metrics.json, reliability.png
    lookup_prior_from_sequences(sequences, starts, LookupConfig(), gamma).save("out/lookup_prior.json")
"""

from dspark.calibration.data import (
    CalibrationData,
    accept_prob_labels,
    collect_calibration_data,
    greedy_match_labels,
)
from dspark.calibration.lookup_prior import lookup_prior_from_sequences
from dspark.calibration.metrics import auroc, brier, ece, reliability_bins
from dspark.calibration.report import (
    CalibrationReport,
    calibrate,
    calibration_metrics,
    reliability_diagram,
    write_calibration_outputs,
)
from dspark.calibration.sts import (
    DEFAULT_BIAS_GRID,
    DEFAULT_GRID,
    StsFit,
    cross_fitted_survival,
    cumulative_survival,
    fit_sts,
)

__all__ = [
    "DEFAULT_BIAS_GRID",
    "DEFAULT_GRID",
    "CalibrationData",
    "CalibrationReport",
    "StsFit",
    "accept_prob_labels",
    "auroc",
    "brier",
    "calibrate",
    "calibration_metrics",
    "collect_calibration_data",
    "cross_fitted_survival",
    "cumulative_survival",
    "ece",
    "fit_sts",
    "greedy_match_labels",
    "lookup_prior_from_sequences",
    "reliability_bins",
    "reliability_diagram",
    "write_calibration_outputs",
]
