# SPDX-License-Identifier: Apache-2.0
"""DSparkDecoder with the target's forwards and the drafter's block forward replayed from CUDA graphs (skipped
without a GPU and a CUDA build).

Greedy output equals the target's own greedy decoding through ragged verify blocks, truncation (rejected
drafts), preemption, a KV cache that grows (the graphs are dropped and captured again) and evictions; a round
still waits for the device only at its counted reads once the buckets are captured; a capture that fails turns
graphs off with a warning and the output stays right (a failure in the drafter's sampling / confidence graphs
leaves its block-forward graphs on). Sampled drafts replayed from the heads' graphs equal the eager ones, with a
new Philox offset every round. The padding itself is tested on any device in tests/models/test_target_graphs.py
and tests/models/test_drafter_head_graphs.py.
"""

import random

import pytest
import torch

from dspark import DSparkDecoder, GraphBuckets
from dspark.models.drafter_graphs import DrafterGraphs
from dspark.models.target import TargetAdapter
from dspark.models.target_graphs import TargetGraphs
from tests.decoding.test_decoder import SPS, hf_greedy, prompts_of
from tests.decoding.test_decoder_cuda import _count_syncs, _uncounted
from tests.decoding.toy_models import random_drafter, tiny_target
from tests.models.test_drafter_graphs import _pair
from tests.models.test_drafter_graphs import _rounds as _drafter_rounds
from tests.models.test_drafter_head_graphs import CASES as HEAD_CASES
from tests.models.test_drafter_head_graphs import _assert_same as _assert_same_draft
from tests.models.test_drafter_head_graphs import _pair as _heads_pair
from tests.models.test_drafter_head_graphs import _rounds as _heads_rounds
from tests.models.test_target_graphs import ATOL, _ragged_rounds
from tests.models.tiny import tiny_model
from tests.training.test_copy_channel import frozen_target

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


def _all_captures(dec) -> int:
    """Graphs captured so far by the decoder's target and drafter graph sets (those it has)."""
    drafter = dec.drafter_graphs
    sets = [dec.adapter.graph_stats]
    if drafter is not None:
        sets += [drafter.stats, drafter.heads.stats, drafter.context.stats]
    return sum(s.captures for s in sets)


@pytest.mark.parametrize("mode", ["full", "early_stop"])
@pytest.mark.parametrize("lookup", [False, True])
def test_greedy_with_graphs_equals_the_target_and_syncs_only_at_counted_reads(mode, lookup):
    target = tiny_target("llama", seed=5).to("cuda")
    prompts = prompts_of([4, 9, 13, 2], 96, seed=5)
    want = [hf_greedy(target, p, 12) for p in prompts]
    dec = DSparkDecoder(
        target,
        random_drafter(target),
        planner=mode,
        sps_table=SPS,
        max_batch_size=4,
        lookup=lookup,
        cuda_graphs=True,
    )
    try:
        dec.generate(prompts, max_new_tokens=12, eos_token_id=[])  # captures the buckets this call uses
        captured = _all_captures(dec)
        before = dec.host.syncs
        out, stacks = _count_syncs(lambda: dec.generate(prompts, max_new_tokens=12, eos_token_id=[]))
        counted = dec.host.syncs - before
        recaptured = _all_captures(dec) != captured  # before close(), which drops the drafter's graphs
        stats = dec.adapter.graph_stats
        drafter_stats = dec.drafter_graphs.stats
        heads_stats = dec.drafter_graphs.heads.stats
        context_stats = dec.drafter_graphs.context.stats
    finally:
        dec.close()
    assert out.sequences == want
    assert stats.disabled is None and stats.replays > 0 and stats.captures > 0
    # the drafter's block forward replays too (unless every round took lookup blocks alone), and its heads
    assert drafter_stats.disabled is None and drafter_stats.captures > 0 and drafter_stats.replays > 0
    assert heads_stats.disabled is None and heads_stats.replays > 0 and not heads_stats.eager, heads_stats
    # the context appends replay (the prompts' rows at prefill fit a bucket here, and each round's rows)
    assert context_stats.disabled is None and context_stats.replays > 0, context_stats
    others = _uncounted(stacks)
    # no new graph in the measured call (torch.cuda.graph synchronises the device when a capture begins), in the
    # target's graphs nor in the drafter's (block forward, heads, context append): their captures are not
    # counted reads either
    if not recaptured:
        assert not others and len(stacks) == counted, "\n----\n".join(others)


