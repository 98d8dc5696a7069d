# SPDX-License-Identifier: Apache-2.0
"""CUDA graphs for the target adapter's decode and verify forwards (docs/target-adapter.md, "CUDA graphs").

A decode round's target forward is hundreds of small kernels for a small model (SmolLM2-135M: 30 layers of
~15 each), so its launch overhead can exceed its work. :class:`TargetGraphs` captures the forward once per
*bucket* — the request count ``R`` and the packed token count ``T`` rounded up to the next of
:class:`GraphBuckets` — and replays it:

* every input the forward reads (token ids, positions, KV slots, the ragged page index) lives in static
  buffers, refilled before each replay by queued copies from pinned memory (no host sync);
* a batch smaller than its bucket is padded, without changing the real rows: requests ``R .. R_b - 1`` have no
  rows and no pages, and the rows ``T .. T_b - 1`` belong to one more request (the *sink*) with no pages, whose
  queries see no key (``paged_verify_attention`` returns zeros for them) and whose K/V slots are ``-1``
  (``paged_kv_append`` skips them), so the cache is never written outside the real requests' slots;
* only forwards in which every request already has tokens in the cache (decode and verify steps) are graphed;
  prefills, and shapes past the largest bucket, run eagerly as before.

The graphs hold the addresses of the model's parameters and of the KV caches: a cache that grows (a pool
without ``max_pages`` doubling) drops them, and they are captured again at the next forward. Captured graphs
share one memory pool and at most ``max_graphs`` are kept (the least recently used goes first).
"""

from __future__ import annotations

import time
import warnings
from collections import OrderedDict
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from dspark.host_sync import cat_to_device, to_device
from dspark.ops import paged_verify_attention_split_base

DEFAULT_REQUEST_BUCKETS = (1, 2, 4, 8, 16, 32, 64)
DEFAULT_TOKEN_BUCKETS = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512)


@dataclass(frozen=True)
class GraphBuckets:
    """The shapes :class:`TargetGraphs` captures.

    Attributes
    ----------
    requests : tuple of int
        Request-count buckets, strictly increasing, ≥ 1; a forward of ``R`` requests uses the first ≥ ``R``.
    tokens : tuple of int
        Packed-token-count buckets, strictly increasing, ≥ 1; a forward of ``T`` new tokens uses the first ≥ ``T``.
    max_graphs : int
        Graphs kept at once (≥ 1); capturing one more drops the least recently replayed.
    """

    requests: tuple[int, ...] = DEFAULT_REQUEST_BUCKETS
    tokens: tuple[int, ...] = DEFAULT_TOKEN_BUCKETS
    max_graphs: int = 32

    def __post_init__(self) -> None:
        for name in ("requests", "tokens"):
            values = getattr(self, name)
            ok = (
                isinstance(values, tuple)
                and len(values) > 0
                and all(isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in values)
                and all(a < b for a, b in zip(values[:-1], values[1:], strict=True))
            )
            if not ok:
                raise ValueError(
                    f"GraphBuckets.{name}: expected a strictly increasing tuple of ints >= 1, got {values!r}"
                )
        if isinstance(self.max_graphs, bool) or not isinstance(self.max_graphs, int) or self.max_graphs < 1:
            raise ValueError(f"GraphBuckets.max_graphs: expected an int >= 1, got {self.max_graphs!r}")

    def key(self, num_requests: int, num_tokens: int) -> tuple[int, int] | None:
        """``(R_b, T_b)``: the buckets of a forward of ``num_requests`` requests and ``num_tokens`` new tokens, or
        None past the largest bucket."""
        r = next((b for b in self.requests if b >= num_requests), None)
        t = next((b for b in self.tokens if b >= num_tokens), None)
        return None if r is None or t is None else (r, t)


@dataclass
class PaddedBatch:
    """A batch's host metadata padded to its bucket ``(R_b, T_b)`` (lists of ints).

    ``qo_indptr`` / ``kv_indptr`` ``(R_b + 2,)`` and ``kv_last_page_len`` ``(R_b + 1,)``: the real requests, the
    empty padding requests, then the sink that holds the padding rows; ``slot_mapping`` ``(T_b,)``: the real
    rows' slots, then ``-1`` (skipped) for the padding rows; ``kv_indices`` the real requests' pages (the
    buffer past them is never read).
    """

    qo_indptr: list[int]
    kv_indptr: list[int]
    kv_indices: list[int]
    kv_last_page_len: list[int]
    slot_mapping: list[int]


