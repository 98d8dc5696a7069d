# SPDX-License-Identifier: Apache-2.0
"""Earlier requests' outputs as a lookup source: the index against a brute force, the capacity, the decoder
(greedy equals the target's greedy; sampled tokens keep the target's distribution, with the peeking choice of
DESIGN §4.5 as the negative control)."""

from __future__ import annotations

import random

import pytest
import torch

import dspark.decoding.round as round_mod
from dspark import DSparkDecoder, Planner
from dspark.decoding.lookup import LookupConfig, LookupIndex
from dspark.decoding.lookup_corpus import LookupCorpus
from tests.decoding.test_decoder_sampling import (
    APPENDIX_A_CONF,
    START,
    TV_MAX,
    N,
    chain_table,
    score_first_three,
)
from tests.decoding.test_lookup_round import peeking_choice
from tests.decoding.toy_models import markov_chain_target, markov_drafter, random_drafter, tiny_target


def brute_force(h, outputs, config, k, newest_first=True):
    """The rule of docs/lookup.md by list scans: for each n from ``max_match`` down, the history's latest
    earlier occurrence, else the latest occurrence in the newest output holding one; ``(proposal, n, extent,
    from_corpus)``."""
    L, cap = len(h), max((config.max_match, *config.extent_bounds))
    order = list(reversed(outputs)) if newest_first else list(outputs)
    for n in range(config.max_match, config.min_match - 1, -1):
        if n > L:
            continue
        suffix = h[L - n :]
        own = [e for e in range(n, L) if h[e - n : e] == suffix]
        src, e, corpus = (h, max(own), False) if own else (None, None, True)
        if not own:
            for out in order:
                found = [e for e in range(n, len(out)) if out[e - n : e] == suffix]
                if found:
                    src, e = out, max(found)
                    break
        if e is None:
            continue
        x = n
        while n == config.max_match and x < cap and x < e and x < L and src[e - 1 - x] == h[L - 1 - x]:
            x += 1
        return src[e : e + k], n, x, corpus
    return [], 0, 0, False


def random_case(rng, vocab=4):
    h = [rng.randrange(vocab) for _ in range(rng.randrange(0, 12))]
    outputs = [
        [rng.randrange(vocab) for _ in range(rng.randrange(1, 30))] for _ in range(rng.randrange(0, 4))
    ]
    return h, outputs


def proposal_of(h, outputs, config, k):
    corpus = LookupCorpus(config.min_match, config.max_match, capacity=10_000)
    for out in outputs:
        corpus.add(out)
    index = LookupIndex(config, corpus)
    index.extend(h)
    got = index.propose(k)
    return got, index.match_length, index.match_extent, index.from_corpus


@pytest.mark.parametrize(
    "config",
    [LookupConfig(1, 3), LookupConfig(2, 4, extent_bounds=(6, 8)), LookupConfig(2, 2, extent_bounds=())],
)
def test_proposals_equal_the_brute_force(config):
    rng = random.Random(7)
    from_corpus = 0
    for _ in range(3000):
        h, outputs = random_case(rng)
        got = proposal_of(h, outputs, config, 5)
        assert got == brute_force(h, outputs, config, 5), (h, outputs)
        from_corpus += got[3]
    assert from_corpus > 300  # the corpus was consulted, and answered, often


def test_a_corpus_searched_oldest_first_is_caught():
    # negative control: the recency rule matters, and the comparison sees it
    config = LookupConfig(2, 3)
    h, outputs = [7, 1, 2], [[1, 2, 5], [1, 2, 6]]
    assert proposal_of(h, outputs, config, 3)[0] == [6]
    assert brute_force(h, outputs, config, 3)[0] == [6]
    assert brute_force(h, outputs, config, 3, newest_first=False)[0] == [5]
    rng = random.Random(7)
    differ = sum(
        proposal_of(h, o, config, 5) != brute_force(h, o, config, 5, newest_first=False)
        for h, o in (random_case(rng) for _ in range(2000))
    )
    assert differ > 20


def test_the_history_wins_over_the_corpus_at_equal_length_and_a_longer_corpus_match_wins():
    config = LookupConfig(2, 3)
    corpus = LookupCorpus(2, 3)
    corpus.add([9, 1, 2, 8, 8])
    index = LookupIndex(config, corpus)
    index.extend([5, 1, 2, 3, 4, 1, 2])  # own 2-gram (1, 2) -> 3; the corpus has no (4, 1, 2)
    assert index.propose(2) == [3, 4] and not index.from_corpus and index.match_length == 2
    index.extend([8])  # (1, 2, 8): only in the corpus, a 3-gram beats the history's shorter matches
    assert index.propose(2) == [8] and index.from_corpus and index.match_length == 3


def test_capacity_keeps_the_newest_outputs():
    corpus = LookupCorpus(1, 2, capacity=10)
    for i in range(20):
        corpus.add([100 + i, 200 + i, 300 + i, 400 + i])
        assert len(corpus) <= 10
    assert corpus.find((100,)) is None  # the oldest output is gone
    doc, e = corpus.find((119,))
    assert doc[e] == 219
    corpus.add(list(range(50)))  # longer than the capacity: its last 10 tokens
    assert len(corpus) == 10 and corpus.find((39,)) is None and corpus.find((40,)) is not None
    corpus.add([1])  # too short to hold an n-gram followed by a token: not kept
    assert corpus.outputs == 1
    corpus.clear()
    assert len(corpus) == 0 and corpus.find((40,)) is None


