# SPDX-License-Identifier: Apache-2.0
"""Soak: 200 requests through one decoder under KV pressure, with stop strings, abandoned streams and a fault
injected once at every stage of a round. Afterwards every request that was not faulted holds exactly the tokens
of its solo greedy run, every faulted call raised the injected error, and the decoder holds nothing.
"""

import contextlib
import random

import pytest

import dspark.decoding.round as round_module
from dspark import DSparkDecoder
from tests.decoding.test_decoder import SPS, hf_greedy
from tests.decoding.toy_models import random_drafter, tiny_target

V = 32
REQUESTS = 200


class LetterTokenizer:
    """Token i is the character ``chr(65 + i)``; no special tokens."""

    eos_token_id = None

    def __len__(self):
        return V

    def get_vocab(self):
        return {chr(65 + i): i for i in range(V)}

    def decode(self, ids, skip_special_tokens=False):
        return "".join(chr(65 + int(i)) for i in ids)


def cut_at_stop(tokens, stop):
    """What plain decoding keeps: the shortest prefix whose text contains a stop string (all without one)."""
    for m in range(1, len(tokens) + 1):
        text = LetterTokenizer().decode(tokens[:m])
        if any(s in text for s in stop):
            return tokens[:m]
    return tokens


class InjectedFault(RuntimeError):
    pass


@contextlib.contextmanager
def fault_once(obj, name, stage, after=0):
    """Make ``obj.name`` raise :class:`InjectedFault` once inside the block, on call ``after + 1``."""
    real = getattr(obj, name)
    fired, calls = [], []

    def faulty(*args, **kwargs):
        calls.append(1)
        if not fired and len(calls) > after:
            fired.append(1)
            raise InjectedFault(f"injected fault at the {stage} stage")
        return real(*args, **kwargs)

    setattr(obj, name, faulty)
    try:
        yield fired
    finally:
        setattr(obj, name, real)


def make_calls(rng):
    """Calls of 3-8 requests (200 in all): prompt lengths 1-40, one max_new_tokens and stop set per call."""
    calls, made = [], 0
    while made < REQUESTS:
        n = min(rng.randint(3, 8), REQUESTS - made)
        prompts = [[rng.randrange(V) for _ in range(rng.randint(1, 40))] for _ in range(n)]
        stop = (
            [chr(65 + rng.randrange(V)) + chr(65 + rng.randrange(V)) for _ in range(2)]
            if rng.random() < 0.4
            else []
        )
        calls.append(dict(prompts=prompts, max_new_tokens=rng.randint(1, 24), stop=stop))
        made += n
    return calls


def test_soak():
    rng = random.Random(2026)
    target = tiny_target("llama", vocab=V, seed=11)
    drafter = random_drafter(target, block_size=4)
    calls = make_calls(rng)
    faulted = [3, 7, 11, 15, 19, 23, 27, 31]
    for i in faulted:  # long enough to reach a round after the prefill
        calls[i]["max_new_tokens"] = max(calls[i]["max_new_tokens"], 8)
    want = [
        [cut_at_stop(hf_greedy(target, p, c["max_new_tokens"]), c["stop"]) for p in c["prompts"]]
        for c in calls
    ]
    page_size = 8
    at_once = sum(-(-(len(p) + c["max_new_tokens"] + 5) // page_size) for c in calls for p in c["prompts"])
    per_call = at_once / len(calls)
    pages = max(int(0.3 * per_call), -(-(40 + 24 + 5) // page_size))  # ~30 %, and the largest request fits
    dec = DSparkDecoder(
        target,
        drafter,
        planner="early_stop",
        sps_table=SPS,
        tokenizer=LetterTokenizer(),
        max_batch_size=8,
        page_size=page_size,
        max_kv_pages=pages,
    )
    stages = [  # (object, attribute, stage, calls before the faulty one)
        (drafter, "propose", "draft", 0),
        (drafter, "sample", "markov_sample", 1),
        (drafter, "score", "confidence", 2),
        (dec.planner, "plan", "plan", 1),
        (dec.adapter, "forward", "verify", 1),  # the first forward is the prefill
        (round_module, "accept_drafts", "accept", 0),
        (dec.adapter, "truncate", "commit", 1),
        (round_module, "sample_next", "prefill", 0),
    ]
    faults = dict(zip(faulted, stages, strict=True))
    abandoned = {5, 13, 21}
    checked = 0
    try:
        for i, c in enumerate(calls):
            kw = dict(eos_token_id=[], **c)
            if i in faults:
                obj, name, stage, after = faults[i]
                with fault_once(obj, name, stage, after) as fired, pytest.raises(InjectedFault, match=stage):
                    dec.generate(**kw)
                assert fired, f"the {stage} fault was never reached"
            elif i in abandoned:
                got = [[] for _ in c["prompts"]]
                stream = dec.generate(stream=True, **kw)
                for k, ev in enumerate(stream):
                    got[ev.index] += ev.tokens
                    if k == 3:
                        break
                stream.close()
                for g, w in zip(got, want[i], strict=True):
                    assert g == w[: len(g)]  # what was streamed is a prefix of the solo run
            else:
                out = dec.generate(**kw)
                assert out.sequences == want[i], f"call {i}"
                checked += len(want[i])
            pool = dec.adapter.pool
            pool.check()
            assert pool.used_pages == 0 and pool.requests == [] and drafter.contexts.requests == []
        assert len(calls) > 32 and checked >= 120
        assert dec.stats.preemptions > 0  # the pool was short: requests were preempted and resumed
        # the decoder serves the next call correctly
        last = calls[0]
        assert dec.generate(eos_token_id=[], **last).sequences == want[0]
    finally:
        dec.close()
