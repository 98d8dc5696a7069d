# SPDX-License-Identifier: Apache-2.0
"""Sampled generation has the target's distribution: a Markov-chain target with known transitions.

The first three generated tokens of many independent requests (one generate call, different request ids,
so independent Philox streams) are compared with the exact joint distribution of plain decoding — softmax
of the processed transition logits (temperature, top-k, top-p as Hugging Face applies them) — by a chi-square
test and the total variation distance. The anticipating planner of the paper's Appendix A fails the same test.

CI runs N = 20,000 sequences per case (TV bound 0.03: sampling noise alone is ~0.01 there);
``DSPARK_EXACTNESS_N=100000`` runs the full-size check (TV < 0.01).
"""

import itertools
import math
import os

import pytest
import torch
from transformers import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

from dspark import DSparkDecoder, DSparkDrafter, Planner, SpsTable
from dspark.decoding.planner import PlanResult
from dspark.reference import plan_verify_anticipating_ref
from tests.decoding.toy_models import markov_chain_target, markov_drafter

V, START = 4, 2
N = int(os.environ.get("DSPARK_EXACTNESS_N", "20000"))
TV_MAX = 0.01 if N >= 100_000 else 0.03
APPENDIX_A_SPS = SpsTable((1, 2, 3, 4), (1.0, 0.5, 0.45, 0.4), 4)


def batch_sps(n: int, gamma: int = 3) -> SpsTable:
    """A smooth cost curve for n requests verified together: one probe per token count, so ceiling pricing is
    exact, and steps/s falling as 1 / (1 + (B - n) / (2n)): drafts with survival above ~0.5 pay off."""
    tokens = tuple(range(n, n * (gamma + 1) + 1))
    return SpsTable(tokens, tuple(1.0 / (1.0 + (b - n) / (2.0 * n)) for b in tokens), tokens[-1])


