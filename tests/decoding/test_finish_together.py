# SPDX-License-Identifier: Apache-2.0
"""finish_together: when no prompt waits, verify rows go to the requests predicted to finish last.

The weights against their formula, the plan step of a round with requests at different progress (the one far
ahead verifies its anchor alone, the last one keeps its plan; with ``finish_together`` off both plan alike),
the decoder turning it on only while no prompt waits, and greedy output equal to the target's either way.
Sampled exactness with it on is covered by the chi-square tests of test_lookup_round.py and
test_decoder_sampling.py, whose N requests share one call (no prompt waits, so every cost-driven round there
is weighted).
"""

from __future__ import annotations

import pytest
import torch

import dspark.decoding.round as round_mod
from dspark import DSparkDecoder, Planner, SpsTable
from dspark.decoding.planner import FINISH_TOGETHER_POWER, finish_together_weights
from dspark.decoding.request import Request
from dspark.decoding.round import CallState, RoundState
from dspark.decoding.stopping import StopCriteria
from dspark.host_sync import HostReader
from tests.decoding.toy_models import tiny_target

# every row costs 1 % of a round's rate (no step of the curve where a row is free): early_stop admits the drafts
# of survival above ~0.05 and none of weight ~0
TABLE = SpsTable(tuple(range(1, 33)), tuple(100.0 - b for b in range(32)), 64)


def test_weights_follow_the_predicted_rounds():
    # predicted rounds 100, 50, 0 and 100 / 4 = 25: the last request 1, the others (f / 100) ** power
    w = finish_together_weights([100, 50, 0, 100], [1.0, 1.0, 2.0, 4.0])
    expected = torch.tensor([1.0, 0.5**FINISH_TOGETHER_POWER, 0.0, 0.25**FINISH_TOGETHER_POWER])
    torch.testing.assert_close(w, expected)
    assert w.dtype == torch.float32


def test_weights_when_nothing_remains_are_all_one():
    assert torch.equal(finish_together_weights([0, 0], [1.0, 2.0]), torch.ones(2))
    assert finish_together_weights([], []).shape == (0,)


@pytest.mark.parametrize(
    "remaining,rates,match",
    [([1, 2], [1.0], "2 remaining counts for 1 rates"), ([-1], [1.0], ">= 0"), ([3], [0.0], "rates > 0")],
)
def test_bad_weight_inputs_are_named(remaining, rates, match):
    with pytest.raises(ValueError, match=match):
        finish_together_weights(remaining, rates)


def request(rid: int, generated: int, commits: int, max_new: int = 100) -> Request:
    stop = StopCriteria(max_new)
    stop.generated = [7] * generated
    return Request(rid, rid, [1, 2, 3], stop, None, anchor=7, started=True, commits=commits)


def test_a_request_tracks_its_rate_and_what_remains():
    q = request(0, generated=30, commits=9, max_new=100)
    assert q.remaining_tokens == 70 and q.tokens_per_round == pytest.approx(31 / 10)
    fresh = request(1, generated=0, commits=0)
    assert fresh.tokens_per_round == 1.0
    q.commit([5, 6])
    assert q.commits == 10 and q.remaining_tokens == 68


class Engine:
    def __init__(self) -> None:
        self.planner = Planner("early_stop", TABLE)
        self.host = HostReader()
        self.adaptive_slots = False


def planned(finish_together: bool) -> list[int]:
    # request 0 is far ahead (90 of 100 tokens at 3 a round), request 1 far behind (10 at 1 a round); both
    # hold a block of 4 drafts of survival 0.8 — the same plan for both without the weighting
    reqs = [request(0, generated=90, commits=30), request(1, generated=10, commits=10)]
    call = CallState(sampling=None, drafting=True, stats=None, slots=4, finish_together=finish_together)
    r = RoundState(reqs, torch.tensor([7, 7]), slots=4, draft_slots=4)
    r.survival = torch.full((2, 4), 0.8).cumprod(1)
    r.run_drafter = True
    round_mod.plan(Engine(), call, r)
    return r.verify_len.tolist()


def test_the_plan_serves_the_request_that_finishes_last():
    alone = planned(finish_together=False)
    assert alone[0] == alone[1] > 1  # the control: without the weights both verify the same drafts
    together = planned(finish_together=True)
    assert together[1] == alone[1]  # the last one keeps its plan (weight 1)
    assert together[0] == 1  # 10 / 3 against 90 rounds: weight ~1e-12, its anchor alone


@pytest.fixture
def seen_flags(monkeypatch):
    flags: list[bool] = []
    real = round_mod.plan

    def spy(engine, call, r):
        flags.append(call.finish_together)
        return real(engine, call, r)

    monkeypatch.setattr(round_mod, "plan", spy)
    return flags


def test_the_decoder_weighs_only_while_no_prompt_waits(seen_flags):
    target = tiny_target(seed=3)
    dec = DSparkDecoder(target, None, lookup=True, sps_table=TABLE, max_batch_size=2)
    dec.generate([[1, 2, 3, 1, 2]] * 3, max_new_tokens=6, temperature=0.0)
    # three prompts, two slots: the third waits until one finishes, then the last two run weighted
    assert False in seen_flags and True in seen_flags
    assert seen_flags.index(True) > 0 and all(seen_flags[seen_flags.index(True) :])
    seen_flags.clear()
    off = DSparkDecoder(target, None, lookup=True, sps_table=TABLE, max_batch_size=2, finish_together=False)
    off.generate([[1, 2, 3, 1, 2]] * 3, max_new_tokens=6, temperature=0.0)
    assert seen_flags and not any(seen_flags)


def test_greedy_output_is_the_targets_either_way():
    target = tiny_target(seed=5)
    prompts = [[1, 2, 3, 1, 2, 3, 1], [4, 9, 4, 9, 4], [5, 6, 7, 8, 9, 10, 11]]
    plain = DSparkDecoder(target, None, max_batch_size=3).generate(
        prompts, max_new_tokens=24, temperature=0.0
    )
    for together in (True, False):
        dec = DSparkDecoder(
            target, None, lookup=True, sps_table=TABLE, max_batch_size=3, finish_together=together
        )
        out = dec.generate(prompts, max_new_tokens=24, temperature=0.0)
        assert out.sequences == plain.sequences


def test_finish_together_must_be_a_bool():
    with pytest.raises(TypeError, match="finish_together: expected a bool"):
        DSparkDecoder(tiny_target(seed=0), None, finish_together=1)
