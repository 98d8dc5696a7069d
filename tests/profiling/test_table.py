# SPDX-License-Identifier: Apache-2.0
"""CostTable: JSON round trip, conversion to the SPS curve, loading either file, clear errors for bad files."""

import json

import pytest
import torch

from dspark import Planner, SpsTable
from dspark.profiling import CostTable, DraftCost, VerifyCost, load
from dspark.profiling.table import isotonic
from dspark.reference import plan_verify_ref

# verify ms: R = 1 at B = 1, 2, 4; R = 2 at B = 2, 4, 8. Drafter round ms: R = 1 -> 5, R = 2 -> 6.
TABLE = CostTable(
    verify=(
        VerifyCost(2, 8, 26.0, (25.0, 26.0, 30.0)),
        VerifyCost(1, 1, 10.0),
        VerifyCost(1, 2, 12.0),
        VerifyCost(1, 4, 16.0),
        VerifyCost(2, 2, 14.0),
        VerifyCost(2, 4, 18.0),
    ),
    draft=(DraftCost(1, 5.0, 4.0, 1.0, (5.0, 5.5)), DraftCost(2, 6.0)),
    block_size=3,
    metadata={"device": "cpu", "context_length": 256},
)


def rates(times_ms):
    return tuple(1000.0 / t for t in times_ms)


def test_json_round_trip_and_layout(tmp_path):
    path = tmp_path / "costs.json"
    TABLE.save_json(path)
    d = json.loads(path.read_text())
    assert d["format"] == "dspark-cost-table" and d["version"] == 1 and d["block_size"] == 3
    assert d["metadata"] == {"device": "cpu", "context_length": 256}
    assert d["draft"][0] == {
        "num_requests": 1,
        "ms": 5.0,
        "draft_ms": 4.0,
        "append_ms": 1.0,
        "samples_ms": [5.0, 5.5],
    }
    assert d["draft"][1] == {"num_requests": 2, "ms": 6.0, "samples_ms": []}
    # stored sorted by (R, B)
    assert [(v["num_requests"], v["batch_tokens"]) for v in d["verify"]] == [
        (1, 1),
        (1, 2),
        (1, 4),
        (2, 2),
        (2, 4),
        (2, 8),
    ]
    assert d["verify"][-1]["samples_ms"] == [25.0, 26.0, 30.0]
    back = CostTable.load(path)
    assert back == TABLE
    assert isinstance(load(path), CostTable) and load(path) == TABLE


def test_curve_for_each_batch_size():
    # R = 1: B = 1..4, draft 5 + verify 10, 12, (14), 16
    assert TABLE.to_sps(1) == SpsTable((1, 2, 3, 4), rates([15, 17, 19, 21]), 8)
    # R = 2: B = 2..8, draft 6 + verify 14, (16), 18, (20), (22), (24), 26
    assert TABLE.to_sps(2) == SpsTable(tuple(range(2, 9)), rates([20, 22, 24, 26, 28, 30, 32]), 8)
    # R = 3 and past the end are priced as the largest profiled R (2)
    assert TABLE.to_sps(3) == TABLE.to_sps(2) == TABLE.to_sps(9)
    assert TABLE.verify_ms(1, 3) == pytest.approx(14.0)
    # past the last probe each row costs what one cost over the upper half of the probes: (26 - 18) / (8 - 4)
    assert TABLE.verify_ms(2, 16) == pytest.approx(26.0 + 2.0 * 8)
    assert TABLE.draft_ms(1) == 5.0 and TABLE.draft_ms(2) == 6.0 and TABLE.draft_ms(7) == 6.0


def test_curve_reaches_wider_blocks_than_profiled():
    # R = 1 was profiled to B = 4 (10, 12, 16 ms at B = 1, 2, 4): rows past it cost (16 - 12) / (4 - 2) each
    wide = TABLE.to_sps(1, max_tokens=7)
    assert wide.sample_batch_tokens == tuple(range(1, 8))
    assert wide == SpsTable(tuple(range(1, 8)), rates([15, 17, 19, 21, 23, 25, 27]), 8)
    assert TABLE.to_sps(1, max_tokens=3) == TABLE.to_sps(1)  # inside the range: the profiled curve
    # one probe: no per-row cost is known, so the time grows in proportion
    one = CostTable(verify=(VerifyCost(1, 4, 20.0),), draft=(), block_size=3)
    assert one.verify_ms(1, 8) == pytest.approx(40.0)


def test_one_dimensional_export_uses_the_fewest_requests_that_carry_b():
    sps = TABLE.to_sps()
    # B = 1..4 by one request (draft 5), B = 5..8 by two (draft 6 + interpolated verify 20, 22, 24, 26)
    assert sps == SpsTable(tuple(range(1, 9)), rates([15, 17, 19, 21, 26, 28, 30, 32]), 8)
    assert not sps.is_flat


