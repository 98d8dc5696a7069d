# SPDX-License-Identifier: Apache-2.0
"""Planner: SGLang SPS JSON in and out, validation, the flat/missing-table fallback, the lagged ring."""

import json
import logging

import pytest
import torch

from dspark import Planner, SpsTable
from dspark.reference import plan_verify_ref

TABLE = SpsTable((1, 2, 4, 8, 16), (100.0, 98.0, 90.0, 70.0, 40.0), 64)


def test_sps_json_round_trip(tmp_path):
    path = tmp_path / "sps.json"
    TABLE.save(path)
    d = json.loads(path.read_text())
    assert set(d) == {"sample_batch_tokens", "sample_steps_per_sec", "max_batch_tokens"}
    assert SpsTable.load(path) == TABLE


@pytest.mark.parametrize(
    "d,match",
    [
        ({"sample_batch_tokens": [1, 2]}, "missing keys"),
        ({"sample_batch_tokens": [2, 1], "sample_steps_per_sec": [1.0, 1.0]}, "strictly increasing"),
        ({"sample_batch_tokens": [0, 1], "sample_steps_per_sec": [1.0, 1.0]}, "strictly increasing"),
        ({"sample_batch_tokens": [1, 2], "sample_steps_per_sec": [1.0, -1.0]}, "must be a finite rate > 0"),
        ({"sample_batch_tokens": [1, 2], "sample_steps_per_sec": [1.0]}, "equal length"),
        (
            {"sample_batch_tokens": [1, 8], "sample_steps_per_sec": [1.0, 0.5], "max_batch_tokens": 4},
            "max_batch_tokens",
        ),
    ],
)
def test_bad_tables_are_refused(d, match):
    with pytest.raises(ValueError, match=match):
        SpsTable.from_dict(d)


def test_malformed_json_file(tmp_path):
    path = tmp_path / "bad.json"
    path.write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        Planner("early_stop", str(path))


def test_planner_equals_op_reference():
    surv = torch.cumprod(torch.rand(6, 7, generator=torch.Generator().manual_seed(0)), dim=1)
    p = Planner("early_stop", TABLE)
    res = p.plan(surv)
    ref = plan_verify_ref(surv, *TABLE.tensors(), "early_stop")
    assert torch.equal(res.verify_len, ref[0]) and res.mode == "early_stop"


@pytest.mark.parametrize("table", [None, SpsTable.flat(64)])
def test_missing_or_flat_table_verifies_everything_and_says_so_once(table, caplog):
    surv = torch.full((3, 4), 0.1)
    p = Planner("early_stop", table)
    with caplog.at_level(logging.WARNING, logger="dspark.planner"):
        for _ in range(3):
            res = p.plan(surv)
            assert res.verify_len.tolist() == [5, 5, 5] and res.mode == "full"
    assert sum("verifies every draft" in r.message for r in caplog.records) == 1


def test_lagged_topk_uses_the_earlier_round():
    p = Planner("lagged_topk", TABLE, lag=1)
    low = torch.full((2, 3), 1e-3).cumprod(1)
    high = torch.full((2, 3), 0.99).cumprod(1)
    # round 1: no history -> lagged survival is optimistic (ones) -> a large budget
    first = p.plan(low, request_ids=[10, 11])
    expect = plan_verify_ref(low, *TABLE.tensors(), "lagged_topk", torch.ones_like(low))
    assert torch.equal(first.verify_len, expect[0]) and int(first.budget) == int(expect[1])
    # round 2: the budget comes from round 1's (low) survival, whatever this round says
    second = p.plan(high, request_ids=[10, 11])
    expect = plan_verify_ref(high, *TABLE.tensors(), "lagged_topk", low)
    assert torch.equal(second.verify_len, expect[0]) and int(second.budget) == int(expect[1])
    assert int(second.budget) < int(first.budget)


def test_lagged_rows_follow_request_ids():
    p = Planner("lagged_topk", TABLE, lag=1)
    a = torch.tensor([[0.9, 0.8], [0.1, 0.01]])
    p.plan(a, request_ids=[7, 8])
    lagged = p._lagged((8, 9, 7), torch.zeros(3, 2))
    assert torch.equal(lagged[0], a[1])  # request 8 moved to row 0
    assert torch.equal(lagged[1], torch.ones(2))  # request 9 is new: optimistic
    assert torch.equal(lagged[2], a[0])


def test_lag_two_reads_two_rounds_back():
    p = Planner("lagged_topk", TABLE, lag=2)
    r1, r2 = torch.tensor([[0.5, 0.25]]), torch.tensor([[0.9, 0.81]])
    p.plan(r1)
    p.plan(r2)
    assert torch.equal(p._lagged((0,), torch.zeros(1, 2)), r1)


def test_bad_planner_arguments():
    with pytest.raises(ValueError, match="mode must be one of"):
        Planner("greedy")
    with pytest.raises(ValueError, match="lag must be >= 1"):
        Planner("lagged_topk", TABLE, lag=0)
    with pytest.raises(ValueError, match="request_ids"):
        Planner("early_stop", TABLE).plan(torch.ones(2, 3), request_ids=[1])


def test_lagged_survival_across_rounds_of_different_widths():
    planner = Planner("lagged_topk", SpsTable((1, 2, 4, 8), (100.0, 95.0, 80.0, 60.0), 64))
    old = torch.tensor([[0.9, 0.5, 0.2], [0.8, 0.4, 0.1]])
    planner.plan(old, [7, 3])
    wide = torch.full((2, 5), 0.5)
    lagged = planner._lagged((3, 9), wide)
    # request 3 was the second row: its 3 slots, then its last value (confidence 1); request 9 is new
    torch.testing.assert_close(lagged, torch.tensor([[0.8, 0.4, 0.1, 0.1, 0.1], [1.0, 1.0, 1.0, 1.0, 1.0]]))
    planner.plan(wide, [3, 9])
    narrow = torch.full((2, 2), 0.5)
    torch.testing.assert_close(planner._lagged((9, 3), narrow), torch.full((2, 2), 0.5))
    planner.plan(narrow, [9, 3])  # a plan over the narrower width runs


def test_a_cost_table_prices_blocks_wider_than_it_was_profiled_for():
    # profiled to B = 4 at R = 1 (γ = 3): 10 ms + 2 ms a row; a 9-row block is priced per row past the table
    from dspark.profiling import CostTable, VerifyCost

    table = CostTable(
        verify=tuple(VerifyCost(1, b, 10.0 + 2.0 * (b - 1)) for b in (1, 2, 3, 4)), draft=(), block_size=3
    )
    survival = torch.tensor([[0.95**j for j in range(1, 9)]])
    planner = Planner("early_stop", table)
    got = planner.plan(survival).verify_len
    per_row = table.to_sps(1, max_tokens=9)
    assert per_row.sample_batch_tokens[-1] == 9 and per_row.steps_per_sec(9) == pytest.approx(1000.0 / 26.0)
    want, _ = plan_verify_ref(survival, *per_row.tensors())
    assert torch.equal(got, want) and int(got[0]) == 9
    # negative control: the profiled range alone prices 9 rows at 9 / 4 of the 4-row time, and stops short
    short, _ = plan_verify_ref(survival, *table.to_sps(1).tensors())
    assert int(short[0]) < 9
    rates = planner.relative_rates(1, 8)
    assert rates.shape == (9,) and float(rates[8]) == pytest.approx(10.0 / 26.0)
