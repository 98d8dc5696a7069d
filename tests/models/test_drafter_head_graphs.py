# SPDX-License-Identifier: Apache-2.0
"""CUDA graphs of a draft round's heads (dspark.models.drafter_head_graphs): the LM head with the Markov draw, and
the confidence head.

On any device: the padded steps (``capture=False``: the graphs' bodies run eagerly on the static buffers) against
the plain ones over rounds of changing request counts, at T = 1 with a new Philox offset every round (read from
the device counter), greedy with a copy head's greedy table, over a draft vocabulary and without a Markov head.
Each test checks that the graphs' path ran (a silent eager fallback would pass every comparison). A counter
that is not refilled — the captured round's offset replayed — is a negative control that must be caught. With a
GPU, tests/decoding/test_decoder_cuda_graphs.py replays the captured graphs in the decoder.
"""

from __future__ import annotations

import copy
import random

import pytest
import torch

from dspark.models.drafter import DSparkDrafter
from dspark.models.drafter_graphs import DrafterGraphs
from dspark.models.drafter_head_graphs import DraftHeadGraphs
from dspark.models.target_graphs import GraphBuckets
from tests.training.test_copy_channel import frozen_target

ATOL = 1e-5
BUCKETS = GraphBuckets(requests=(1, 2, 4, 8))
STS = (torch.linspace(0.8, 1.4, 5), torch.linspace(-0.2, 0.3, 5))  # affine STS of the 5 slots


@pytest.fixture(scope="module")
def target():
    return frozen_target()


def _pair(target, draft_vocab: bool = False, markov_rank: int = 8, **config):
    torch.manual_seed(1)
    L = target.config.num_hidden_layers
    d = DSparkDrafter.from_config(
        target,
        block_size=5,
        num_layers=1,
        target_layer_ids=[0, L - 2],
        markov_rank=markov_rank,
        initializer_range=0.2,
        enable_confidence_head=True,
        **config,
    ).eval()
    if draft_vocab:
        d.set_draft_vocab(list(range(0, target.config.vocab_size, 2)))
    if d.copy_head is not None:
        g = torch.Generator().manual_seed(3)
        with torch.no_grad():  # bonuses large enough to move drafts
            for w in d.copy_head.parameters():
                w.copy_(3 * torch.randn(w.shape, generator=g))
    graphed = copy.deepcopy(d)
    graphed.graphs = DrafterGraphs(graphed, BUCKETS, capture=False)
    return d, graphed


def _rounds(plain, graphed, temperature: float, rounds: int = 8, seed: int = 0):
    """Rounds of 1-7 requests at offsets 1, 4, 7, ...; yields (plain draft, graphed draft)."""
    c = plain.config
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    width, V = c.num_taps * c.hidden_size, c.vocab_size
    live = list(range(40, 47))
    for rnd in range(rounds):
        ids = rng.sample(live, rng.randint(1, len(live)))
        feats = [torch.randn(rng.randint(1, 6), width, generator=gen) for _ in ids]
        for d in (plain, graphed):
            d.append_context(ids, feats)
        anchors = torch.randint(0, V, (len(ids),), generator=gen)
        kw = {}
        if c.uses_copies:
            conts = [[rng.randrange(V) for _ in range(rng.randint(0, c.block_size))] for _ in ids]
            kw = dict(copy_continuations=conts, copy_matches=[rng.randint(1, 3) if t else 0 for t in conts])
        outs = [
            d.draft(ids, anchors, temperature, 11, 3 * rnd + 1, STS[0], sts_bias=STS[1], **kw)
            for d in (plain, graphed)
        ]
        yield outs[0], outs[1]


def _assert_same(want, got) -> None:
    assert torch.equal(got.tokens, want.tokens)
    torch.testing.assert_close(got.draft_logits, want.draft_logits, atol=ATOL, rtol=0)
    torch.testing.assert_close(got.prev_emb, want.prev_emb, atol=ATOL, rtol=0)
    for name in ("conf_logit", "conf", "survival"):
        torch.testing.assert_close(getattr(got, name), getattr(want, name), atol=ATOL, rtol=0)


CASES = {
    "markov": dict(),
    "copy head, greedy table": dict(copy_head=True, copy_extent_bounds=[5], copy_greedy_bias=True),
    "draft vocabulary": dict(draft_vocab=True),
    "copy head over a draft vocabulary": dict(copy_head=True, copy_greedy_bias=True, draft_vocab=True),
    "no markov head": dict(markov_rank=0),
}


@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize("case", list(CASES))
def test_padded_heads_equal_the_plain_ones(target, case, temperature):
    plain, graphed = _pair(target, **CASES[case])
    heads = graphed.graphs.heads
    for want, got in _rounds(plain, graphed, temperature):
        _assert_same(want, got)
    assert heads.stats.replays == 2 * 8 and not heads.stats.eager, heads.stats  # every round took the graphs


def test_a_counter_not_refilled_is_caught(target, monkeypatch):
    """Negative control: replaying the first round's offset (what an int offset baked into a captured launch
    would do) draws other tokens than the plain drafter at T = 1."""
    plain, graphed = _pair(target)
    monkeypatch.setattr(DraftHeadGraphs, "_refill_counter", lambda self, offset: None)
    differ = [not torch.equal(w.tokens, g.tokens) for w, g in _rounds(plain, graphed, 1.0)]
    assert sum(differ) >= 4, differ


def test_what_runs_eagerly(target):
    plain, graphed = _pair(target, markov_head_type="gated")
    heads = graphed.graphs.heads
    for want, got in _rounds(plain, graphed, 1.0, rounds=2):
        _assert_same(want, got)
    assert heads.stats.eager == {"markov head": 2}  # sampling eager; confidence still replayed
    assert heads.stats.replays == 2
    plain, graphed = _pair(target)
    ids, anchors = list(range(9)), torch.arange(9)
    feats = [torch.randn(2, plain.config.num_taps * plain.config.hidden_size) for _ in ids]
    for d in (plain, graphed):
        d.append_context(ids, feats)
    t = torch.ones(9)
    _assert_same(*(d.draft(ids, anchors, t, 5, 2) for d in (plain, graphed)))  # past the largest bucket
    assert graphed.graphs.heads.stats.eager == {"too large": 2}
    _assert_same(*(d.draft(ids[:3], anchors[:3], t[:3], 5, 2) for d in (plain, graphed)))
    assert graphed.graphs.heads.stats.eager == {"too large": 2, "tensor argument": 1}


def test_defers_the_lm_head_only_while_the_graphs_run(target):
    _, graphed = _pair(target)
    h = torch.zeros(2, 3, graphed.config.hidden_size)
    assert graphed.defers_lm_head(h)
    graphed.graphs.heads.stats.disabled = "a failed capture"
    assert not graphed.defers_lm_head(h)
