# SPDX-License-Identifier: Apache-2.0
"""The target adapter: run any Hugging Face causal LM on packed ragged batches over a paged KV cache.

:class:`TargetAdapter` registers a ``"dspark"`` attention function with transformers' ``AttentionInterface``
and switches the model to it. A forward packs the new tokens of several requests into one row
(``input_ids [1, T]``, ``position_ids [1, T]``), disables HF's own cache (``use_cache=False``) and passes the
ragged metadata through the forward's keyword arguments (``dspark_meta``), which transformers hands unchanged
to the attention function. There, per layer, the new K/V rows go into the adapter's paged cache
(``dspark.ops.paged_kv_append``) and each request's queries attend to its own cache
(``dspark.ops.paged_verify_attention``, causal, bottom-right aligned). The model's own modules (embeddings,
RoPE, norms, MLPs, LM head) do everything else, so any model whose attention goes through the interface
works. Logits are computed only for the rows asked for (``logits_to_keep`` with row indices), and forward
hooks return the raw outputs of the requested decoder layers. See docs/target-adapter.md.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from dspark.host_sync import cat_to_device, to_device
from dspark.kv import PagePool
from dspark.kv.pool import grow_pages
from dspark.models.cpu_linear import few_row_linears, plain_linears
from dspark.models.support import (  # noqa: F401 (tap_layers, TESTED_FAMILIES: re-exported)
    TESTED_FAMILIES,
    UnsupportedModelError,
    check_supported,
    decoder_layers,
    tap_layers,
)
from dspark.models.target_graphs import GraphBuckets, GraphStats, TargetGraphs
from dspark.ops import paged_kv_append, paged_verify_attention, paged_verify_attention_split_base

ATTN_NAME = "dspark"
_USERS_ATTR = "_dspark_attention_users"  # set on a model while adapters use it: {"count", "previous"}
LogitsSpec = Literal["all", "last", "none"] | Sequence[int]


@dataclass
class TargetInput:
    """New tokens of one request in a forward.

    Attributes
    ----------
    rid : Hashable
        The request (added with :meth:`TargetAdapter.add_request`).
    tokens : Sequence[int] or Tensor
        Token ids appended after the request's current length (prefill: the prompt; verify: 1..16 tokens).
    logits : "all", "last", "none" or Sequence[int]
        Which of these rows get logits (indices relative to ``tokens``). Default ``"all"``.
    positions : Sequence[int] or Tensor or None
        RoPE positions; default ``length, length + 1, ...``.
    """

    rid: Hashable
    tokens: Sequence[int] | Tensor
    logits: LogitsSpec = "all"
    positions: Sequence[int] | Tensor | None = None


@dataclass
class TargetOutput:
    """Result of :meth:`TargetAdapter.forward` (rows in batch order).

    Attributes
    ----------
    logits : Tensor
        ``(N, V)``: the requested rows of every request, concatenated in batch order.
    logits_indptr : list[int]
        ``R + 1`` offsets: request ``i``'s logits are ``logits[logits_indptr[i]:logits_indptr[i+1]]``.
    hidden : dict[int, Tensor]
        Layer ``l`` -> ``(T, H)`` raw output of decoder layer ``l`` for every new token (HF's
        ``hidden_states[l + 1]``, before the final norm).
    qo_indptr : list[int]
        ``R + 1`` offsets of each request's new tokens in the packed batch (rows of ``hidden``).
    """

    logits: Tensor
    logits_indptr: list[int]
    hidden: dict[int, Tensor] = field(default_factory=dict)
    qo_indptr: list[int] = field(default_factory=list)

    def request_logits(self, i: int) -> Tensor:
        return self.logits[self.logits_indptr[i] : self.logits_indptr[i + 1]]

    def request_hidden(self, layer: int, i: int) -> Tensor:
        return self.hidden[layer][self.qo_indptr[i] : self.qo_indptr[i + 1]]


@dataclass
class _Meta:
    """Ragged metadata carried to the attention function through the model's keyword arguments."""

    k_cache: list[Tensor]
    v_cache: list[Tensor]
    slot_mapping: Tensor
    qo_indptr: Tensor
    kv_indptr: Tensor
    kv_indices: Tensor
    kv_last_page_len: Tensor
    max_kv_len: int
    dense_qo: list[int] | None = None  # host qo_indptr when the batch is a prefill taken by dense attention
    split_base: Tensor | None = None  # the attention's split plan, computed once for every layer


