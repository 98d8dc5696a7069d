# SPDX-License-Identifier: Apache-2.0
"""Whether the drafter runs: only when its predicted tokens pay its time (``sources.drafter_pays``).

The decision reads the history and the acceptance tables only, before anything is drafted, so rounds without
the drafter (plain, or lookup blocks alone) mix with drafter rounds without changing the output distribution:
greedy output equals the target's, and sampled output passes the chi-square test of
``test_decoder_sampling.py`` (whose negative controls — a planner and a source choice that read this round's
draws — show that the test fails a biased round).
"""

from __future__ import annotations

import pytest
import torch

import dspark.decoding.round as round_mod
from dspark import DSparkDecoder, Planner
from dspark.decoding.acceptance import AcceptanceTable
from dspark.decoding.lookup import LookupConfig, LookupIndex, match_class
from dspark.decoding.sources import (
    DRAFTER_PROBE_ROUNDS,
    DRAFTER_SKIP_MARGIN,
    DRAFTER_SKIP_MARGIN_LOCAL,
    DrafterYield,
    drafter_pays,
    look_up,
)
from dspark.decoding.tables import CostTable, DraftCost, SpsTable, VerifyCost
from tests.decoding.test_decoder_sampling import (
    APPENDIX_A_CONF,
    START,
    TV_MAX,
    N,
    chain_table,
    score_first_three,
)
from tests.decoding.toy_models import markov_chain_target, markov_drafter, random_drafter, tiny_target


def table_for(num_requests: int, draft_ms: float, gamma: int = 4) -> CostTable:
    """Verify of B rows from R requests costs 10 ms per request plus 2 ms per extra row; the drafter
    ``draft_ms``."""
    R = num_requests
    verify = tuple(VerifyCost(R, b, 10.0 * R + 2.0 * (b - R)) for b in (R, R * (gamma + 1)))
    return CostTable(verify, (DraftCost(R, draft_ms),), block_size=gamma)


def count_drafts(monkeypatch, drafter) -> list[int]:
    """A list that grows by one at every round the drafter drafts."""
    calls: list[int] = []
    propose = drafter.propose
    monkeypatch.setattr(drafter, "propose", lambda *a, **k: calls.append(1) or propose(*a, **k))
    return calls


def test_a_cheap_drafter_runs_and_a_dear_one_does_not():
    good = DrafterYield(tokens=4.5, rows=5.0)  # 3.5 of 4 drafts accepted per round
    # with it: 2 · 4.5 tokens / (draft + 20 + 2 · 8 ms); without: 2 / 20 ms
    assert drafter_pays(Planner("early_stop", table_for(2, 1.0)), good, 2, 4)  # 9 / 37 > 2 / 20
    assert not drafter_pays(Planner("early_stop", table_for(2, 100.0)), good, 2, 4)  # 9 / 136 < 2 / 20
    # cheap, but its blocks return nothing: verifying them only costs
    assert not drafter_pays(Planner("early_stop", table_for(2, 1.0)), DrafterYield(1.0, 2.0), 2, 4)


def test_without_a_drafter_price_the_drafter_always_runs():
    poor = DrafterYield(1.0, 5.0)
    assert drafter_pays(Planner("early_stop", SpsTable((1, 2), (2.0, 1.0), 2)), poor, 1, 4)
    assert drafter_pays(Planner("full", table_for(1, 1e6)), poor, 1, 4)


def test_the_yield_is_a_running_mean_of_what_the_blocks_returned():
    y = DrafterYield(tokens=2.0, rows=2.0, weight=1.0, window=2)
    y.observe(4, 6)  # weight 2: halfway
    assert (y.tokens, y.rows) == (3.0, 4.0)
    y.observe(1, 2)  # the window: halfway again
    assert (y.tokens, y.rows) == (2.0, 3.0)


class History:
    """A request as ``look_up`` reads it: its lookup index."""

    config = LookupConfig(min_match=1, max_match=3)

    def __init__(self, tokens):
        self.lookup = LookupIndex(self.config)
        self.lookup.extend(tokens)