def test_noisy_measurements_give_a_non_increasing_curve():
    noisy = CostTable(
        verify=(
            VerifyCost(1, 1, 10.0),
            VerifyCost(1, 2, 9.0),
            VerifyCost(1, 3, 14.0),
            VerifyCost(1, 4, 13.0),
        ),
        draft=(DraftCost(1, 2.0),),
    )
    # the dips are averaged with the point they undercut: 9.5, 9.5, 13.5, 13.5
    assert noisy.to_sps(1).sample_steps_per_sec == pytest.approx(rates([11.5, 11.5, 15.5, 15.5]))
    # the stored measurements are untouched
    assert [v.ms for v in noisy.verify] == [10.0, 9.0, 14.0, 13.0]
    # drafter time falling with R (noise) is pooled too
    d = CostTable((VerifyCost(1, 1, 1.0), VerifyCost(2, 2, 1.0)), (DraftCost(1, 4.0), DraftCost(2, 2.0)))
    assert d.draft_ms(1) == d.draft_ms(2) == 3.0


def test_one_dimensional_export_is_monotone_where_r_steps_up():
    # two requests at B = 2 look cheaper than one request at B = 2: the export must not rise there
    t = CostTable(
        (VerifyCost(1, 1, 10.0), VerifyCost(1, 2, 20.0), VerifyCost(2, 3, 12.0), VerifyCost(2, 4, 30.0))
    )
    r = t.to_sps().sample_steps_per_sec
    assert all(a >= b for a, b in zip(r, r[1:], strict=False))
    assert r == pytest.approx(rates([10, 16, 16, 30]))


@pytest.mark.parametrize(
    "values,expected",
    [([1, 2, 3], [1, 2, 3]), ([3, 1], [2, 2]), ([1, 5, 2, 2, 6], [1, 3, 3, 3, 6]), ([4, 3, 2, 1], [2.5] * 4)],
)
def test_isotonic(values, expected):
    assert isotonic(values) == pytest.approx(expected)


def test_sglang_file_loads_in_sps_table(tmp_path):
    path = tmp_path / "sps.json"
    TABLE.to_sps().save(path)
    d = json.loads(path.read_text())
    assert set(d) == {"sample_batch_tokens", "sample_steps_per_sec", "max_batch_tokens"}
    assert d["sample_batch_tokens"] == list(range(1, 9)) and d["max_batch_tokens"] == 8
    assert d["sample_steps_per_sec"][4] == pytest.approx(1000 / 26)
    assert SpsTable.load(path) == TABLE.to_sps()
    assert isinstance(load(path), SpsTable)


def test_sps_table_and_planner_read_the_cost_table_file(tmp_path):
    path = tmp_path / "costs.json"
    TABLE.save_json(path)
    assert SpsTable.load(path) == SpsTable(tuple(range(1, 9)), rates([15, 17, 19, 21, 26, 28, 30, 32]), 8)
    p = Planner("early_stop", str(path))
    assert p.cost_table == TABLE and p.effective_mode == "early_stop"
    assert Planner("early_stop", json.loads(path.read_text())).cost_table == TABLE


def test_planner_prices_each_round_with_its_own_batch_size():
    g = torch.Generator().manual_seed(3)
    per_r = {
        1: SpsTable((1, 2, 3, 4), rates([15, 17, 19, 21]), 8),
        2: SpsTable(tuple(range(2, 9)), rates([20, 22, 24, 26, 28, 30, 32]), 8),
    }
    p = Planner("early_stop", TABLE)
    for R in (1, 2, 1, 2, 2, 1):
        surv = torch.cumprod(0.6 + 0.4 * torch.rand(R, 3, generator=g), dim=1)
        ref_len, _ = plan_verify_ref(surv, *per_r[R].tensors(), "early_stop")
        assert torch.equal(p.plan(surv).verify_len, ref_len)


def test_draft_cost_changes_the_plan():
    # verify is cheap per token, drafting is slow: with the drafter cost counted, admitting drafts pays off
    verify = tuple(VerifyCost(1, b, 10.0 * b) for b in (1, 2, 3, 4))
    surv = torch.tensor([[0.9, 0.85, 0.8]])
    no_draft = Planner("early_stop", CostTable(verify)).plan(surv).verify_len
    slow_draft = Planner("early_stop", CostTable(verify, (DraftCost(1, 100.0),))).plan(surv).verify_len
    # without drafter cost: 1 token/10 ms vs 1.9 tokens/20 ms -> verify the anchor only
    assert no_draft.tolist() == [1]
    # with 100 ms drafting: 1/110 < 1.9/120 < 2.75/130 < 3.55/140 -> verify everything
    assert slow_draft.tolist() == [4]


def _write(tmp_path, d, name="costs.json"):
    path = tmp_path / name
    path.write_text(json.dumps(d) if not isinstance(d, str) else d)
    return path


GOOD = TABLE.to_dict()


