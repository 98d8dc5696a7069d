# SPDX-License-Identifier: Apache-2.0
"""DSparkDecoder: greedy output equals the target's own greedy decoding; state after rejections; errors."""

import copy

import pytest
import torch

from dspark import DSparkDecoder, DSparkDrafter, SpsTable
from tests.decoding.toy_models import markov_chain_target, markov_drafter, random_drafter, tiny_target

MODES = ["full", "threshold", "early_stop", "lagged_topk"]
# a cost curve under which the planner verifies some drafts but not all
SPS = SpsTable((1, 2, 4, 8, 16, 32), (100.0, 97.0, 90.0, 75.0, 50.0, 30.0), 64)


def prompts_of(lengths, vocab, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab, (n,), generator=g).tolist() for n in lengths]


def hf_greedy(model, prompt, n, eos=None):
    ids = torch.tensor([prompt], device=model.device)
    out = model.generate(
        ids,
        attention_mask=torch.ones_like(ids),
        do_sample=False,
        max_new_tokens=n,
        eos_token_id=eos,
        pad_token_id=0,
    )
    return out[0, len(prompt) :].tolist()


GREEDY_CASES = [("llama", b, m) for b in (1, 4, 8) for m in MODES] + [
    ("qwen3", b, m) for b in (1, 8) for m in MODES
]


@pytest.mark.parametrize("family,batch,mode", GREEDY_CASES)
def test_greedy_equals_target_greedy(family, batch, mode):
    target = tiny_target(family, seed=batch)
    drafter = random_drafter(target)
    lengths = [3, 17, 5, 30, 9, 1, 22, 12][:batch]
    prompts = prompts_of(lengths, 96, seed=batch)
    want = [hf_greedy(target, p, 12) for p in prompts]
    dec = DSparkDecoder(target, drafter, planner=mode, sps_table=SPS, threshold=0.3, max_batch_size=3)
    try:
        out = dec.generate(prompts, max_new_tokens=12, temperature=0.0, eos_token_id=[])
    finally:
        dec.close()
    assert out.sequences == want
    assert out.finish_reasons == ["length"] * batch
    assert out.stats.request_rounds > 0 and out.stats.tau >= 1.0


def test_plain_decoding_through_the_same_engine():
    target = tiny_target("llama", seed=3)
    prompts = prompts_of([4, 11], 96, seed=3)
    want = [hf_greedy(target, p, 10) for p in prompts]
    dec = DSparkDecoder(target, random_drafter(target))
    try:
        out = dec.generate(prompts, max_new_tokens=10, speculative=False, eos_token_id=[])
    finally:
        dec.close()
    assert out.sequences == want
    assert out.stats.tau == 1.0


def _chain(V=6, seed=0):
    """Transition logits whose greedy walk from token 4 visits every token once (a cycle 4 -> 0 -> 1 -> ...)."""
    g = torch.Generator().manual_seed(seed)
    table = torch.randn(V, V, generator=g)
    order = [4, 0, 1, 2, 3, 5]
    for a, b in zip(order, order[1:] + order[:1], strict=True):
        table[a, b] = 4.0
    return table


@pytest.mark.parametrize("mode", MODES)
def test_eos_inside_an_accepted_block(mode):
    table = _chain()
    target = markov_chain_target(table)
    prompt = [1, 4]
    free = hf_greedy(target, prompt, 8)
    # a token the greedy chain first reaches at step >= 3: the perfect drafter drafts it inside a block
    eos = next(t for i, t in enumerate(free) if i >= 3 and t not in free[:i])
    want = hf_greedy(target, prompt, 8, eos=eos)
    dec = DSparkDecoder(target, markov_drafter(target, table, block_size=4), planner=mode, sps_table=SPS)
    try:
        out = dec.generate([prompt], max_new_tokens=8, eos_token_id=eos)
    finally:
        dec.close()
    assert out.sequences == [want]
    assert out.finish_reasons == ["eos"]
    assert out.stats.conditional_acceptance[0] == 1.0  # every verified draft accepted: a perfect drafter


