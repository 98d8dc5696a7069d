# SPDX-License-Identifier: Apache-2.0
"""DeepSpec's training objective for a DSpark drafter (reference/deepspec-checkpoint.md §6).

Per sequence ``x`` ``[S]`` with target features ``F`` ``[S, m*H]`` and final-normed target hidden ``Hl`` ``[S, H]``:

* anchors: up to ``num_anchors`` positions ``a`` with ``loss_mask[a]`` and ``loss_mask[a + 1]``, drawn uniformly
  without replacement and sorted;
* one block per anchor: tokens ``[x_a, MASK x (γ-1)]`` at positions ``a .. a+γ-1``; its queries see the context
  rows ``< a`` (``hidden_norm(fc(F))``, projected by every layer's K/V) and their own block (bidirectional) —
  exactly what :meth:`DSparkDrafter.draft` computes at serving time;
* slot ``j`` predicts ``x[a+1+j]``; a slot counts while its label is a response token (a contiguous prefix);
* teacher-forced Markov head: ``z_j = U_j + W2·W1[prev_j]`` with ``prev = [x_a, x_{a+1} .. x_{a+γ-1}]``;
* target distribution of slot ``j``: ``softmax(lm_head(Hl[a + j]))``;
* loss ``ce_w·CE + l1_w·L1 + conf_w·BCE(c_j, clamp(1 - L1/2, 0, 1))`` with ``L1 = Σ_v |softmax(z) - p|`` (= 2 TV,
  not halved, as DeepSpec), each term ``Σ w·loss / Σ w`` with ``w_j = exp(-j / decay)`` on counted slots.

With ``markov_rank = 0`` and no confidence head the same code trains the DFlash ablation (``z = U``).

With a draft vocabulary (``draft_ids``, the ids the drafter will be served with) ``q`` is a softmax over those
ids only, as :meth:`DSparkDrafter.draft` computes it with ``set_draft_vocab``: ``L1`` is still the distance to
the target's full ``p`` (``Σ_{v in D} |q - p| + (1 - Σ_{v in D} p)``, so ``1 - L1/2 = Σ min(p, q)`` is the served
acceptance), CE counts only slots whose label is a draft id, and the logged KL is its part over the draft ids.
The drafter-side vocabulary work (the logits GEMM and its two backward GEMMs, the softmax passes) shrinks by
``V / V'``.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from dspark.models.block_inputs import block_embeddings, context_rows
from dspark.models.drafter import DSparkDrafter
from dspark.models.heads import VanillaMarkovHead
from dspark.training.copy_inputs import anchor_copy_inputs


@dataclass
class LossWeights:
    """Coefficients of the loss terms and the position decay (DeepSpec's recipe by default).

    ``kl`` weights an optional forward KL ``Σ_v p (log p - log q)`` to the target's distribution (0 in DeepSpec's
    recipe): unlike L1, whose gradient at a token is scaled by ``q`` there, its gradient ``q - p`` stays large
    while the drafter puts little mass where the target does.
    """

    ce: float = 0.1
    l1: float = 0.9
    conf: float = 1.0
    decay: float = 4.0
    kl: float = 0.0


def sample_anchors(loss_mask: Tensor, num_anchors: int, generator: torch.Generator | None = None) -> Tensor:
    """Sorted anchor positions ``[A]``: ``p`` with ``loss_mask[p] & loss_mask[p+1]``, ``A <= num_anchors``."""
    m = loss_mask.bool()
    cand = torch.nonzero(m[:-1] & m[1:]).view(-1)
    if cand.numel() > num_anchors:
        pick = torch.randperm(cand.numel(), generator=generator)[:num_anchors]
        cand = cand[pick]
    return cand.sort().values


def block_hidden(drafter: DSparkDrafter, features: Tensor, input_ids: Tensor, anchors: Tensor) -> Tensor:
    """Differentiable block forward of all anchors of one sequence: final-normed hidden ``(A, γ, H)``.

    Parameters
    ----------
    features : Tensor
        ``(S, m*H)`` target features of the whole sequence (context rows at positions ``0 .. S-1``).
    input_ids : Tensor
        ``(S,)`` int64.
    anchors : Tensor
        ``(A,)`` int64 anchor positions in ``[0, S)``, sorted.

    The block inputs are ``block_inputs.block_embeddings``'s, as at serving time: with a copy channel each
    anchor's lookup continuation over ``x[0 .. a]``, with a context projection the context row ``a - 1``.
    """
    c = drafter.config
    dev, dt = drafter.device, drafter.dtype
    S, A, g = input_ids.numel(), anchors.numel(), c.block_size
    ctx = context_rows(drafter, features.to(device=dev, dtype=dt))  # [S, H]
    copy_tokens = copy_match = last_rows = None
    if c.copy_channel:
        copy_tokens, copy_match = (t.to(dev) for t in anchor_copy_inputs(input_ids.cpu(), anchors.cpu(), c))
    if c.context_projection:  # row a-1; an anchor at 0 has no context (zeros, as serving gives)
        prev = (anchors.to(dev) - 1).clamp_min(0)
        last_rows = ctx[prev] * (anchors.to(dev) > 0).unsqueeze(1).to(ctx.dtype)
    anchor_ids = input_ids.to(dev)[anchors.to(dev)]
    x = block_embeddings(drafter, anchor_ids, drafter.embed_weight, copy_tokens, copy_match, last_rows)
    pos_b = (anchors.to(dev).unsqueeze(1) + torch.arange(g, device=dev)).view(-1)
    cos_b, sin_b = drafter.rotary_emb.cos_sin(pos_b, dt)
    cos_c, sin_c = drafter.rotary_emb.cos_sin(torch.arange(S, device=dev), dt)
    # mask [A*g, S + A*g]: context key s visible iff s < anchor; block keys only within the same block
    owner = torch.arange(A, device=dev).repeat_interleave(g)
    ctx_vis = torch.arange(S, device=dev).unsqueeze(0) < anchors.to(dev).repeat_interleave(g).unsqueeze(1)
    blk_vis = owner.unsqueeze(1) == owner.unsqueeze(0)
    mask = torch.cat([ctx_vis, blk_vis], 1).view(1, 1, A * g, S + A * g)
    scale = c.head_dim**-0.5
    for layer in drafter.layers:
        attn = layer.self_attn
        h = layer.input_layernorm(x)
        q = attn.project_q(h, cos_b, sin_b)  # [A*g, nh, D]
        kb, vb = attn.project_kv(h, cos_b, sin_b)
        kc, vc = attn.project_kv(ctx, cos_c, sin_c)
        k = torch.cat([kc, kb], 0).transpose(0, 1).unsqueeze(0)
        v = torch.cat([vc, vb], 0).transpose(0, 1).unsqueeze(0)
        o = F.scaled_dot_product_attention(
            q.transpose(0, 1).unsqueeze(0), k, v, attn_mask=mask, scale=scale, enable_gqa=True
        )  # [1, nh, A*g, D]
        x = x + attn.o_proj(o[0].transpose(0, 1).reshape(A * g, -1))
        x = x + layer.mlp(layer.post_attention_layernorm(x))
    return drafter.norm(x).view(A, g, -1)


def block_labels(
    input_ids: Tensor, loss_mask: Tensor, anchors: Tensor, g: int
) -> tuple[Tensor, Tensor, Tensor]:
    """Per anchor and slot: ``labels`` ``x[a+1+j]``, ``counted`` (the contiguous prefix of slots whose label is a
    response token) and the teacher-forced previous tokens ``prev = [x_a, x_{a+1} .. x_{a+g-1}]``; all ``(A, g)``.
    """
    S = input_ids.numel()
    lab_pos = anchors.unsqueeze(1) + 1 + torch.arange(g, device=input_ids.device)  # [A, g]
    lab_pos_c = lab_pos.clamp(max=S - 1)
    counted = ((lab_pos < S) & loss_mask[lab_pos_c]).to(torch.int64).cumprod(1).bool()
    labels = input_ids[lab_pos_c]
    prev = torch.cat([input_ids[anchors].unsqueeze(1), labels[:, :-1]], 1)
    return labels, counted, prev


@dataclass
class LossOutput:
    """Total loss and the per-term / per-position diagnostics of one batch."""

    loss: Tensor
    ce: Tensor
    l1: Tensor
    bce: Tensor
    kl: Tensor  # forward KL(p || q), weighted like the others (logged even when its weight is 0)
    accept: Tensor  # [γ] mean of 1 - L1/2 over counted slots (DeepSpec's accept_rate@j)
    counted: Tensor  # [γ] number of counted slots
    conf_pred: Tensor | None  # [γ] mean sigmoid(conf) over counted slots


def block_loss(
    drafter: DSparkDrafter,
    features: Tensor,
    last_hidden: Tensor,
    input_ids: Tensor,
    loss_mask: Tensor,
    anchors: Tensor,
    weights: LossWeights | None = None,
    compile_loss: bool = False,
    lm_head: Tensor | None = None,
    draft_ids: Tensor | None = None,
    p_lse: Tensor | None = None,
) -> LossOutput:
    """DeepSpec's loss for one sequence's anchors (module docstring); ``last_hidden`` ``(S, H)``.

    ``compile_loss`` runs the vocabulary-sized loss terms through ``torch.compile`` (~3-4x faster on CPU).
    ``lm_head`` ``(V, H)``: the frozen LM head already in the compute dtype (saves a cast per call under
    autocast); the drafter's (aliased) LM head by default. ``draft_ids`` ``(V',)``: sorted distinct token ids
    the drafter drafts from (module docstring); None: the whole vocabulary. ``p_lse`` ``(S,)``: the target's
    fp32 log-normaliser per row (:class:`~dspark.training.features.FeatureCache`'s); with ``draft_ids`` it spares
    the whole-vocabulary product for ``p`` (ignored without ``draft_ids``).
    """
    w = weights or LossWeights()
    c = drafter.config
    dev = drafter.device
    S, g = input_ids.numel(), c.block_size
    ids = input_ids.to(dev)
    anchors = anchors.to(dev)
    hidden = block_hidden(drafter, features, ids, anchors)  # [A, g, H]
    head_w = drafter.lm_head_weight if lm_head is None else lm_head
    dv = None if draft_ids is None else draft_ids.to(dev)
    U = F.linear(hidden, head_w if dv is None else head_w.index_select(0, dv))  # [A, g, V or V']
    labels, counted, prev = block_labels(ids, loss_mask.to(dev), anchors, g)
    head = drafter.markov_head
    bias = None
    if head is None:
        z = U
        prev_emb = hidden.new_zeros(*hidden.shape[:2], 0)
    else:
        prev_emb = head.markov_w1(prev)
        if isinstance(head, VanillaMarkovHead):  # z = U + W2·W1[prev], added inside the fused loss terms
            w2 = head.markov_w2.weight
            z, bias = U, F.linear(prev_emb, w2 if dv is None else w2.index_select(0, dv))
        elif dv is not None:
            raise NotImplementedError(
                f"draft_ids: training over a draft vocabulary supports the vanilla Markov head only, "
                f"not {type(head).__name__}"
            )
        else:
            z = head(U, prev, hidden)
    with torch.no_grad():
        rows = (anchors.unsqueeze(1) + torch.arange(g, device=dev)).clamp(max=S - 1)  # [A, g]
        if dv is not None and p_lse is not None:  # p at the draft ids only, fp32 like the cached normaliser
            with torch.autocast(dev.type, enabled=False):
                w_p = drafter.lm_head_weight.index_select(0, dv).float()
                p_logits = F.linear(last_hidden.to(dev)[rows].float(), w_p)
            p_lse = p_lse.to(dev)[rows]
        else:
            p_logits = F.linear(last_hidden.to(dev, head_w.dtype)[rows], head_w)
            p_lse = None
    ce_counted = counted
    if dv is None:
        terms = _compiled_terms(vocab_terms) if compile_loss else vocab_terms
        l1, ce, kl = terms(z, bias, p_logits, labels)  # [A, g] each
    else:
        with torch.no_grad():
            if p_lse is None:
                p_lse = torch.logsumexp(p_logits.float(), -1)
                p_logits = p_logits.index_select(-1, dv)
            pos = torch.full((head_w.shape[0],), -1, dtype=torch.int64, device=dev)
            pos[dv] = torch.arange(dv.numel(), device=dev)
            labels = pos[labels]  # position in the draft vocabulary, -1 outside it
            ce_counted = counted & (labels >= 0)
        terms = _compiled_terms(draft_vocab_terms) if compile_loss else draft_vocab_terms
        l1, ce, kl = terms(z, bias, p_logits, p_lse, labels.clamp_min(0))
    pos_w = torch.exp(-torch.arange(g, device=dev, dtype=torch.float32) / w.decay)
    wt = counted.float() * pos_w
    denom = wt.sum().clamp_min(1e-6)
    wt_ce = ce_counted.float() * pos_w
    ce_m = (wt_ce * ce).sum() / wt_ce.sum().clamp_min(1e-6)
    l1_m = (wt * l1).sum() / denom
    kl_m = (wt * kl).sum() / denom
    bce_m = torch.zeros((), device=dev)
    conf_pred = None
    if drafter.confidence_head is not None:
        logit = drafter.confidence_head.logits(hidden, prev_emb)
        tgt = (1 - 0.5 * l1.detach()).clamp(0, 1)
        bce = F.binary_cross_entropy_with_logits(logit, tgt, reduction="none")
        bce_m = (wt * bce).sum() / denom
        with torch.no_grad():
            conf_pred = (torch.sigmoid(logit) * counted).sum(0) / counted.sum(0).clamp_min(1)
    loss = (
        w.ce * ce_m
        + w.l1 * l1_m
        + w.kl * kl_m
        + (w.conf * bce_m if drafter.confidence_head is not None else 0.0)
    )
    with torch.no_grad():
        n = counted.sum(0)
        acc = ((1 - 0.5 * l1) * counted).sum(0) / n.clamp_min(1)
    return LossOutput(loss, ce_m.detach(), l1_m.detach(), bce_m.detach(), kl_m.detach(), acc, n, conf_pred)


def vocab_terms(
    z: Tensor, bias: Tensor | None, p_logits: Tensor, labels: Tensor
) -> tuple[Tensor, Tensor, Tensor]:
    """``L1 = Σ_v |q - p|``, ``CE = -log q[label]`` and ``KL = Σ_v p (log p - log q)`` with
    ``q = softmax(z + bias)`` and ``p = softmax(p_logits)``, fp32.

    ``z``, ``bias`` (optional), ``p_logits``: ``[..., V]`` (any float dtype); ``labels``: ``[...]`` int64;
    all three outputs ``[...]``. The vocabulary-sized passes dominate a CPU training step;
    :func:`_compiled_vocab_terms` fuses them (same values).
    """
    z = z.float() if bias is None else z.float() + bias.float()
    logq = torch.log_softmax(z, -1)
    logp = torch.log_softmax(p_logits.float(), -1)
    p = logp.exp()
    l1 = (logq.exp() - p).abs().sum(-1)
    ce = -logq.gather(-1, labels.unsqueeze(-1)).squeeze(-1)
    kl = (p * (logp - logq)).sum(-1)
    return l1, ce, kl


def draft_vocab_terms(
    z: Tensor, bias: Tensor | None, p_logits: Tensor, p_lse: Tensor, labels: Tensor
) -> tuple[Tensor, Tensor, Tensor]:
    """:func:`vocab_terms` for a drafter that drafts from ``V'`` ids only: ``q = softmax(z + bias)`` over them,
    the target's ``p`` given by its logits at those ids and its full-vocabulary log-normaliser.

    ``z``, ``bias`` (optional), ``p_logits``: ``[..., V']``; ``p_lse``: ``[...]`` (``logsumexp`` of the target's
    logits over the whole vocabulary); ``labels``: ``[...]`` positions in the draft vocabulary. Returns
    ``L1 = Σ_{v in D} |q - p| + (1 - Σ_{v in D} p)`` (the full-vocabulary L1 of a ``q`` that is 0 outside ``D``),
    ``CE = -log q[label]`` and ``Σ_{v in D} p (log p - log q)``, all ``[...]`` fp32.
    """
    z = z.float() if bias is None else z.float() + bias.float()
    logq = torch.log_softmax(z, -1)
    logp = p_logits.float() - p_lse.float().unsqueeze(-1)
    p = logp.exp()
    l1 = (logq.exp() - p).abs().sum(-1) + (1 - p.sum(-1)).clamp_min(0)
    ce = -logq.gather(-1, labels.unsqueeze(-1)).squeeze(-1)
    kl = (p * (logp - logq)).sum(-1)
    return l1, ce, kl


_COMPILED: dict[str, object] = {}


def _compiled_vocab_terms():
    """:func:`vocab_terms` through ``torch.compile`` (see :func:`_compiled_terms`)."""
    return _compiled_terms(vocab_terms)


def _compiled_terms(fn):
    """``fn`` (:func:`vocab_terms` or :func:`draft_vocab_terms`) through ``torch.compile`` (dynamic shapes: the
    anchor count varies per sequence).

    If compiling fails (no C++ compiler for inductor, an unsupported backend), one warning names the error and
    the eager ``fn`` is used from then on: same values, slower.
    """
    name = fn.__name__
    if name not in _COMPILED:
        compiled = torch.compile(fn, dynamic=True)

        def run(*args):
            if _COMPILED.get("failed"):
                return fn(*args)
            try:
                return compiled(*args)
            except Exception as e:  # noqa: BLE001 - any compile failure falls back to the same eager math
                _COMPILED["failed"] = True
                warnings.warn(
                    f"compile_loss: torch.compile of the loss terms failed ({type(e).__name__}: {e}); "
                    "using the eager loss terms",
                    stacklevel=2,
                )
                return fn(*args)

        _COMPILED[name] = run
    return _COMPILED[name]


def tau_estimate(accept: Tensor) -> float:
    """DeepSpec's ``tau_probabilistic = 1 + Σ_k Π_{i<=k} accept_i`` from per-position acceptance ``[γ]``."""
    return 1.0 + float(torch.cumprod(accept.double(), 0).sum())


def cosine_lr(step: int, total: int, base: float, warmup_ratio: float = 0.04) -> float:
    """Linear warm-up for ``warmup_ratio * total`` steps, then cosine decay to 0 (DeepSpec's schedule)."""
    warm = max(1, int(round(warmup_ratio * total)))
    if step < warm:
        return base * (step + 1) / warm
    prog = min(1.0, (step - warm) / max(1, total - warm))
    return base * 0.5 * (1 + math.cos(math.pi * prog))
