# SPDX-License-Identifier: Apache-2.0
"""A ``DSparkDrafter``'s draft round: the block forward over each request's context (:meth:`DraftSteps.backbone`)
and the three steps the decoder runs one by one — :meth:`~DraftSteps.propose` (backbone + LM head),
:meth:`~DraftSteps.sample` (Markov sampling), :meth:`~DraftSteps.score` (confidence) — chained by
:meth:`~DraftSteps.draft`. A mixin of ``DSparkDrafter`` (docs/drafter.md), so the steps are the drafter's methods.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import torch
from torch import Tensor, nn

from dspark.host_sync import to_device
from dspark.models import cpu_linear
from dspark.models.block_batch import BlockBatch, BlockLayout
from dspark.models.block_inputs import block_embeddings, copy_inputs
from dspark.models.config import DrafterConfig
from dspark.models.context import PagedContexts
from dspark.models.cpu_linear import few_row_linears
from dspark.models.draft_vocab import expand_to_vocab
from dspark.models.drafter_graphs import DrafterGraphs
from dspark.models.drafter_head_graphs import DraftHeadGraphs
from dspark.models.heads import MarkovSample, VanillaMarkovHead, sample_without_markov
from dspark.ops import paged_verify_attention


@dataclasses.dataclass
class DraftOutput:
    """One draft round for R requests (γ = drafted slots, the block size unless fewer were asked for).

    tokens ``(R, γ)`` int64; draft_logits ``(R, γ, V)`` float32 (Markov-corrected ``z``; ``q = softmax(z/T)``);
    prev_emb ``(R, γ, r)`` (``W1[x_{k-1}]``, r = 0 without a Markov head); hidden ``(R, γ, H)`` final-normed;
    base_logits ``(R, γ, V)`` (``U = lm_head(hidden)``, plus the copy head's bonus for a drafter with one; None
    unless asked); conf_logit / conf / survival
    ``(R, γ)`` float32 (None without a confidence head). With a draft vocabulary the logits are still over the
    whole vocabulary, ``outside_logit`` (q = 0) at the ids outside it.
    """

    tokens: Tensor
    draft_logits: Tensor
    prev_emb: Tensor
    hidden: Tensor
    base_logits: Tensor | None = None
    conf_logit: Tensor | None = None
    conf: Tensor | None = None
    survival: Tensor | None = None


@dataclasses.dataclass
class DraftProposal:
    """What :meth:`DSparkDrafter.propose` hands to sampling: ``request_ids`` ``(R,)`` and ``anchors`` ``(R,)``
    int64 on the drafter's device, ``hidden`` ``(R, g, H)`` final-normed, ``base_logits`` ``U`` ``(R, g, V)``
    (``(R, g, V')`` over a draft vocabulary; with a copy head, its bonus included; None where the LM head is
    fused with the draw, :meth:`DraftSteps.lm_head_fused`), ``copy`` the copy inputs ``(copy_tokens (R, γ),
    copy_match (R,))`` on the device (None for a drafter that reads no copies)."""

    request_ids: Tensor
    anchors: Tensor
    hidden: Tensor
    base_logits: Tensor | None
    copy: tuple[Tensor, Tensor] | None = None


def previous_tokens(anchors: Tensor, tokens: Tensor) -> Tensor:
    """The token before each draft slot ``(R, g)``: the anchor ``(R,)``, then the drafts ``tokens[:, :-1]``."""
    return torch.cat([anchors.to(tokens.device, tokens.dtype).unsqueeze(1), tokens[:, :-1]], 1)


class DraftSteps:
    """The draft round of ``DSparkDrafter`` (mixed in). It reads what the drafter defines: the attributes below,
    ``embed_weight`` / ``lm_head_weight``, ``device`` / ``dtype`` and ``_vocab_tables()`` (the draft vocabulary's
    gathered rows, None without one)."""

    # set by DSparkDrafter.__init__ (annotations only: nn.Module resolves its submodules itself)
    config: DrafterConfig
    layers: nn.ModuleList
    norm: nn.Module
    rotary_emb: nn.Module
    markov_head: nn.Module | None
    confidence_head: nn.Module | None
    copy_head: nn.Module | None
    contexts: PagedContexts
    graphs: DrafterGraphs | None  # CUDA graphs of block_forward (drafter_graphs), or None
    fuse_lm_head: bool = True  # see lm_head_fused
    fused_lm_head_devices: tuple[str, ...] = ("cuda",)  # where the fused op pays (tests add "cpu")

    @property
    def _head_graphs(self) -> DraftHeadGraphs | None:
        """The CUDA graphs of the draw and the confidence step (``DrafterGraphs.heads``), or None."""
        return None if self.graphs is None else self.graphs.heads

    def lm_head_fused(self, hidden: Tensor) -> bool:
        """Whether a draft of ``hidden`` ``(R, g, H)`` runs the LM head inside the Markov draw
        (``dspark.ops.markov_sample_from_hidden``: ``U`` for every slot and the first slot's draw in one GEMM
        over the LM head, never stored apart from ``z``) rather than as its own linear: on CUDA, for a vanilla
        Markov head over the whole vocabulary, without a copy head (its bonus is added to ``U``), with the LM
        head in the hidden states' dtype, unless ``fuse_lm_head`` is False. On CPU the op would be the same
        matmul and draw, so the few-row linear path stays."""
        return (
            self.fuse_lm_head
            and hidden.device.type in self.fused_lm_head_devices
            and isinstance(self.markov_head, VanillaMarkovHead)
            and self.copy_head is None
            and self._vocab_tables() is None
            and self.lm_head_weight.dtype == hidden.dtype
        )

    def base_logits(self, proposal: DraftProposal) -> Tensor:
        """``U`` of a proposal ``(R, g, V)`` (``(R, g, V')`` over a draft vocabulary): its own, or computed here
        where :meth:`propose` left it to the draw (:meth:`defers_lm_head`)."""
        if proposal.base_logits is not None:
            return proposal.base_logits
        return self.lm_head_logits(proposal.hidden, proposal.copy)

    def lm_head_logits(self, hidden: Tensor, copy: tuple[Tensor, Tensor] | None) -> Tensor:
        """``U = lm_head(hidden)`` ``(R, g, V)`` for final-normed ``hidden`` ``(R, g, H)`` (``(R, g, V')`` over a
        draft vocabulary), plus the copy head's bonus for a drafter with one (``copy`` as in
        :class:`DraftProposal`)."""
        vocab = self._vocab_tables()
        R, g, _ = hidden.shape
        # 2-D rows: a sliced 3-D hidden can send F.linear down a batched path that copies the whole weight
        W = self.lm_head_weight if vocab is None else vocab.lm_head
        U = cpu_linear.linear(hidden.reshape(R * g, -1), W).view(R, g, -1)
        if self.copy_head is not None:
            U = self.copy_head.add_to_logits(U, hidden, *copy, None if vocab is None else vocab.token_ids)
        return U

    def defers_lm_head(self, hidden: Tensor) -> bool:
        """Whether :meth:`propose` leaves ``U`` to :meth:`sample`: where the LM head is fused with the draw
        (:meth:`lm_head_fused`), and where the sampling step is replayed from a CUDA graph that runs the LM head
        too (``DrafterGraphs.heads``; a round it cannot replay computes ``U`` eagerly in :meth:`sample`)."""
        heads = self._head_graphs
        return self.lm_head_fused(hidden) or (heads is not None and heads.active)

    def block_forward(
        self, anchors: Tensor, batch: BlockBatch, copy: tuple[Tensor, Tensor] | None = None
    ) -> Tensor:
        """Block forward of R requests whose blocks sit in the paged contexts (``batch``): ``[anchor, MASK x
        (s-1)]``, ``s = config.block_slots`` (plus the v2 inputs of ``block_inputs``: ``copy`` = ``(copy_tokens
        (R, γ), copy_match (R,))``) -> final-normed hidden ``(R, s, H)``. Every layer writes the block's K/V to
        its scratch slots and attends, without a mask, to the context and the whole block (one op call per layer
        for the batch). Device tensors only: no host read, so it can be captured in a CUDA graph."""
        c = self.config
        R, g = anchors.shape[0], c.block_slots
        store = self.contexts
        last_rows = None
        if c.context_projection:
            last_rows = store.last_rows(batch.last_slots)
        copy_tokens, copy_match = copy if copy is not None else (None, None)
        x = block_embeddings(self, anchors, self.embed_weight, copy_tokens, copy_match, last_rows)  # [R*g, H]
        cos, sin = self.rotary_emb.cos_sin(batch.positions, self.dtype)
        scale = c.head_dim**-0.5
        for li, layer in enumerate(self.layers):
            attn = layer.self_attn
            h = layer.input_layernorm(x)
            q = attn.project_q(h, cos, sin)  # [R*g, nh, D]
            k, v = attn.project_kv(h, cos, sin)  # [R*g, nkv, D]
            store.write(li, batch.slot_mapping, k, v)
            o = paged_verify_attention(
                q,
                store.k[li],
                store.v[li],
                batch.qo_indptr,
                batch.kv_indptr,
                batch.kv_indices,
                batch.kv_last_page_len,
                scale,
                causal=False,  # the block is bidirectional and sees its whole context
                split_base=batch.split_base,
            )
            x = x + attn.o_proj(o.reshape(R * g, -1))
            x = x + layer.mlp(layer.post_attention_layernorm(x))
        return self.norm(x).view(R, g, -1)

    def block_layout(
        self, ids: Sequence[int], starts: Sequence[int], lengths: Sequence[int], slots: list[int]
    ) -> BlockLayout:
        """The :class:`BlockLayout` of blocks opened in the contexts of ``ids`` (``PagedContexts.open_block``)
        at anchor positions ``starts``; ``lengths`` the contexts' committed lengths, ``slots`` the block slots."""
        g, store = self.config.block_slots, self.contexts
        kv_indptr, kv_indices, last = store.host_index(ids)
        last_slots = store.last_row_slots(ids, lengths) if self.config.context_projection else None
        positions = [s + j for s in starts for j in range(g)]
        return BlockLayout(g, positions, slots, kv_indptr, kv_indices, last, last_slots)

    def backbone(
        self,
        anchors: Tensor,
        request_ids: Sequence[int],
        starts: Sequence[int],
        copy: tuple[Tensor, Tensor] | None = None,
    ) -> Tensor:
        """Block forward for R requests at anchor positions ``starts`` over their contexts (a request without
        one attends to its block alone) -> final-normed hidden ``(R, s, H)`` (:meth:`block_forward`).
        ``anchors`` ``(R,)`` int64 on the drafter's device."""
        store, g = self.contexts, self.config.block_slots
        ids = [int(i) for i in request_ids]
        fresh = [rid for rid in ids if rid not in store]  # drafting without a context: their block alone
        for rid, s in zip(ids, starts, strict=True):
            if rid in fresh:
                store.start(rid, s)
        lengths = [store.length(rid) for rid in ids]
        try:
            slots = store.open_block(ids, g)
            layout = self.block_layout(ids, starts, lengths, slots)
            hidden = None if self.graphs is None else self.graphs.run(anchors, layout, copy)
            if hidden is None:
                hidden = self.block_forward(anchors, layout.to_device(self.device), copy)
        finally:
            store.close_block(ids, lengths)
            for rid in fresh:
                store.finish(rid)
        return hidden

    @torch.no_grad()
    def propose(
        self,
        request_ids: Sequence[int] | Tensor,
        anchors: Tensor,
        *,
        start_positions: Sequence[int] | None = None,
        num_positions: int | None = None,
        copy_continuations: Sequence[Sequence[int]] | None = None,
        copy_matches: Sequence[int] | None = None,
    ) -> DraftProposal:
        """Step 1 of a draft: the block forward and the LM head, ``U = lm_head(hidden)`` for ``g`` slots.

        Arguments as in :meth:`draft`. The backbone always runs the whole block; only the first ``g`` slots
        reach the LM head. Where the LM head runs inside the draw (:meth:`defers_lm_head`: fused with it, or in
        the sampling step's CUDA graph) the proposal's ``base_logits`` is None and :meth:`sample` computes it.
        """
        copy = None
        if self.config.uses_copies:
            if copy_continuations is None or copy_matches is None:
                raise ValueError(
                    "copy_continuations / copy_matches: this drafter reads copies (copy channel or copy head); "
                    "pass each request's lookup continuation and copy class (empty and 0 where there is none)"
                )
            n = len(request_ids)
            if len(copy_continuations) != n or len(copy_matches) != n:
                raise ValueError(
                    f"copy_continuations / copy_matches: expected {n} entries (one per request), got "
                    f"{len(copy_continuations)} / {len(copy_matches)}"
                )
            copy = copy_inputs(
                [list(t) for t in copy_continuations],
                [int(m) for m in copy_matches],
                self.config.block_size,
                self.device,
            )
        ids_t = torch.as_tensor(
            request_ids.tolist() if isinstance(request_ids, Tensor) else list(request_ids), dtype=torch.int64
        )
        ids = ids_t.tolist()
        R = len(ids)
        if len(set(ids)) != R:
            raise ValueError(f"request_ids: must be distinct, got {ids}")
        g = self.config.block_size if num_positions is None else int(num_positions)
        if not 1 <= g <= self.config.block_size:
            raise ValueError(f"num_positions: must be in [1, {self.config.block_size}], got {num_positions}")
        if anchors.shape != (R,):
            raise ValueError(f"anchors: expected shape ({R},), got {tuple(anchors.shape)}")
        # the decoder passes host anchors, so this check costs no device read
        if bool(((anchors < 0) | (anchors >= self.config.vocab_size)).any()):
            raise ValueError(f"anchors: token ids must be in [0, {self.config.vocab_size})")
        store = self.contexts
        if start_positions is None:
            starts = [store.next_position(i) for i in ids]
        else:
            starts = [int(s) for s in start_positions]
            for j, (s, rid) in enumerate(zip(starts, ids, strict=True)):
                if rid in store and s < store.next_position(rid):
                    raise ValueError(
                        f"start_positions[{j}]: {s} overlaps the context (ends at {store.next_position(rid)})"
                    )
                if s < 0:
                    raise ValueError(f"start_positions[{j}]: must be >= 0, got {s}")
        anchors = to_device(anchors, self.device, torch.int64)  # once: backbone and sampling both read it
        # fp32 CPU: few rows (γ per request) go faster transposed
        with few_row_linears(self.modules()):
            hidden = self.backbone(anchors, ids, starts, copy)
            skip = self.config.block_slots - self.config.block_size  # 1: the anchor's slot drafts nothing
            if skip or g < hidden.shape[1]:
                hidden = hidden[:, skip : skip + g].contiguous()
        U = None if self.defers_lm_head(hidden) else self.lm_head_logits(hidden, copy)
        return DraftProposal(to_device(ids_t, self.device), anchors, hidden, U, copy)

    @torch.no_grad()
    def sample(
        self,
        proposal: DraftProposal,
        temperature: float | Tensor,
        seed: int,
        offset: int,
        *,
        whole_vocab: bool = True,
    ) -> MarkovSample:
        """Step 2 of a draft: Markov sampling of the proposal's slots (tokens, ``z``, ``prev_emb``). The noise is
        keyed by ``(seed, offset, request id, slot)``. Greedy rows (temperature 0) get the copy head's greedy
        table here (``dspark.models.copy_head``).

        ``z`` is over the whole vocabulary ``(R, g, V)``; with ``whole_vocab=False`` a drafter with a draft
        vocabulary leaves it over that vocabulary ``(R, g, V')`` (:meth:`whole_vocab_logits` widens it later,
        where a caller needs ``q`` at all: greedy verification reads none).
        """
        heads = self._head_graphs
        s = None if heads is None else heads.sample(proposal, temperature, seed, offset)
        if s is None:
            s = self.draw(proposal, temperature, seed, offset)
        if whole_vocab:
            s = MarkovSample(s.tokens, self.whole_vocab_logits(s.logits), s.prev_emb)
        return s

    def draw(
        self, proposal: DraftProposal, temperature: float | Tensor, seed: int, offset: int | Tensor
    ) -> MarkovSample:
        """:meth:`sample` run eagerly, ``z`` over the draft vocabulary where there is one; ``U`` computed here
        where the proposal has none. ``offset`` may be a ``(1,)`` int64 device tensor (the Markov ops'
        ``round_offset``, base 0: what the sampling graph replays with) for a vanilla head or none."""
        p, vocab = proposal, self._vocab_tables()
        if p.base_logits is None and self.lm_head_fused(p.hidden):
            return self.markov_head.sample_from_hidden(
                p.hidden, self.lm_head_weight, p.anchors, temperature, seed, offset, p.request_ids
            )
        base = self.base_logits(p)
        head = self.copy_head
        if head is not None and head.greedy_bias is not None:  # the greedy rows' extra bonus (copy_head)
            ids = None if vocab is None else vocab.token_ids
            if isinstance(temperature, Tensor):  # per row; no host read of a device tensor
                rows = temperature.reshape(-1).expand(base.shape[0]) <= 0
                base = head.add_greedy_bonus(base, *p.copy, rows, ids)
            elif temperature <= 0:
                base = head.add_greedy_bonus(base, *p.copy, None, ids)
        if self.markov_head is not None:
            s = self.markov_head.sample(
                base, p.anchors, temperature, seed, offset, p.hidden, p.request_ids, vocab=vocab
            )
        else:  # DFlash: no Markov bias (z = U)
            s = sample_without_markov(base, p.anchors, temperature, seed, offset, p.request_ids, vocab=vocab)
        return s

    def whole_vocab_logits(self, logits: Tensor) -> Tensor:
        """Draft logits ``(..., V')`` over the draft vocabulary -> ``(..., V)`` over the whole one (q = 0 outside
        it: the verifier takes q over the whole vocabulary); unchanged without a draft vocabulary."""
        vocab = self._vocab_tables()
        if vocab is None:
            return logits
        return expand_to_vocab(logits, vocab.token_ids, self.config.vocab_size)

    def score(
        self,
        hidden: Tensor,
        prev_emb: Tensor,
        sts_temperature: Tensor | None = None,
        sts_bias: Tensor | None = None,
        *,
        prev_tokens: Tensor | None = None,
        copy: tuple[Tensor, Tensor] | None = None,
    ) -> tuple[Tensor, Tensor, Tensor] | None:
        """Step 3 of a draft: ``(conf_logit, conf, survival)`` ``(R, g)`` of the confidence head (None without).

        A drafter with a copy head also needs ``prev_tokens`` ``(R, g)``, the token before each slot
        (:func:`previous_tokens`), and the proposal's ``copy``.
        """
        if self.confidence_head is None:
            return None
        if self.copy_head is not None and (prev_tokens is None or copy is None):
            raise ValueError(
                "prev_tokens / copy: a drafter with a copy head scores each slot by whether the draft "
                "before it followed the proposal's copy; pass both"
            )
        heads = self._head_graphs
        args = (hidden, prev_emb, sts_temperature, sts_bias, prev_tokens, copy)
        out = None if heads is None else heads.score(*args)
        return self.confidence(*args) if out is None else out

    def confidence(
        self,
        hidden: Tensor,
        prev_emb: Tensor,
        sts_temperature: Tensor | None,
        sts_bias: Tensor | None,
        prev_tokens: Tensor | None,
        copy: tuple[Tensor, Tensor] | None,
    ) -> tuple[Tensor, Tensor, Tensor]:
        """:meth:`score` run eagerly (a drafter with a confidence head; arguments checked there)."""
        extra = None if self.copy_head is None else self.copy_head.confidence_inputs(prev_tokens, *copy)
        return self.confidence_head(hidden, prev_emb, sts_temperature, sts_bias, extra)

    @torch.no_grad()
    def draft(
        self,
        request_ids: Sequence[int] | Tensor,
        anchors: Tensor,
        temperature: float | Tensor = 0.0,
        seed: int = 0,
        offset: int = 0,
        sts_temperature: Tensor | None = None,
        *,
        sts_bias: Tensor | None = None,
        start_positions: Sequence[int] | None = None,
        return_base_logits: bool = False,
        num_positions: int | None = None,
        copy_continuations: Sequence[Sequence[int]] | None = None,
        copy_matches: Sequence[int] | None = None,
    ) -> DraftOutput:
        """One draft round for R requests: :meth:`propose`, :meth:`sample`, :meth:`score`.

        Parameters
        ----------
        request_ids : sequence of int or Tensor
            R distinct request ids; they select the contexts and key the sampling noise.
        anchors : Tensor
            ``(R,)`` int64: each request's last committed token (at its :meth:`next_position`).
        temperature : float or Tensor
            Scalar or ``(R,)`` float; 0 = greedy (argmax).
        seed, offset : int
            Philox stream of this round (``offset`` advances once per round).
        sts_temperature : Tensor, optional
            ``(γ,)`` float32 STS temperatures of the confidence (ones when None).
        sts_bias : Tensor, optional
            ``(γ,)`` float32 offsets of affine STS, ``conf = sigmoid(logit / T + o)`` (zeros when None).
        start_positions : sequence of int, optional
            Anchor positions; default each request's :meth:`next_position`.
        return_base_logits : bool
            Also return ``U`` (the logits before the Markov bias).
        num_positions : int, optional
            Draft only the first ``g`` slots (default: all γ). The backbone still runs the whole block, and the
            sampling noise is keyed by position, so the result equals the first ``g`` slots of a full draft; the
            LM head, Markov sampling and confidence skip the rest. Outputs are ``(R, g, ...)`` and the STS
            vectors have ``g`` entries.
        copy_continuations, copy_matches : optional
            Required for a drafter with a copy channel or copy head: per request, the (up to γ) tokens that
            followed the most recent earlier occurrence of its history's longest suffix of ``copy_min_match ..
            copy_max_match`` tokens (``LookupIndex.propose``; empty for none) and the copy's class (that
            suffix's length, split by its extent with ``copy_extent_bounds``; 0 for none):
            ``dspark.decoding.sources.copy_proposal`` gives both.
        """
        p = self.propose(
            request_ids,
            anchors,
            start_positions=start_positions,
            num_positions=num_positions,
            copy_continuations=copy_continuations,
            copy_matches=copy_matches,
        )
        s = self.sample(p, temperature, seed, offset)
        base = None
        if return_base_logits:
            vocab = self._vocab_tables()
            base = self.base_logits(p)
            if vocab is not None:
                base = expand_to_vocab(base, vocab.token_ids, self.config.vocab_size)
        out = DraftOutput(s.tokens, s.logits, s.prev_emb, p.hidden, base)
        scored = self.score(
            p.hidden,
            s.prev_emb,
            sts_temperature,
            sts_bias,
            prev_tokens=previous_tokens(p.anchors, s.tokens),
            copy=p.copy,
        )
        if scored is not None:
            out.conf_logit, out.conf, out.survival = scored
        return out
