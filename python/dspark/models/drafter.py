# SPDX-License-Identifier: Apache-2.0
"""``DSparkDrafter``: DeepSpec's parallel block drafter with Markov and confidence heads (see docs/drafter.md)."""

from __future__ import annotations

import copy
import dataclasses
import os
import time
from collections.abc import Sequence
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from dspark.host_sync import to_device
from dspark.models import checkpoint as ckpt
from dspark.models import cpu_linear
from dspark.models import drafter_loading as loading
from dspark.models.config import DrafterConfig
from dspark.models.context import RequestContext
from dspark.models.cpu_linear import weight_stationary_linears
from dspark.models.draft_vocab import (
    DRAFT_VOCAB_FILE,
    DraftVocabTables,
    check_draft_vocab,
    expand_to_vocab,
    resolve_draft_vocab,
    save_draft_vocab,
)
from dspark.models.heads import MARKOV_HEADS, ConfidenceHead, MarkovSample, sample_without_markov
from dspark.models.layers import DraftLayer, RMSNorm, Rotary
from dspark.models.pairing import (
    check_dtype_device,
    target_num_layers,
    target_text_config,
    validate_pairing,
)


@dataclasses.dataclass
class DraftOutput:
    """One draft round for R requests (γ = drafted slots, the block size unless fewer were asked for).

    tokens ``(R, γ)`` int64; draft_logits ``(R, γ, V)`` float32 (Markov-corrected ``z``; ``q = softmax(z/T)``);
    prev_emb ``(R, γ, r)`` (``W1[x_{k-1}]``, r = 0 without a Markov head); hidden ``(R, γ, H)`` final-normed;
    base_logits ``(R, γ, V)`` (``U = lm_head(hidden)``, None unless asked); conf_logit / conf / survival
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
    markov_seconds: float = 0.0  # host time of the Markov sampling step (launch time only on CUDA)


@dataclasses.dataclass
class DraftProposal:
    """What :meth:`DSparkDrafter.propose` hands to sampling: ``request_ids`` ``(R,)`` and ``anchors`` ``(R,)``
    int64 on the drafter's device, ``hidden`` ``(R, g, H)`` final-normed, ``base_logits`` ``U`` ``(R, g, V)``
    (``(R, g, V')`` over a draft vocabulary)."""

    request_ids: Tensor
    anchors: Tensor
    hidden: Tensor
    base_logits: Tensor


def _detach(t: Tensor | None) -> Tensor | None:
    return None if t is None else t.detach()


def default_target_layer_ids(num_layers: int, taps: int = 5) -> list[int]:
    """DeepSpec's spread: ``1 + j (L - 4) / (taps - 1)`` (``[1,9,17,25,33]`` for 36 layers), clipped to ``L - 2``."""
    if num_layers < 2:
        raise ValueError(f"target_layer_ids: a target needs >= 2 layers to tap one, it has {num_layers}")
    hi = num_layers - 2
    span = max(num_layers - 4, 0)
    ids = sorted({min(hi, round(1 + j * span / max(taps - 1, 1))) for j in range(taps)})
    return ids


class DSparkDrafter(nn.Module):
    """DSpark drafter: DFlash-style backbone + low-rank Markov head + confidence head, DeepSpec checkpoint layout.

    Build with :meth:`from_pretrained` (a DeepSpec checkpoint) or :meth:`from_config` (a fresh drafter for a
    target). Serving calls :meth:`append_context` with the target's tapped features of committed rows and
    :meth:`draft` once per round; :meth:`truncate` / :meth:`finish` manage per-request state.
    """

    def __init__(self, config: DrafterConfig, *, own_embed: bool = True, own_lm_head: bool = True) -> None:
        super().__init__()
        c = config
        self.config = c
        H, V = c.hidden_size, c.vocab_size
        if own_embed:
            self.embed_tokens = nn.Embedding(V, H)
        self.layers = nn.ModuleList(
            DraftLayer(
                H,
                c.intermediate_size,
                c.num_attention_heads,
                c.num_key_value_heads,
                c.head_dim,
                c.rms_norm_eps,
            )
            for _ in range(c.num_hidden_layers)
        )
        self.norm = RMSNorm(H, c.rms_norm_eps)
        self.fc = nn.Linear(c.num_taps * H, H, bias=False)
        self.hidden_norm = RMSNorm(H, c.rms_norm_eps)
        if own_lm_head:
            self.lm_head = nn.Linear(H, V, bias=False)
        self.markov_head = MARKOV_HEADS[c.markov_head_type](V, H, c.markov_rank) if c.has_markov else None
        self.confidence_head = (
            ConfidenceHead(H, c.confidence_input_rank) if c.enable_confidence_head else None
        )
        self.rotary_emb = Rotary(c.head_dim, c.rope_theta)
        self._shared: dict[str, nn.Module] = {}  # target modules aliased (not registered: not in state_dict)
        self._contexts: dict[int, RequestContext] = {}
        self._draft_vocab: Tensor | None = None  # sorted token ids (CPU) the drafter may propose; None = all
        self._vocab_tables_cache: tuple[tuple, DraftVocabTables] | None = None

    # ---- shared embedding / LM head --------------------------------------------------------------------------
    def share_target_embeddings(self, target: nn.Module, embed: bool = True, lm_head: bool = True) -> None:
        """Alias the target's input embedding and/or LM head (no copy); drops the drafter's own copies.

        Aliased modules are not registered (not in ``state_dict`` or ``parameters()``); ``repr`` names them.
        """
        if embed:
            self._shared["embed_tokens"] = target.get_input_embeddings()
            self._modules.pop("embed_tokens", None)
        if lm_head:
            head = target.get_output_embeddings()
            if head is None:
                raise ValueError("lm_head: the target has no output embedding to share")
            self._shared["lm_head"] = head
            self._modules.pop("lm_head", None)

    def _own_or_shared_weight(self, name: str, what: str) -> Tensor:
        m = self._modules.get(name)
        m = self._shared.get(name) if m is None else m
        if m is None:
            raise ValueError(
                f"{name}: the drafter has no {what} (load it with a target to share the target's)"
            )
        return m.weight

    @property
    def embed_weight(self) -> Tensor:
        return self._own_or_shared_weight("embed_tokens", "embedding")

    @property
    def lm_head_weight(self) -> Tensor:
        return self._own_or_shared_weight("lm_head", "LM head")

    @property
    def shares_embeddings(self) -> dict[str, bool]:
        """Which of ``embed_tokens`` / ``lm_head`` alias the target's."""
        return {n: n in self._shared for n in ("embed_tokens", "lm_head")}

    def extra_repr(self) -> str:
        # aliased modules are not children, so nn.Module's repr would not show them at all
        shared = [n for n in ("embed_tokens", "lm_head") if n in self._shared]
        return f"(shared with the target): {', '.join(shared)}" if shared else ""

    @property
    def dtype(self) -> torch.dtype:
        return self.fc.weight.dtype

    # ---- draft vocabulary ------------------------------------------------------------------------------------
    @property
    def draft_vocab(self) -> Tensor | None:
        """Sorted int64 token ids the drafter proposes from (None: the whole vocabulary); docs/drafter.md."""
        return self._draft_vocab

    def set_draft_vocab(self, token_ids: Tensor | Sequence[int] | None) -> None:
        """Draft only from these token ids (None: the whole vocabulary).

        ``q`` becomes the softmax over them (0 elsewhere), so the LM head and the Markov bias read V' rows
        instead of V. Exactness is unchanged; acceptance drops by what the drafter would have drafted outside.

        Raises
        ------
        ValueError
            Empty, duplicate or out-of-range ids.
        """
        self._draft_vocab = (
            None if token_ids is None else check_draft_vocab(token_ids, self.config.vocab_size)
        )
        self._vocab_tables_cache = None

    def _vocab_tables(self) -> DraftVocabTables | None:
        """The gathered rows of the draft vocabulary, rebuilt when a source weight changed (version counters)."""
        if self._draft_vocab is None:
            return None
        lm = self.lm_head_weight
        mh = self.markov_head
        w1 = w2 = None
        if mh is not None and mh.head_type == "vanilla":
            w1, w2 = mh.markov_w1.weight, mh.markov_w2.weight
        key = tuple((t.data_ptr(), t._version, t.dtype, t.device) for t in (lm, w1, w2) if t is not None)
        cached = self._vocab_tables_cache
        if cached is None or cached[0] != key:
            with torch.no_grad():
                tables = DraftVocabTables(self._draft_vocab, lm.detach(), _detach(w1), _detach(w2))
            self._vocab_tables_cache = cached = (key, tables)
        return cached[1]

    @property
    def device(self) -> torch.device:
        return self.fc.weight.device

    # ---- construction ------------------------------------------------------------------------------------------
    @classmethod
    def from_pretrained(
        cls,
        path: str | os.PathLike,
        target: nn.Module | None = None,
        *,
        dtype: torch.dtype | str | None = None,
        device: torch.device | str | None = None,
        share_target_embeddings: bool | None = None,
        tokenizer=None,
        draft_vocab: bool | str | os.PathLike | Tensor | Sequence[int] | None = True,
    ) -> DSparkDrafter:
        """Load a DeepSpec-layout checkpoint (``config.json`` + ``model.safetensors`` or a sharded index).

        Parameters
        ----------
        path : path
            Checkpoint directory.
        target : nn.Module, optional
            The HF causal LM it will draft for; when given, the pairing is validated (docs/drafter.md) and the
            target's embedding / LM head are aliased where the checkpoint omits them or stores copies of them.
        dtype : torch.dtype or str, optional
            Default: the target's dtype, else the checkpoint's. The confidence head stays float32. A dtype other
            than the target's (e.g. a bf16 drafter for an fp32 target on a CPU with AMX: its vocabulary-sized GEMMs
            are several times faster) makes the drafter keep its own cast copy of the shared embedding / LM head
            instead of aliasing them (one copy when they are tied). Exactness does not depend on it: the verifier
            uses the draft distribution the drafter actually sampled from.
        device : optional
            Default: the target's device, else CPU.
        share_target_embeddings : bool, optional
            None: alias the target's where the checkpoint omits them or stores copies bit-equal at ``dtype``
            (a cast copy when ``dtype``/``device`` differ from the target's); a stored copy that differs is an
            error, unless it equals the target's in the coarser of the two dtypes (then it is kept). True: always
            alias the target's (same dtype required). False: require stored copies and keep them as the
            drafter's own, not compared with the target's.
        tokenizer : optional
            The target's tokenizer, checked against the vocabulary (and the checkpoint's tokenizer, if stored).
        draft_vocab : bool, path, Tensor or sequence of int, optional
            True (default): use the folder's ``draft_vocab.json`` when it has one. False / None: draft from the
            whole vocabulary. A path: that file. Ids: those (see :meth:`set_draft_vocab`).

        Raises
        ------
        ValueError
            Malformed checkpoint (naming the tensor, or the file and what it should hold), malformed draft
            vocabulary, or a pairing mismatch (naming the field).
        """
        cfg = ckpt.read_config(path)
        tensors = ckpt.read_tensors(path)
        ckpt.check_tensors(cfg, tensors, where=f"drafter checkpoint {path}")
        if target is not None:
            validate_pairing(cfg, target, tokenizer=tokenizer, drafter_dir=path)
        tables = loading.target_tables(target)
        dtype, device = loading.resolve_dtype_device(cfg, tensors, tables["embed_tokens"], dtype, device)
        share = loading.place_embeddings(
            tensors,
            tables,
            has_target=target is not None,
            dtype=dtype,
            device=device,
            share=share_target_embeddings,
        )
        cfg.dtype = dtype
        with torch.device("meta"):
            model = cls(cfg, own_embed=not share["embed_tokens"], own_lm_head=not share["lm_head"])
        model.load_state_dict(loading.loaded_state(tensors, dtype, device), strict=True, assign=True)
        model.rotary_emb.reset(device)
        if target is not None:
            model.share_target_embeddings(target, embed=share["embed_tokens"], lm_head=share["lm_head"])
            model._check_runtime(target)
        model.set_draft_vocab(resolve_draft_vocab(draft_vocab, path, cfg.vocab_size))
        return model.eval()

    @classmethod
    def from_config(
        cls,
        target: nn.Module,
        *,
        block_size: int = 7,
        num_layers: int = 1,
        target_layer_ids: Sequence[int] | None = None,
        markov_rank: int = 256,
        markov_head_type: str = "vanilla",
        mask_token_id: int | None = None,
        enable_confidence_head: bool | None = None,
        confidence_head_with_markov: bool = True,
        intermediate_size: int | None = None,
        num_attention_heads: int | None = None,
        num_key_value_heads: int | None = None,
        head_dim: int | None = None,
        share_embeddings: bool = True,
        dtype: torch.dtype | None = None,
        initializer_range: float | None = None,
    ) -> DSparkDrafter:
        """A fresh (randomly initialised) drafter for an HF causal LM ``target``.

        The config is a copy of the target's text config plus the DSpark fields (as DeepSpec writes it). Layer
        shapes default to the target's; ``target_layer_ids`` defaults to DeepSpec's spread of 5 taps;
        ``mask_token_id`` defaults to the last vocabulary id; ``markov_rank=0`` gives a DFlash drafter (no Markov
        and, by default, no confidence head). RoPE is the default kind at the target's ``rope_theta`` (a target's
        RoPE scaling is not copied). Weights use HF's default init (normal, ``initializer_range``).
        With ``share_embeddings`` the target's embedding and LM head are aliased (frozen in training by the
        caller); otherwise they are copied.
        """
        tc = target_text_config(target)
        raw = copy.deepcopy(tc.to_dict())
        L = int(tc.num_hidden_layers)
        heads = num_attention_heads or int(tc.num_attention_heads)
        hd = head_dim or getattr(tc, "head_dim", None) or int(tc.hidden_size) // heads
        raw.update(
            model_type="qwen3",
            hidden_size=int(tc.hidden_size),
            intermediate_size=intermediate_size or int(tc.intermediate_size),
            num_attention_heads=heads,
            num_key_value_heads=num_key_value_heads or int(getattr(tc, "num_key_value_heads", None) or heads),
            head_dim=int(hd),
            vocab_size=int(tc.vocab_size),
            num_hidden_layers=num_layers,
            num_target_layers=L,
            block_size=block_size,
            mask_token_id=int(tc.vocab_size) - 1 if mask_token_id is None else mask_token_id,
            target_layer_ids=list(target_layer_ids)
            if target_layer_ids is not None
            else default_target_layer_ids(L),
            markov_rank=markov_rank,
            markov_head_type=markov_head_type,
            enable_confidence_head=(markov_rank > 0)
            if enable_confidence_head is None
            else enable_confidence_head,
            confidence_head_with_markov=confidence_head_with_markov,
            attention_bias=False,
            hidden_act="silu",
        )
        raw.pop("layer_types", None)
        # A fresh drafter uses default RoPE at the target's base frequency (scaled variants are not implemented).
        rope = raw.get("rope_parameters") if isinstance(raw.get("rope_parameters"), dict) else {}
        theta = rope.get("rope_theta", raw.get("rope_theta", 10000.0))
        raw.pop("rope_scaling", None)
        raw.pop("rope_theta", None)
        raw["rope_parameters"] = {"rope_theta": float(theta), "rope_type": "default"}
        cfg = DrafterConfig.from_dict(raw)
        validate_pairing(cfg, target)
        t_embed = target.get_input_embeddings().weight
        dtype = dtype or t_embed.dtype
        cfg.dtype = dtype
        model = cls(cfg, own_embed=not share_embeddings, own_lm_head=not share_embeddings)
        std = (
            initializer_range
            if initializer_range is not None
            else float(getattr(tc, "initializer_range", 0.02))
        )
        for m in model.modules():
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, 0.0, std)
                if getattr(m, "bias", None) is not None:
                    nn.init.zeros_(m.bias)
        if share_embeddings:
            model.share_target_embeddings(target)
        else:
            with torch.no_grad():
                model.embed_tokens.weight.copy_(t_embed)
                model.lm_head.weight.copy_(target.get_output_embeddings().weight)
        model.to(device=t_embed.device, dtype=dtype)
        model._check_runtime(target)
        return model

    def _check_runtime(self, target: nn.Module) -> None:
        """Aliased weights must already have the drafter's dtype/device (we never copy them)."""
        for name, m in self._shared.items():
            check_dtype_device(f"the target's {name}", m.weight, self.dtype, self.device)
        if target_num_layers(target) < 1:
            raise ValueError("target: has no decoder layers")

    # ---- saving ------------------------------------------------------------------------------------------------
    def checkpoint_tensors(self, include_embeddings: bool = True) -> dict[str, Tensor]:
        """The DeepSpec-named tensors ``save_pretrained`` writes (shared embeddings included on request)."""
        out = dict(self.state_dict())
        if include_embeddings:
            out.setdefault("embed_tokens.weight", self.embed_weight)
            out.setdefault("lm_head.weight", self.lm_head_weight)
        if self.confidence_head is not None:  # stored in the backbone dtype when that is lossless
            for n in ("confidence_head.proj.weight", "confidence_head.proj.bias"):
                t = out[n]
                if torch.equal(t.to(self.dtype).float(), t):
                    out[n] = t.to(self.dtype)
        return out

    def save_pretrained(self, path: str | os.PathLike, *, include_embeddings: bool = True) -> None:
        """Write ``config.json`` + ``model.safetensors`` in DeepSpec's layout (reloads bit-identically), and
        ``draft_vocab.json`` when a draft vocabulary is set (a stale one in ``path`` is removed otherwise)."""
        self.config.dtype = self.dtype
        ckpt.write_checkpoint(path, self.config, self.checkpoint_tensors(include_embeddings))
        if self._draft_vocab is not None:
            save_draft_vocab(path, self._draft_vocab)
        else:
            (Path(path) / DRAFT_VOCAB_FILE).unlink(missing_ok=True)

    # ---- per-request context --------------------------------------------------------------------------------
    def features_from_hidden_states(self, hidden_states: Sequence[Tensor]) -> Tensor:
        """Concatenate HF ``hidden_states[i + 1]`` (``-1`` -> ``hidden_states[0]``) for ``target_layer_ids``."""
        return torch.cat([hidden_states[i + 1] for i in self.config.target_layer_ids], -1)

    def context_length(self, request_id: int) -> int:
        ctx = self._contexts.get(int(request_id))
        return 0 if ctx is None else ctx.length

    def next_position(self, request_id: int) -> int:
        """The anchor position the next draft of this request uses by default."""
        ctx = self._contexts.get(int(request_id))
        return 0 if ctx is None else ctx.next_position

    def truncate(self, request_id: int, length: int) -> None:
        """Keep only the first ``length`` context rows of a request (e.g. after a rollback)."""
        ctx = self._contexts.get(int(request_id))
        if ctx is None:
            if length != 0:
                raise ValueError(f"request_id: {request_id} has no context")
            return
        ctx.truncate(length)

    def finish(self, request_id: int) -> None:
        """Free a request's context."""
        self._contexts.pop(int(request_id), None)

    def finish_all(self) -> None:
        self._contexts.clear()

    def _new_context(self, first_position: int) -> RequestContext:
        c = self.config
        return RequestContext(
            c.num_hidden_layers, c.num_key_value_heads, c.head_dim, self.dtype, self.device, first_position
        )

    @torch.no_grad()
    def append_context(
        self,
        request_ids: Sequence[int] | Tensor,
        features: Sequence[Tensor],
        positions: Sequence[int] | None = None,
    ) -> None:
        """Append committed rows to each request's context: ``c = hidden_norm(fc(F))`` -> per-layer K/V.

        Parameters
        ----------
        request_ids : sequence of int
            R distinct request ids (a new id starts a context).
        features : sequence of Tensor
            Per request ``(n_i, m * H)``: the target's tapped layer outputs of the committed rows, concatenated
            in ``target_layer_ids`` order (see :meth:`features_from_hidden_states`); ``n_i`` may be 0.
        positions : sequence of int, optional
            Absolute position of each request's first new row. Default: right after its context (0 for a new
            request). For an existing context it must equal :meth:`next_position`.
        """
        ids = [int(i) for i in (request_ids.tolist() if isinstance(request_ids, Tensor) else request_ids)]
        if len(set(ids)) != len(ids):
            raise ValueError(f"request_ids: must be distinct, got {ids}")
        if len(features) != len(ids):
            raise ValueError(f"features: expected {len(ids)} tensors (one per request), got {len(features)}")
        c = self.config
        width = c.num_taps * c.hidden_size
        ctxs, starts, counts = [], [], []
        for j, rid in enumerate(ids):
            f = features[j]
            if f.dim() != 2 or f.shape[1] != width:
                raise ValueError(f"features[{j}]: expected shape (n, {width}) (m * H), got {tuple(f.shape)}")
            ctx = self._contexts.get(rid)
            pos = None if positions is None else int(positions[j])
            if ctx is None:
                ctx = self._new_context(0 if pos is None else pos)
                if pos is not None and pos < 0:
                    raise ValueError(f"positions[{j}]: must be >= 0, got {pos}")
                self._contexts[rid] = ctx
            elif pos is not None and pos != ctx.next_position:
                raise ValueError(
                    f"positions[{j}]: request {rid} continues at position {ctx.next_position}, got {pos} "
                    f"(truncate the context first to rewrite rows)"
                )
            ctxs.append(ctx)
            starts.append(ctx.next_position)
            counts.append(f.shape[0])
        total = sum(counts)
        if total == 0:
            return
        F_all = torch.cat([f.to(device=self.device, dtype=self.dtype) for f in features], 0)
        ctx_rows = self.hidden_norm(self.fc(F_all))  # [N, H]
        pos = torch.cat(
            [torch.arange(s, s + n, device=self.device) for s, n in zip(starts, counts, strict=True)]
        )
        cos, sin = self.rotary_emb.cos_sin(pos, self.dtype)
        for ctx, n in zip(ctxs, counts, strict=True):
            ctx.reserve(ctx.length + n + c.block_size)
        for li, layer in enumerate(self.layers):
            k, v = layer.self_attn.project_kv(ctx_rows, cos, sin)
            off = 0
            for ctx, n in zip(ctxs, counts, strict=True):
                ctx.write(li, ctx.length, k[off : off + n], v[off : off + n])
                off += n
        for ctx, n in zip(ctxs, counts, strict=True):
            ctx.length += n

    # ---- drafting ----------------------------------------------------------------------------------------------
    def backbone(
        self, anchors: Tensor, contexts: Sequence[RequestContext | None], starts: Sequence[int]
    ) -> Tensor:
        """Block forward for R requests: ``[anchor, MASK x (γ-1)]`` -> final-normed hidden ``(R, γ, H)``."""
        c = self.config
        R, g = anchors.shape[0], c.block_size
        tok = torch.full((R, g), c.mask_token_id, dtype=torch.int64, device=self.device)
        tok[:, 0] = to_device(anchors, self.device)
        x = F.embedding(tok.view(-1), self.embed_weight).to(self.dtype)  # [R*g, H]
        start_t = to_device(list(starts), self.device, torch.int64)
        pos = (start_t.unsqueeze(1) + torch.arange(g, device=self.device)).view(-1)
        cos, sin = self.rotary_emb.cos_sin(pos, self.dtype)
        scale = c.head_dim**-0.5
        for li, layer in enumerate(self.layers):
            attn = layer.self_attn
            h = layer.input_layernorm(x)
            q = attn.project_q(h, cos, sin)  # [R*g, nh, D]
            k, v = attn.project_kv(h, cos, sin)  # [R*g, nkv, D]
            outs = []
            for i, ctx in enumerate(contexts):
                sl = slice(i * g, (i + 1) * g)
                if ctx is None or ctx.length == 0:
                    K, V = k[sl], v[sl]
                else:  # block K/V go to scratch rows past the context; length is not advanced
                    ctx.write(li, ctx.length, k[sl], v[sl])
                    K, V = ctx.keys_values(li, ctx.length + g)
                o = F.scaled_dot_product_attention(
                    q[sl].transpose(0, 1).unsqueeze(0),
                    K.transpose(0, 1).unsqueeze(0),
                    V.transpose(0, 1).unsqueeze(0),
                    scale=scale,
                    enable_gqa=True,
                )  # [1, nh, g, D], no mask: bidirectional block + all context
                outs.append(o[0].transpose(0, 1))
            o = torch.cat(outs, 0).reshape(R * g, -1)
            x = x + attn.o_proj(o)
            x = x + layer.mlp(layer.post_attention_layernorm(x))
        return self.norm(x).view(R, g, -1)

    @torch.no_grad()
    def propose(
        self,
        request_ids: Sequence[int] | Tensor,
        anchors: Tensor,
        *,
        start_positions: Sequence[int] | None = None,
        num_positions: int | None = None,
    ) -> DraftProposal:
        """Step 1 of a draft: the block forward and the LM head, ``U = lm_head(hidden)`` for ``g`` slots.

        Arguments as in :meth:`draft`. The backbone always runs the whole block; only the first ``g`` slots
        reach the LM head.
        """
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
        ctxs = [self._contexts.get(i) for i in ids]
        if start_positions is None:
            starts = [0 if ctx is None else ctx.next_position for ctx in ctxs]
        else:
            starts = [int(s) for s in start_positions]
            for j, (s, ctx) in enumerate(zip(starts, ctxs, strict=True)):
                if ctx is not None and s < ctx.next_position:
                    raise ValueError(
                        f"start_positions[{j}]: {s} overlaps the context (ends at {ctx.next_position})"
                    )
        for ctx in ctxs:
            if ctx is not None:
                ctx.reserve(ctx.length + self.config.block_size)
        anchors = to_device(anchors, self.device, torch.int64)  # once: backbone and sampling both read it
        vocab = self._vocab_tables()
        # fp32 CPU: few rows (γ per request) go faster transposed
        with weight_stationary_linears(self.modules()):
            hidden = self.backbone(anchors, ctxs, starts)
            if g < hidden.shape[1]:
                hidden = hidden[:, :g].contiguous()
            # [R, g, V], or [R, g, V'] over a draft vocabulary; 2-D rows: a sliced 3-D hidden can send
            # F.linear down a batched path that copies the whole weight
            W = self.lm_head_weight if vocab is None else vocab.lm_head
            U = cpu_linear.linear(hidden.reshape(R * g, -1), W).view(R, g, -1)
        return DraftProposal(to_device(ids_t, self.device), anchors, hidden, U)

    @torch.no_grad()
    def sample(
        self, proposal: DraftProposal, temperature: float | Tensor, seed: int, offset: int
    ) -> MarkovSample:
        """Step 2 of a draft: Markov sampling of the proposal's slots (tokens, ``z`` over the whole vocabulary,
        ``prev_emb``). The noise is keyed by ``(seed, offset, request id, slot)``."""
        p, vocab = proposal, self._vocab_tables()
        if self.markov_head is not None:
            s = self.markov_head.sample(
                p.base_logits, p.anchors, temperature, seed, offset, p.hidden, p.request_ids, vocab=vocab
            )
        else:  # DFlash: no Markov bias (z = U)
            s = sample_without_markov(
                p.base_logits, p.anchors, temperature, seed, offset, p.request_ids, vocab=vocab
            )
        if vocab is not None:  # the verifier takes q over the whole vocabulary: 0 outside the draft one
            s = MarkovSample(
                s.tokens, expand_to_vocab(s.logits, vocab.token_ids, self.config.vocab_size), s.prev_emb
            )
        return s

    def score(
        self,
        hidden: Tensor,
        prev_emb: Tensor,
        sts_temperature: Tensor | None = None,
        sts_bias: Tensor | None = None,
    ) -> tuple[Tensor, Tensor, Tensor] | None:
        """Step 3 of a draft: ``(conf_logit, conf, survival)`` ``(R, g)`` of the confidence head (None without)."""
        if self.confidence_head is None:
            return None
        return self.confidence_head(hidden, prev_emb, sts_temperature, sts_bias)

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
        """
        p = self.propose(request_ids, anchors, start_positions=start_positions, num_positions=num_positions)
        t_markov = time.perf_counter()
        s = self.sample(p, temperature, seed, offset)
        base = None
        if return_base_logits:
            vocab = self._vocab_tables()
            base = (
                p.base_logits
                if vocab is None
                else expand_to_vocab(p.base_logits, vocab.token_ids, self.config.vocab_size)
            )
        out = DraftOutput(s.tokens, s.logits, s.prev_emb, p.hidden, base)
        out.markov_seconds = time.perf_counter() - t_markov
        scored = self.score(p.hidden, s.prev_emb, sts_temperature, sts_bias)
        if scored is not None:
            out.conf_logit, out.conf, out.survival = scored
        return out