def dense_prefill_attention(
    q: Tensor, k: Tensor, v: Tensor, qo_indptr: Sequence[int], scale: float
) -> Tensor:
    """Causal attention of each request's rows over its own rows, for requests whose cache was empty.

    q [T, Hq, D], k / v [T, Hkv, D] (the forward's new rows, packed), qo_indptr host [R + 1] -> out [T, Hq, D].
    What ``paged_verify_attention`` computes for such a batch, through ``F.scaled_dot_product_attention`` on the
    contiguous rows (PyTorch's flash kernels on CUDA), one call per request.
    """
    out = torch.empty_like(q)
    for a, b in zip(qo_indptr[:-1], qo_indptr[1:], strict=True):
        if b == a:
            continue
        qi, ki, vi = (t[a:b].transpose(0, 1)[None] for t in (q, k, v))  # [1, H, n, D]
        o = F.scaled_dot_product_attention(qi, ki, vi, is_causal=True, scale=scale, enable_gqa=True)
        out[a:b] = o[0].transpose(0, 1)
    return out


def _dspark_attention(
    module: nn.Module,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attention_mask: Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs: Any,
) -> tuple[Tensor, None]:
    # query [1, Hq, T, D], key/value [1, Hkv, T, D] (RoPE applied) -> out [1, T, Hq, D]
    meta: _Meta | None = kwargs.get("dspark_meta")
    if meta is None:
        raise RuntimeError(
            "dspark attention was called without dspark_meta: run this model through TargetAdapter.forward "
            "(or set another attention implementation with model.set_attn_implementation)"
        )
    if kwargs.get("softcap") is not None:
        raise UnsupportedModelError(f"{type(module).__name__}: attention logit soft-capping is not supported")
    window = kwargs.get("sliding_window")
    if window is not None and meta.max_kv_len > window:
        raise UnsupportedModelError(
            f"{type(module).__name__}: sliding-window attention (window {window}) is not supported past the "
            f"window (a request holds {meta.max_kv_len} tokens)"
        )
    if query.shape[0] != 1:
        raise RuntimeError(f"dspark attention expects a packed batch of one row, got batch {query.shape[0]}")
    layer = module.layer_idx
    kc, vc = meta.k_cache[layer], meta.v_cache[layer]
    k = key[0].transpose(0, 1).to(kc.dtype)  # [T, Hkv, D]
    v = value[0].transpose(0, 1).to(kc.dtype)
    paged_kv_append(k, v, kc, vc, meta.slot_mapping)
    q = query[0].transpose(0, 1).to(kc.dtype)  # [T, Hq, D]
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    if meta.dense_qo is not None:
        o = dense_prefill_attention(q, k, v, meta.dense_qo, scale)
    else:
        o = paged_verify_attention(
            q,
            kc,
            vc,
            meta.qo_indptr,
            meta.kv_indptr,
            meta.kv_indices,
            meta.kv_last_page_len,
            scale,
            True,
            meta.split_base,
        )
    return o.to(query.dtype).unsqueeze(0), None


def _no_dense_mask(*args: Any, **kwargs: Any) -> None:
    return None  # dspark attention builds its mask from the ragged metadata