def padded_batch(
    key: tuple[int, int],
    qo_indptr: Sequence[int],
    page_index: tuple[Sequence[int], Sequence[int], Sequence[int]],
    slot_mapping: Sequence[int],
) -> PaddedBatch:
    """Pad a forward's ragged metadata to its bucket ``key = (R_b, T_b)`` (see :class:`PaddedBatch`).

    ``qo_indptr`` ``(R + 1,)`` host offsets of each request's new rows; ``page_index`` the pool's
    ``(kv_indptr (R + 1,), kv_indices (nnz,), kv_last_page_len (R,))``; ``slot_mapping`` ``(T,)``. Requires
    ``R <= R_b`` and ``T <= T_b``.
    """
    r_b, t_b = key
    R, T = len(qo_indptr) - 1, qo_indptr[-1]
    kv_indptr, kv_indices, last = page_index
    if not (R <= r_b and T <= t_b and len(slot_mapping) == T and len(kv_indptr) == R + 1 and len(last) == R):
        raise ValueError(f"padded_batch: a batch of {R} requests / {T} rows does not fit the bucket {key}")
    pad_requests = r_b - R
    nnz = kv_indptr[-1]
    return PaddedBatch(
        qo_indptr=[*qo_indptr, *([T] * pad_requests), t_b],
        kv_indptr=[*kv_indptr, *([nnz] * (pad_requests + 1))],
        kv_indices=list(kv_indices),
        kv_last_page_len=[*last, *([0] * (pad_requests + 1))],
        slot_mapping=[*slot_mapping, *([-1] * (t_b - T))],
    )


@dataclass
class GraphStats:
    """What the graphs did (``TargetAdapter.graph_stats``).

    Attributes
    ----------
    captures, replays : int
        Graphs captured (again after a cache growth or an eviction) and forwards replayed (with
        ``capture=False``: run padded to their bucket).
    eager : dict
        Forwards run eagerly, by reason (``"prefill"``, ``"too large"``, ``"disabled"``).
    evictions : int
        Graphs dropped to stay within ``max_graphs``.
    capture_ms : float
        Time spent capturing (warm-up included).
    pool_bytes : int
        Growth of the CUDA caching allocator's reserved memory over the captures (what the graphs' pool took).
    disabled : str or None
        Why graphs were turned off (a capture failed), if they were.
    """

    captures: int = 0
    replays: int = 0
    eager: dict[str, int] = field(default_factory=dict)
    evictions: int = 0
    capture_ms: float = 0.0
    pool_bytes: int = 0
    disabled: str | None = None

    def count_eager(self, reason: str) -> None:
        self.eager[reason] = self.eager.get(reason, 0) + 1