class CheckingDecoder(DSparkDecoder):
    """After every round: the target KV and drafter context hold exactly the committed tokens."""

    checks = 0

    def _round(self, call, rs):
        super()._round(call, rs)
        for r in rs:
            if r.done:
                continue
            committed = r.prompt + r.generated[:-1]  # the anchor is not in the caches yet
            assert self.adapter.length(r.rid) == len(committed)
            assert self.drafter.context_length(r.rid) == len(committed)
            # the live cache gives the same next-token logits as a fresh prefill of the committed tokens
            live = self.adapter.forward([(r.rid, [r.anchor], "all")]).logits
            self.adapter.truncate(r.rid, len(committed))
            self.adapter.add_request(-1)
            fresh = self.adapter.forward([(-1, committed + [r.anchor], "last")]).logits
            self.adapter.finish(-1)
            torch.testing.assert_close(live, fresh, atol=1e-4, rtol=1e-4)
            type(self).checks += 1


def test_state_after_rejections_matches_a_fresh_prefill():
    target = tiny_target("qwen3", seed=5)
    dec = CheckingDecoder(target, random_drafter(target), planner="early_stop", sps_table=SPS)
    try:
        out = dec.generate(prompts_of([5, 13, 8], 96, seed=5), max_new_tokens=10, temperature=1.0, seed=3)
    finally:
        dec.close()
    assert CheckingDecoder.checks > 5
    assert out.stats.rejected_drafts > 0  # the random drafter is rejected often


class ContextCheckingDecoder(DSparkDecoder):
    """Before a request is released: its drafter context equals one built from HF's hidden states of the
    committed tokens (the tapped features as ``features_from_hidden_states`` reads them)."""

    checks = 0
    reference = None  # a copy of the target with its own attention (the decoder switches the target's)

    def _release(self, r):
        store = self.drafter.contexts
        n = store.length(r.rid)
        if n:
            tokens = (r.prompt + r.generated)[:n]
            with torch.no_grad():
                hs = self.reference(input_ids=torch.tensor([tokens]), output_hidden_states=True).hidden_states
            fresh_id = 10_000 + r.rid
            self.drafter.append_context([fresh_id], [self.drafter.features_from_hidden_states(hs)[0]])
            (k, v), (k_fresh, v_fresh) = store.context_kv(r.rid), store.context_kv(fresh_id)
            torch.testing.assert_close(k, k_fresh, atol=1e-4, rtol=1e-4)
            torch.testing.assert_close(v, v_fresh, atol=1e-4, rtol=1e-4)
            self.drafter.finish(fresh_id)
            type(self).checks += 1
        super()._release(r)


@pytest.mark.parametrize("taps", ["default", "with_embeddings"])
def test_drafter_context_is_built_from_the_tapped_layers(taps):
    target = tiny_target("llama", seed=7)
    L = target.config.num_hidden_layers
    torch.manual_seed(2)
    drafter = DSparkDrafter.from_config(
        target,
        block_size=4,
        num_layers=1,
        target_layer_ids=[0, L - 2] if taps == "default" else [-1, 0, L - 2],
        markov_rank=8,
        initializer_range=0.2,
    ).eval()
    prompts = prompts_of([6, 11], 96, seed=7)
    want = [hf_greedy(target, p, 10) for p in prompts]
    ContextCheckingDecoder.checks = 0
    ContextCheckingDecoder.reference = copy.deepcopy(target)
    dec = ContextCheckingDecoder(target, drafter, planner="full", max_batch_size=2)
    try:
        out = dec.generate(prompts, max_new_tokens=10, temperature=0.0, eos_token_id=[])
    finally:
        dec.close()
    assert out.sequences == want
    assert ContextCheckingDecoder.checks == len(prompts)


def test_stream_yields_committed_tokens_in_order():
    target = tiny_target("llama", seed=6)
    prompts = prompts_of([4, 9], 96, seed=6)
    dec = DSparkDecoder(target, random_drafter(target))
    try:
        full = dec.generate(prompts, max_new_tokens=9, seed=1, temperature=1.0, eos_token_id=[])
        got = [[], []]
        for ev in dec.generate(
            prompts, max_new_tokens=9, seed=1, temperature=1.0, eos_token_id=[], stream=True
        ):
            got[ev.index] += ev.tokens
    finally:
        dec.close()
    assert got == full.sequences  # same seed: same tokens; streamed pieces concatenate to the result


