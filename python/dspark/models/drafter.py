# SPDX-License-Identifier: Apache-2.0
"""``DSparkDrafter``: DeepSpec's parallel block drafter with Markov and confidence heads (see docs/drafter.md).

This module holds the model itself: its modules, the embedding / LM head it may share with the target, its draft
vocabulary and its per-request contexts. The draft round is in ``drafting.py`` (mixed in), a fresh drafter's
config in ``drafter_config.py``, checkpoint loading and saving in ``drafter_loading.py``.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import torch
from torch import Tensor, nn

from dspark.host_sync import to_device
from dspark.models import drafter_loading as loading
from dspark.models.block_inputs import add_input_modules, context_rows, write_context
from dspark.models.config import DrafterConfig
from dspark.models.context import PagedContexts
from dspark.models.copy_head import CopyHead
from dspark.models.draft_vocab import DraftVocabTables, check_draft_vocab
from dspark.models.drafter_config import default_target_layer_ids, new_drafter
from dspark.models.drafting import DraftOutput, DraftProposal, DraftSteps
from dspark.models.heads import MARKOV_HEADS, ConfidenceHead
from dspark.models.layers import DraftLayer, RMSNorm, Rotary
from dspark.models.pairing import check_dtype_device, target_num_layers

# DraftOutput, DraftProposal and default_target_layer_ids live in their own modules; importable from here too
__all__ = ["DSparkDrafter", "DraftOutput", "DraftProposal", "default_target_layer_ids"]


def _detach(t: Tensor | None) -> Tensor | None:
    return None if t is None else t.detach()


class DSparkDrafter(DraftSteps, nn.Module):
    """DSpark drafter: DFlash-style backbone + low-rank Markov head + confidence head, DeepSpec checkpoint layout.

    Build with :meth:`from_pretrained` (a DeepSpec checkpoint) or :meth:`from_config` (a fresh drafter for a
    target). Serving calls :meth:`append_context` with the target's tapped features of committed rows and
    :meth:`draft` (or its steps :meth:`propose`, :meth:`sample`, :meth:`score`) once per round; :meth:`truncate` /
    :meth:`finish` manage per-request state.
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
        self.copy_head = (
            CopyHead(c.block_size, H, c.num_copy_classes, c.copy_greedy_bias) if c.copy_head else None
        )
        add_input_modules(self, c)
        self.rotary_emb = Rotary(c.head_dim, c.rope_theta, c.rope_scaling)
        self._shared: dict[str, nn.Module] = {}  # target modules aliased (not registered: not in state_dict)
        self._context_store: PagedContexts | None = None  # made at the first context, on the drafter's device
        # DrafterGraphs of block_forward while a decoder with cuda_graphs holds the drafter
        self.graphs = None
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
        """Load a drafter checkpoint of any known packaging, detected from its ``config.json``: DeepSpec's layout
        (``config.json`` + ``model.safetensors`` or a sharded index), vLLM's ``speculators`` (DFlash / DSpark;
        ``d2t`` / ``t2d`` become the draft vocabulary), SpecForge's DSpark, z-lab's DFlash (docs/file-formats.md,
        "Drafter packagings"). An unknown packaging is a ``ValueError`` listing the known ones.

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
            True (default): use the folder's ``draft_vocab.json`` (or the packaging's ``d2t``) when it has one.
            False / None: draft from the whole vocabulary (refused for a checkpoint that stores only the draft
            vocabulary's LM head rows). A path: that file. Ids: those (see :meth:`set_draft_vocab`).

        Raises
        ------
        ValueError
            Malformed checkpoint (naming the tensor, or the file and what it should hold), malformed draft
            vocabulary, or a pairing mismatch (naming the field).
        """
        return loading.load_pretrained(
            cls,
            path,
            target,
            dtype=dtype,
            device=device,
            share_target_embeddings=share_target_embeddings,
            tokenizer=tokenizer,
            draft_vocab=draft_vocab,
        )

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
        **inputs: bool | int | Sequence[int],
    ) -> DSparkDrafter:
        """A fresh (randomly initialised) drafter for an HF causal LM ``target``.

        The config is a copy of the target's text config plus the DSpark fields (as DeepSpec writes it). Layer
        shapes default to the target's; ``target_layer_ids`` defaults to DeepSpec's spread of 5 taps;
        ``mask_token_id`` defaults to the last vocabulary id; ``markov_rank=0`` gives a DFlash drafter (no Markov
        and, by default, no confidence head). RoPE is the default kind at the target's ``rope_theta`` (a target's
        RoPE scaling is not copied). Weights use HF's default init (normal, ``initializer_range``).
        With ``share_embeddings`` the target's embedding and LM head are aliased (frozen in training by the
        caller); otherwise they are copied. ``inputs``: the v2 input flags of
        :func:`~dspark.models.drafter_config.fresh_config` (``copy_channel``, ``context_projection``,
        ``learned_mask``, ``tap_norm``, ``copy_head``, ``copy_min_match``, ``copy_max_match``,
        ``copy_extent_bounds``, ``copy_greedy_bias``; docs/drafter.md).
        """
        return new_drafter(
            cls,
            target,
            share_embeddings=share_embeddings,
            dtype=dtype,
            initializer_range=initializer_range,
            block_size=block_size,
            num_layers=num_layers,
            target_layer_ids=target_layer_ids,
            markov_rank=markov_rank,
            markov_head_type=markov_head_type,
            mask_token_id=mask_token_id,
            enable_confidence_head=enable_confidence_head,
            confidence_head_with_markov=confidence_head_with_markov,
            intermediate_size=intermediate_size,
            num_attention_heads=num_attention_heads,
            num_key_value_heads=num_key_value_heads,
            head_dim=head_dim,
            **inputs,
        )

    def _check_runtime(self, target: nn.Module) -> None:
        """Aliased weights must already have the drafter's dtype/device (we never copy them)."""
        for name, m in self._shared.items():
            check_dtype_device(f"the target's {name}", m.weight, self.dtype, self.device)
        if target_num_layers(target) < 1:
            raise ValueError("target: has no decoder layers")

    # ---- saving ------------------------------------------------------------------------------------------------
    def checkpoint_tensors(self, include_embeddings: bool = True) -> dict[str, Tensor]:
        """The DeepSpec-named tensors ``save_pretrained`` writes (shared embeddings included on request)."""
        return loading.checkpoint_tensors(self, include_embeddings)

    def save_pretrained(
        self,
        path: str | os.PathLike,
        *,
        include_embeddings: bool = True,
        max_shard_bytes: int | None = None,
        format: str = "deepspec",
        verifier: str | None = None,
    ) -> None:
        """Write ``config.json`` + ``model.safetensors`` in DeepSpec's layout (reloads bit-identically), and
        ``draft_vocab.json`` when a draft vocabulary is set (a stale one in ``path`` is removed otherwise).
        ``max_shard_bytes`` shards the weights (HF's ``model.safetensors.index.json``). ``format="speculators"``
        (vLLM) or ``"specforge"`` writes that packaging instead, into a new or empty folder; ``verifier`` is the
        target's name or path for a speculators config. What a format cannot represent is a ``ValueError``
        naming it (docs/file-formats.md, "Drafter packagings")."""
        loading.save_pretrained(
            self,
            path,
            include_embeddings=include_embeddings,
            max_shard_bytes=max_shard_bytes,
            format=format,
            verifier=verifier,
        )

    # ---- per-request context --------------------------------------------------------------------------------
    def features_from_hidden_states(self, hidden_states: Sequence[Tensor]) -> Tensor:
        """Concatenate HF ``hidden_states[i + 1]`` (``-1`` -> ``hidden_states[0]``) for ``target_layer_ids``."""
        return torch.cat([hidden_states[i + 1] for i in self.config.target_layer_ids], -1)

    @property
    def contexts(self) -> PagedContexts:
        """Every request's context K/V (``dspark.models.context``), made on the drafter's device and dtype."""
        store = self._context_store
        if store is not None and (store.device != self.device or store.dtype != self.dtype):
            if store.pool.requests:
                raise ValueError(
                    f"the drafter moved to {self.device} / {self.dtype} while requests hold contexts on "
                    f"{store.device} / {store.dtype}; finish them first (finish_all)"
                )
            store = None
        if store is None:
            c = self.config
            store = PagedContexts(
                c.num_hidden_layers,
                c.num_key_value_heads,
                c.head_dim,
                self.dtype,
                self.device,
                row_width=c.hidden_size if c.context_projection else 0,
            )
            self._context_store = store
        return store

    def context_length(self, request_id: int) -> int:
        store = self._context_store
        return 0 if store is None else store.length(int(request_id))

    def next_position(self, request_id: int) -> int:
        """The anchor position the next draft of this request uses by default."""
        store = self._context_store
        return 0 if store is None else store.next_position(int(request_id))

    def truncate(self, request_id: int, length: int) -> None:
        """Keep only the first ``length`` context rows of a request (e.g. after a rollback)."""
        rid = int(request_id)
        store = self._context_store
        if store is None or rid not in store:
            if length != 0:
                raise ValueError(f"request_id: {request_id} has no context")
            return
        store.truncate(rid, length)

    def finish(self, request_id: int) -> None:
        """Free a request's context."""
        if self._context_store is not None:
            self._context_store.finish(int(request_id))

    def finish_all(self) -> None:
        if self._context_store is not None:
            self._context_store.clear()

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
        store = self.contexts
        for j, rid in enumerate(ids):
            f = features[j]
            if f.dim() != 2 or f.shape[1] != width:
                raise ValueError(f"features[{j}]: expected shape (n, {width}) (m * H), got {tuple(f.shape)}")
            pos = None if positions is None else int(positions[j])
            if rid not in store:
                if pos is not None and pos < 0:
                    raise ValueError(f"positions[{j}]: must be >= 0, got {pos}")
            elif pos is not None and pos != store.next_position(rid):
                raise ValueError(
                    f"positions[{j}]: request {rid} continues at position {store.next_position(rid)}, got {pos} "
                    f"(truncate the context first to rewrite rows)"
                )
        counts = [f.shape[0] for f in features]
        n = sum(counts)
        feats = torch.cat([f.to(device=self.device, dtype=self.dtype) for f in features]) if n else None
        graphs = None if self.graphs is None or not n else self.graphs.context
        if graphs is not None and not graphs.fits(n):
            graphs = None
        # eager: computed before any context changes (a failure here changes none)
        ctx_rows = None if graphs is not None or not n else context_rows(self, feats)
        for j, rid in enumerate(ids):  # an empty append still starts a context
            if rid not in store:
                store.start(rid, 0 if positions is None else int(positions[j]))
        if not n:
            return
        starts = [store.next_position(rid) for rid in ids]
        slots = torch.tensor(
            [s for rid, k in zip(ids, counts, strict=True) for s in store.append_slots(rid, k)],
            dtype=torch.int64,
        )
        pos = torch.tensor(
            [s + j for s, k in zip(starts, counts, strict=True) for j in range(k)], dtype=torch.int64
        )
        if graphs is not None and graphs.run(feats, slots, pos):
            return
        if ctx_rows is None:  # the graph's capture failed: these rows run eagerly
            ctx_rows = context_rows(self, feats)
        write_context(self, ctx_rows, to_device(pos, self.device), to_device(slots, self.device))
