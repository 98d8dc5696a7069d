# SPDX-License-Identifier: Apache-2.0
"""STS fit: recovers known temperatures (and offsets), is a no-op on calibrated data, minimises the documented
objective; cross-fitting scores every row with parameters fitted without it."""

import math

import numpy as np
import pytest
import torch

from dspark.calibration import (
    DEFAULT_BIAS_GRID,
    DEFAULT_GRID,
    cross_fitted_survival,
    cumulative_survival,
    ece,
    fit_sts,
)


def synthetic(t_star, n=40000, seed=0, mean=1.0, scale=2.5, b_star=None):
    """Raw logits and cumulative 0/1 labels whose per-position acceptance is sigmoid(c / T* + b*)."""
    rng = np.random.default_rng(seed)
    c = rng.normal(mean, scale, size=(n, len(t_star)))
    b = np.zeros(len(t_star)) if b_star is None else np.asarray(b_star)
    accept = rng.random(c.shape) < 1.0 / (1.0 + np.exp(-(c / np.asarray(t_star) + b)))
    return c, np.cumprod(accept, 1).astype(np.float64)


def test_default_grid_is_sglangs():
    assert len(DEFAULT_GRID) == 41
    assert DEFAULT_GRID[0] == pytest.approx(0.1) and DEFAULT_GRID[-1] == pytest.approx(10.0)
    assert DEFAULT_GRID[20] == pytest.approx(1.0)


def test_recovers_known_temperatures_and_reduces_ece():
    t_star = [0.5, 2.0, 1.0, 3.0]
    c, cum = synthetic(t_star)
    fit = fit_sts(c, cum)
    for t, ts in zip(fit.temperatures, t_star, strict=True):
        assert abs(math.log10(t / ts)) <= 0.1, (fit.temperatures, t_star)  # within two grid steps
    assert fit.temperatures[0] == pytest.approx(0.5, rel=0.02)  # position 0 has all rows: one grid step
    for b, a in zip(fit.ece_before, fit.ece_after, strict=True):
        assert a <= b
    assert fit.ece_after[0] < 0.25 * fit.ece_before[0]
    assert max(fit.ece_after) < 0.01


def test_default_bias_grid():
    assert len(DEFAULT_BIAS_GRID) == 81 and 0.0 in DEFAULT_BIAS_GRID
    assert DEFAULT_BIAS_GRID[0] == -4.0 and DEFAULT_BIAS_GRID[-1] == 4.0


def test_affine_recovers_a_biased_head_that_temperature_alone_cannot_fix():
    # a head too confident by a constant in logit space: no temperature removes that
    t_star, b_star = [1.0, 0.5, 2.0], [-1.2, 0.8, -0.5]
    c, cum = synthetic(t_star, b_star=b_star, mean=-0.5, seed=3)
    temp_only = fit_sts(c, cum)
    affine = fit_sts(c, cum, bias_grid=DEFAULT_BIAS_GRID)
    assert temp_only.biases == [0.0, 0.0, 0.0] and not temp_only.affine and affine.affine
    for k in range(3):  # within about one step of either grid
        assert abs(affine.biases[k] - b_star[k]) <= 0.15, (affine.biases, b_star)
        assert abs(math.log10(affine.temperatures[k] / t_star[k])) <= 0.06, (affine.temperatures, t_star)
    assert temp_only.ece_after[0] > 0.1 and affine.ece_after[0] < 0.01
    for a, t in zip(affine.ece_after, temp_only.ece_after, strict=True):
        assert a <= t + 1e-12  # b = 0 is on the grid: affine can only do better at each position
    s = cumulative_survival(c, affine.temperatures, affine.biases)
    for k in range(3):
        assert ece(s[:, k], cum[:, k], 20) == pytest.approx(affine.ece_after[k])


def test_affine_fit_minimises_the_ece_over_both_grids_left_to_right():
    c, cum = synthetic([0.7, 1.6], n=3000, seed=4, b_star=[0.5, -0.5])
    grid, bias_grid = [0.5, 1.0, 2.0], [-1.0, -0.5, 0.0, 0.5]
    fit = fit_sts(c, cum, grid=grid, bias_grid=bias_grid, n_bins=10)
    t_fixed: list[float] = []
    b_fixed: list[float] = []
    for k in range(2):
        scores = {
            (t, b): ece(cumulative_survival(c[:, : k + 1], t_fixed + [t], b_fixed + [b])[:, k], cum[:, k], 10)
            for t in grid
            for b in bias_grid
        }
        best = min(scores, key=scores.get)
        assert (fit.temperatures[k], fit.biases[k]) == best
        t_fixed.append(best[0])
        b_fixed.append(best[1])


def test_affine_ties_keep_the_offset_nearest_zero():
    c = np.zeros((50, 2))  # sigmoid(0 / T + b) = sigmoid(b): b = 0 matches the label exactly for every T
    cum = np.full((50, 2), 0.5) * np.array([1.0, 0.5])
    fit = fit_sts(c, cum, grid=[2.0, 0.5, 1.0], bias_grid=[0.5, -0.5, 0.0])
    assert fit.temperatures == [0.5, 0.5] and fit.biases == [0.0, 0.0]


