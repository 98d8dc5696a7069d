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
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from dspark.models.block_inputs import block_embeddings, context_rows
from dspark.models.config import DrafterConfig
from dspark.models.drafter import DSparkDrafter
from dspark.models.heads import VanillaMarkovHead
from dspark.training.copy_inputs import anchor_copy_inputs
from dspark.training.features import Sample


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
    return packed_hidden(drafter, [features], [input_ids], [anchors])


def packed_copy_inputs(
    config: DrafterConfig, input_ids: list[Tensor], anchors: list[Tensor], device: torch.device
) -> tuple[Tensor, Tensor]:
    """The copy inputs ``(copy_tokens (ΣA, γ), copy_match (ΣA,))`` of several sequences' anchors, on ``device``
    (``copy_inputs.anchor_copy_inputs`` per sequence, in order)."""
    pairs = [anchor_copy_inputs(i.cpu(), a.cpu(), config) for i, a in zip(input_ids, anchors, strict=True)]
    return torch.cat([p[0] for p in pairs]).to(device), torch.cat([p[1] for p in pairs]).to(device)


def packed_hidden(
    drafter: DSparkDrafter,
    features: list[Tensor],
    input_ids: list[Tensor],
    anchors: list[Tensor],
    copy: tuple[Tensor, Tensor] | None = None,
) -> Tensor:
    """:func:`block_hidden` of several sequences at once: hidden ``(ΣA, γ, H)``, the sequences' anchors in order.

    Every projection and MLP runs once over the rows of all sequences (flattened anchors); attention runs per
    sequence (its blocks over its own context rows ``< a`` and their own block), so the result equals the
    sequences' :func:`block_hidden` stacked (tested) and a batch of long and short sequences pads nothing.
    ``features[i]`` ``(S_i, m*H)``, ``input_ids[i]`` ``(S_i,)``, ``anchors[i]`` ``(A_i,)`` sorted; ``copy``: the
    anchors' :func:`packed_copy_inputs` when the caller has them (computed here for a copy channel otherwise).
    """
    c = drafter.config
    dev, dt = drafter.device, drafter.dtype
    g = c.block_size
    lengths = [int(t.numel()) for t in input_ids]
    counts = [int(a.numel()) for a in anchors]
    anchors = [a.to(dev) for a in anchors]
    ctx = context_rows(drafter, torch.cat([f.to(device=dev, dtype=dt) for f in features]))  # [ΣS, H]
    ctxs = ctx.split(lengths)
    copy_tokens = copy_match = last_rows = None
    if c.copy_channel:
        copy_tokens, copy_match = copy if copy is not None else packed_copy_inputs(c, input_ids, anchors, dev)
    if c.context_projection:  # row a-1; an anchor at 0 has no context (zeros, as serving gives)
        last_rows = torch.cat(
            [
                x[(a - 1).clamp_min(0)] * (a > 0).unsqueeze(1).to(x.dtype)
                for x, a in zip(ctxs, anchors, strict=True)
            ]
        )
    anchor_ids = torch.cat([i.to(dev)[a] for i, a in zip(input_ids, anchors, strict=True)])
    x = block_embeddings(drafter, anchor_ids, drafter.embed_weight, copy_tokens, copy_match, last_rows)
    pos_b = torch.cat([a.unsqueeze(1) + torch.arange(g, device=dev) for a in anchors]).view(-1)
    cos_b, sin_b = drafter.rotary_emb.cos_sin(pos_b, dt)
    pos_c = torch.cat([torch.arange(n, device=dev) for n in lengths])
    cos_c, sin_c = drafter.rotary_emb.cos_sin(pos_c, dt)
    masks = []  # per sequence [A*g, S + A*g]: context key s visible iff s < anchor; block keys in-block only
    for n, a in zip(lengths, anchors, strict=True):
        owner = torch.arange(a.numel(), device=dev).repeat_interleave(g)
        ctx_vis = torch.arange(n, device=dev).unsqueeze(0) < a.repeat_interleave(g).unsqueeze(1)
        blk_vis = owner.unsqueeze(1) == owner.unsqueeze(0)
        masks.append(torch.cat([ctx_vis, blk_vis], 1).view(1, 1, a.numel() * g, n + a.numel() * g))
    scale = c.head_dim**-0.5
    rows_b = [k * g for k in counts]
    for layer in drafter.layers:
        attn = layer.self_attn
        h = layer.input_layernorm(x)
        q = attn.project_q(h, cos_b, sin_b)  # [ΣA*g, nh, D]
        kb, vb = attn.project_kv(h, cos_b, sin_b)
        kc, vc = attn.project_kv(ctx, cos_c, sin_c)
        outs = []
        for qi, kbi, vbi, kci, vci, m in zip(
            q.split(rows_b),
            kb.split(rows_b),
            vb.split(rows_b),
            kc.split(lengths),
            vc.split(lengths),
            masks,
            strict=True,
        ):
            k = torch.cat([kci, kbi], 0).transpose(0, 1).unsqueeze(0)
            v = torch.cat([vci, vbi], 0).transpose(0, 1).unsqueeze(0)
            o = F.scaled_dot_product_attention(
                qi.transpose(0, 1).unsqueeze(0), k, v, attn_mask=m, scale=scale, enable_gqa=True
            )  # [1, nh, A*g, D]
            outs.append(o[0].transpose(0, 1).reshape(qi.shape[0], -1))
        x = x + attn.o_proj(torch.cat(outs))
        x = x + layer.mlp(layer.post_attention_layernorm(x))
    return drafter.norm(x).view(sum(counts), g, -1)


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
    seq = Sample(input_ids, loss_mask, features, last_hidden, p_lse)
    return packed_block_loss(drafter, [seq], [anchors], weights, compile_loss, lm_head, draft_ids)