def register_dspark_attention() -> None:
    """Register the ``"dspark"`` attention and (no-op) mask functions with transformers (idempotent)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(ATTN_NAME, _dspark_attention)
    AttentionMaskInterface.register(ATTN_NAME, _no_dense_mask)


class TargetAdapter:
    """Run a Hugging Face causal LM on packed ragged batches of requests over a paged KV cache.

    Parameters
    ----------
    model : transformers.PreTrainedModel
        A decoder-only ``XxxForCausalLM`` whose attention goes through transformers' ``AttentionInterface``
        (Llama, Qwen2, Qwen3, Mistral, SmolLM2 are tested). The adapter switches it to the ``"dspark"``
        attention implementation; :meth:`close` restores the previous one.
    page_size : int
        Tokens per KV page (default 16).
    max_pages : int or None
        Pool size in pages, allocated up front; running out raises :class:`dspark.kv.KVPoolExhausted`. With
        ``None`` the pool starts at ``num_pages`` and doubles (reallocating the caches) when it runs out.
    num_pages : int or None
        Initial pool size when ``max_pages`` is None (default 64).
    dtype : torch.dtype or None
        KV cache dtype (default: the model's parameter dtype).
    linear_max_rows : int or None
        During each forward, the model's ``nn.Linear`` layers fed at most this many rows compute ``(W · xᵀ)ᵀ``
        instead of ``x · Wᵀ`` (fp32 on CPU only; several times faster with MKL at 1–8 rows, see
        :mod:`dspark.models.cpu_linear`). ``None``: :func:`dspark.models.cpu_linear.default_max_rows` (0 where it
        does not pay); ``0`` turns it off. The model is unchanged outside the adapter's forwards.
    dense_prefill_min_rows : int or None
        A forward in which every request starts with an empty cache (a prefill of new requests) and one of
        them brings at least this many tokens computes attention with :func:`dense_prefill_attention`
        (``F.scaled_dot_product_attention`` on the new rows) instead of ``paged_verify_attention``; the cache is
        written the same way. ``None``: 128 on CUDA, where the op's split-KV kernel is built for verify blocks
        (on an H200 it took 3-7x longer than SDPA for 768-row prefills, docs/benchmarks.md; where between its
        fast 16-row verify blocks and 768 rows the two cross has not been measured), and off elsewhere; ``0``
        turns it off.
    cuda_graphs : bool or GraphBuckets
        Capture decode / verify forwards (every request already in the cache) in CUDA graphs bucketed by request
        and packed token count, and replay them (:mod:`dspark.models.target_graphs`; True: the default
        :class:`~dspark.models.target_graphs.GraphBuckets`). Prefills and shapes past the buckets run eagerly.
        CUDA only (ValueError elsewhere); off by default. A capture synchronises the device (once per bucket).

    Examples
    --------
    >>> adapter = TargetAdapter(model)                               # doctest: +SKIP
    >>> adapter.add_request("a"); adapter.add_request("b")           # doctest: +SKIP
    >>> out = adapter.forward([TargetInput("a", prompt_a, logits="last"),
    ...                        TargetInput("b", prompt_b, logits="last")], layers=[1, 5])  # doctest: +SKIP
    >>> out = adapter.forward([("a", draft_a), ("b", draft_b)])      # verify: logits of every row  # doctest: +SKIP
    >>> adapter.truncate("a", committed_len_a)                       # doctest: +SKIP
    """

    def __init__(
        self,
        model: nn.Module,
        page_size: int = 16,
        max_pages: int | None = None,
        num_pages: int | None = None,
        dtype: torch.dtype | None = None,
        linear_max_rows: int | None = None,
        dense_prefill_min_rows: int | None = None,
        cuda_graphs: bool | GraphBuckets = False,
    ) -> None:
        check_supported(model)
        if not isinstance(cuda_graphs, (bool, GraphBuckets)):
            raise ValueError(
                f"cuda_graphs: expected a bool or a GraphBuckets, got {type(cuda_graphs).__name__}"
            )
        if linear_max_rows is not None and int(linear_max_rows) < 0:
            raise ValueError(f"linear_max_rows: must be >= 0 or None, got {linear_max_rows}")
        if dense_prefill_min_rows is not None and int(dense_prefill_min_rows) < 0:
            raise ValueError(f"dense_prefill_min_rows: must be >= 0 or None, got {dense_prefill_min_rows}")
        self.model = model
        self.linear_max_rows = None if linear_max_rows is None else int(linear_max_rows)
        config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
        self.num_layers = int(config.num_hidden_layers)
        self.num_kv_heads = int(getattr(config, "num_key_value_heads", None) or config.num_attention_heads)
        self.head_dim = int(
            getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        )
        param = next(model.parameters())
        self.device = param.device
        self.dtype = dtype or param.dtype
        if dense_prefill_min_rows is None:
            dense_prefill_min_rows = 128 if self.device.type == "cuda" else 0
        self.dense_prefill_min_rows = int(dense_prefill_min_rows)
        if max_pages is not None:
            num_pages = max_pages
        self.pool = PagePool(page_size, num_pages if num_pages is not None else 64, max_pages)
        shape = (self.pool.total_pages, page_size, self.num_kv_heads, self.head_dim)
        self.k_cache = [
            torch.zeros(shape, dtype=self.dtype, device=self.device) for _ in range(self.num_layers)
        ]
        self.v_cache = [
            torch.zeros(shape, dtype=self.dtype, device=self.device) for _ in range(self.num_layers)
        ]
        self._layers = decoder_layers(model)
        self._linears = plain_linears(model)  # found once: each forward routes them (few-row fp32 on CPU)
        # Handed to the model as its attention mask: transformers returns a 4-D mask as it is, before its
        # packed-sequence check of position_ids, which reads a device value back (a sync on every forward).
        # dspark attention ignores it and masks from the ragged metadata.
        self._mask_placeholder = torch.ones(1, 1, 1, 1, dtype=torch.bool, device=self.device)
        buckets = GraphBuckets() if cuda_graphs is True else cuda_graphs or None
        # checked before the model is switched to dspark attention: a refusal leaves it as it was
        self.graphs = TargetGraphs(self, buckets) if buckets is not None else None
        register_dspark_attention()
        # Adapters over one model share its switch: the first records the model's own implementation and the
        # last one closed restores it (a later adapter must not record "dspark" as the model's own).
        users = getattr(model, _USERS_ATTR, None)
        if users is None:
            users = {"count": 0, "previous": getattr(model.config, "_attn_implementation", None)}
            setattr(model, _USERS_ATTR, users)
        users["count"] += 1
        self._closed = False
        model.set_attn_implementation(ATTN_NAME)

    # ---- requests ---------------------------------------------------------------------------------------------
    def add_request(self, rid: Hashable) -> None:
        """Register a new, empty request."""
        self.pool.add_request(rid)

    def length(self, rid: Hashable) -> int:
        """Tokens of ``rid`` in the KV cache."""
        return self.pool.length(rid)

    def truncate(self, rid: Hashable, committed_len: int) -> None:
        """Drop ``rid``'s tokens past ``committed_len`` (rejected drafts). No copy: the next forward overwrites."""
        self.pool.truncate(rid, committed_len)

    def finish(self, rid: Hashable) -> None:
        """Release every page of ``rid``."""
        self.pool.finish(rid)

    def close(self) -> None:
        """Drop the caches; the last open adapter of the model restores its own attention (idempotent)."""
        if self._closed:
            return
        self._closed = True
        if self.graphs is not None:
            self.graphs.reset()
        self.k_cache, self.v_cache = [], []
        users = getattr(self.model, _USERS_ATTR)
        users["count"] -= 1
        if users["count"] == 0:
            delattr(self.model, _USERS_ATTR)
            if users["previous"] is not None:
                self.model.set_attn_implementation(users["previous"])

    @property
    def graph_stats(self) -> GraphStats | None:
        """What the CUDA graphs did (None without ``cuda_graphs``)."""
        return None if self.graphs is None else self.graphs.stats

    # ---- forward ------------------------------------------------------------------------------------------------
    @torch.inference_mode()
    def forward(self, batch: Sequence[TargetInput | tuple], layers: Sequence[int] = ()) -> TargetOutput:
        """Append each request's new tokens and run them through the model in one packed forward.

        Runs under ``torch.inference_mode`` (a SmolLM2-135M one-token step on CPU: ~8 % faster than under
        ``no_grad``, from less per-op bookkeeping), so the returned tensors are inference tensors: read them
        freely; ``clone()`` one to modify it in place or to use it in autograd.

        Parameters
        ----------
        batch : sequence of TargetInput or tuples ``(rid, tokens[, logits[, positions]])``
            One entry per request (distinct ``rid``); prefill and verify entries may be mixed.
        layers : sequence of int
            Decoder layers whose raw outputs to return (layer ``l`` is HF's ``hidden_states[l + 1]``; ``-1`` is
            the embedding output, HF's ``hidden_states[0]``).

        Returns
        -------
        TargetOutput
            Logits of the requested rows, per-layer hidden states of all new tokens, and the offsets.

        Raises
        ------
        dspark.kv.KVPoolExhausted
            When the pool cannot hold the new tokens; no request was changed.
        """
        items = [b if isinstance(b, TargetInput) else TargetInput(*b) for b in batch]
        rids = [it.rid for it in items]
        if len(set(rids)) != len(rids):
            raise ValueError("TargetAdapter.forward: a request appears twice in the batch")
        for layer in layers:
            if not -1 <= layer < self.num_layers:
                raise ValueError(
                    f"TargetAdapter.forward: layer {layer} outside [-1, {self.num_layers}) (-1: the embeddings)"
                )
        old_len = {rid: self.pool.length(rid) for rid in rids}
        tokens = [torch.as_tensor(it.tokens, dtype=torch.long).reshape(-1) for it in items]
        slots, positions, rows, qo, lo = [], [], [], [0], [0]
        try:
            for it, tok in zip(items, tokens, strict=True):
                n = tok.numel()
                slots.append(self.pool.append_slots(it.rid, n))
        except BaseException:
            for rid, n in old_len.items():  # all-or-nothing: undo the requests already extended
                if self.pool.length(rid) != n:
                    self.pool.truncate(rid, n)
            raise
        try:
            for it, tok in zip(items, tokens, strict=True):
                n, start = tok.numel(), old_len[it.rid]
                if it.positions is None:
                    positions.append(torch.arange(start, start + n, dtype=torch.long))
                else:
                    p = torch.as_tensor(it.positions, dtype=torch.long).reshape(-1)
                    if p.numel() != n:
                        raise ValueError(
                            f"TargetAdapter.forward: request {it.rid!r} has {n} tokens, {p.numel()} positions"
                        )
                    positions.append(p)
                rows.append(self._logit_rows(it, n) + qo[-1])
                qo.append(qo[-1] + n)
                lo.append(lo[-1] + rows[-1].numel())
            dense = 0 < self.dense_prefill_min_rows <= max(
                (t.numel() for t in tokens), default=0
            ) and not any(old_len.values())
            prefill = not all(old_len.values())
            return self._run(items, tokens, slots, positions, rows, qo, lo, layers, dense, prefill)
        except BaseException:
            for rid, n in old_len.items():
                self.pool.truncate(rid, n)
            raise

    __call__ = forward

    def _logit_rows(self, it: TargetInput, n: int) -> Tensor:
        spec = it.logits
        if isinstance(spec, str):
            if spec == "all":
                return torch.arange(n)
            if spec == "last":
                return torch.arange(n - 1, n) if n else torch.arange(0)
            if spec == "none":
                return torch.arange(0)
            raise ValueError(
                f"TargetAdapter.forward: logits must be 'all', 'last', 'none' or indices, got {spec!r}"
            )
        idx = torch.as_tensor(spec, dtype=torch.long).reshape(-1)
        if idx.numel() and (idx.min() < 0 or idx.max() >= n):
            raise ValueError(
                f"TargetAdapter.forward: logits rows {idx.tolist()} outside [0, {n}) for {it.rid!r}"
            )
        return idx

    def _grow_caches(self) -> None:
        for caches in (self.k_cache, self.v_cache):
            caches[:] = [grow_pages(c, self.pool.total_pages) for c in caches]

    def _run(self, items, tokens, slots, positions, rows, qo, lo, layers, dense, prefill) -> TargetOutput:
        self._grow_caches()
        rids = [it.rid for it in items]
        if self.graphs is not None and not dense:
            graphed = self.graphs.run(rids, tokens, slots, positions, torch.cat(rows), qo, layers, prefill)
            if graphed is not None:
                logits, hidden = graphed
                return TargetOutput(logits=logits, logits_indptr=lo, hidden=hidden, qo_indptr=qo)
        dev = self.device
        index = self.pool.batch_index(rids, device=dev)
        logits, captured = self.call_model(
            cat_to_device(tokens, dev)[None],  # a prefill's host ids in one copy; a verify's drafts stay
            to_device(torch.cat(positions), dev)[None],
            to_device(torch.cat(rows), dev),
            layers,
            slot_mapping=to_device(torch.cat(slots), dev),
            qo_indptr=to_device(qo, dev, torch.int32),
            kv_indptr=index.kv_indptr,
            kv_indices=index.kv_indices,
            kv_last_page_len=index.kv_last_page_len,
            max_kv_len=max((self.pool.length(r) for r in rids), default=0),
            dense_qo=qo if dense else None,
            split_base=None if dense else to_device(paged_verify_attention_split_base(qo), dev, torch.int32),
        )
        return TargetOutput(logits=logits, logits_indptr=lo, hidden=captured, qo_indptr=qo)

    def call_model(
        self,
        input_ids: Tensor,
        position_ids: Tensor,
        logits_to_keep: Tensor | int,
        layers: Sequence[int],
        **meta: Any,
    ) -> tuple[Tensor, dict[int, Tensor]]:
        """One packed forward of the model over the adapter's caches (the eager path and the graphs' body).

        ``input_ids`` / ``position_ids`` ``(1, T)`` on the device; ``logits_to_keep`` the row indices that get
        logits (``0``: every row); ``meta`` the fields of the attention metadata (``_Meta``). Returns the logits
        ``(N, V)`` and the tapped layers' outputs ``{layer: (T, H)}``.
        """
        captured: dict[int, Tensor] = {}
        handles = tap_layers(
            self._layers, sorted(set(layers)), lambda layer, h: captured.__setitem__(layer, h[0])
        )
        try:
            with few_row_linears(self._linears, self.linear_max_rows):
                out = self.model(
                    input_ids=input_ids,
                    position_ids=position_ids,
                    attention_mask=self._mask_placeholder,
                    use_cache=False,
                    logits_to_keep=logits_to_keep,
                    dspark_meta=_Meta(k_cache=self.k_cache, v_cache=self.v_cache, **meta),
                )
        finally:
            for h in handles:
                h.remove()
        return out.logits[0], captured