def chain_table(seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(V, V, generator=g) * 1.5


def processed_probs(table, temperature, top_k, top_p):
    x = table.clone().float()
    ids = torch.zeros(V, 1, dtype=torch.long)
    for w in [TemperatureLogitsWarper(temperature)]:
        x = w(ids, x)
    if top_k:
        x = TopKLogitsWarper(top_k)(ids, x)
    if top_p < 1.0:
        x = TopPLogitsWarper(top_p)(ids, x)
    return torch.softmax(x, -1).double()


def exact_joint(P):
    return {
        (a, b, c): float(P[START, a] * P[a, b] * P[b, c]) for a, b, c in itertools.product(range(V), repeat=3)
    }


def chi_square_p(counts, probs, n):
    keep = [k for k in probs if probs[k] * n >= 5]
    stat = sum((counts.get(k, 0) - n * probs[k]) ** 2 / (n * probs[k]) for k in keep)
    rest_p = 1 - sum(probs[k] for k in keep)
    rest_c = n - sum(counts.get(k, 0) for k in keep)
    dof = len(keep) - 1
    if rest_p * n >= 5:
        stat += (rest_c - n * rest_p) ** 2 / (n * rest_p)
        dof += 1
    return float(
        torch.special.gammaincc(torch.tensor(dof / 2.0, dtype=torch.float64), torch.tensor(stat / 2.0))
    )


# confidence depends on the previous token only, as in the paper's Appendix A: after the start token c = 0.8,
# after token 0 c = 0.9, after any other token c ~ 0
APPENDIX_A_CONF = [math.log(0.9 / 0.1), -9.0, math.log(0.8 / 0.2), -9.0]


def run(planner, temperature, top_k=0, top_p=1.0, n=N, seed=0, drafter_dir=None, draft_vocab=None):
    table = chain_table()
    target = markov_chain_target(table)
    drafter = markov_drafter(target, table, noise=1.0, block_size=3, conf_logits=APPENDIX_A_CONF)
    drafter.set_draft_vocab(draft_vocab)
    if drafter_dir is not None:  # the same drafter in bf16 (its own cast copy of the fp32 target's LM head)
        drafter.save_pretrained(drafter_dir, include_embeddings=False)
        drafter = DSparkDrafter.from_pretrained(drafter_dir, target=target, dtype=torch.bfloat16)
        assert drafter.dtype == torch.bfloat16
    dec = DSparkDecoder(target, drafter, planner=planner, max_batch_size=n)
    try:
        out = dec.generate(
            [[START]] * n,
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


def score_first_three(sequences, table, temperature, top_k, top_p):
    """(chi-square p-value, total variation) of the generated 3-token sequences against the exact joint."""
    n = len(sequences)
    counts = {}
    for s in sequences:
        counts[tuple(s)] = counts.get(tuple(s), 0) + 1
    probs = exact_joint(processed_probs(table, temperature, top_k, top_p))
    tv = 0.5 * sum(abs(counts.get(k, 0) / n - p) for k, p in probs.items())
    tv += 0.5 * sum(c / n for k, c in counts.items() if k not in probs)
    return chi_square_p(counts, probs, n), tv


SAMPLERS = ((0.7, 0, 1.0), (1.0, 3, 1.0), (1.0, 0, 0.8), (1.0, 0, 1.0))
MODES = ("full", "threshold", "early_stop", "lagged_topk")
# every mode with every sampler at full size; in CI each mode once, with a different sampler each
CASES = (
    [(m, *s) for m in MODES for s in SAMPLERS]
    if N >= 100_000
    else [(m, *s) for m, s in zip(MODES, SAMPLERS, strict=True)]
)


@pytest.mark.slow
@pytest.mark.parametrize("mode,temperature,top_k,top_p", CASES)
def test_first_three_tokens_follow_the_target(mode, temperature, top_k, top_p):
    planner = Planner(mode, batch_sps(N), threshold=0.5)
    pval, tv, stats = run(planner, temperature, top_k, top_p)
    assert pval > 1e-3 and tv < TV_MAX, (pval, tv)
    assert 0 < stats.rejected_drafts < stats.verified_drafts  # drafts are both accepted and rejected


@pytest.mark.slow
def test_a_bf16_drafter_for_an_fp32_target_keeps_its_distribution(tmp_path):
    planner = Planner("early_stop", batch_sps(N), threshold=0.5)
    pval, tv, stats = run(planner, 1.0, drafter_dir=tmp_path / "d")
    assert pval > 1e-3 and tv < TV_MAX, (pval, tv)
    assert 0 < stats.rejected_drafts < stats.verified_drafts


@pytest.mark.slow
@pytest.mark.parametrize("mode,temperature,top_k,top_p", [("early_stop", 1.0, 0, 1.0), ("full", 0.7, 0, 0.8)])
def test_a_draft_vocabulary_keeps_the_distribution(mode, temperature, top_k, top_p):
    # q is 0 on token 1: every 1 the target emits comes from a rejection's residual or a bonus token
    planner = Planner(mode, batch_sps(N), threshold=0.5)
    pval, tv, stats = run(planner, temperature, top_k, top_p, draft_vocab=[0, 2, 3])
    assert pval > 1e-3 and tv < TV_MAX, (pval, tv)
    assert 0 < stats.rejected_drafts < stats.verified_drafts


class AnticipatingPlanner(Planner):
    """Global argmax of Theta over this round's own survival, no early stop: NOT exact (paper, Appendix A)."""

    def plan(self, survival, request_ids=None, drafter=True):
        tokens, rate = self._sps(survival.device, survival.shape[0], drafter)
        vl = torch.cat([plan_verify_anticipating_ref(row[None], tokens, rate) for row in survival])
        return PlanResult(vl, torch.tensor(int((vl - 1).sum())), "anticipating")


@pytest.mark.slow
def test_the_anticipating_planner_fails_the_same_test():
    pval, tv, _ = run(AnticipatingPlanner("early_stop", APPENDIX_A_SPS), 1.0)
    assert pval < 1e-6, (pval, tv)


def test_chi_square_helper_is_calibrated():
    probs = {(i,): 0.25 for i in range(4)}
    assert chi_square_p({(0,): 250, (1,): 250, (2,): 250, (3,): 250}, probs, 1000) > 0.99
    assert chi_square_p({(0,): 400, (1,): 200, (2,): 200, (3,): 200}, probs, 1000) < 1e-6
    assert math.isclose(
        sum(exact_joint(processed_probs(chain_table(), 1.0, 0, 1.0)).values()), 1.0, abs_tol=1e-6
    )
