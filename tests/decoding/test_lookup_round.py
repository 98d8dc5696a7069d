# SPDX-License-Identifier: Apache-2.0
"""Lookup drafts in the round: greedy equals the target's greedy, sampling keeps the target's distribution.

Sampled runs use the Markov-chain target of ``test_decoder_sampling.py``: a prompt that repeats a pattern (so
lookup matches happen at every round) and ends in the chain's start token, N independent requests in one call,
the first three generated tokens against the exact joint by chi-square and total variation. A source choice
that looks at the drafter's sampled tokens — the peek DESIGN §4.5 forbids — fails the same test.
"""

from __future__ import annotations

import pytest
import torch

import dspark.decoding.round as round_mod
from dspark import DSparkDecoder, Planner
from dspark.decoding.acceptance import AcceptanceTable
from dspark.decoding.lookup import LookupConfig
from tests.decoding.test_decoder_sampling import (
    APPENDIX_A_CONF,
    MODES,
    SAMPLERS,
    START,
    TV_MAX,
    N,
    batch_sps,
    chain_table,
    score_first_three,
)
from tests.decoding.toy_models import markov_chain_target, markov_drafter, random_drafter, tiny_target

PATTERN = [START, 0, 1, 3, START, 0, 1, 3, START]  # ends in START: the exact joint starts there
# 4 tokens: a match at every round; with a drafter of γ = 3 the lookup blocks are 16 wide (the default)
CONFIG = LookupConfig(min_match=1, max_match=3)


def confident_prior() -> dict:
    """A lookup prior of acceptance 0.9 everywhere: with it a cost-driven planner verifies lookup drafts from
    the first round (a call of three tokens is too short to learn that from the weak default)."""
    table = AcceptanceTable(CONFIG.max_match + 1, 3)
    for n in range(1, CONFIG.max_match + 1):
        for _ in range(9):
            table.observe(n, 3, 3)
        table.observe(n, 1, 0)
    return table.to_dict()


def run(planner, temperature, top_k=0, top_p=1.0, drafter=True, n=N, seed=0, prior=None):
    table = chain_table()
    target = markov_chain_target(table)
    d = (
        markov_drafter(target, table, noise=1.0, block_size=3, conf_logits=APPENDIX_A_CONF)
        if drafter
        else None
    )
    kw = {} if drafter else {"block_size": 3}
    dec = DSparkDecoder(target, d, planner=planner, max_batch_size=n, lookup=CONFIG, lookup_prior=prior, **kw)
    try:
        out = dec.generate(
            [PATTERN] * n,
            max_new_tokens=3,
            temperature=temperature,
            top_k=top_k or None,
            top_p=top_p,
            eos_token_id=[],
            seed=seed,
        )
    finally:
        dec.close()
    return (*score_first_three(out.sequences, table, temperature, top_k, top_p), out.stats)


# each planner mode once in CI, each with a different sampler (T 0.7, top-k, top-p, T 1)
CASES = list(zip(MODES, SAMPLERS, strict=True))


@pytest.mark.slow
@pytest.mark.parametrize("mode,sampler", CASES)
def test_hybrid_rounds_follow_the_target(mode, sampler):
    temperature, top_k, top_p = sampler
    pval, tv, stats = run(Planner(mode, batch_sps(N), threshold=0.5), temperature, top_k, top_p)
    assert pval > 1e-3 and tv < TV_MAX, (pval, tv)
    src = stats.sources
    assert src["lookup"]["request_rounds"] > 0 and src["dspark"]["request_rounds"] > 0  # both sources ran
    assert 0 < stats.rejected_drafts < stats.verified_drafts