class TargetGraphs:
    """Captured decode / verify forwards of one :class:`~dspark.models.target.TargetAdapter` (CUDA only).

    Parameters
    ----------
    adapter : TargetAdapter
        Its model must be on a CUDA device and must not use sliding-window attention.
    buckets : GraphBuckets
        The captured shapes.
    capture : bool
        False runs the padded forwards eagerly instead of capturing them (any device; for tests of the padding).
    """

    def __init__(self, adapter: Any, buckets: GraphBuckets, capture: bool = True) -> None:
        if capture and adapter.device.type != "cuda":
            raise ValueError(f"cuda_graphs: needs a model on a CUDA device, got {adapter.device}")
        config = adapter.model.config
        config = config.get_text_config() if hasattr(config, "get_text_config") else config
        if getattr(config, "sliding_window", None) is not None and getattr(
            config, "use_sliding_window", True
        ):
            # the window check reads the forward's longest request on the host: a graph would bake it in
            raise ValueError("cuda_graphs: models with sliding-window attention are not supported")
        self.adapter = adapter
        self.buckets = buckets
        self.capture = bool(capture)
        self.stats = GraphStats()
        dev = adapter.device
        t_max, r_max = buckets.tokens[-1], buckets.requests[-1]
        i32, i64 = torch.int32, torch.int64
        # static inputs, shared by every graph (each reads a prefix); the page list grows with the pool
        self.input_ids = torch.zeros(1, t_max, dtype=i64, device=dev)
        self.position_ids = torch.zeros(1, t_max, dtype=i64, device=dev)
        self.slot_mapping = torch.full((t_max,), -1, dtype=i64, device=dev)
        self.qo_indptr = torch.zeros(r_max + 2, dtype=i32, device=dev)
        self.kv_indptr = torch.zeros(r_max + 2, dtype=i32, device=dev)
        self.kv_last_page_len = torch.zeros(r_max + 1, dtype=i32, device=dev)
        self.split_base = torch.zeros(r_max + 1, dtype=i32, device=dev)  # the attention's split plan
        self.kv_indices = torch.zeros(0, dtype=i32, device=dev)
        self._graphs = GraphSet(buckets.max_graphs, dev, self.stats)

    # ---- public -------------------------------------------------------------------------------------------------
    def reset(self) -> None:
        """Drop every captured graph (the next forward of each bucket captures again)."""
        self._graphs.clear()

    def run(
        self,
        rids: Sequence[Hashable],
        tokens: Sequence[Tensor],
        slots: Sequence[Tensor],
        positions: Sequence[Tensor],
        rows: Tensor,
        qo: list[int],
        layers: Sequence[int],
        prefill: bool,
    ) -> tuple[Tensor, dict[int, Tensor]] | None:
        """Replay (capturing first if needed) the forward of this batch, or None to run it eagerly.

        ``tokens`` / ``slots`` / ``positions``: each request's new rows (``slots`` on the host);
        ``rows`` the host indices of the packed rows that get logits; ``qo`` the host offsets ``(R + 1,)``;
        ``prefill``: some request had no tokens in the cache. Returns ``(logits (len(rows), V), hidden)`` with
        ``hidden[l]`` ``(T, H)``, copies that stay valid after the next replay.
        """
        if self.stats.disabled is not None:
            self.stats.count_eager("disabled")
            return None
        if prefill:
            self.stats.count_eager("prefill")
            return None
        key = self.buckets.key(len(rids), qo[-1])
        if key is None:
            self.stats.count_eager("too large")
            return None
        self._follow_caches()
        self._fill(key, rids, tokens, slots, positions, qo)
        gkey = (*key, tuple(sorted(set(layers))))
        if self.capture:
            out = self._graphs.replay(gkey, lambda: self._forward(key, gkey[2]))
            if out is None:
                return None
            logits, hidden = out
        else:  # the same padded forward, run eagerly (tests the padding where no GPU is)
            logits, hidden = self._forward(key, gkey[2])
        self.stats.replays += 1
        T = qo[-1]
        # copies: the graph's outputs are overwritten by its next replay
        out = (
            logits[:T].clone()
            if _all_rows(rows, T)
            else logits.index_select(0, to_device(rows, logits.device))
        )
        return out, {layer: h[:T].clone() for layer, h in hidden.items()}

    # ---- internals ----------------------------------------------------------------------------------------------
    def _follow_caches(self) -> None:
        """Drop the graphs when the adapter's caches were reallocated, and keep the page list as long as the pool."""
        self.kv_indices = self._graphs.follow(
            self.adapter.k_cache[0], self.adapter.pool.total_pages, self.kv_indices
        )

    def _fill(self, key, rids, tokens, slots, positions, qo) -> None:
        """Queue the copies of this batch's padded metadata into the static buffers (pinned, no sync)."""
        r_b, t_b = key
        T = qo[-1]
        padded = padded_batch(
            key, qo, self.adapter.pool.host_batch_index(rids), torch.cat(list(slots)).tolist()
        )
        copy_in(self.qo_indptr[: r_b + 2], padded.qo_indptr)
        copy_in(self.kv_indptr[: r_b + 2], padded.kv_indptr)
        copy_in(self.kv_last_page_len[: r_b + 1], padded.kv_last_page_len)
        copy_in(self.split_base[: r_b + 1], paged_verify_attention_split_base(padded.qo_indptr))
        if padded.kv_indices:
            copy_in(self.kv_indices[: len(padded.kv_indices)], padded.kv_indices)
        copy_in(self.slot_mapping[:t_b], padded.slot_mapping)
        dev = self.adapter.device
        for buf, parts in ((self.input_ids, tokens), (self.position_ids, positions)):  # host or device rows
            buf[0, :T].copy_(cat_to_device(parts, dev))  # one pinned copy of the host positions, not R
            buf[0, T:t_b].zero_()

    def _forward(self, key, layers) -> tuple[Tensor, dict[int, Tensor]]:
        """One forward of the bucket ``key`` on the static buffers (eager, or recorded under capture)."""
        r_b, t_b = key
        return self.adapter.call_model(
            self.input_ids[:, :t_b],
            self.position_ids[:, :t_b],
            0,  # logits of every row: the rows asked for are picked after the replay
            layers,
            slot_mapping=self.slot_mapping[:t_b],
            qo_indptr=self.qo_indptr[: r_b + 2],
            kv_indptr=self.kv_indptr[: r_b + 2],
            kv_indices=self.kv_indices,
            kv_last_page_len=self.kv_last_page_len[: r_b + 1],
            split_base=self.split_base[: r_b + 1],
            max_kv_len=0,  # read only by the sliding-window check, and such models are refused
        )


