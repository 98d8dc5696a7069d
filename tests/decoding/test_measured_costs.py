# SPDX-License-Identifier: Apache-2.0
"""Measured round costs: the prior table corrected by measurements, and the planner pricing with them.

Expected values are computed here by hand from the running-mean rule (a cell starts at the prior with
``prior_weight`` pseudo-measurements; each measurement moves it by ``(x - mean) / weight`` with the weight
capped at ``window``).
"""

from __future__ import annotations

import math

import pytest
import torch

from dspark import DSparkDecoder, Planner
from dspark.decoding.measured_costs import MeasuredCosts
from dspark.decoding.tables import CostTable, DraftCost, SpsTable, VerifyCost
from tests.decoding.toy_models import random_drafter, tiny_target


def prior_table() -> CostTable:
    verify = (VerifyCost(1, 1, 10.0), VerifyCost(1, 2, 12.0), VerifyCost(2, 2, 20.0), VerifyCost(2, 4, 30.0))
    return CostTable(verify, (DraftCost(1, 4.0), DraftCost(2, 6.0)), block_size=3)


def test_estimates_start_at_the_prior():
    prior = prior_table()
    costs = MeasuredCosts(prior)
    for r, b in [(1, 1), (1, 2), (2, 2), (2, 3), (2, 4)]:
        assert costs.verify_ms(r, b) == pytest.approx(prior.verify_ms(r, b))
    assert costs.draft_ms(1) == 4.0 and costs.draft_ms(2) == 6.0
    assert costs.measurements == 0 and costs.version == 0


def test_a_measured_cell_follows_the_running_mean():
    costs = MeasuredCosts(prior_table(), prior_weight=2.0, window=4)
    costs.observe_verify(1, 2, 18.0)  # weight 3: 12 + 6 / 3
    assert costs.verify_ms(1, 2) == pytest.approx(14.0)
    costs.observe_verify(1, 2, 18.0)  # weight 4: 14 + 4 / 4
    assert costs.verify_ms(1, 2) == pytest.approx(15.0)
    costs.observe_verify(1, 2, 18.0)  # weight stays 4 (the window): 15 + 3 / 4
    assert costs.verify_ms(1, 2) == pytest.approx(15.75)
    for _ in range(200):  # a rate of 1 / window: the prior is forgotten
        costs.observe_verify(1, 2, 30.0)
    assert costs.verify_ms(1, 2) == pytest.approx(30.0, rel=1e-6)


def test_unmeasured_cells_scale_with_the_measured_ratio():
    costs = MeasuredCosts(prior_table(), prior_weight=1.0, window=1)  # a cell is its latest measurement
    costs.observe_verify(1, 1, 20.0)  # R = 1 runs twice as slow as profiled
    assert costs.verify_ms(1, 1) == pytest.approx(20.0)
    assert costs.verify_ms(1, 2) == pytest.approx(24.0)  # same R: 12 * 2
    assert costs.verify_ms(2, 4) == pytest.approx(60.0)  # no R = 2 measured: every R's ratio, 30 * 2
    costs.observe_verify(2, 2, 30.0)  # R = 2: 1.5 times the table
    assert costs.verify_ms(2, 4) == pytest.approx(45.0)
    assert costs.verify_ms(1, 2) == pytest.approx(24.0)  # R = 1 keeps its own ratio
    costs.observe_draft(1, 8.0)
    assert costs.draft_ms(1) == pytest.approx(8.0) and costs.draft_ms(2) == pytest.approx(12.0)


def test_glitches_are_ignored_and_the_version_moves_every_refresh():
    costs = MeasuredCosts(prior_table(), refresh=2)
    for bad in (0.0, -1.0, math.nan, math.inf):
        costs.observe_verify(1, 1, bad)
    assert costs.measurements == 0 and costs.verify_ms(1, 1) == pytest.approx(10.0)
    costs.observe_verify(1, 1, 11.0)
    assert costs.version == 0
    costs.observe_draft(1, 5.0)
    assert costs.version == 1 and costs.measurements == 2


def test_the_curve_starts_at_r_and_never_rises():
    costs = MeasuredCosts(prior_table(), prior_weight=1.0, window=1)
    costs.observe_verify(2, 3, 15.0)  # R = 2 at 0.6 times the table (25 ms profiled at B = 3)
    table = costs.to_sps(2)
    assert table.sample_batch_tokens[0] == 2 and table.sample_batch_tokens[-1] >= 8  # R (γ + 1)
    rates = table.sample_steps_per_sec
    assert all(a >= b for a, b in zip(rates, rates[1:], strict=False))
    assert rates[0] == pytest.approx(1000.0 / (costs.draft_ms(2) + costs.verify_ms(2, 2)))
    plain = costs.to_sps(2, include_draft=False)
    assert plain.sample_steps_per_sec[0] == pytest.approx(1000.0 / costs.verify_ms(2, 2))


@pytest.mark.parametrize(
    "kwargs,error,match",
    [
        ({"prior": SpsTable.flat()}, TypeError, "prior: expected a CostTable"),
        ({"prior_weight": 0.0}, ValueError, "prior_weight"),
        ({"prior_weight": math.nan}, ValueError, "prior_weight"),
        ({"prior_weight": True}, ValueError, "prior_weight"),
        ({"window": 0}, ValueError, "window"),
        ({"refresh": 1.5}, ValueError, "refresh"),
    ],
)
def test_bad_arguments_are_named(kwargs, error, match):
    args = {"prior": prior_table(), **kwargs}
    with pytest.raises(error, match=match):
        MeasuredCosts(**args)


