# SPDX-License-Identifier: Apache-2.0
"""Reference of ``dspark::rejection_sample``: one request and one row at a time, same float32 rounding.

Also ``target_probs_ref``: the processed target distribution p of one verify row (what plain decoding
samples from), and ``draft_probs_ref``: q = softmax(z / T).
"""

from __future__ import annotations

import torch
from torch import Tensor

from dspark.reference import sampling_math as sm


def _penalize(x: Tensor, penalty: float) -> Tensor:
    return torch.where(x < 0, x * sm.f32(penalty), x / sm.f32(penalty))


def scaled_weights_ref(
    logits: Tensor,
    temperature: float,
    top_k: int = 0,
    penalty: float = 1.0,
    seen_tokens: list[int] | None = None,
) -> tuple[int, Tensor, Tensor | None]:
    """A target row before top-p: (argmax, y, w) — ``y`` the penalised scaled logits ``(V,)``, ``w`` their
    unnormalised weights ``exp(y - max)`` zeroed below the top-k threshold (None when greedy).

    HF order: repetition penalty on raw logits (tokens in ``seen_tokens``, each once), ``/ T``, top-k (keep
    values >= the k-th largest).
    """
    raw = logits.float()
    y = raw.clone()
    if penalty != 1.0 and seen_tokens:
        idx = torch.tensor(sorted(set(seen_tokens)), dtype=torch.int64)
        y[idx] = _penalize(raw[idx], penalty)
    greedy = temperature == 0.0
    if not greedy:
        y = y / sm.f32(temperature)
    arg = int(torch.argmax(y))
    if greedy:
        return arg, y, None
    V = y.shape[0]
    lo, hi = sm.ordered_key(float("-inf")), sm.ordered_key(float(y[arg]))
    thr = torch.tensor(float("-inf"))
    if 0 < top_k < V:
        thr = sm.key_to_float(sm.search_key(lo, hi, lambda v: int((y > v).sum()) < top_k))
    return arg, y, torch.where(y >= thr, sm.exp_exact(y - y[arg]), torch.zeros_like(y))


def target_probs_ref(
    logits: Tensor,
    temperature: float,
    top_k: int = 0,
    top_p: float = 1.0,
    penalty: float = 1.0,
    seen_tokens: list[int] | None = None,
) -> tuple[int, Tensor | None]:
    """Processed target row: (argmax of the penalised scaled logits, p or None when greedy).

    :func:`scaled_weights_ref`, then top-p (keep value classes whose strictly higher mass is < top_p).
    """
    arg, y, w = scaled_weights_ref(logits, temperature, top_k, penalty, seen_tokens)
    if w is None:
        return arg, None
    if top_p < 1.0:
        lo, hi = sm.ordered_key(float("-inf")), sm.ordered_key(float(y[arg]))
        target = sm.f32(top_p) * sm.lane_sum(w)
        thr_p = sm.key_to_float(
            sm.search_key(lo, hi, lambda v: bool(sm.lane_sum(torch.where(y > v, w, 0.0)) < target))
        )
        w = torch.where(y >= thr_p, w, torch.zeros_like(w))
    return arg, w / sm.lane_sum(w)


def draft_probs_ref(z: Tensor, temperature: float) -> Tensor:
    """q = softmax(z / T) with the ops' exp and fixed-order sum."""
    y = z.float() / sm.f32(temperature)
    f = sm.exp_exact(y - y.max())
    return f / sm.lane_sum(f)


def _draw(weights: Tensor, seed: int, offset: int, request: int, position: int) -> int:
    """Gumbel-max over log(weights) restricted to weights > 0; -1 if none."""
    V = weights.shape[0]
    pos = weights > 0
    if not bool(pos.any()):
        return -1
    _, g = torch.ops.dspark.philox_draw.default(
        seed,
        offset,
        torch.full((V,), request, dtype=torch.int64),
        torch.full((V,), position, dtype=torch.int64),
        sm.RESIDUAL_PURPOSE,
        torch.arange(V, dtype=torch.int64),
    )
    key = sm.log_positive(torch.where(pos, weights, sm.f32(1.0))) + g
    key = torch.where(pos, key, torch.tensor(float("-inf")))
    return int(torch.argmax(key))