@pytest.mark.slow
@pytest.mark.parametrize("mode,sampler", [("full", (1.0, 0, 1.0)), ("early_stop", (0.7, 0, 0.8))])
def test_lookup_alone_follows_the_target(mode, sampler):
    temperature, top_k, top_p = sampler
    planner = Planner(mode, batch_sps(N), threshold=0.5)
    pval, tv, stats = run(planner, temperature, top_k, top_p, drafter=False, prior=confident_prior())
    assert pval > 1e-3 and tv < TV_MAX, (pval, tv)
    assert stats.sources["lookup"]["request_rounds"] > 0
    assert 0 < stats.rejected_drafts < stats.verified_drafts


def peeking_choice(engine, r):
    """Forbidden: take the lookup block exactly when the drafter's own first draft agrees with it."""
    round_mod_choose(engine, r)
    if r.lookup is None or not r.run_drafter:
        return
    lk = round_mod.to_device(r.lookup.tokens, r.sample.tokens.device)
    has = round_mod.to_device([n > 0 for n in r.lookup.lengths], lk.device, torch.bool)
    use = has & (r.sample.tokens[:, 0] == lk[:, 0])
    r.one_hot = use
    r.one_hot_host = None
    cap = round_mod.to_device([n + 1 for n in r.lookup.lengths], lk.device, torch.int32)
    r.verify_cap = torch.where(use, cap, torch.full_like(cap, r.draft_slots + 1))
    own = torch.nn.functional.pad(r.sample.tokens, (0, r.slots - r.draft_slots))  # lookup blocks are wider
    r.draft_tokens = torch.where(use[:, None], lk, own)


round_mod_choose = round_mod.choose_sources


@pytest.mark.slow
def test_a_choice_that_peeks_at_the_drafts_fails_the_same_test(monkeypatch):
    monkeypatch.setattr(round_mod, "choose_sources", peeking_choice)
    pval, tv, _ = run(Planner("full"), 1.0)
    assert pval < 1e-6, (pval, tv)


@pytest.mark.parametrize("with_drafter", [True, False])
@pytest.mark.parametrize("mode", ["full", "early_stop"])
def test_greedy_equals_the_target_greedy(with_drafter, mode):
    target = tiny_target("llama", vocab=64)
    drafter = random_drafter(target, block_size=4) if with_drafter else None
    prompts = [[5, 6, 7, 8, 9, 5, 6, 7], [1, 2, 3, 1, 2, 3, 1, 2, 3, 1], [40, 41, 42]]
    want = []
    for p in prompts:
        ids = target.generate(torch.tensor([p]), max_new_tokens=20, do_sample=False, eos_token_id=None)
        want.append(ids[0, len(p) :].tolist())
    sps = batch_sps(3, 4)
    dec = DSparkDecoder(target, drafter, planner=Planner(mode, sps), lookup=True, block_size=4)
    try:
        out = dec.generate(prompts, max_new_tokens=20, eos_token_id=[])
    finally:
        dec.close()
    assert out.sequences == want
    assert out.stats.sources["lookup"]["request_rounds"] > 0


@pytest.mark.parametrize(
    "with_drafter,mode,per_round",
    [
        (False, "full", 1),  # lookup alone: proposals, lengths and sources are on the host
        (False, "early_stop", 2),  # + the plan
        (True, "full", 2),  # hybrid: the sources are chosen on the device, read with the verify lengths
        (True, "early_stop", 2),
    ],
)
def test_host_reads_per_round(with_drafter, mode, per_round):
    target = tiny_target("llama", vocab=64)
    drafter = random_drafter(target, block_size=4) if with_drafter else None
    dec = DSparkDecoder(target, drafter, planner=Planner(mode, batch_sps(2, 4)), lookup=True, block_size=4)
    try:
        out = dec.generate([[1, 2, 3, 1, 2, 3, 1, 2], [9, 8, 7]], max_new_tokens=10, eos_token_id=[])
    finally:
        dec.close()
    rounds = out.stats.rounds
    assert rounds > 0 and dec.host.syncs == 1 + per_round * rounds  # + 1: the prefill's first tokens


