# SPDX-License-Identifier: Apache-2.0
"""A whole speculative round (markov_sample -> rejection_sample) keeps the target's distribution.

Toy instance: V = 4 tokens, gamma = 3; the drafter is a real low-rank Markov head (its q depends on the
previous token), the target's logits depend on the whole prefix. (a) exact enumeration of the round with the
reference formulas; (b) Monte Carlo with the real ops, 200k rounds per verify length batched as requests with
distinct request_ids in one op call, on the joint of the first three emitted tokens (a round that emits fewer
continues with target draws). A round whose q is not the proposal law must fail the same test.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch

import dspark
from dspark.reference import draft_probs_ref, target_probs_ref
from tests.decoding.exact_round import ToyRequest, round_output, total_variation

V, GAMMA, RANK, N_ROUNDS = 4, 3, 3, 200_000
ANCHOR = 1


def _toy(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    U = torch.randn(GAMMA, V, generator=g)
    w1, w2 = torch.randn(V, RANK, generator=g), torch.randn(V, RANK, generator=g) * 0.7
    prefixes = [t for n in range(GAMMA + 1) for t in itertools.product(range(V), repeat=n)]
    target = {t: torch.randn(V, generator=g) * 1.2 for t in prefixes}
    return U, w1, w2, target


def _procs(t: float, variant: str) -> dict:
    if variant == "processed":
        return dict(top_k=3, top_p=0.9, penalty=1.5, ctx=[0])
    return dict(top_k=0, top_p=1.0, penalty=1.0, ctx=[])


def _p(target, prefix, t, pr) -> list[float]:
    _, p = target_probs_ref(
        target[prefix], t, pr["top_k"], pr["top_p"], pr["penalty"], pr["ctx"] + list(prefix)
    )
    return p.double().tolist()


def _q(U, w1, w2, prefix, t) -> list[float]:
    prev = ANCHOR if not prefix else prefix[-1]
    z = U[len(prefix)] + (w2.double() @ w1[prev].double()).float()
    return draft_probs_ref(z, t).double().tolist()


def _target_joint(target, t, pr) -> dict:
    out = {}
    for x in itertools.product(range(V), repeat=3):
        w = 1.0
        for k in range(3):
            w *= _p(target, x[:k], t, pr)[x[k]]
        out[x] = w
    return out


@pytest.mark.parametrize("t", [0.5, 1.0, 1.5])
@pytest.mark.parametrize("variant", ["plain", "processed"])
def test_exact_enumeration(t, variant):
    U, w1, w2, target = _toy()
    pr = _procs(t, variant)
    prefixes = [x for n in range(GAMMA + 1) for x in itertools.product(range(V), repeat=n)]
    req = ToyRequest(
        V,
        GAMMA,
        p={x: _p(target, x, t, pr) for x in prefixes},
        q={x: _q(U, w1, w2, x, t) for x in prefixes if len(x) < GAMMA},
        c={},
    )
    want = _target_joint(target, t, pr)
    for n_verified in range(GAMMA + 1):
        full: dict = {}
        from collections import defaultdict

        full = defaultdict(float)
        for x in itertools.product(range(V), repeat=GAMMA):
            round_output(req, x, n_verified, req.draft_prob(x), full)
        got = defaultdict(float)
        for seq, w in full.items():
            got[seq[:3]] += w
        assert total_variation(got, want) < 1e-6  # float32 p and q, (t, n_verified)


def _run_rounds(t: float, variant: str, verify_len: int, wrong: bool, seed: int) -> np.ndarray:
    U, w1, w2, target = _toy()
    pr = _procs(t, variant)
    R = N_ROUNDS
    ids = torch.arange(R, dtype=torch.int64) + verify_len * 10_000_000
    temp = torch.full((R,), t)
    x, z, _ = dspark.ops.markov_sample(
        U.expand(R, GAMMA, V).contiguous(), torch.full((R,), ANCHOR), w1, w2, temp, seed, 7, ids
    )
    # target rows: row i of request r is the logits after the prefix x_1..x_i
    codes = {p: i for i, p in enumerate(target)}
    table = torch.stack(list(target.values()))
    n = verify_len
    rows = []
    code = torch.full((R,), codes[()], dtype=torch.int64)
    pow_code = torch.zeros(R, dtype=torch.int64)
    for i in range(n):
        if i > 0:
            pow_code = pow_code * V + x[:, i - 1]
            base = sum(V**m for m in range(i))  # prefixes are ordered by length, then lexicographically
            code = base + pow_code
        rows.append(table[code])
    tl = torch.stack(rows, dim=1).reshape(R * n, V)
    qo = torch.arange(R + 1, dtype=torch.int32) * n
    kw = {}
    if variant == "processed":
        kw = dict(
            top_k=torch.full((R,), pr["top_k"]),
            top_p=torch.full((R,), pr["top_p"]),
            repetition_penalty=torch.full((R,), pr["penalty"]),
            penalty_tokens=torch.zeros(R, dtype=torch.int64),
            penalty_indptr=torch.arange(R + 1, dtype=torch.int64),
        )
    q_logits = z * 0.6 if wrong else z  # wrong: q is not the law the drafts were drawn from
    acc, out = dspark.ops.rejection_sample(
        tl, qo, q_logits, x, torch.full((R,), n, dtype=torch.int32), temp, seed, 8, ids, **kw
    )
    seqs = out[:, :3].clone()
    # continue with target draws where the round emitted fewer than 3 tokens (p tables indexed by prefix code)
    gen = torch.Generator().manual_seed(seed)
    emitted_t = acc + 1
    for k in range(3):
        need = (emitted_t <= k).nonzero().flatten()
        if len(need) == 0:
            continue
        pre = list(itertools.product(range(V), repeat=k))
        ptab = torch.tensor([_p(target, pp, t, pr) for pp in pre])
        pcode = torch.zeros(len(need), dtype=torch.int64)
        for m in range(k):
            pcode = pcode * V + seqs[need, m]
        seqs[need, k] = torch.multinomial(ptab[pcode], 1, generator=gen).flatten()
    flat = (seqs[:, 0] * V + seqs[:, 1]) * V + seqs[:, 2]
    return np.bincount(flat.numpy(), minlength=V**3)


def _chi2_p(counts: np.ndarray, probs: np.ndarray) -> float:
    n = counts.sum()
    exp = probs * n
    mask = exp > 0
    stat = float((((counts - exp) ** 2)[mask] / exp[mask]).sum())
    dof = int(mask.sum()) - 1
    # Wilson-Hilferty normal approximation of the chi-square upper tail
    zval = ((stat / dof) ** (1 / 3) - (1 - 2 / (9 * dof))) / math.sqrt(2 / (9 * dof))
    return 0.5 * math.erfc(zval / math.sqrt(2))


def _check(t, variant, verify_len, wrong, seed=0):
    _, _, _, target = _toy()
    want = _target_joint(target, t, _procs(t, variant))
    probs = np.array([want[x] for x in itertools.product(range(V), repeat=3)])
    counts = _run_rounds(t, variant, verify_len, wrong, seed)
    tv = 0.5 * float(np.abs(counts / counts.sum() - probs).sum())
    return _chi2_p(counts, probs), tv


@pytest.mark.slow
@pytest.mark.parametrize("t", [0.5, 1.0, 1.5])
@pytest.mark.parametrize("verify_len", [1, 2, 3, 4])
def test_monte_carlo_real_ops(t, verify_len):
    p, tv = _check(t, "plain", verify_len, wrong=False, seed=verify_len)
    assert p > 1e-3 and tv < 0.01, (p, tv)


@pytest.mark.slow
@pytest.mark.parametrize("verify_len", [2, 4])
def test_monte_carlo_with_processors(verify_len):
    p, tv = _check(1.0, "processed", verify_len, wrong=False, seed=11)
    assert p > 1e-3 and tv < 0.01, (p, tv)


@pytest.mark.slow
def test_wrong_q_fails():
    p, tv = _check(1.0, "plain", 4, wrong=True, seed=3)
    assert p < 1e-3, (p, tv)
