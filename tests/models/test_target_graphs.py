# SPDX-License-Identifier: Apache-2.0
"""CUDA graphs of the target adapter (dspark.models.target_graphs).

On any device: the buckets, the padding of a batch to its bucket, and the padded forward itself (run eagerly,
``capture=False``) against the adapter's plain forward over ragged, truncated rounds — the real rows' logits and
hidden states agree and the padding writes nothing into the KV cache. With a GPU: the captured graphs replay
the same forwards (greedy decoding equal to eager, after cache growth, evictions and preemption).
"""

from __future__ import annotations

import copy
import random

import pytest
import torch

from dspark.models import target_graphs
from dspark.models.target import TargetAdapter
from dspark.models.target_graphs import GraphBuckets, TargetGraphs, padded_batch
from tests.models.tiny import tiny_model

ATOL = 1e-4


def test_bucket_key_is_the_first_bucket_at_least_the_size():
    b = GraphBuckets(requests=(1, 2, 4), tokens=(4, 16, 64))
    assert b.key(1, 1) == (1, 4)
    assert b.key(3, 5) == (4, 16)
    assert b.key(4, 64) == (4, 64)
    assert b.key(5, 8) is None  # more requests than the largest bucket
    assert b.key(2, 65) is None


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"requests": ()}, "requests"),
        ({"requests": (2, 1)}, "requests"),
        ({"tokens": (0, 4)}, "tokens"),
        ({"tokens": [1, 2]}, "tokens"),
        ({"max_graphs": 0}, "max_graphs"),
        ({"max_graphs": True}, "max_graphs"),
    ],
)
def test_bad_buckets_name_the_field(kwargs, field):
    with pytest.raises(ValueError, match=f"GraphBuckets.{field}"):
        GraphBuckets(**kwargs)


def test_padded_batch_adds_empty_requests_and_a_sink_for_the_padding_rows():
    # two requests: 2 rows over pages [3, 5] (20 tokens, 4 in the last page), 1 row over page [7] (9 tokens)
    padded = padded_batch((4, 8), [0, 2, 3], ([0, 2, 3], [3, 5, 7], [4, 9]), [84, 85, 120])
    assert padded.qo_indptr == [0, 2, 3, 3, 3, 8]  # requests 2, 3 empty; the sink holds rows 3..7
    assert padded.kv_indptr == [0, 2, 3, 3, 3, 3]  # padding requests and the sink own no page
    assert padded.kv_last_page_len == [4, 9, 0, 0, 0]
    assert padded.kv_indices == [3, 5, 7]
    assert padded.slot_mapping == [84, 85, 120, -1, -1, -1, -1, -1]  # -1: never written
    with pytest.raises(ValueError, match="does not fit the bucket"):
        padded_batch((1, 8), [0, 2, 3], ([0, 2, 3], [3, 5, 7], [4, 9]), [84, 85, 120])


def _eager_and_padded(model, buckets, page_size=4, num_pages=64):
    plain = TargetAdapter(copy.deepcopy(model), page_size=page_size, num_pages=num_pages)
    padded = TargetAdapter(copy.deepcopy(model), page_size=page_size, num_pages=num_pages)
    padded.graphs = TargetGraphs(padded, buckets, capture=False)
    return plain, padded


def _ragged_rounds(plain, padded, rng, vocab, rounds=6, layers=(0, 2)):
    """Prefill three requests, then verify rounds of 1-5 rows each with random rejections, on both adapters."""
    lengths = {}
    for rid in range(3):
        prompt = [rng.randrange(vocab) for _ in range(rng.randint(3, 9))]
        for a in (plain, padded):
            a.add_request(rid)
            a.forward([(rid, prompt, "last")])
        lengths[rid] = len(prompt)
    outs = []
    for _ in range(rounds):
        batch = [(rid, [rng.randrange(vocab) for _ in range(rng.randint(1, 5))], "all") for rid in range(3)]
        got = [a.forward(batch, layers=list(layers)) for a in (plain, padded)]
        outs.append(got)
        for rid, toks, _ in batch:  # keep a random prefix of the block: rejected rows are rewritten later
            lengths[rid] += rng.randint(1, len(toks))
            for a in (plain, padded):
                a.truncate(rid, lengths[rid])
    return outs


