# SPDX-License-Identifier: Apache-2.0
"""Exact enumeration of one speculative round's output distribution on toy instances.

A toy request has a vocabulary of V tokens, a target p(. | prefix) and a draft q(. | prefix) for every prefix,
and a confidence c_k(x_{<k}) for every draft position (it may depend only on earlier draws, as the Markov
confidence head does). One round: draw x_1..x_gamma from q, plan verify lengths from the survivals of all
requests, verify with standard rejection sampling (accept x_k w.p. min(1, p/q), else a residual draw from
norm(max(p - q, 0)); a bonus from p after a fully accepted prefix), then continue with target draws up to
gamma + 1 tokens. A lossless round gives every request exactly the target's distribution over those tokens.
"""

from __future__ import annotations

import itertools
import random
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass

import torch


@dataclass
class ToyRequest:
    V: int
    gamma: int
    p: dict  # prefix tuple -> list of V probabilities (target)
    q: dict  # prefix tuple -> list of V probabilities (draft)
    c: dict  # prefix tuple (length k-1) -> confidence of draft k

    def survival(self, x: tuple) -> list[float]:
        a, out = 1.0, []
        for k in range(self.gamma):
            a *= self.c[x[:k]]
            out.append(a)
        return out

    def draft_prob(self, x: tuple) -> float:
        w = 1.0
        for k, tok in enumerate(x):
            w *= self.q[x[:k]][tok]
        return w


def random_request(rng: random.Random, V: int, gamma: int, zero_conf: float = 0.2) -> ToyRequest:
    def dist():
        w = [rng.random() ** 2 + 1e-3 for _ in range(V)]
        s = sum(w)
        return [x / s for x in w]

    prefixes = [t for n in range(gamma + 1) for t in itertools.product(range(V), repeat=n)]
    p = {t: dist() for t in prefixes}
    q = {t: dist() for t in prefixes if len(t) < gamma}
    c = {t: (0.0 if rng.random() < zero_conf else rng.random()) for t in prefixes if len(t) < gamma}
    return ToyRequest(V, gamma, p, q, c)


def _continue_with_target(req: ToyRequest, prefix: tuple, weight: float, out: dict) -> None:
    if len(prefix) == req.gamma + 1:
        out[prefix] += weight
        return
    for tok, pr in enumerate(req.p[prefix]):
        if pr > 0:
            _continue_with_target(req, prefix + (tok,), weight * pr, out)


def round_output(req: ToyRequest, x: tuple, n_verified: int, weight: float, out: dict) -> None:
    """Add to ``out`` the distribution of the gamma+1 output tokens given drafts x and n_verified drafts."""
    prefix = ()
    for k in range(n_verified):
        p, q = req.p[prefix], req.q[prefix]
        tok = x[k]
        acc = min(1.0, p[tok] / q[tok])
        resid = [max(pi - qi, 0.0) for pi, qi in zip(p, q, strict=True)]
        z = sum(resid)
        if acc < 1.0:
            for y, ry in enumerate(resid):
                if ry > 0:
                    _continue_with_target(req, prefix + (y,), weight * (1 - acc) * ry / z, out)
        weight *= acc
        if weight == 0:
            return
        prefix = prefix + (tok,)
    # every verified draft accepted: bonus (and the rest) from the target
    _continue_with_target(req, prefix, weight, out)


def target_output(req: ToyRequest) -> dict:
    out: dict = defaultdict(float)
    _continue_with_target(req, (), 1.0, out)
    return out


def round_distributions(reqs: list[ToyRequest], plan: Callable[[torch.Tensor], list[int]]) -> list[dict]:
    """Exact per-request output distributions of one round under the planner ``plan(survival) -> verify_len``."""
    outs = [defaultdict(float) for _ in reqs]
    spaces = [list(itertools.product(range(r.V), repeat=r.gamma)) for r in reqs]
    for xs in itertools.product(*spaces):
        w = 1.0
        for r, x in zip(reqs, xs, strict=True):
            w *= r.draft_prob(x)
        if w == 0:
            continue
        surv = torch.tensor([r.survival(x) for r, x in zip(reqs, xs, strict=True)], dtype=torch.float32)
        verify_len = plan(surv)
        for i, (r, x) in enumerate(zip(reqs, xs, strict=True)):
            round_output(r, x, int(verify_len[i]) - 1, w, outs[i])
    return outs


def total_variation(a: dict, b: dict) -> float:
    keys = set(a) | set(b)
    return 0.5 * sum(abs(a.get(k, 0.0) - b.get(k, 0.0)) for k in keys)
