# SPDX-License-Identifier: Apache-2.0
"""CUDA graphs of the drafter's context append (dspark.models.context_graphs), run padded on any device
(``capture=False``: the graph's body on its static buffers).

Ragged appends of row counts between the buckets, through pool growth, leave every cache — each layer's K and V
and the kept context rows, all slots — as the eager append leaves it; appends past the largest bucket and after
a failed capture run eagerly and are counted. Negative control: padding rows that write the slot after the last
row's touch a slot the eager append does not, and the cache comparison catches it. With a GPU,
tests/decoding/test_decoder_cuda_graphs.py replays the captured graphs in the decoder.
"""

from __future__ import annotations

import random

import pytest
import torch

from dspark.models.context_graphs import ContextGraphs
from dspark.models.target_graphs import GraphBuckets
from tests.models.test_drafter_graphs import _pair as drafter_pair
from tests.training.test_copy_channel import frozen_target

ATOL = 1e-5  # the padded GEMMs have more rows than the eager ones: same products, possibly other blocking
BUCKETS = GraphBuckets(requests=(1, 2, 4), tokens=(1, 2, 4, 8, 16, 64, 128))


@pytest.fixture(scope="module")
def target():
    return frozen_target()


def _pair(target, v2: bool):
    return drafter_pair(target, v2, BUCKETS)


def _append_rounds(plain, graphed, seed: int, rounds: int = 12) -> None:
    """Ragged appends on both drafters: new and continuing requests, 0 to 40 rows each (up to 120 in one
    append, past the initial 16 pages of 16 rows), some contexts truncated (rejected rows) in between."""
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    width = plain.config.num_taps * plain.config.hidden_size
    live = [10, 11]
    for rnd in range(rounds):
        if rng.random() < 0.5:
            live.append(20 + rnd)
        ids = rng.sample(live, rng.randint(1, min(3, len(live))))
        feats = [torch.randn(rng.choice([0, 1, 3, 5, 7, 13, 40]), width, generator=gen) for _ in ids]
        for d in (plain, graphed):
            d.append_context(ids, feats)
        if rng.random() < 0.4:  # a rejection: cut one context back
            rid = rng.choice(ids)
            keep = rng.randint(0, plain.contexts.length(rid))
            for d in (plain, graphed):
                d.contexts.truncate(rid, keep)


def _assert_same_caches(plain, graphed) -> None:
    a, b = plain.contexts, graphed.contexts
    assert a.pool.total_pages == b.pool.total_pages
    for li in range(len(a.k)):
        torch.testing.assert_close(b.k[li], a.k[li], atol=ATOL, rtol=0, msg=f"layer {li} K")
        torch.testing.assert_close(b.v[li], a.v[li], atol=ATOL, rtol=0, msg=f"layer {li} V")
    if a.rows is not None:
        torch.testing.assert_close(b.rows, a.rows, atol=ATOL, rtol=0, msg="context rows")


@pytest.mark.parametrize("v2", [False, True])
def test_padded_appends_leave_the_caches_the_eager_appends_leave(target, v2):
    plain, graphed = _pair(target, v2)
    _append_rounds(plain, graphed, seed=3)
    assert graphed.contexts.pool.total_pages > 16  # the pool grew: the graphs followed the new caches
    _assert_same_caches(plain, graphed)
    stats = graphed.graphs.context.stats
    assert stats.replays > 0
    assert set(stats.eager) <= {"too large"}, stats.eager  # only appends past 128 rows ran eagerly


def test_padding_into_the_next_slot_is_caught(target, monkeypatch):
    """Negative control: padding rows one slot (and position) past the last row's write a slot that the eager
    append leaves at zero."""
    plain, graphed = _pair(target, v2=True)

    def shifted(x, n_b):
        last = x[-1:] + 1 if x.dtype == torch.int64 else x[-1:]
        return torch.cat([x, last.expand(n_b - x.shape[0], *x.shape[1:])])

    monkeypatch.setattr(ContextGraphs, "_padded", staticmethod(shifted))
    _append_rounds(plain, graphed, seed=3)
    with pytest.raises(AssertionError):
        _assert_same_caches(plain, graphed)


def test_large_appends_and_a_failed_capture_run_eagerly(target):
    plain, graphed = _pair(target, v2=False)
    width = plain.config.num_taps * plain.config.hidden_size
    feats = [torch.randn(129, width)]  # past the largest bucket, 128
    for d in (plain, graphed):
        d.append_context([5], feats)
    ctx = graphed.graphs.context
    assert ctx.stats.eager == {"too large": 1} and ctx.stats.replays == 0
    ctx.stats.disabled = "RuntimeError: capture failed"  # as capture_graph leaves it
    feats = [torch.randn(3, width)]
    for d in (plain, graphed):
        d.append_context([5], feats)
    assert ctx.stats.eager["disabled"] == 1 and ctx.stats.replays == 0
    _assert_same_caches(plain, graphed)
