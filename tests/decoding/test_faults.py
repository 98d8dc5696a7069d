# SPDX-License-Identifier: Apache-2.0
"""Faults and bad input: KV pressure, overlapping calls, failed constructors, NaN rows, late errors.

Every case of docs/decoder.md's "Faults and bad input" table has a test here (the soak test mixes them).
"""

import numpy as np
import pytest
import torch

from dspark import DSparkDecoder
from dspark.kv import KVPoolExhausted
from tests.decoding.test_decoder import SPS, hf_greedy
from tests.decoding.toy_models import markov_chain_target, markov_drafter, random_drafter, tiny_target


def small_pair(vocab=6, seed=0):
    target = tiny_target("llama", vocab=vocab, seed=seed)
    return target, random_drafter(target, block_size=3)


def solo(target, prompts, n):
    return [hf_greedy(target, p, n) for p in prompts]


def check_empty(dec):
    pool = dec.adapter.pool
    pool.check()
    assert pool.used_pages == 0 and pool.requests == []
    assert dec.drafter is None or dec.drafter.contexts.requests == []


# ---------------------------------------------------------------------------------------------- KV pressure
@pytest.mark.parametrize(
    "pages,prompts,n",
    [
        (3, [[1] * 20, [2] * 20], 20),  # the joint prefill does not fit; each request alone does
        (4, [[1] * 10, [2] * 10], 40),  # running requests outgrow the pool: the newest is preempted
        (6, [[k] * 20 for k in range(3)], 20),  # a preempted request was once registered twice
        (12, [[k] * 20 for k in range(5)], 20),
    ],
)
def test_requests_share_a_small_pool_and_finish_exactly(pages, prompts, n):
    target, drafter = small_pair()
    want = solo(target, prompts, n)
    dec = DSparkDecoder(target, drafter, max_kv_pages=pages, max_batch_size=8)
    try:
        out = dec.generate(prompts, max_new_tokens=n, eos_token_id=[])
        assert out.sequences == want
        check_empty(dec)
    finally:
        dec.close()


def test_a_request_that_never_fits_fails_alone_and_the_others_finish():
    target, drafter = small_pair()
    prompts = [[1] * 10, [2] * 46, [3] * 8]  # the second needs 4 pages of 16 for prefill + a round; 3 exist
    want = solo(target, [prompts[0], prompts[2]], 12)
    dec = DSparkDecoder(target, drafter, max_kv_pages=3)
    try:
        with pytest.raises(KVPoolExhausted, match=r"prompts\[1\].*max_kv_pages") as e:
            dec.generate(prompts, max_new_tokens=12, eos_token_id=[])
        out = e.value.output
        assert out.finish_reasons == ["length", "error", "length"]
        assert [out.sequences[0], out.sequences[2]] == want and out.sequences[1] == []
        check_empty(dec)
        assert dec.generate([prompts[0]], max_new_tokens=12, eos_token_id=[]).sequences == [want[0]]
    finally:
        dec.close()


def test_a_request_that_outgrows_the_whole_pool_fails_and_the_others_finish():
    target, drafter = small_pair()
    prompts = [[1] * 8, [2] * 30]  # the second reaches 48 tokens + a round: more than 3 pages
    want = hf_greedy(target, prompts[0], 20)
    dec = DSparkDecoder(target, drafter, max_kv_pages=3, max_batch_size=1)
    try:
        with pytest.raises(KVPoolExhausted, match=r"prompts\[1\]"):
            dec.generate(prompts, max_new_tokens=20, eos_token_id=[])
    finally:
        dec.close()
    dec = DSparkDecoder(target, drafter, max_kv_pages=3, max_batch_size=1)
    try:
        events = []
        with pytest.raises(KVPoolExhausted):
            for ev in dec.generate(prompts, max_new_tokens=20, eos_token_id=[], stream=True):
                events.append(ev)
        first = [t for ev in events if ev.index == 0 for t in ev.tokens]
        assert first == want
        assert [ev.finish_reason for ev in events if ev.finished] == ["length", "error"]
        check_empty(dec)
    finally:
        dec.close()