def test_graphs_survive_preemption_cache_growth_and_evictions():
    target = tiny_target("llama", seed=7).to("cuda")
    prompts = prompts_of([20, 25, 18, 30, 22], 96, seed=7)
    want = [hf_greedy(target, p, 14) for p in prompts]
    buckets = GraphBuckets(requests=(1, 2, 4, 8), tokens=(4, 8, 16, 32, 64), max_graphs=2)
    # 12 pages cannot hold five requests of ~45 tokens: requests get preempted and resumed
    dec = DSparkDecoder(
        target, random_drafter(target), max_batch_size=5, max_kv_pages=12, cuda_graphs=buckets
    )
    try:
        out = dec.generate(prompts, max_new_tokens=14, eos_token_id=[])
        stats = dec.adapter.graph_stats
        drafter_stats = dec.drafter_graphs.stats
    finally:
        dec.close()
    assert out.sequences == want
    assert stats.replays > 0 and stats.evictions > 0 and stats.disabled is None
    assert drafter_stats.replays > 0 and drafter_stats.disabled is None


def test_captured_forwards_equal_the_plain_forward_when_the_cache_grows():
    model = tiny_model("llama", seed=3).to("cuda")
    plain = TargetAdapter(model, page_size=4, num_pages=2)  # the pools double several times
    graphed = TargetAdapter(model, page_size=4, num_pages=2)
    graphed.graphs = TargetGraphs(graphed, GraphBuckets(requests=(4,), tokens=(8, 16)))
    outs = _ragged_rounds(plain, graphed, random.Random(0), model.config.vocab_size, rounds=8)
    for want, got in outs:
        torch.testing.assert_close(got.logits, want.logits, atol=ATOL, rtol=0)
        for layer in want.hidden:
            torch.testing.assert_close(got.hidden[layer], want.hidden[layer], atol=ATOL, rtol=0)
    stats = graphed.graph_stats
    assert (
        stats.replays == len(outs) and stats.captures > 2
    )  # captured again after the caches were reallocated
    assert graphed.pool.total_pages > 2


@pytest.mark.parametrize("side", ["target", "drafter", "heads"])
def test_a_failed_capture_turns_graphs_off_and_the_output_stays_right(monkeypatch, side):
    """A host read under capture (what breaks a capture in practice) in the target's forward, the drafter's
    block forward or its sampling step: those graphs turn off with a warning, and the output stays the
    target's."""
    target = tiny_target("llama", seed=5).to("cuda")
    prompts = prompts_of([4, 9], 96, seed=5)
    want = [hf_greedy(target, p, 8) for p in prompts]
    drafter = random_drafter(target)
    dec = DSparkDecoder(target, drafter, cuda_graphs=True)
    owner, name = {
        "target": (dec.adapter, "call_model"),
        "drafter": (drafter, "block_forward"),
        "heads": (drafter, "draw"),
    }[side]
    real = getattr(owner, name)

    def syncing(*args, **kwargs):
        if torch.cuda.is_current_stream_capturing():
            torch.ones(1, device="cuda").item()
        return real(*args, **kwargs)

    monkeypatch.setattr(owner, name, syncing)
    try:
        with pytest.warns(RuntimeWarning, match="CUDA graph capture failed"):
            out = dec.generate(prompts, max_new_tokens=8, eos_token_id=[])
        graphs = dec.drafter_graphs
        stats = {"target": dec.adapter.graph_stats, "drafter": graphs.stats, "heads": graphs.heads.stats}[
            side
        ]
        block_stats = graphs.stats
    finally:
        dec.close()
    assert out.sequences == want
    assert stats.disabled is not None and stats.eager.get("disabled", 0) > 0
    if side == "heads":  # the block forward's graphs are not the heads'
        assert block_stats.disabled is None and block_stats.replays > 0
    assert drafter.graphs is None  # closing the decoder detached the drafter's