def _bad(**changes):
    d = json.loads(json.dumps(GOOD))
    for key, value in changes.items():
        if "." in key:
            section, index, field = key.split(".")
            d[section][int(index)][field] = value
        elif value is None:
            d.pop(key)
        else:
            d[key] = value
    return d


@pytest.mark.parametrize(
    "d,match",
    [
        ("{not json", "not valid JSON"),
        ([1, 2], "must hold a JSON object"),
        (_bad(version=2), "'version' must be 1"),
        (_bad(verify=None), "missing field 'verify'"),
        (_bad(verify=[]), "'verify' must be a non-empty list"),
        (_bad(**{"verify.1.ms": -3.0}), r"verify\[1\]\.ms = -3\.0 must be a finite time > 0"),
        (_bad(**{"verify.0.ms": "fast"}), r"verify\[0\]\.ms"),
        (
            _bad(**{"verify.2.batch_tokens": 0}),
            r"verify\[2\]\.batch_tokens = 0 must be an integer >= num_requests",
        ),
        (_bad(**{"verify.3.num_requests": 1.5}), r"verify\[3\]\.num_requests"),
        (_bad(**{"verify.0.samples_ms": [1.0, "x"]}), r"verify\[0\]\.samples_ms"),
        (_bad(**{"draft.0.ms": 0}), r"draft\[0\]\.ms = 0 must be a finite time > 0"),
        (_bad(**{"draft.1.num_requests": 1}), r"draft entry \(num_requests=1\): measured twice"),
        (_bad(**{"verify.1.batch_tokens": 1}), r"num_requests=1, batch_tokens=1\): measured twice"),
        (_bad(block_size=1), r"batch_tokens exceeds num_requests \* \(block_size \+ 1\)"),
        (_bad(block_size=0), "'block_size' = 0 must be an integer >= 1"),
        (_bad(metadata=[1]), "'metadata' must be a JSON object"),
        (_bad(draft={"num_requests": 1}), "'draft' must be a list"),
    ],
)
def test_bad_cost_files_name_the_file_and_the_field(tmp_path, d, match):
    path = _write(tmp_path, d)
    with pytest.raises(ValueError, match=match) as e:
        CostTable.load(path)
    assert str(path) in str(e.value)
    if isinstance(d, dict):  # the planner and SpsTable refuse it the same way
        with pytest.raises(ValueError, match=match):
            Planner("early_stop", path)
        with pytest.raises(ValueError, match=match):
            SpsTable.load(path)


def test_sglang_file_is_not_a_cost_table(tmp_path):
    path = _write(tmp_path, TABLE.to_sps().to_dict(), "sps.json")
    with pytest.raises(ValueError, match="SGLang's 1-D SPS JSON, not a dspark cost table"):
        CostTable.load(path)


def test_bad_sglang_file_names_the_file(tmp_path):
    path = _write(tmp_path, {"sample_batch_tokens": [2, 1], "sample_steps_per_sec": [1.0, 1.0]}, "sps.json")
    with pytest.raises(ValueError, match="strictly increasing") as e:
        load(path)
    assert str(path) in str(e.value)
    other = _write(tmp_path, {"tokens": [1]}, "other.json")
    with pytest.raises(ValueError, match="missing keys") as e:
        SpsTable.load(other)
    assert str(other) in str(e.value)


def test_cost_table_refuses_bad_objects():
    with pytest.raises(ValueError, match="at least one"):
        CostTable(())
    with pytest.raises(ValueError, match="batch_tokens must be an integer >= num_requests"):
        CostTable((VerifyCost(4, 2, 1.0),))
    with pytest.raises(ValueError, match="num_requests must be >= 1"):
        TABLE.to_sps(0)
    with pytest.raises(TypeError, match="sps_table must be"):
        Planner("early_stop", 42)


def test_rounds_without_a_drafter_are_priced_by_the_verify_alone():
    # R = 1: verify 10 / 12 / 16 ms at B = 1 / 2 / 4 (interpolated at 3), drafter 5 ms
    with_draft = TABLE.to_sps(1)
    verify_only = TABLE.to_sps(1, include_draft=False)
    assert verify_only.sample_batch_tokens == with_draft.sample_batch_tokens == (1, 2, 3, 4)
    assert verify_only.sample_steps_per_sec == pytest.approx(rates((10.0, 12.0, 14.0, 16.0)))
    assert with_draft.sample_steps_per_sec == pytest.approx(rates((15.0, 17.0, 19.0, 21.0)))
    # the planner of lookup decoding prices its rounds the same way
    lookup = Planner("early_stop", TABLE, draft_cost=False)
    assert lookup.relative_rates(1, 3).tolist() == pytest.approx([1.0, 10 / 12, 10 / 14, 10 / 16])
    drafted = Planner("early_stop", TABLE)
    assert drafted.relative_rates(1, 3).tolist() == pytest.approx([1.0, 15 / 17, 15 / 19, 15 / 21])