def test_stats_count_each_source_and_the_shares_add_up():
    target = tiny_target("llama", vocab=64)
    dec = DSparkDecoder(target, random_drafter(target, block_size=4), lookup=True)
    try:
        out = dec.generate([[1, 2, 3, 1, 2, 3, 1, 2, 3, 1]] * 2, max_new_tokens=24, eos_token_id=[])
    finally:
        dec.close()
    src = out.stats.sources
    rounds = sum(v["request_rounds"] for k, v in src.items() if k != "target")
    assert rounds == out.stats.request_rounds
    assert abs(sum(v["token_share"] for v in src.values()) - 1.0) < 1e-9
    assert "lookup" in out.stats.summary()
    assert out.stats.to_dict()["sources"] == src


def test_a_round_where_every_request_takes_its_lookup_block_skips_the_drafter(monkeypatch):
    target = tiny_target("llama", vocab=64)
    drafter = random_drafter(target, block_size=4)
    calls = []
    propose = drafter.propose
    monkeypatch.setattr(drafter, "propose", lambda *a, **k: calls.append(1) or propose(*a, **k))
    dec = DSparkDecoder(target, drafter, lookup=True)
    # a drafter that never gets anything right and a lookup that always does: after a few rounds the tables
    # say the lookup block wins even against a drafter certain of its first slot
    for _ in range(200):
        dec.draft_acceptance.observe(0, 4, 0)
        dec.lookup_acceptance.observe(4, 4, 4)
        dec.lookup_acceptance.observe(3, 4, 4)
        dec.lookup_acceptance.observe(2, 4, 4)
    try:
        out = dec.generate([[7, 8, 9, 10] * 6], max_new_tokens=12, eos_token_id=[])
    finally:
        dec.close()
    ref = target.generate(torch.tensor([[7, 8, 9, 10] * 6]), max_new_tokens=12, do_sample=False)
    assert out.sequences[0] == ref[0, 24:].tolist()
    assert out.stats.rounds > len(calls)  # some rounds ran without the drafter
    assert out.stats.seconds["lookup"] > 0


@pytest.mark.parametrize(
    "kwargs,error,match",
    [
        ({"lookup": "yes"}, TypeError, "lookup: expected a bool or a LookupConfig"),
        ({"lookup_prior": {"accepts": []}}, ValueError, "lookup_prior: given without lookup"),
        ({"lookup": True, "lookup_prior": 3}, TypeError, "lookup_prior: expected a path"),
        ({"lookup": True, "block_size": 65}, ValueError, "block_size: must be in"),
    ],
)
def test_bad_lookup_arguments_fail_before_the_target_is_touched(kwargs, error, match):
    target = tiny_target("llama", vocab=64)
    attn = target.config._attn_implementation
    with pytest.raises(error, match=match):
        DSparkDecoder(target, None, **kwargs)
    assert target.config._attn_implementation == attn


@pytest.mark.parametrize("kwargs", [{"min_match": 0}, {"min_match": 3, "max_match": 2}])
def test_bad_lookup_config_is_named(kwargs):
    with pytest.raises(ValueError, match="min_match|max_match"):
        LookupConfig(**kwargs)


def test_lookup_without_history_decodes_plainly():
    target = tiny_target("llama", vocab=64)
    dec = DSparkDecoder(target, None, lookup=LookupConfig(min_match=2))
    try:
        out = dec.generate([[3]], max_new_tokens=3, eos_token_id=[])  # nothing to match yet
    finally:
        dec.close()
    ref = target.generate(torch.tensor([[3]]), max_new_tokens=3, do_sample=False)
    assert out.sequences[0] == ref[0, 1:].tolist()


