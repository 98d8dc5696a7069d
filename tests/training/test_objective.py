# SPDX-License-Identifier: Apache-2.0
"""The training forward equals serving's draft forward; the loss terms equal a direct per-slot computation."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from dspark.training.features import target_features
from dspark.training.objective import (
    LossWeights,
    _compiled_terms,
    _compiled_vocab_terms,
    block_hidden,
    block_loss,
    cosine_lr,
    draft_vocab_terms,
    sample_anchors,
    tau_estimate,
    vocab_terms,
)
from tests.decoding.toy_models import random_drafter, tiny_target


@pytest.fixture(scope="module")
def pair():
    t = tiny_target("llama", vocab=96, layers=4)
    for p in t.parameters():
        p.requires_grad_(False)
    d = random_drafter(t, block_size=4, markov_rank=8)
    return t, d


def _seq(n: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, 90, (n,), generator=torch.Generator().manual_seed(seed))


def test_block_hidden_equals_serving_draft(pair):
    t, d = pair
    ids = _seq(30)
    feats, _ = target_features(t, ids, d.config.target_layer_ids)
    anchors = torch.tensor([0, 5, 17, 29])
    h_train = block_hidden(d, feats, ids, anchors)
    for i, a in enumerate(anchors.tolist()):
        d.finish_all()
        rid = 100 + i
        d.append_context([rid], [feats[:a]])
        out = d.draft([rid], ids[a : a + 1], temperature=0.0)
        torch.testing.assert_close(h_train[i], out.hidden[0], atol=2e-5, rtol=1e-5)
    d.finish_all()


def test_target_features_match_hf_hidden_states(pair):
    t, d = pair
    ids = _seq(12, seed=3)
    feats, last = target_features(t, ids, d.config.target_layer_ids)
    out = t(input_ids=ids.view(1, -1), output_hidden_states=True)
    ref = torch.cat([out.hidden_states[i + 1][0] for i in d.config.target_layer_ids], -1)
    torch.testing.assert_close(feats, ref)
    torch.testing.assert_close(F.linear(last, t.lm_head.weight), out.logits[0], atol=1e-5, rtol=1e-5)


def test_target_features_embedding_tap_and_bad_layer_ids(pair):
    t, _ = pair
    ids = _seq(9, seed=4)
    feats, _ = target_features(t, ids, [-1, 2])  # -1: the embedding output, HF's hidden_states[0]
    out = t(input_ids=ids.view(1, -1), output_hidden_states=True)
    torch.testing.assert_close(feats, torch.cat([out.hidden_states[0][0], out.hidden_states[3][0]], -1))
    for bad in ([-2, 1], [1, 4]):  # the target has 4 layers
        with pytest.raises(ValueError, match="layer_ids"):
            target_features(t, ids, bad)


def _case(t, d, S: int, seed: int, prompt_len: int):
    """A random sequence of ``S`` tokens whose response starts at ``prompt_len``: ids, loss mask, features."""
    ids = _seq(S, seed=seed)
    mask = torch.zeros(S, dtype=torch.bool)
    mask[prompt_len:] = True
    feats, last = target_features(t, ids, d.config.target_layer_ids)
    return ids, mask, feats, last


def _direct_means(d, t, feats, last, ids, anchors, decay: float, dv=None) -> dict:
    """The loss terms' weighted means computed slot by slot from their definitions: ``q`` over the draft ids
    ``dv`` (all ids when None) and 0 elsewhere, ``p`` the target's full distribution, CE over the slots whose
    label ``q`` can draw; ``skipped`` counts the others."""
    S, g = ids.numel(), d.config.block_size
    hidden = block_hidden(d, feats, ids, anchors)
    W = t.lm_head.weight
    V = W.shape[0]
    in_d = (
        torch.ones(V, dtype=torch.bool)
        if dv is None
        else torch.zeros(V, dtype=torch.bool).index_fill(0, dv, True)
    )
    num = {"ce": 0.0, "l1": 0.0, "bce": 0.0, "kl": 0.0}
    den = den_ce = 0.0
    skipped = 0
    for i, a in enumerate(anchors.tolist()):
        prev = int(ids[a])
        for j in range(g):
            lab = a + 1 + j
            if lab >= S:
                break
            e = d.markov_head.markov_w1.weight[prev]
            z = hidden[i, j] @ W.T + d.markov_head.markov_w2.weight @ e
            q = torch.zeros(V)
            q[in_d] = torch.softmax(z[in_d], -1)  # what serving draws from with this draft vocabulary
            p = torch.softmax(last[a + j] @ W.T, -1)
            l1 = float((q - p).abs().sum())
            kl = sum(
                float(p[v]) * math.log(float(p[v]) / float(q[v])) for v in range(V) if in_d[v] and p[v] > 0
            )
            c = float(d.confidence_head.proj(torch.cat([hidden[i, j], e]))[0])
            y = min(max(1 - 0.5 * l1, 0.0), 1.0)
            bce = -(y * math.log(1 / (1 + math.exp(-c))) + (1 - y) * math.log(1 - 1 / (1 + math.exp(-c))))
            wj = math.exp(-j / decay)
            if in_d[ids[lab]]:
                num["ce"] += wj * -math.log(float(q[ids[lab]]))
                den_ce += wj
            else:
                skipped += 1
            num["l1"] += wj * l1
            num["kl"] += wj * kl
            num["bce"] += wj * bce
            den += wj
            prev = int(ids[lab])
    out = {k: v / (den_ce if k == "ce" else den) for k, v in num.items()}
    return {**out, "skipped": skipped}


@torch.no_grad()
def test_loss_terms_match_direct_computation(pair):
    t, d = pair
    ids, mask, feats, last = _case(t, d, 20, seed=1, prompt_len=6)
    anchors = torch.tensor([6, 10, 16])  # anchor 16: slots past S-1 are not counted
    w = LossWeights(kl=0.5)
    lo = block_loss(d, feats, last, ids, mask, anchors, w)
    ref = _direct_means(d, t, feats, last, ids, anchors, w.decay)
    for k in ("ce", "l1", "kl", "bce"):
        assert getattr(lo, k).item() == pytest.approx(ref[k], rel=1e-4), k
    total = w.ce * ref["ce"] + w.l1 * ref["l1"] + w.kl * ref["kl"] + w.conf * ref["bce"]
    assert lo.loss.item() == pytest.approx(total, rel=1e-4)
    assert lo.counted.tolist() == [3, 3, 3, 2]


@torch.no_grad()
def test_draft_vocab_loss_terms_match_direct_computation(pair):
    """With draft ids D: q is a softmax over D, L1 is the distance to the full p, CE skips labels outside D."""
    t, d = pair
    ids, mask, feats, last = _case(t, d, 22, seed=5, prompt_len=5)
    anchors = torch.tensor([5, 9, 14, 19])
    labels_seen = set(ids[6:].tolist())
    outside = sorted(labels_seen)[::3]  # some labels fall outside D, so CE must skip them
    dv = torch.tensor([v for v in range(96) if v not in outside])
    w = LossWeights(kl=0.5)
    lo = block_loss(d, feats, last, ids, mask, anchors, w, draft_ids=dv)
    ref = _direct_means(d, t, feats, last, ids, anchors, w.decay, dv)
    assert ref["skipped"] > 0
    for k in ("ce", "l1", "kl", "bce"):
        assert getattr(lo, k).item() == pytest.approx(ref[k], rel=1e-4), k
    W = t.lm_head.weight
    # the cached fp32 normaliser (FeatureCache's p_lse) gives the same loss without the whole-vocabulary product
    lse = torch.logsumexp(last @ W.T, -1)
    lse[:5] = float("nan")  # prompt rows: never read
    cached = block_loss(d, feats, last, ids, mask, anchors, w, draft_ids=dv, p_lse=lse)
    for k in ("loss", "ce", "l1", "kl", "bce"):
        torch.testing.assert_close(getattr(cached, k), getattr(lo, k), atol=1e-5, rtol=1e-5)
    # the whole vocabulary as D gives the plain loss
    full = block_loss(d, feats, last, ids, mask, anchors, w)
    every = block_loss(d, feats, last, ids, mask, anchors, w, draft_ids=torch.arange(96))
    for k in ("loss", "ce", "l1", "kl", "bce"):
        torch.testing.assert_close(getattr(every, k), getattr(full, k), atol=1e-5, rtol=1e-5)


def test_draft_vocab_terms_equal_full_terms_of_the_zero_extended_q():
    """draft_vocab_terms' L1 / CE are vocab_terms' for the same q put on the whole vocabulary (0 outside D)."""
    gen = torch.Generator().manual_seed(2)
    V, A = 64, 3
    dv = torch.randperm(V, generator=gen)[:40].sort().values
    z = torch.randn(A, 4, dv.numel(), generator=gen, requires_grad=True)
    bias = torch.randn(A, 4, dv.numel(), generator=gen, requires_grad=True)
    p_full = torch.randn(A, 4, V, generator=gen) * 3
    lab = torch.randint(0, dv.numel(), (A, 4), generator=gen)
    got = draft_vocab_terms(z, bias, p_full[..., dv], torch.logsumexp(p_full, -1), lab)
    z_full = torch.full((A, 4, V), -1e4).index_copy(-1, dv, (z + bias).detach())
    ref = vocab_terms(z_full, None, p_full, dv[lab])
    torch.testing.assert_close(got[0], ref[0])
    torch.testing.assert_close(got[1], ref[1])
    comp = _compiled_terms(draft_vocab_terms)(z, bias, p_full[..., dv], torch.logsumexp(p_full, -1), lab)
    ge = torch.autograd.grad(sum(x.sum() for x in got), (z, bias))
    gc = torch.autograd.grad(sum(x.sum() for x in comp), (z, bias))
    for a, b in zip(got + ge, comp + gc, strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


def test_anchor_sampling_respects_mask_and_count():
    mask = torch.tensor([0, 0, 1, 1, 1, 0, 1, 1, 1, 1], dtype=torch.bool)
    allowed = {2, 3, 6, 7, 8}
    got = sample_anchors(mask, 3, torch.Generator().manual_seed(0))
    assert got.numel() == 3 and set(got.tolist()) <= allowed and got.tolist() == sorted(got.tolist())
    assert set(sample_anchors(mask, 100).tolist()) == allowed
    seen = set()
    for s in range(50):
        seen |= set(sample_anchors(mask, 2, torch.Generator().manual_seed(s)).tolist())
    assert seen == allowed  # every candidate can be drawn


def test_schedule_and_tau():
    total, base = 100, 1.0
    lrs = [cosine_lr(s, total, base, 0.04) for s in range(total)]
    assert lrs[0] == pytest.approx(0.25) and lrs[3] == pytest.approx(1.0)
    assert all(a >= b for a, b in zip(lrs[3:], lrs[4:], strict=False))
    assert lrs[-1] < 0.01
    assert tau_estimate(torch.tensor([1.0, 1.0, 0.0])) == pytest.approx(3.0)
    assert tau_estimate(torch.tensor([0.5, 0.5])) == pytest.approx(1.75)


def test_dflash_ablation_has_no_markov_or_confidence_terms():
    t = tiny_target("llama", vocab=96, layers=4)
    d = random_drafter(t, block_size=4, markov_rank=0)
    assert d.markov_head is None and d.confidence_head is None
    ids = _seq(16)
    mask = torch.ones(16, dtype=torch.bool)
    feats, last = target_features(t, ids, d.config.target_layer_ids)
    lo = block_loss(d, feats, last, ids, mask, torch.tensor([2, 7]))
    assert lo.bce.item() == 0.0 and lo.conf_pred is None
    assert lo.loss.item() == pytest.approx(0.1 * lo.ce.item() + 0.9 * lo.l1.item(), rel=1e-5)


def test_compiled_vocab_terms_equal_eager():
    g = torch.Generator().manual_seed(0)
    for A in (3, 5):  # two anchor counts: the compiled graph is shape-dynamic
        z = torch.randn(A, 4, 96, generator=g, requires_grad=True)
        bias = torch.randn(A, 4, 96, generator=g, requires_grad=True)
        p = torch.randn(A, 4, 96, generator=g)
        lab = torch.randint(0, 96, (A, 4), generator=g)
        eager = vocab_terms(z, bias, p, lab)
        grads_e = torch.autograd.grad(sum(x.sum() for x in eager), (z, bias))
        comp = _compiled_vocab_terms()(z, bias, p, lab)
        grads_c = torch.autograd.grad(sum(x.sum() for x in comp), (z, bias))
        for a, b in zip(eager + grads_e, comp + grads_c, strict=True):
            torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
        ce_ref = F.cross_entropy((z + bias).flatten(0, 1), lab.flatten(), reduction="none").view(A, 4)
        torch.testing.assert_close(eager[1], ce_ref)
    import dspark.training.objective as obj

    assert not obj._COMPILED.get("failed")  # the compiled path really ran (no silent eager fallback)


def test_compile_failure_falls_back_to_eager_with_a_warning(monkeypatch):
    import dspark.training.objective as obj

    def broken(fn, **kw):
        def call(*a):
            raise RuntimeError("no C++ compiler")

        return call

    monkeypatch.setattr(obj, "_COMPILED", {})
    monkeypatch.setattr(obj.torch, "compile", broken)
    g = torch.Generator().manual_seed(1)
    z, p = torch.randn(2, 3, 16, generator=g), torch.randn(2, 3, 16, generator=g)
    lab = torch.randint(0, 16, (2, 3), generator=g)
    with pytest.warns(UserWarning, match="no C\\+\\+ compiler"):
        got = obj._compiled_vocab_terms()(z, None, p, lab)
    for a, b in zip(got, vocab_terms(z, None, p, lab), strict=True):
        torch.testing.assert_close(a, b)