def _uniform(seed: int, offset: int, request: int, position: int) -> Tensor:
    one = torch.ones(1, dtype=torch.int64)
    u, _ = torch.ops.dspark.philox_draw.default(
        seed, offset, one * request, one * position, sm.ACCEPT_PURPOSE, one * 0
    )
    return u[0]


def rejection_sample_ref(
    target_logits: Tensor,
    qo_indptr: Tensor,
    draft_logits: Tensor | None,
    draft_tokens: Tensor,
    verify_len: Tensor,
    temperature: Tensor,
    seed: int,
    offset: int,
    request_ids: Tensor | None = None,
    top_k: Tensor | None = None,
    top_p: Tensor | None = None,
    repetition_penalty: Tensor | None = None,
    penalty_tokens: Tensor | None = None,
    penalty_indptr: Tensor | None = None,
    draft_one_hot: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """target_logits ``(T, V)``, qo_indptr ``(R+1,)``, draft_logits ``(R, g, V)`` or None, draft_tokens ``(R, g)``,
    verify_len ``(R,)``, temperature ``(R,)``, draft_one_hot ``(R,)`` bool or None -> accepted ``(R,)`` int32,
    out_tokens ``(R, g+1)`` int64.

    A request with ``draft_one_hot[r]`` (every request when ``draft_logits`` is None) proposes deterministically:
    q one-hot at x, so accept iff ``u * 1 < p(x)`` and the residual ``(p - onehot_x)+`` is p with x zeroed."""
    R, G = draft_tokens.shape
    accepted = torch.zeros(R, dtype=torch.int32)
    out = torch.full((R, G + 1), -1, dtype=torch.int64)
    for r in range(R):
        req = r if request_ids is None else int(request_ids[r])
        t = float(temperature[r])
        k = 0 if top_k is None else int(top_k[r])
        tp = 1.0 if top_p is None else float(top_p[r])
        pen = 1.0 if repetition_penalty is None else float(repetition_penalty[r])
        ctx: list[int] = []
        if penalty_tokens is not None:
            ctx = penalty_tokens[int(penalty_indptr[r]) : int(penalty_indptr[r + 1])].tolist()
        n = int(verify_len[r])
        drafts = draft_tokens[r].tolist()
        one_hot = draft_logits is None or (draft_one_hot is not None and bool(draft_one_hot[r]))
        for i in range(n):
            row = target_logits[int(qo_indptr[r]) + i]
            arg, p = target_probs_ref(row, t, k, tp, pen, ctx + drafts[:i])
            if i == n - 1:
                out[r, i] = arg if p is None else _draw(p, seed, offset, req, i)
                break
            x = drafts[i]
            if p is None:
                out[r, i] = x if arg == x else arg
                if arg != x:
                    break
                accepted[r] += 1
                continue
            u = _uniform(seed, offset, req, i)
            if one_hot:
                if bool(u * sm.f32(1.0) < p[x]):
                    out[r, i] = x
                    accepted[r] += 1
                    continue
                resid = p.clone()
                resid[x] = 0.0  # (p - onehot_x)+
                c = _draw(resid, seed, offset, req, i)
                out[r, i] = c if c >= 0 else _draw(p, seed, offset, req, i)
                break
            q = draft_probs_ref(draft_logits[r, i], t)
            if bool(u * q[x] < p[x]):
                out[r, i] = x
                accepted[r] += 1
                continue
            c = _draw(p - q, seed, offset, req, i)
            out[r, i] = c if c >= 0 else _draw(p, seed, offset, req, i)
            break
    return accepted, out
