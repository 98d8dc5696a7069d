# SPDX-License-Identifier: Apache-2.0
"""STS fit: recovers known temperatures, is a no-op on calibrated data, minimises the documented objective."""

import math

import numpy as np
import pytest
import torch

from dspark.calibration import DEFAULT_GRID, cumulative_survival, ece, fit_sts


def synthetic(t_star, n=40000, seed=0, mean=1.0, scale=2.5):
    """Raw logits and cumulative 0/1 labels whose per-position acceptance is sigmoid(c / T*)."""
    rng = np.random.default_rng(seed)
    c = rng.normal(mean, scale, size=(n, len(t_star)))
    accept = rng.random(c.shape) < 1.0 / (1.0 + np.exp(-c / np.asarray(t_star)))
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
