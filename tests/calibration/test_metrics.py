# SPDX-License-Identifier: Apache-2.0
"""ECE, AUROC and Brier against brute-force loops and hand-derived cases; bad inputs name the argument."""

import math

import numpy as np
import pytest
import torch

from dspark.calibration import auroc, brier, ece, reliability_bins


def ece_loop(pred, label, n_bins):
    total = 0.0
    for b in range(n_bins):
        lo, hi = b / n_bins, (b + 1) / n_bins
        members = [i for i, p in enumerate(pred) if lo <= p < hi or (b == n_bins - 1 and p == 1.0)]
        if members:
            mp = sum(pred[i] for i in members) / len(members)
            ml = sum(label[i] for i in members) / len(members)
            total += len(members) / len(pred) * abs(mp - ml)
    return total


def auroc_pairs(score, label):
    pos = [s for s, y in zip(score, label, strict=True) if y == 1]
    neg = [s for s, y in zip(score, label, strict=True) if y == 0]
    good = 0.0
    for a in pos:
        for b in neg:
            good += 1.0 if a > b else 0.5 if a == b else 0.0
    return good / (len(pos) * len(neg))


def test_ece_hand_derived():
    # bin 1: preds 0.1, 0.1 vs labels 0, 1 -> |0.1 - 0.5| * 2/4; bin 9: 0.9, 0.9 vs 1, 1 -> |0.9 - 1| * 2/4
    assert ece([0.1, 0.1, 0.9, 0.9], [0, 1, 1, 1], n_bins=10) == pytest.approx(0.2 + 0.05)
    assert ece([0.3, 0.7], [0.3, 0.7]) == pytest.approx(0.0)
    assert ece([1.0, 1.0], [0.0, 0.0]) == pytest.approx(1.0)  # 1.0 falls in the last bin


@pytest.mark.parametrize("seed", range(4))
def test_ece_matches_a_loop_over_bins(seed):
    rng = np.random.default_rng(seed)
    pred = rng.random(300)
    pred[:10] = [0.0, 1.0, 0.05, 0.95, 0.5, 0.25, 0.75, 1.0, 0.0, 0.65]  # bin edges
    label = rng.random(300) if seed % 2 else (rng.random(300) < pred).astype(float)
    for n_bins in (1, 7, 20):
        assert ece(pred, label, n_bins) == pytest.approx(
            ece_loop(pred.tolist(), label.tolist(), n_bins), abs=1e-12
        )


@pytest.mark.parametrize("seed", range(4))
def test_auroc_equals_fraction_of_correctly_ordered_pairs(seed):
    rng = np.random.default_rng(seed)
    score = np.round(rng.normal(size=80), 1)  # rounding makes ties
    label = (rng.random(80) < 1 / (1 + np.exp(-2 * score))).astype(int)
    assert auroc(score, label) == pytest.approx(auroc_pairs(score.tolist(), label.tolist()), abs=1e-12)
    assert auroc(torch.tensor(score), torch.tensor(label, dtype=torch.bool)) == pytest.approx(
        auroc_pairs(score.tolist(), label.tolist()), abs=1e-12
    )


def test_auroc_hand_derived():
    assert auroc([0.1, 0.4, 0.35, 0.8], [0, 0, 1, 1]) == pytest.approx(0.75)
    assert auroc([1, 2, 3], [0, 1, 1]) == 1.0
    assert auroc([3, 2, 1], [0, 1, 1]) == 0.0
    assert auroc([0.5, 0.5, 0.5], [0, 1, 1]) == 0.5
    assert math.isnan(auroc([0.1, 0.2], [1, 1]))


def test_brier_hand_derived():
    assert brier([0.2, 0.9, 0.5], [0, 1, 1]) == pytest.approx((0.04 + 0.01 + 0.25) / 3)
    assert brier(torch.tensor([0.25]), torch.tensor([0.75])) == pytest.approx(0.25)


def test_reliability_bins():
    b = reliability_bins([0.05, 0.15, 0.12, 0.99], [0, 1, 0, 1], n_bins=10)
    assert b["count"].tolist() == [1, 2, 0, 0, 0, 0, 0, 0, 0, 1]
    assert b["mean_pred"][1] == pytest.approx(0.135)
    assert b["mean_label"][1] == pytest.approx(0.5)
    assert math.isnan(b["mean_pred"][2])


@pytest.mark.parametrize(
    "fn,args,match",
    [
        (ece, ([0.1, 0.2], [0, 1, 1]), "label"),
        (ece, ([0.1, float("nan")], [0, 1]), "pred"),
        (ece, ([0.1, 0.2], [0, float("inf")]), "label"),
        (ece, ([0.1, 1.2], [0, 1]), "pred"),
        (ece, ([[0.1, 0.2]], [[0, 1]]), "pred"),
        (ece, ([0.1], [1], 0), "n_bins"),
        (brier, ([0.1, 0.2], [0]), "label"),
        (brier, ([float("nan")], [0]), "pred"),
        (auroc, ([0.1, 0.2], [0, 0.5]), "label"),
        (auroc, ([0.1, float("nan")], [0, 1]), "score"),
        (auroc, ([0.1, 0.2, 0.3], [0, 1]), "label"),
        (auroc, ([], []), "score"),
    ],
)
def test_bad_inputs_name_the_argument(fn, args, match):
    with pytest.raises(ValueError, match=match):
        fn(*args)
