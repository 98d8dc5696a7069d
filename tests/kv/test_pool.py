# SPDX-License-Identifier: Apache-2.0
"""PagePool: exact accounting under random add/grow/truncate/finish sequences, slot mapping, exhaustion."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dspark.kv import KVPoolExhausted, PagePool
from dspark.kv.pool import grow_pages


def _live_slots(pool: PagePool) -> dict[int, tuple]:
    """slot -> (request, token index) for every live token; a slot shared by two tokens fails."""
    owner = {}
    for rid in pool.requests:
        table = pool.block_table(rid)
        for i in range(pool.length(rid)):
            s = table[i // pool.page_size] * pool.page_size + i % pool.page_size
            assert s not in owner, f"slot {s} held by {owner[s]} and {(rid, i)}"
            owner[s] = (rid, i)
    return owner


ops = st.lists(
    st.tuples(
        st.sampled_from(["add", "append", "truncate", "finish"]), st.integers(0, 5), st.integers(0, 40)
    ),
    max_size=60,
)


@settings(max_examples=150, deadline=None)
@given(ops=ops, page_size=st.sampled_from([1, 3, 16]), max_pages=st.sampled_from([None, 4, 12]))
def test_accounting_is_exact_under_any_sequence(ops, page_size, max_pages):
    pool = PagePool(page_size, num_pages=max_pages or 2, max_pages=max_pages)
    lengths: dict[int, int] = {}
    for op, rid, n in ops:
        if op == "add" and rid not in lengths:
            pool.add_request(rid)
            lengths[rid] = 0
        elif op == "append" and rid in lengths:
            before = (pool.free_pages, {r: pool.block_table(r) for r in lengths})
            try:
                slots = pool.append_slots(rid, n)
            except KVPoolExhausted:
                # nothing changed, for this request or any other
                assert (pool.free_pages, {r: pool.block_table(r) for r in lengths}) == before
                assert (
                    max_pages is not None
                    and pool.pages_needed(lengths[rid] + n) - len(before[1][rid]) > before[0]
                )
            else:
                table = pool.block_table(rid)
                expect = [
                    table[i // page_size] * page_size + i % page_size
                    for i in range(lengths[rid], lengths[rid] + n)
                ]
                assert slots.tolist() == expect and slots.dtype == torch.int64
                lengths[rid] += n
        elif op == "truncate" and rid in lengths:
            keep = min(n, lengths[rid])
            kept_table = pool.block_table(rid)[: pool.pages_needed(keep)]
            pool.truncate(rid, keep)
            assert pool.block_table(rid) == kept_table  # no copy: kept tokens stay in place
            lengths[rid] = keep
        elif op == "finish" and rid in lengths:
            pool.finish(rid)
            del lengths[rid]
            assert rid not in pool
        pool.check()
        assert pool.free_pages + pool.used_pages == pool.total_pages
        assert {r: pool.length(r) for r in pool.requests} == lengths
        if max_pages is not None:
            assert pool.total_pages == max_pages
        _live_slots(pool)
    for rid in list(lengths):
        pool.finish(rid)
    assert pool.used_pages == 0 and pool.free_pages == pool.total_pages


def test_batch_index_layout():
    pool = PagePool(page_size=4, num_pages=10, max_pages=10)
    for rid, n in (("a", 6), ("b", 0), ("c", 8)):
        pool.add_request(rid)
        pool.append_slots(rid, n)
    ix = pool.batch_index(["c", "a", "b"])
    assert ix.kv_indptr.tolist() == [0, 2, 4, 4]
    assert ix.kv_indices.tolist() == pool.block_table("c") + pool.block_table("a")
    assert ix.kv_last_page_len.tolist() == [4, 2, 0]
    assert ix.kv_indptr.dtype == ix.kv_indices.dtype == ix.kv_last_page_len.dtype == torch.int32


def test_exhaustion_message_and_growth():
    pool = PagePool(page_size=2, num_pages=3, max_pages=3)
    pool.add_request(0)
    pool.add_request(1)
    pool.append_slots(0, 4)
    with pytest.raises(KVPoolExhausted, match="request 1 needs 2 more page"):
        pool.append_slots(1, 3)
    assert pool.length(1) == 0 and pool.free_pages == 1
    grow = PagePool(page_size=2, num_pages=1)
    grow.add_request("x")
    grow.append_slots("x", 9)
    assert grow.total_pages >= 5 and grow.used_pages == 5
    grow.check()


def test_errors():
    pool = PagePool(page_size=4, num_pages=2)
    pool.add_request("a")
    with pytest.raises(ValueError, match="already exists"):
        pool.add_request("a")
    with pytest.raises(KeyError, match="unknown request 'z'"):
        pool.append_slots("z", 1)
    with pytest.raises(ValueError, match="outside"):
        pool.truncate("a", 1)
    with pytest.raises(ValueError, match="page_size"):
        PagePool(page_size=0)


def test_slot_of_is_the_slot_append_handed_out():
    pool = PagePool(page_size=4, num_pages=2)
    pool.add_request("a")
    pool.add_request("b")
    slots = {"a": pool.append_slots("a", 3).tolist(), "b": pool.append_slots("b", 6).tolist()}
    slots["a"] += pool.append_slots("a", 7).tolist()  # grows the pool; pages interleave with b's
    for rid, want in slots.items():
        assert [pool.slot_of(rid, i) for i in range(len(want))] == want


def test_grow_pages_keeps_the_old_pages_and_zeroes_the_new():
    cache = torch.arange(2 * 3 * 2, dtype=torch.float32).view(2, 3, 2)
    grown = grow_pages(cache, 5)
    assert grown.shape == (5, 3, 2) and torch.equal(grown[:2], cache) and not grown[2:].any()
    assert grow_pages(cache, 2) is cache and grow_pages(cache, 1) is cache