# ---------------------------------------------------------------------------------------------- streams
def test_a_call_while_a_stream_is_open_fails_and_leaves_the_stream_intact():
    target, drafter = small_pair(vocab=32)
    p = [[3, 1, 4, 1, 5], [9, 2, 6]]
    want = solo(target, p, 10)
    dec = DSparkDecoder(target, drafter)
    try:
        it = dec.generate(p, max_new_tokens=10, eos_token_id=[], stream=True)
        other = dec.generate(p, max_new_tokens=10, stream=True)  # a stream starts work at its first next()
        got = [[], []]
        ev = next(it)
        got[ev.index] += ev.tokens
        with pytest.raises(RuntimeError, match="stream .* still open"):
            dec.generate(p, max_new_tokens=10)
        with pytest.raises(RuntimeError, match="still open"):
            dec.generate(p, max_new_tokens=10, stream=True)
        with pytest.raises(RuntimeError, match="still open"):
            next(other)
        for ev in it:
            got[ev.index] += ev.tokens
        assert got == want
        check_empty(dec)
        # an abandoned stream frees everything once closed (or dropped), and the next call works
        it = dec.generate(p, max_new_tokens=10, eos_token_id=[], stream=True)
        next(it)
        it.close()
        check_empty(dec)
        assert dec.generate(p, max_new_tokens=10, eos_token_id=[]).sequences == want
    finally:
        dec.close()


# ---------------------------------------------------------------------------------------------- constructor
def test_a_failed_constructor_leaves_the_target_as_it_was():
    target, drafter = small_pair()
    ids = torch.tensor([[1, 2, 3]])
    before = target(ids).logits
    impl = target.config._attn_implementation
    for kwargs in (
        dict(sts=[1.0]),
        dict(max_batch_size=0),
        dict(page_size=0),
        dict(block_size=9),
        dict(max_kv_pages=2.5),
        dict(planner="nope"),
    ):
        with pytest.raises(ValueError):
            DSparkDecoder(target, drafter, **kwargs)
        assert target.config._attn_implementation == impl
        torch.testing.assert_close(target(ids).logits, before)
    # two decoders on one target: the target gets its own attention back once both are closed
    a, b = DSparkDecoder(target, drafter), DSparkDecoder(target, drafter)
    a.close()
    assert len(b.generate([[1, 2, 3]], max_new_tokens=4).sequences[0]) == 4
    b.close()
    b.close()
    assert target.config._attn_implementation == impl
    torch.testing.assert_close(target(ids).logits, before)


# ---------------------------------------------------------------------------------------------- NaN rows
def _chain_with_nan_row(V=6, bad=5):
    """A Markov-chain target whose logits are NaN after token ``bad``, which its greedy path never emits."""
    g = torch.Generator().manual_seed(0)
    table = torch.randn(V, V, generator=g)
    table[:, bad] = -20.0  # the target never wants ``bad``
    target = markov_chain_target(table)

    def nan_after_bad(_module, args, out):
        rows = args[0].argmax(-1) == bad  # the final hidden of token i is c * e_i
        out[rows] = float("nan")
        return out

    target.lm_head.register_forward_hook(nan_after_bad)
    drafter_table = table.clone()
    drafter_table[:, bad] = 20.0  # the drafter proposes ``bad`` every time
    return target, table, markov_drafter(target, drafter_table, block_size=3)


def test_nan_rows_after_a_rejection_do_not_fail_the_round():
    target, _, drafter = _chain_with_nan_row()
    prompts = [[0, 1], [2]]
    want = solo(target, prompts, 10)  # plain decoding never reads a NaN row
    seen = []
    dec = DSparkDecoder(target, drafter, planner="full", round_observer=lambda rec: seen.append(rec))
    try:
        out = dec.generate(prompts, max_new_tokens=10, eos_token_id=[])
    finally:
        dec.close()
    assert out.sequences == want
    # the NaN rows were verified (row 1 scores the token after the rejected draft 5) and skipped
    assert any(bool(torch.isnan(rec.target_logits).any()) for rec in seen)


def test_nan_in_a_committed_row_fails_naming_the_stage():
    target, drafter = small_pair(vocab=32)
    dec = DSparkDecoder(target, drafter)
    try:
        handle = target.lm_head.register_forward_hook(lambda m, a, out: out.fill_(float("nan")))
        with pytest.raises(RuntimeError, match="target verify"):
            dec.generate([[1, 2, 3]], max_new_tokens=4)
        handle.remove()
        check_empty(dec)
        w = drafter.norm.weight.data.clone()
        drafter.norm.weight.data.fill_(float("nan"))
        with pytest.raises(RuntimeError, match="^draft: "):
            dec.generate([[1, 2, 3]], max_new_tokens=4)
        drafter.norm.weight.data.copy_(w)
        check_empty(dec)
        assert len(dec.generate([[1, 2, 3]], max_new_tokens=4).sequences[0]) == 4
    finally:
        dec.close()