def test_continuous_batching_and_kv_preemption_lose_nothing():
    target = tiny_target("llama", seed=7)
    prompts = prompts_of([20, 25, 18, 30, 22], 96, seed=7)
    want = [hf_greedy(target, p, 14) for p in prompts]
    # 12 pages of 16 tokens cannot hold five requests of ~45 tokens at once: requests get preempted and resumed
    dec = DSparkDecoder(target, random_drafter(target), max_batch_size=5, max_kv_pages=12)
    try:
        out = dec.generate(prompts, max_new_tokens=14, eos_token_id=[])
        assert dec.adapter.pool.used_pages == 0
    finally:
        dec.close()
    assert out.sequences == want


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(prompts=[[]]), "prompts\\[0\\]: the prompt is empty"),
        (dict(prompts=[[1, 2]], max_new_tokens=0), "max_new_tokens"),
        (dict(prompts=[[1, 500]]), "token ids must be in"),
        (dict(prompts=[[1] * 600]), "context"),
        (dict(prompts=[[1, 2]], temperature=-1.0), "temperature"),
        (dict(prompts=[[1, 2]], top_p=0.0), "top_p"),
        (dict(prompts="hello"), "tokenizer"),
        (dict(prompts=[[1, 2]], stop=["x"]), "tokenizer"),
    ],
)
def test_bad_requests_fail_clearly_and_leave_the_decoder_usable(kwargs, match):
    target = tiny_target("llama", seed=8)
    dec = DSparkDecoder(target, random_drafter(target))
    try:
        with pytest.raises(ValueError, match=match):
            dec.generate(**kwargs)
        out = dec.generate([[1, 2, 3]], max_new_tokens=3)
        assert len(out.sequences[0]) == 3
    finally:
        dec.close()


def test_nan_logits_name_the_stage_and_leave_the_decoder_usable():
    target = tiny_target("llama", seed=9)
    dec = DSparkDecoder(target, random_drafter(target))
    try:
        w = target.lm_head.weight.data.clone()
        target.lm_head.weight.data[5] = float("nan")
        with pytest.raises(RuntimeError, match="target verify"):
            dec.generate([[1, 2, 3]], max_new_tokens=3)
        target.lm_head.weight.data.copy_(w)
        assert dec.adapter.pool.used_pages == 0
        assert len(dec.generate([[1, 2, 3]], max_new_tokens=3).sequences[0]) == 3
    finally:
        dec.close()


def test_mismatched_drafter_fails_before_anything_runs():
    a = tiny_target("llama", vocab=96)
    b = tiny_target("llama", vocab=80)
    with pytest.raises(ValueError, match="vocab_size"):
        DSparkDecoder(b, random_drafter(a))


@pytest.mark.parametrize(
    "mode,markov_rank,speculative,per_round",
    [
        ("full", 8, True, 1),  # every draft verified: only the round's results are read
        ("early_stop", 8, True, 2),  # + the plan, whose verify lengths shape the target batch
        ("lagged_topk", 8, True, 2),
        ("early_stop", 0, True, 1),  # DFlash (no confidence head): nothing to plan with
        ("full", 8, False, 1),  # plain decoding through the engine
    ],
)
def test_host_reads_per_round(mode, markov_rank, speculative, per_round):
    target = tiny_target("llama", seed=5)
    drafter = random_drafter(target, markov_rank=markov_rank)
    prompts = prompts_of([4, 9, 13], 96, seed=5)
    want = [hf_greedy(target, p, 10) for p in prompts]
    dec = DSparkDecoder(target, drafter, planner=mode, sps_table=SPS, max_batch_size=8)
    try:
        out = dec.generate(prompts, max_new_tokens=10, eos_token_id=[], speculative=speculative)
    finally:
        dec.close()
    assert out.sequences == want
    rounds = out.stats.rounds
    assert rounds > 0 and dec.host.syncs == 1 + per_round * rounds  # + 1: the prefill's first tokens


