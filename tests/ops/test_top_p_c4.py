# SPDX-License-Identifier: Apache-2.0
"""The top-p rule the CUDA split kernels are held to (tests/ops/top_p_c4.py), checked on the CPU: the fixed-
point kept set on hand-made rows (ties, a boundary exactly on the target), agreement with the CPU's rule on
random rows, and the comparison it guards fails where the kept sets really differ (a top_p moved by 0.05)."""

import pytest
import torch

import dspark
from tests.ops.test_rejection_sample import PROCS, rs_inputs
from tests.ops.top_p_c4 import assert_equal_outside, cpu_keeps, fixed_point_keeps, top_p_disagreements


def test_fixed_point_keeps_on_hand_made_rows():
    y = torch.tensor([3.0, 2.0, 2.0, 1.0, 0.0, -0.0, float("-inf")])
    w = torch.tensor([0.5, 0.125, 0.125, 0.25, 0.0, 0.0, 0.0])
    assert fixed_point_keeps(y, w, 0.5).tolist() == [True] + [False] * 6  # the top class holds exactly half
    assert fixed_point_keeps(y, w, 0.6).tolist() == [True, True, True] + [False] * 4  # the tied pair together
    assert fixed_point_keeps(y, w, 0.99).tolist() == [True] * 4 + [False] * 3  # no weightless id counts
    assert fixed_point_keeps(y, w, 1e-9).tolist() == [True] + [False] * 6  # need at least one unit


@pytest.mark.parametrize("V", [50, 5000, 151936])
def test_both_rules_agree_on_random_rows(V):
    g = torch.Generator().manual_seed(V)
    agree = 0
    for _ in range(6):
        y = torch.randn(V, generator=g) * 2
        w = (y - y.max()).exp()
        agree += torch.equal(fixed_point_keeps(y, w, 0.9), cpu_keeps(y, w, 0.9))
    assert agree >= 5


@pytest.mark.parametrize("procs", PROCS[2:])
def test_equal_outside_disagreements_and_able_to_fail(procs):
    args = rs_inputs(seed=3)
    skip = top_p_disagreements(args, procs)
    assert len(skip) <= 1
    cpu = dspark.ops.rejection_sample(*args, 5, 1, **procs)
    assert_equal_outside(cpu, dspark.ops.rejection_sample(*args, 5, 1, **procs), skip)
    # negative control: other kept sets (top_p + 0.05) must be caught for some request over a few seeds
    moved = dict(procs, top_p=(procs["top_p"] + 0.05).clamp(max=1.0))
    caught = 0
    for seed in range(8):
        cpu = dspark.ops.rejection_sample(*args, seed, 1, **procs)
        other = dspark.ops.rejection_sample(*args, seed, 1, **moved)
        try:
            assert_equal_outside(cpu, other, skip)
        except AssertionError:
            caught += 1
    assert caught >= 2