def test_dropping_old_outputs_leaves_the_index_of_the_kept_ones():
    # the index after drops equals one built from the kept outputs alone (no stale or missing entries)
    rng = random.Random(3)
    corpus = LookupCorpus(1, 3, capacity=40)
    added = []
    for _ in range(200):
        out = [rng.randrange(5) for _ in range(rng.randrange(2, 15))]
        corpus.add(out)
        added.append(out)
        kept = added[len(added) - corpus.outputs :]
        fresh = LookupCorpus(1, 3, capacity=10_000)
        for o in kept:
            fresh.add(o)
        assert len(corpus) == sum(map(len, kept)) <= 40 or corpus.outputs == 1
        grams = {tuple(o[i : i + n]) for o in added for n in (1, 2, 3) for i in range(len(o) - n + 1)}
        for g in grams:
            a, b = corpus.find(g), fresh.find(g)
            assert (a is None) == (b is None) and (a is None or (a[0] == b[0] and a[1] == b[1])), g


@pytest.mark.parametrize(
    "make,match",
    [
        (lambda: LookupConfig(corpus_tokens=-1), "corpus_tokens: must be >= 0"),
        (lambda: LookupConfig(corpus_tokens=True), "corpus_tokens"),
        (lambda: LookupCorpus(2, 4, capacity=0), "capacity: must be an int >= 1"),
    ],
)
def test_bad_corpus_sizes_are_named(make, match):
    with pytest.raises(ValueError, match=match):
        make()


@pytest.mark.parametrize("with_drafter", [False, True])
def test_a_later_call_drafts_from_earlier_outputs_and_greedy_equals_the_target(with_drafter):
    target = tiny_target("llama", vocab=64)
    drafter = random_drafter(target, block_size=4) if with_drafter else None
    prompts = [[40, 41, 42], [7, 30, 11, 2]]
    want = []
    for p in prompts:
        ids = target.generate(torch.tensor([p]), max_new_tokens=24, do_sample=False, eos_token_id=None)
        want.append(ids[0, len(p) :].tolist())
    config = LookupConfig(corpus_tokens=10_000)
    dec = DSparkDecoder(target, drafter, lookup=config, block_size=4)
    try:
        first = dec.generate(prompts, max_new_tokens=24, eos_token_id=[])
        assert dec.lookup_corpus.outputs == 2
        again = dec.generate(prompts[::-1], max_new_tokens=24, eos_token_id=[])
    finally:
        dec.close()
    assert first.sequences == want and again.sequences == want[::-1]
    corpus = again.stats.sources["corpus"]
    assert corpus["request_rounds"] > 0 and corpus["token_share"] > 0.1
    assert "corpus" not in first.stats.sources  # nothing had finished during the first call


def test_no_corpus_by_default():
    target = tiny_target("llama", vocab=64)
    dec = DSparkDecoder(target, None, lookup=True, block_size=4)
    try:
        dec.generate([[40, 41, 42]], max_new_tokens=8, eos_token_id=[])
        out = dec.generate([[40, 41, 42]], max_new_tokens=8, eos_token_id=[])
    finally:
        dec.close()
    assert dec.lookup_corpus is None and "corpus" not in out.stats.sources


def sampled_second_call(temperature, top_p=1.0, n=N):
    """Call 1 fills the corpus with n sampled chains from START; call 2's first three tokens are scored. The
    prompt [START] has no earlier occurrence of anything, so call 2's lookup blocks come from the corpus."""
    table = chain_table()
    target = markov_chain_target(table)
    d = markov_drafter(target, table, noise=1.0, block_size=3, conf_logits=APPENDIX_A_CONF)
    config = LookupConfig(min_match=1, max_match=3, corpus_tokens=1_000_000)
    dec = DSparkDecoder(target, d, planner=Planner("full"), max_batch_size=n, lookup=config)
    try:
        kw = dict(temperature=temperature, top_p=top_p, eos_token_id=[])
        dec.generate([[START]] * n, max_new_tokens=6, seed=1, **kw)
        out = dec.generate([[START]] * n, max_new_tokens=3, seed=2, **kw)
    finally:
        dec.close()
    return (*score_first_three(out.sequences, table, temperature, 0, top_p), out.stats)


@pytest.mark.slow
@pytest.mark.parametrize("temperature,top_p", [(1.0, 1.0), (0.7, 0.8)])
def test_corpus_drafts_keep_the_target_distribution(temperature, top_p):
    pval, tv, stats = sampled_second_call(temperature, top_p)
    assert pval > 1e-3 and tv < TV_MAX, (pval, tv)
    assert stats.sources["corpus"]["request_rounds"] > 0
    assert 0 < stats.rejected_drafts < stats.verified_drafts


@pytest.mark.slow
def test_a_choice_that_peeks_at_the_drafts_fails_with_the_corpus_too(monkeypatch):
    monkeypatch.setattr(round_mod, "choose_sources", peeking_choice)
    pval, tv, _ = sampled_second_call(1.0)
    assert pval < 1e-6, (pval, tv)