@pytest.mark.parametrize("v2", [False, True])
def test_captured_block_forwards_equal_the_plain_one(v2):
    """The drafter's graphs against its eager block forward over ragged rounds: changing request counts
    (padding), context growth past the pages the pool started with (captured again), truncations."""
    target = frozen_target().to("cuda")
    plain, graphed = _pair(target, v2)
    plain, graphed = plain.to("cuda"), graphed.to("cuda")
    graphed.graphs = DrafterGraphs(graphed, GraphBuckets(requests=(1, 2, 4, 8)))
    n = 0
    for want, got, ids in _drafter_rounds(plain, graphed, random.Random(3), rounds=24):
        torch.testing.assert_close(got.hidden, want.hidden, atol=ATOL, rtol=0)
        assert torch.equal(got.tokens, want.tokens)
        for rid in ids:
            for a, b in zip(graphed.contexts.context_kv(rid), plain.contexts.context_kv(rid), strict=True):
                torch.testing.assert_close(a, b, atol=ATOL, rtol=0)
        n += 1
    stats = graphed.graphs.stats
    assert stats.replays == n and stats.captures >= 2 and stats.disabled is None


@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize("case", ["markov", "copy head, greedy table", "no markov head"])
def test_captured_heads_equal_the_plain_ones(case, temperature):
    """The sampling and confidence graphs against the eager steps over rounds of changing request counts; at
    T = 1 every round draws with a new offset, which only the refilled device counter gives a replay."""
    target = frozen_target().to("cuda")
    plain, graphed = _heads_pair(target, **HEAD_CASES[case])
    plain, graphed = plain.to("cuda"), graphed.to("cuda")
    graphed.graphs = DrafterGraphs(graphed, GraphBuckets(requests=(1, 2, 4, 8)))
    for want, got in _heads_rounds(plain, graphed, temperature):
        _assert_same_draft(want, got)
    stats = graphed.graphs.heads.stats
    assert stats.disabled is None and stats.captures >= 2 and stats.replays == 16 and not stats.eager, stats


def test_captured_draws_follow_the_draft_vocabulary_tables():
    """An eager round past the largest bucket grows (reallocates) the draft vocabulary's Markov tables that the
    captured draws read: the graphs are captured again, and later replays still equal the eager steps."""
    target = frozen_target().to("cuda")
    plain, graphed = _heads_pair(target, draft_vocab=True)
    plain, graphed = plain.to("cuda"), graphed.to("cuda")
    graphed.graphs = DrafterGraphs(graphed, GraphBuckets(requests=(1, 2, 4)))
    heads = graphed.graphs.heads
    ids = list(range(9))
    feats = [torch.randn(3, plain.config.num_taps * plain.config.hidden_size) for _ in ids]
    for d in (plain, graphed):
        d.append_context(ids, feats)
    anchors = torch.arange(9)

    def draft(n: int, offset: int) -> None:
        _assert_same_draft(*(d.draft(ids[:n], anchors[:n], 1.0, 5, offset) for d in (plain, graphed)))

    draft(2, 1)
    key = graphed._vocab_tables().buffers_key
    captures = heads.stats.captures
    draft(9, 2)  # eager: grows the tables past the reserved 4 spare rows
    assert graphed._vocab_tables().buffers_key != key and heads.stats.eager.get("too large") == 2
    draft(2, 3)
    assert heads.stats.captures > captures  # captured again on the new tables