class GraphSet:
    """Captured graphs by key, at most ``max_graphs`` (the least recently replayed goes first), in one memory
    pool, counted in ``stats`` (shared by :class:`TargetGraphs` and ``DrafterGraphs``)."""

    def __init__(self, max_graphs: int, device: torch.device, stats: GraphStats) -> None:
        self.max_graphs, self.device, self.stats = max_graphs, device, stats
        self._graphs: OrderedDict[Hashable, tuple[torch.cuda.CUDAGraph, Any]] = OrderedDict()
        self._pool = None
        self._cache_ptr: int | None = None

    def clear(self) -> None:
        self._graphs.clear()
        self._pool = None

    def follow(self, cache: Tensor, pages: int, page_list: Tensor) -> Tensor:
        """Drop the graphs when ``cache`` (one of the KV caches they read) was reallocated, or when the pool has
        more ``pages`` than the static ``page_list`` holds; returns the page list to use (a longer one then)."""
        if cache.data_ptr() != self._cache_ptr:
            self.clear()
            self._cache_ptr = cache.data_ptr()
        if page_list.numel() < pages:
            self.clear()  # the graphs read the old page list
            page_list = torch.zeros(pages, dtype=torch.int32, device=page_list.device)
        return page_list

    def replay(self, key: Hashable, fn: Callable[[], Any]) -> Any | None:
        """Replay the graph of ``key``, capturing ``fn`` first when there is none (:func:`capture_graph`), and
        return its outputs (the graph's memory: the next replay overwrites them); None when capturing failed."""
        entry = self._graphs.get(key)
        if entry is None:
            while len(self._graphs) >= self.max_graphs:
                self._graphs.popitem(last=False)
                self.stats.evictions += 1
            if self._pool is None:
                self._pool = torch.cuda.graph_pool_handle()
            entry = capture_graph(fn, self.device, self._pool, self.stats)
            if entry is None:
                self.clear()
                return None
            self._graphs[key] = entry
        else:
            self._graphs.move_to_end(key)
        entry[0].replay()
        return entry[1]


def capture_graph(
    fn: Callable[[], Any], device: torch.device, pool: Any, stats: GraphStats
) -> tuple[torch.cuda.CUDAGraph, Any] | None:
    """Warm ``fn`` up on a side stream, then capture it into a new graph in ``pool``: ``(graph, fn's outputs)``,
    counted in ``stats`` (time, pool growth). On failure graphs are turned off (``stats.disabled``, one warning)
    and None is returned: the caller runs eagerly from then on.

    The warm-up runs on the static buffers, which hold the current batch: it writes what the replay that follows
    writes, so it changes nothing the replay would not.
    """
    t0 = time.perf_counter()
    reserved = torch.cuda.memory_reserved(device)
    caller = torch.cuda.current_stream(device)
    side = None
    try:
        side = torch.cuda.Stream(device)
        side.wait_stream(caller)
        with torch.cuda.stream(side):
            fn()
        caller.wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=pool):
            out = fn()
    except Exception as e:  # noqa: BLE001 (any capture failure: fall back to eager, say why once)
        # torch.cuda.graph.__exit__ calls capture_end() before it restores the stream, so a capture invalidated
        # by a sync (capture_end raises) leaves the capture stream current for the rest of the process: put the
        # caller's stream back, ordered after a warm-up that may have failed part-way on the side stream.
        try:
            torch.cuda.set_stream(caller)
            if side is not None:
                caller.wait_stream(side)
        except RuntimeError:  # a sticky device error: the eager path will report it
            pass
        stats.disabled = f"{type(e).__name__}: {e}"
        warnings.warn(
            f"dspark: CUDA graph capture failed ({stats.disabled}); running eagerly from now on",
            RuntimeWarning,
            stacklevel=4,
        )
        return None
    stats.captures += 1
    stats.capture_ms += (time.perf_counter() - t0) * 1e3
    stats.pool_bytes += max(0, torch.cuda.memory_reserved(device) - reserved)
    return graph, out


def copy_in(dst: Tensor, values: list[int]) -> None:
    """``dst[:] = values``; on CUDA from pinned host memory, queued on the current stream (no wait)."""
    dst.copy_(to_device(torch.tensor(values, dtype=dst.dtype), dst.device))


def _all_rows(rows: Tensor, T: int) -> bool:
    return rows.numel() == T and bool((rows == torch.arange(T)).all())


def describe(stats: GraphStats) -> dict[str, Any]:
    """``stats`` as a plain dict (for benchmarks' JSON)."""
    return {
        "captures": stats.captures,
        "replays": stats.replays,
        "eager": dict(stats.eager),
        "evictions": stats.evictions,
        "capture_ms": round(stats.capture_ms, 1),
        "pool_mib": round(stats.pool_bytes / 2**20, 1),
        "disabled": stats.disabled,
    }
