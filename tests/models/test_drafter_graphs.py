# SPDX-License-Identifier: Apache-2.0
"""CUDA graphs of the drafter's block forward (dspark.models.drafter_graphs) and the paged contexts under them.

On any device: the padded block forward (``capture=False``: the graph's body run eagerly on the static buffers)
against the plain one over rounds of changing request counts and context lengths, with the v2 inputs (copy
channel, context projection); the padding writes nothing into the contexts; requests past the largest bucket
run eagerly. A layout whose padding blocks write real slots is a negative control: the context check catches it.
With a GPU, tests/decoding/test_decoder_cuda_graphs.py replays the captured graphs in the decoder.
"""

from __future__ import annotations

import copy
import random

import pytest
import torch

from dspark.models import block_batch
from dspark.models.block_batch import BlockLayout
from dspark.models.drafter_graphs import DrafterGraphs
from dspark.models.target_graphs import GraphBuckets
from tests.training.test_copy_channel import V2, _drafter, _perturb_inputs, frozen_target

ATOL = 1e-5
BUCKETS = GraphBuckets(requests=(1, 2, 4, 8))


@pytest.fixture(scope="module")
def target():
    return frozen_target()


def _pair(target, v2: bool, buckets: GraphBuckets = BUCKETS):
    """A drafter (with the v2 inputs perturbed, or DeepSpec's) and a copy whose graphs run padded."""
    d = _drafter(target, **V2) if v2 else _drafter(target)
    if v2:
        _perturb_inputs(d)
    graphed = copy.deepcopy(d)
    graphed.graphs = DrafterGraphs(graphed, buckets, capture=False)
    return d, graphed


def _rounds(plain, graphed, rng: random.Random, rounds: int = 10):
    """Ragged rounds on both drafters: append context rows, draft a random subset of requests, truncate some
    (rejections). Yields (plain draft, graphed draft, request ids)."""
    c = plain.config
    width, V = c.num_taps * c.hidden_size, c.vocab_size
    gen = torch.Generator().manual_seed(rng.randrange(1 << 30))
    live: list[int] = [90, 91]
    for rnd in range(rounds):
        if len(live) < 10 and rng.random() < 0.6:
            live.append(100 + rnd)
        ids = rng.sample(live, rng.randint(1, len(live)))
        feats = [torch.randn(rng.randint(0, 9), width, generator=gen) for _ in ids]
        for d in (plain, graphed):
            d.append_context(ids, feats)
        anchors = torch.randint(0, V, (len(ids),), generator=gen)
        conts = [[rng.randrange(V) for _ in range(rng.randint(0, c.block_size))] for _ in ids]
        kw = {}
        if c.uses_copies:
            kw = dict(copy_continuations=conts, copy_matches=[rng.randint(1, 3) if t else 0 for t in conts])
        outs = [d.draft(ids, anchors, return_base_logits=True, **kw) for d in (plain, graphed)]
        yield outs[0], outs[1], ids
        for rid in ids:
            n = plain.context_length(rid)
            if n > 3 and rng.random() < 0.3:
                keep = n - rng.randint(1, 3)
                for d in (plain, graphed):
                    d.truncate(rid, keep)


@pytest.mark.parametrize("v2", [False, True])
def test_padded_block_forward_equals_the_plain_one(target, v2):
    plain, graphed = _pair(target, v2)
    n = 0
    for want, got, ids in _rounds(plain, graphed, random.Random(int(v2))):
        torch.testing.assert_close(got.hidden, want.hidden, atol=ATOL, rtol=0)
        torch.testing.assert_close(got.base_logits, want.base_logits, atol=ATOL, rtol=0)
        assert torch.equal(got.tokens, want.tokens)
        for rid in ids:  # the padding wrote nothing into any context, and every block was dropped
            assert graphed.context_length(rid) == plain.context_length(rid)
            for a, b in zip(graphed.contexts.context_kv(rid), plain.contexts.context_kv(rid), strict=True):
                torch.testing.assert_close(a, b, atol=ATOL, rtol=0)
        graphed.contexts.pool.check()
        n += 1
    stats = graphed.graphs.stats
    assert stats.replays == n and stats.captures == 0 and stats.eager == {}


def test_more_requests_than_the_largest_bucket_run_eagerly(target):
    plain, graphed = _pair(target, False)
    graphed.graphs = DrafterGraphs(graphed, GraphBuckets(requests=(1, 2)), capture=False)
    width = plain.config.num_taps * plain.config.hidden_size
    feats = [torch.randn(5, width) for _ in range(3)]
    for d in (plain, graphed):
        d.append_context([1, 2, 3], feats)
    anchors = torch.tensor([3, 4, 5])
    want, got = plain.draft([1, 2, 3], anchors), graphed.draft([1, 2, 3], anchors)
    torch.testing.assert_close(got.hidden, want.hidden, atol=ATOL, rtol=0)
    assert graphed.graphs.stats.eager == {"too large": 1} and graphed.graphs.stats.replays == 0
    graphed.draft([1, 2], anchors[:2])
    assert graphed.graphs.stats.replays == 1


def test_padding_that_writes_real_slots_is_caught(target, monkeypatch):
    """Negative control: padding blocks whose scratch rows go to slot 0 (a real request's first row) instead of
    -1 corrupt that context, and the check of the first test sees it."""
    plain, graphed = _pair(target, False)
    real = BlockLayout.padded

    def leaky(self, num_blocks):
        out = real(self, num_blocks)
        rows = (num_blocks - self.num_blocks) * self.slots_per_block
        out.slot_mapping = self.slot_mapping + [0] * rows
        return out

    monkeypatch.setattr(block_batch.BlockLayout, "padded", leaky)
    width = plain.config.num_taps * plain.config.hidden_size
    feats = [torch.randn(6, width) for _ in range(3)]
    for d in (plain, graphed):
        d.append_context([1, 2, 3], feats)
    anchors = torch.tensor([3, 4, 5])
    plain.draft([1, 2, 3], anchors)
    graphed.draft([1, 2, 3], anchors)  # 3 requests padded to 4
    differs = [
        not torch.allclose(a, b, atol=ATOL)
        for rid in (1, 2, 3)
        for a, b in zip(graphed.contexts.context_kv(rid), plain.contexts.context_kv(rid), strict=True)
    ]
    assert any(differs)


def test_layout_padding_adds_blocks_without_pages():
    layout = BlockLayout(2, [5, 6, 0, 1], [84, 85, 3, 4], [0, 2, 3], [5, 6, 0], [6, 2], [83, -1])
    padded = layout.padded(4)
    assert padded.num_blocks == 4 and padded.qo_indptr() == [0, 2, 4, 6, 8]
    assert padded.slot_mapping == [84, 85, 3, 4, -1, -1, -1, -1]  # -1: never written
    assert padded.kv_indptr == [0, 2, 3, 3, 3] and padded.kv_last_page_len == [6, 2, 0, 0]
    assert padded.kv_indices == [5, 6, 0] and padded.last_slots == [83, -1, -1, -1]
    assert padded.positions == [5, 6, 0, 1, 0, 0, 0, 0]


def test_graphs_need_a_cuda_drafter(target):
    with pytest.raises(ValueError, match="CUDA device"):
        DrafterGraphs(_drafter(target), BUCKETS)