@pytest.mark.parametrize("mode", ["early_stop", "lagged_topk", "full"])
def test_adaptive_slots_draft_one_past_the_last_plan(mode):
    target = tiny_target("llama", seed=5)
    drafter = random_drafter(target)
    gamma = drafter.config.block_size
    drafted, plans = [], []
    propose = drafter.propose

    def spy(*args, **kwargs):
        out = propose(*args, **kwargs)
        drafted.append(out.base_logits.shape[1])
        return out

    drafter.propose = spy
    prompts = prompts_of([3, 17, 5, 9], 96, seed=5)
    outs = {}
    for adaptive in (True, False):
        dec = DSparkDecoder(
            target, drafter, planner=mode, sps_table=SPS, max_batch_size=2, adaptive_slots=adaptive
        )
        plan = dec.planner.plan

        def plan_spy(survival, ids=None, drafter=True, plan=plan):
            p = plan(survival, ids, drafter)
            plans.append(int(p.verify_len.max()))
            return p

        dec.planner.plan = plan_spy
        drafted.clear()
        plans.clear()
        try:
            outs[adaptive] = dec.generate(prompts, max_new_tokens=10, eos_token_id=[]).sequences
        finally:
            dec.close()
        assert len(drafted) == len(plans) > 1
        if adaptive and mode != "full":
            # first round: γ slots; then one past the most drafts the previous plan verified
            assert drafted == [gamma] + [min(gamma, v) for v in plans[:-1]]
            assert min(drafted) < gamma  # this cost curve makes the planner verify fewer than γ
        else:
            assert drafted == [gamma] * len(drafted)
    assert outs[True] == outs[False] == [hf_greedy(target, p, 10) for p in prompts]


@pytest.mark.parametrize("mode", MODES)
def test_greedy_with_a_draft_vocabulary_missing_tokens_of_the_answer(mode):
    # the perfect chain drafter may only propose 4, 0, 1, 5: the target's 2 and 3 come from rejections
    table = _chain()
    target = markov_chain_target(table)
    prompts = [[1, 4], [3], [5, 2, 0]]
    want = [hf_greedy(target, p, 14) for p in prompts]
    drafter = markov_drafter(target, table, block_size=4)
    drafter.set_draft_vocab([0, 1, 4, 5])
    # every round plans for throughput: the rejections this test is about must happen in all three requests
    dec = DSparkDecoder(target, drafter, planner=mode, sps_table=SPS, threshold=0.3, finish_together=False)
    try:
        out = dec.generate(prompts, max_new_tokens=14, eos_token_id=[])
    finally:
        dec.close()
    assert out.sequences == want
    assert {2, 3} <= {t for s in want for t in s}
    assert 0 < out.stats.rejected_drafts < out.stats.verified_drafts


@pytest.mark.parametrize("temperature,observed", [(0.0, False), (0.0, True), (1.0, False)])
def test_only_rounds_that_read_q_widen_it_to_the_whole_vocabulary(monkeypatch, temperature, observed):
    # greedy rows accept by argmax match: a greedy round builds no (R, g, V) q unless an observer records it
    table = _chain()
    target = markov_chain_target(table)
    prompts = [[1, 4], [3], [5, 2, 0]]
    drafter = markov_drafter(target, table, block_size=4)
    drafter.set_draft_vocab([0, 1, 4, 5])
    widened = []
    whole = drafter.whole_vocab_logits
    monkeypatch.setattr(drafter, "whole_vocab_logits", lambda z: widened.append(z.shape) or whole(z))
    records = []
    dec = DSparkDecoder(target, drafter, round_observer=records.append if observed else None)
    try:
        out = dec.generate(prompts, max_new_tokens=10, temperature=temperature, eos_token_id=[])
    finally:
        dec.close()
    assert out.stats.verified_drafts > 0
    assert bool(widened) == (temperature > 0 or observed)
    assert all(shape[-1] == 4 for shape in widened)
    assert all(rec.draft_logits.shape[-1] == table.shape[0] for rec in records)
    assert bool(records) == observed
    if temperature == 0:
        assert out.sequences == [hf_greedy(target, p, 10) for p in prompts]