# ---------------------------------------------------------------------------------------------- bad input
@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(temperature=float("inf")), "temperature: must be finite"),
        (dict(temperature=float("nan")), "temperature: must be finite"),
        (dict(repetition_penalty=float("nan")), "repetition_penalty: must be finite"),
        (dict(repetition_penalty=0.0), "repetition_penalty: must be > 0"),
        (dict(seed=2**63), "seed: must be < 9223372036854775808"),
        (dict(seed=-1), "seed: must be >= 0"),
        (dict(seed=1.5), "seed: must be an integer"),
        (dict(prompts=[[1.0, 2.0]]), r"prompts\[0\]\[0\]: token ids must be integers"),
        (dict(prompts=torch.tensor([[1.0, 2.0]])), r"prompts\[0\]: token ids must be integers"),
        (dict(prompts=[[1, True]]), r"prompts\[0\]\[1\]: token ids must be integers"),
        (dict(prompts=np.array([[1.5, 2.0]])), r"prompts\[0\]\[0\]: token ids must be integers"),
        (dict(top_k=2.5), "top_k: must be an integer"),
        (dict(top_k=-1), "top_k: must be >= 0"),
        (dict(top_p=float("nan")), "top_p: must be finite"),
        (dict(max_new_tokens=3.0), "max_new_tokens: must be an integer"),
        (dict(eos_token_id=1.5), "eos_token_id: must be an integer"),
        (dict(stop=[""]), "stop: stop strings must be non-empty"),
        (dict(prompts=[[1] * 507]), r"\(anchor \+ drafts\) exceed the target's context"),
    ],
)
def test_bad_arguments_fail_before_any_forward(kwargs, match):
    target, drafter = small_pair(vocab=32)
    dec = DSparkDecoder(target, drafter)
    calls = []
    forward = dec.adapter.forward
    dec.adapter.forward = lambda *a, **k: calls.append(1) or forward(*a, **k)
    try:
        args = {"prompts": [[1, 2, 3]], "max_new_tokens": 3, **kwargs}
        with pytest.raises(ValueError, match=match):
            dec.generate(**args)
        assert calls == []
        assert len(dec.generate([[1, 2, 3]], max_new_tokens=3).sequences[0]) == 3
    finally:
        dec.close()


# ---------------------------------------------------------------------------------------------- no drafter
def test_plain_decoding_without_a_drafter():
    target = tiny_target("llama", seed=3)
    prompts = [[5, 6, 7, 8], [9] * 11, [1]]
    want = solo(target, prompts, 9)
    dec = DSparkDecoder(target, None, max_batch_size=2, max_kv_pages=3)
    try:
        assert dec.gamma == 0
        out = dec.generate(prompts, max_new_tokens=9, eos_token_id=[])
        streamed = [[], [], []]
        for ev in dec.generate(prompts, max_new_tokens=9, eos_token_id=[], stream=True):
            streamed[ev.index] += ev.tokens
        check_empty(dec)
    finally:
        dec.close()
    assert out.sequences == want == streamed
    assert out.stats.verified_drafts == 0 and out.stats.rounds > 0
    with pytest.raises(ValueError, match="block_size"):
        DSparkDecoder(target, None, block_size=2)
    with pytest.raises(TypeError, match="drafter"):
        DSparkDecoder(target, "drafter")


def test_sampled_plain_decoding_matches_with_and_without_a_drafter():
    # plain decoding draws each token from p with the same keys whether or not a drafter is loaded
    target, drafter = small_pair(vocab=32)
    outs = []
    for d in (drafter, None):
        dec = DSparkDecoder(target, d)
        try:
            outs.append(
                dec.generate(
                    [[1, 2], [3]], max_new_tokens=8, temperature=1.0, seed=7, speculative=False
                ).sequences
            )
        finally:
            dec.close()
    assert outs[0] == outs[1]


def test_planner_modes_survive_preemption():
    target, drafter = small_pair(vocab=32)
    prompts = [[k % 32] * (12 + 3 * k) for k in range(6)]
    want = solo(target, prompts, 16)
    for mode in ("early_stop", "lagged_topk"):
        dec = DSparkDecoder(target, drafter, planner=mode, sps_table=SPS, max_kv_pages=6, max_batch_size=4)
        try:
            assert dec.generate(prompts, max_new_tokens=16, eos_token_id=[]).sequences == want
            check_empty(dec)
        finally:
            dec.close()