def lookup_block(first_accepted: float):
    """Two requests' 4-token lookup blocks whose first draft is accepted with ``first_accepted``, later ones
    almost surely."""
    table = AcceptanceTable.for_lookup(History.config, 4)
    for n in range(1, table.num_classes):
        for i in range(100):
            table.observe(n, 4, 4 if i < 100 * first_accepted else 0)
    return look_up([History([1, 2, 3, 4, 1, 2, 3, 4, 1, 2, 3])] * 2, 4, table)


def test_the_drafter_runs_only_where_it_beats_the_lookup_blocks():
    planner, good = Planner("early_stop", table_for(2, 10.0)), DrafterYield(4.5, 5.0)
    assert drafter_pays(planner, good, 2, 4)  # no lookup: the drafter pays
    weak, sure = lookup_block(0.5), lookup_block(0.99)
    assert drafter_pays(planner, good, 2, 4, weak, [False, False])  # ~3 tokens a block against 4.5
    assert not drafter_pays(planner, good, 2, 4, weak, [True, True])  # every request keeps its lookup block
    assert not drafter_pays(planner, good, 2, 4, sure, [False, False])  # ~4.9 tokens a block, no drafter time


def test_a_near_tie_keeps_the_drafter():
    good = DrafterYield(tokens=4.5, rows=5.0)
    # with it 9 tokens / (draft + 36 ms), without 2 / 20 ms: a tie at a 54 ms drafter
    assert drafter_pays(Planner("early_stop", table_for(2, 60.0)), good, 2, 4)  # 9 / 96 ms: 6 % worse, kept
    assert not drafter_pays(
        Planner("early_stop", table_for(2, 75.0)), good, 2, 4
    )  # 9 / 111 ms: 19 % worse, skipped


def test_a_table_from_this_machine_narrows_the_margin():
    good = DrafterYield(tokens=4.5, rows=5.0)
    planner = Planner("early_stop", table_for(2, 60.0))  # the drafter side 6 % below the other (above)
    assert drafter_pays(planner, good, 2, 4, margin=DRAFTER_SKIP_MARGIN)
    assert not drafter_pays(planner, good, 2, 4, margin=DRAFTER_SKIP_MARGIN_LOCAL)


@pytest.mark.parametrize("lookup", [False, True])
def test_a_dear_drafter_runs_only_in_probe_rounds_and_output_stays_greedy(monkeypatch, lookup):
    target = tiny_target("llama", vocab=64)
    drafter = random_drafter(target, block_size=4)
    calls = count_drafts(monkeypatch, drafter)
    prompt = [7, 8, 9, 10] * 6
    dec = DSparkDecoder(target, drafter, sps_table=table_for(1, 1e4), lookup=lookup)
    try:
        out = dec.generate([prompt], max_new_tokens=64, eos_token_id=[])
    finally:
        dec.close()
    ref = target.generate(torch.tensor([prompt]), max_new_tokens=64, do_sample=False, eos_token_id=None)
    assert out.sequences[0] == ref[0, len(prompt) :].tolist()
    assert len(calls) == out.stats.rounds // DRAFTER_PROBE_ROUNDS  # the probes only
    assert lookup or len(calls) > 0


def test_a_cheap_drafter_runs_every_round(monkeypatch):
    target = tiny_target("llama", vocab=64)
    drafter = random_drafter(target, block_size=4)
    calls = count_drafts(monkeypatch, drafter)
    dec = DSparkDecoder(target, drafter, sps_table=table_for(1, 0.1))
    dec.drafter_yield = DrafterYield(tokens=4.0, rows=4.0, weight=64.0)  # known to be right most of the time
    try:
        out = dec.generate([[3, 4, 5]], max_new_tokens=12, eos_token_id=[])
    finally:
        dec.close()
    assert len(calls) == out.stats.rounds > 0