# ---------------------------------------------------------------------------------------------- the planner
def cheap_rows_table() -> CostTable:
    """A profile that says a second and third row cost almost nothing."""
    return CostTable((VerifyCost(1, 1, 10.0), VerifyCost(1, 2, 10.5), VerifyCost(1, 3, 11.0)), block_size=2)


def test_the_planner_stops_admitting_drafts_that_measure_dear():
    survival = torch.tensor([[0.5, 0.4]])
    measured = Planner("early_stop", cheap_rows_table(), measure_costs=True)
    profiled = Planner("early_stop", cheap_rows_table())  # negative control: the same observations, ignored
    assert measured.plan(survival).verify_len.tolist() == [3]
    for _ in range(200):  # here every extra row doubles the forward
        for planner in (measured, profiled):
            planner.observe(1, 1, 10.0, None)
            planner.observe(1, 2, 20.0, None)
            planner.observe(1, 3, 30.0, None)
    assert measured.plan(survival).verify_len.tolist() == [1]
    assert profiled.plan(survival).verify_len.tolist() == [3]
    assert measured.relative_rates(1, 2).tolist() == pytest.approx([1.0, 0.5, 1 / 3], rel=0.02)


@pytest.mark.parametrize("table", [None, SpsTable((1, 2), (2.0, 1.0), 2)])
def test_measuring_needs_a_cost_table(table):
    with pytest.raises(ValueError, match="measure_costs: needs a dspark cost table"):
        Planner("early_stop", table, measure_costs=True)


def test_round_value_prices_the_plan_with_and_without_the_drafter():
    table = CostTable(
        (VerifyCost(1, 1, 10.0), VerifyCost(1, 2, 11.0), VerifyCost(1, 3, 12.0)), (DraftCost(1, 5.0),), 2
    )
    planner = Planner("early_stop", table)
    survival = torch.tensor([[0.8, 0.0]])
    # with the drafter: one draft admitted (1.8 tokens / 16 ms beats 1 / 15 ms); without: 1.8 / 11 ms
    assert planner.round_value(survival, drafter=True) == pytest.approx(1.8 * 1000 / 16)
    assert planner.round_value(survival, drafter=False) == pytest.approx(1.8 * 1000 / 11)
    assert planner.prices_drafter
    assert not Planner("early_stop", SpsTable((1, 2), (2.0, 1.0), 2)).prices_drafter
    assert not Planner("full", table).prices_drafter


# ---------------------------------------------------------------------------------------------- the decoder
def test_the_decoder_measures_its_rounds_and_stays_exact():
    target = tiny_target("llama", vocab=64)
    table = CostTable(
        tuple(VerifyCost(r, b, 5.0 + b) for r in (1, 2) for b in range(r, 5 * r + 1)),
        (DraftCost(1, 2.0), DraftCost(2, 3.0)),
        block_size=4,
    )
    prompts = [[5, 6, 7, 8, 9, 5, 6, 7], [1, 2, 3, 1, 2, 3, 1, 2, 3, 1]]
    want = [
        target.generate(torch.tensor([p]), max_new_tokens=16, do_sample=False, eos_token_id=None)[
            0, len(p) :
        ].tolist()
        for p in prompts
    ]
    dec = DSparkDecoder(
        target, random_drafter(target, block_size=4), sps_table=table, lookup=True, measure_costs=True
    )
    try:
        out = dec.generate(prompts, max_new_tokens=16, eos_token_id=[])
        assert out.sequences == want
        assert dec.planner.measured.measurements >= out.stats.rounds > 0
    finally:
        dec.close()


@pytest.mark.parametrize(
    "kwargs,error,match",
    [
        ({"measure_costs": 1}, TypeError, "measure_costs: expected a bool"),
        ({"measure_costs": True}, ValueError, "measure_costs: needs a dspark cost table"),
        ({"measure_costs": True, "planner": Planner("full")}, ValueError, "measure_costs: pass Planner"),
    ],
)
def test_bad_measure_costs_fails_before_the_target_is_touched(kwargs, error, match):
    target = tiny_target("llama", vocab=64)
    attn = target.config._attn_implementation
    with pytest.raises(error, match=match):
        DSparkDecoder(target, random_drafter(target, block_size=4), **kwargs)
    assert target.config._attn_implementation == attn


def test_the_command_line_refuses_measure_costs_without_a_table_before_loading(monkeypatch, capsys):
    import dspark.cli as cli
    from dspark.models import loading

    def no_load(*a, **k):
        raise AssertionError("the target must not load")

    monkeypatch.setattr(loading, "load_target", no_load)
    argv = ["generate", "--target", "smollm2", "--lookup", "--prompt", "hi", "--measure-costs"]
    assert cli.main(argv) == 2
    assert "--measure-costs needs --sps" in capsys.readouterr().err


@pytest.mark.parametrize("ready_planner", [False, True])
def test_measuring_is_refused_off_the_cpu(ready_planner):
    target = tiny_target("llama", vocab=64).to("meta")  # not a CPU target; never run
    table = CostTable((VerifyCost(1, 1, 10.0), VerifyCost(1, 2, 12.0)), (DraftCost(1, 2.0),), block_size=4)
    kwargs = (
        {"planner": Planner("early_stop", table, measure_costs=True)}
        if ready_planner
        else {"sps_table": table, "measure_costs": True}
    )
    with pytest.raises(ValueError, match="measure_costs: CPU targets only"):
        DSparkDecoder(target, None, lookup=True, **kwargs)