def test_cross_fitted_survival_uses_only_the_other_folds():
    c, cum = synthetic([0.8, 1.5, 1.0], n=4000, seed=5, b_star=[-0.5, 0.3, 0.0])
    groups = np.repeat(np.arange(40), 100)  # 40 requests of 100 rounds
    kw = dict(grid=[0.5, 1.0, 2.0], bias_grid=[-0.5, 0.0, 0.5])
    s = cross_fitted_survival(c, cum, groups, folds=2, **kw)
    for f in range(2):
        held = groups % 2 == f
        fit = fit_sts(c[~held], cum[~held], **kw)
        np.testing.assert_array_equal(s[held], cumulative_survival(c[held], fit.temperatures, fit.biases))
    # changing the held-out rows' labels does not change their own scores
    cum2 = cum.copy()
    cum2[groups % 2 == 0] = 0.0
    s2 = cross_fitted_survival(c, cum2, groups, folds=2, **kw)
    np.testing.assert_array_equal(s2[groups % 2 == 0], s[groups % 2 == 0])


@pytest.mark.parametrize(
    "groups,folds,match",
    [(np.zeros(10), 2, "folds"), (np.arange(10), 1, "folds"), (np.arange(9), 2, "groups")],
)
def test_cross_fit_bad_inputs(groups, folds, match):
    with pytest.raises(ValueError, match=match):
        cross_fitted_survival(np.zeros((10, 2)), np.zeros((10, 2)), groups, folds=folds)


def test_is_a_no_op_on_calibrated_data():
    c, cum = synthetic([1.0, 1.0, 1.0], seed=1)
    fit = fit_sts(torch.tensor(c), torch.tensor(cum))
    for t in fit.temperatures:
        assert abs(math.log10(t)) <= 0.05  # T = 1 or its grid neighbour
    for b, a in zip(fit.ece_before, fit.ece_after, strict=True):
        assert a <= b + 1e-12


def test_fit_minimises_the_ece_of_the_cumulative_survival_left_to_right():
    c, cum = synthetic([0.7, 1.6, 0.4], n=3000, seed=2)
    grid = [0.25, 0.5, 1.0, 2.0, 4.0]
    fit = fit_sts(c, cum, grid=grid, n_bins=10)
    fixed: list[float] = []
    for k in range(3):
        # brute force through the public ece(): earlier positions keep their fitted temperatures
        scores = [ece(cumulative_survival(c[:, : k + 1], fixed + [t])[:, k], cum[:, k], 10) for t in grid]
        best = grid[int(np.argmin(scores))]
        assert fit.temperatures[k] == best
        assert fit.ece_after[k] == pytest.approx(min(scores))
        fixed.append(best)
    # the first position's fit does not look at later columns
    cum2 = cum.copy()
    cum2[:, 1:] = 0.0
    assert fit_sts(c, cum2, grid=grid, n_bins=10).temperatures[0] == fit.temperatures[0]


def test_ties_keep_the_smallest_temperature():
    c = np.zeros((50, 2))  # sigmoid(0 / T) = 0.5 for every T: every candidate scores the same
    cum = np.full((50, 2), 0.3)
    assert fit_sts(c, cum, grid=[2.0, 0.5, 1.0]).temperatures == [0.5, 0.5]


def test_cumulative_survival():
    c = torch.randn(6, 3)
    t = [0.5, 1.0, 2.0]
    want = torch.cumprod(torch.sigmoid(c.double() / torch.tensor(t, dtype=torch.float64)), 1)
    np.testing.assert_allclose(cumulative_survival(c, t), want.numpy(), rtol=1e-12)
    np.testing.assert_allclose(cumulative_survival(c), torch.cumprod(torch.sigmoid(c.double()), 1).numpy())


@pytest.mark.parametrize(
    "args,kwargs,match",
    [
        ((np.zeros((4, 3)), np.zeros((4, 2))), {}, "cumulative_label"),
        ((np.full((4, 3), np.nan), np.zeros((4, 3))), {}, "conf_logit"),
        ((np.zeros((4, 3)), np.full((4, 3), np.nan)), {}, "cumulative_label"),
        ((np.zeros((4, 3)), np.full((4, 3), 1.5)), {}, "cumulative_label"),
        ((np.zeros(4), np.zeros(4)), {}, "conf_logit"),
        ((np.zeros((4, 3)), np.zeros((4, 3))), {"grid": [1.0, -1.0]}, "grid"),
        ((np.zeros((4, 3)), np.zeros((4, 3))), {"n_bins": 0}, "n_bins"),
        ((np.zeros((4, 3)), np.zeros((4, 3))), {"bias_grid": [0.0, np.nan]}, "bias_grid"),
        ((np.zeros((4, 3)), np.zeros((4, 3))), {"bias_grid": []}, "bias_grid"),
    ],
)
def test_bad_inputs_name_the_argument(args, kwargs, match):
    with pytest.raises(ValueError, match=match):
        fit_sts(*args, **kwargs)


def test_bad_temperatures():
    with pytest.raises(ValueError, match="temperatures"):
        cumulative_survival(np.zeros((2, 3)), [1.0, 1.0])
    with pytest.raises(ValueError, match="temperatures"):
        cumulative_survival(np.zeros((2, 2)), [1.0, 0.0])
    with pytest.raises(ValueError, match="biases"):
        cumulative_survival(np.zeros((2, 2)), [1.0, 1.0], [0.0, np.inf])
    with pytest.raises(ValueError, match="biases"):
        cumulative_survival(np.zeros((2, 2)), None, [0.0])