@pytest.mark.slow
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_rounds_with_and_without_the_drafter_follow_the_target(monkeypatch, temperature):
    # the drafter is never worth its time here, so it runs only in probe rounds; probing every second round
    # mixes plain rounds and drafter rounds within each request's first three tokens
    monkeypatch.setattr(round_mod, "DRAFTER_PROBE_ROUNDS", 2)
    table = chain_table()
    target = markov_chain_target(table)
    d = markov_drafter(target, table, noise=1.0, block_size=3, conf_logits=APPENDIX_A_CONF)
    calls = count_drafts(monkeypatch, d)
    dec = DSparkDecoder(target, d, sps_table=table_for(N, 1e9, gamma=3), max_batch_size=N)
    try:
        out = dec.generate([[START]] * N, max_new_tokens=3, temperature=temperature, eos_token_id=[], seed=3)
    finally:
        dec.close()
    pval, tv = score_first_three(out.sequences, table, temperature, 0, 1.0)
    assert pval > 1e-3 and tv < TV_MAX, (pval, tv)
    assert 0 < len(calls) < out.stats.rounds  # plain rounds and drafter rounds
    assert 0 < out.stats.rejected_drafts < out.stats.verified_drafts


def test_rows_of_skipped_rounds_reach_the_drafter_before_it_drafts(monkeypatch):
    """Rounds without the drafter hold their rows' features; the drafter sees its whole context when it next
    drafts (one append for many rounds), and output stays the target's greedy."""
    target = tiny_target("llama", vocab=64)
    drafter = random_drafter(target, block_size=4)
    prompt = [7, 8, 9, 10] * 6
    dec = DSparkDecoder(target, drafter, sps_table=table_for(1, 1e4))
    seen, appends = [], []
    propose, append = drafter.propose, drafter.append_context

    def checked_propose(ids, *a, **k):
        seen.extend(drafter.next_position(rid) == dec.adapter.length(rid) for rid in ids)
        return propose(ids, *a, **k)

    monkeypatch.setattr(drafter, "propose", checked_propose)
    monkeypatch.setattr(drafter, "append_context", lambda *a, **k: appends.append(1) or append(*a, **k))
    try:
        out = dec.generate([prompt], max_new_tokens=64, eos_token_id=[])
    finally:
        dec.close()
    ref = target.generate(torch.tensor([prompt]), max_new_tokens=64, do_sample=False, eos_token_id=None)
    assert out.sequences[0] == ref[0, len(prompt) :].tolist()
    assert seen and all(seen)  # every draft saw every committed row
    assert len(appends) < out.stats.rounds // 2  # rows of skipped rounds batched, not one append a round


def test_pending_rows_are_bounded_without_the_drafter(monkeypatch):
    monkeypatch.setattr(round_mod, "PENDING_CONTEXT_ROWS", 5)
    monkeypatch.setattr(round_mod, "drafter_pays", lambda *a, **k: False)
    monkeypatch.setattr(round_mod, "DRAFTER_PROBE_ROUNDS", 10**6)  # the drafter never runs
    target = tiny_target("llama", vocab=64)
    drafter = random_drafter(target, block_size=4)
    dec = DSparkDecoder(target, drafter, sps_table=table_for(1, 1e4))
    held = []
    commit = round_mod.commit

    def watched(engine, call, r):
        commit(engine, call, r)
        held.extend(sum(len(f) for f in q.pending_context) for q in r.requests)

    monkeypatch.setattr(round_mod, "commit", watched)
    try:
        dec.generate([[7, 8, 9, 10] * 6], max_new_tokens=40, eos_token_id=[])
    finally:
        dec.close()
    assert held and max(held) < 5


def test_look_up_scores_a_block_by_its_match_extent():
    cfg = LookupConfig(2, 4)
    table = AcceptanceTable.for_lookup(cfg, 4)
    loop_class = match_class(cfg, 4, 48)
    for _ in range(100):
        table.observe(loop_class, 4, 4)  # loops were always right; fresh 4-token matches keep the 0.5 default
    loop, fresh = History([]), History([])
    loop.lookup, fresh.lookup = LookupIndex(cfg), LookupIndex(cfg)
    loop.lookup.extend([1, 2, 3] * 30)
    fresh.lookup.extend([9, 1, 2, 3, 4, 8, 1, 2, 3, 4])  # the 4-gram's occurrence agrees for 4 tokens only
    block = look_up([loop, fresh], 4, table)
    assert block.classes == [loop_class, 4] and block.lengths == [3, 4]  # the loop's copy runs into the end
    assert block.survival[0, 2] > 0.9 and block.survival[1].tolist() == pytest.approx(
        [0.5, 0.25, 0.125, 0.0625]
    )