def packed_block_loss(
    drafter: DSparkDrafter,
    sequences: Sequence[Sample],
    anchors: Sequence[Tensor],
    weights: LossWeights | None = None,
    compile_loss: bool = False,
    lm_head: Tensor | None = None,
    draft_ids: Tensor | None = None,
) -> LossOutput:
    """:func:`block_loss` of several sequences in one pass (flattened anchors, :func:`packed_hidden`).

    Each term is still a mean over its own sequence's slots, and the returned ``loss`` and terms are the **sums**
    over the sequences of those means (for one sequence: :func:`block_loss`'s values), so a packed step's
    gradient equals the sum of the per-sequence gradients (tested). ``accept`` / ``counted`` / ``conf_pred`` pool
    the slots of all sequences. ``sequences[i].p_lse`` is used when every sequence has one.
    """
    w = weights or LossWeights()
    c = drafter.config
    dev = drafter.device
    g = c.block_size
    anchors = [a.to(dev) for a in anchors]
    ids = [s.input_ids.to(dev) for s in sequences]
    copy = packed_copy_inputs(c, ids, anchors, dev) if c.uses_copies else None
    hidden = packed_hidden(drafter, [s.features for s in sequences], ids, anchors, copy)  # [A, g, H]
    head_w = drafter.lm_head_weight if lm_head is None else lm_head
    dv = None if draft_ids is None else draft_ids.to(dev)
    U = F.linear(hidden, head_w if dv is None else head_w.index_select(0, dv))  # [A, g, V or V']
    if drafter.copy_head is not None:  # as serving adds it (DraftSteps.propose)
        U = drafter.copy_head.add_to_logits(U, hidden, *copy, dv)
    parts = [
        block_labels(i, s.loss_mask.to(dev), a, g) for i, s, a in zip(ids, sequences, anchors, strict=True)
    ]
    labels, counted, prev = (torch.cat([p[k] for p in parts]) for k in range(3))
    seg = torch.cat([torch.full((a.numel(),), k, device=dev) for k, a in enumerate(anchors)])  # anchor -> seq
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
        lengths = [i.numel() for i in ids]
        offsets = torch.tensor([0, *lengths[:-1]], device=dev).cumsum(0)
        rows = torch.cat(
            [
                o + (a.unsqueeze(1) + torch.arange(g, device=dev)).clamp(max=n - 1)
                for o, a, n in zip(offsets, anchors, lengths, strict=True)
            ]
        )  # [A, g] rows of the concatenated sequences
        last_hidden = torch.cat([s.last_hidden.to(dev) for s in sequences])
        p_lse = None
        if dv is not None and all(s.p_lse is not None for s in sequences):
            # p at the draft ids only, fp32 like the cached normaliser
            with torch.autocast(dev.type, enabled=False):
                w_p = drafter.lm_head_weight.index_select(0, dv).float()
                p_logits = F.linear(last_hidden[rows].float(), w_p)
            p_lse = torch.cat([s.p_lse.to(dev) for s in sequences])[rows]
        else:
            p_logits = F.linear(last_hidden.to(head_w.dtype)[rows], head_w)
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
    n_seq = len(sequences)

    def seq_means(term: Tensor, wt: Tensor) -> Tensor:
        """Σ over sequences of each sequence's weighted mean of ``term`` ``(A, g)``."""
        num = term.new_zeros(n_seq).index_add(0, seg, (wt * term).sum(1))
        den = wt.new_zeros(n_seq).index_add(0, seg, wt.sum(1))
        return (num / den.clamp_min(1e-6)).sum()

    wt = counted.float() * pos_w
    ce_m = seq_means(ce, ce_counted.float() * pos_w)
    l1_m = seq_means(l1, wt)
    kl_m = seq_means(kl, wt)
    bce_m = torch.zeros((), device=dev)
    conf_pred = None
    if drafter.confidence_head is not None:
        extra = None
        if drafter.copy_head is not None:  # teacher-forced previous tokens, as the Markov feature reads them
            extra = drafter.copy_head.confidence_inputs(prev, *copy)
        logit = drafter.confidence_head.logits(hidden, prev_emb, extra)
        tgt = (1 - 0.5 * l1.detach()).clamp(0, 1)
        bce_m = seq_means(F.binary_cross_entropy_with_logits(logit, tgt, reduction="none"), wt)
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