def test_padded_forward_equals_the_plain_forward_and_writes_only_real_slots():
    model = tiny_model("llama", seed=3)
    plain, padded = _eager_and_padded(model, GraphBuckets(requests=(4,), tokens=(8, 16)))
    rng = random.Random(0)
    outs = _ragged_rounds(plain, padded, rng, model.config.vocab_size)
    for want, got in outs:
        assert got.logits.shape == want.logits.shape
        torch.testing.assert_close(got.logits, want.logits, atol=ATOL, rtol=0)
        assert got.qo_indptr == want.qo_indptr and got.logits_indptr == want.logits_indptr
        for layer in (0, 2):
            torch.testing.assert_close(got.hidden[layer], want.hidden[layer], atol=ATOL, rtol=0)
    assert padded.graph_stats.replays == len(outs) and padded.graph_stats.eager == {"prefill": 3}
    # the padding rows' K/V went nowhere: the caches agree everywhere, unused pages included
    for kp, kg in zip(plain.k_cache + plain.v_cache, padded.k_cache + padded.v_cache, strict=True):
        torch.testing.assert_close(kg, kp, atol=ATOL, rtol=0)


def test_padding_rows_that_write_the_cache_are_caught(monkeypatch):
    """Negative control: padding rows given a real slot corrupt the cache, and the comparison sees it."""
    real = target_graphs.padded_batch

    def leaky(key, qo, index, slots):
        p = real(key, qo, index, slots)
        p.slot_mapping = [s if s >= 0 else 0 for s in p.slot_mapping]  # slot 0: page 0, row 0
        return p

    monkeypatch.setattr(target_graphs, "padded_batch", leaky)
    model = tiny_model("llama", seed=3)
    plain, padded = _eager_and_padded(model, GraphBuckets(requests=(4,), tokens=(8, 16)))
    _ragged_rounds(plain, padded, random.Random(0), model.config.vocab_size, rounds=2)
    with pytest.raises(AssertionError):
        torch.testing.assert_close(padded.k_cache[0], plain.k_cache[0], atol=ATOL, rtol=0)


def _two_prefilled(model, buckets, prompt):
    """Both adapters with requests 0 and 1 prefilled with ``prompt``."""
    plain, padded = _eager_and_padded(model, buckets)
    for a in (plain, padded):
        for rid in (0, 1):
            a.add_request(rid)
            a.forward([(rid, prompt, "last")])
    return plain, padded


def test_batches_past_the_buckets_run_eagerly():
    model = tiny_model("llama", seed=1)
    plain, padded = _two_prefilled(model, GraphBuckets(requests=(1,), tokens=(2,)), [1, 2, 3])
    two = [(0, [4], "all"), (1, [5], "all")]  # 2 requests: past the request buckets
    long = [(0, [6, 7, 8], "all")]  # 3 tokens: past the token buckets
    for batch in (two, long):
        want, got = plain.forward(batch), padded.forward(batch)
        torch.testing.assert_close(got.logits, want.logits, atol=ATOL, rtol=0)
    assert padded.graph_stats.eager == {"prefill": 2, "too large": 2} and padded.graph_stats.replays == 0


def test_logit_rows_other_than_all_are_picked_after_the_forward():
    model = tiny_model("llama", seed=2)
    plain, padded = _two_prefilled(model, GraphBuckets(requests=(2,), tokens=(8,)), [1, 2, 3, 4, 5])
    batch = [(0, [6, 7, 8], [0, 2]), (1, [9, 10], "last")]
    want, got = plain.forward(batch), padded.forward(batch)
    assert got.logits.shape[0] == 3 and got.logits_indptr == want.logits_indptr
    torch.testing.assert_close(got.logits, want.logits, atol=ATOL, rtol=0)


def test_cuda_graphs_need_a_cuda_model_and_leave_a_refused_model_untouched():
    model = tiny_model("llama", seed=0)
    before = model.config._attn_implementation
    with pytest.raises(ValueError, match="cuda_graphs: needs a model on a CUDA device"):
        TargetAdapter(model, cuda_graphs=True)
    with pytest.raises(ValueError, match="cuda_graphs: expected a bool or a GraphBuckets"):
        TargetAdapter(model, cuda_graphs="yes")
    assert model.config._attn_implementation == before
    assert not hasattr(model, "_dspark_attention_users")
    assert TargetAdapter(model).graph_stats is None  # off by default