def test_lookup_decoding_prices_rounds_without_the_drafter():
    from dspark.profiling import CostTable, DraftCost, VerifyCost

    table = CostTable(
        verify=(VerifyCost(1, 1, 10.0), VerifyCost(1, 2, 12.0), VerifyCost(1, 4, 16.0)),
        draft=(DraftCost(1, 5.0),),
        block_size=4,
    )
    target = tiny_target("llama", vocab=64)
    alone = DSparkDecoder(target, None, lookup=True, sps_table=table)
    hybrid = DSparkDecoder(target, random_drafter(target, block_size=4), lookup=True, sps_table=table)
    try:
        assert not alone.planner.draft_cost and hybrid.planner.draft_cost
        assert alone.planner.relative_rates(1, 1).tolist() == pytest.approx([1.0, 10 / 12])
        assert hybrid.planner.relative_rates(1, 1).tolist() == pytest.approx([1.0, 15 / 17])
    finally:
        alone.close()
        hybrid.close()


def test_lookup_blocks_may_be_wider_than_the_drafters():
    target = tiny_target("llama", vocab=64)
    drafter = random_drafter(target, block_size=4)
    widths = {}
    for name, kw in {
        "default": {"lookup": True},
        "capped below γ": {"lookup": LookupConfig(max_tokens=2)},
        "no drafts": {"lookup": True, "block_size": 0},
    }.items():
        dec = DSparkDecoder(target, drafter, **kw)
        widths[name] = (dec.gamma, dec.lookup_width, dec.round_width)
        dec.close()
    assert widths == {"default": (4, 16, 16), "capped below γ": (4, 4, 4), "no drafts": (0, 0, 0)}
    for config, gamma in ((LookupConfig(max_tokens=5), 5), (True, 8)):  # lookup alone: 8 by default
        alone = DSparkDecoder(target, None, lookup=config)
        assert (alone.gamma, alone.lookup_width, alone.round_width) == (gamma, gamma, gamma)
        alone.close()
    # a target whose greedy path cycles through 12 tokens: lookup blocks of 12 are right, and the hybrid verifies
    # them past γ + 1 rows; greedy stays the target's own
    table = torch.randn(16, 16, generator=torch.Generator().manual_seed(0)) * 0.5
    table[torch.arange(12), (torch.arange(12) + 1) % 12] += 5.0
    cyclic = markov_chain_target(table)
    prompt = list(range(12)) * 2
    cyclic.generation_config.eos_token_id = None  # the cycle passes the config's EOS id
    ref = cyclic.generate(torch.tensor([prompt]), max_new_tokens=40, do_sample=False)[
        0, len(prompt) :
    ].tolist()
    dec = DSparkDecoder(cyclic, random_drafter(cyclic, block_size=4), planner="full", lookup=True)
    try:
        out = dec.generate([prompt], max_new_tokens=40, eos_token_id=[])
    finally:
        dec.close()
    assert out.sequences[0] == ref
    longest = max(i for i, c in enumerate(out.stats.accepted_hist) if c)
    assert len(out.stats.accepted_hist) == 17 and longest > 4  # accepted more drafts than γ = 4 allows


@pytest.mark.parametrize(
    "flags,message",
    [
        (["--lookup-tokens", "0"], "--lookup-tokens (max_tokens): must be >= 1 or None, got 0"),
        (["--min-match", "0"], "--min-match (min_match): must be >= 1, got 0"),
        (
            ["--min-match", "3", "--max-match", "2"],
            "--max-match (max_match): must be >= min_match (3), got 2",
        ),
        (["--lookup-corpus", "-5"], "--lookup-corpus (corpus_tokens): must be >= 0 (0: no corpus), got -5"),
    ],
)
def test_the_command_line_names_a_bad_lookup_flag_before_loading(monkeypatch, capsys, flags, message):
    import dspark.cli as cli
    from dspark.models import loading

    def no_load(*a, **k):
        raise AssertionError("the target must not load")

    monkeypatch.setattr(loading, "load_target", no_load)
    assert cli.main(["generate", "--target", "smollm2", "--lookup", "--prompt", "hi", *flags]) == 2
    assert message in capsys.readouterr().err
