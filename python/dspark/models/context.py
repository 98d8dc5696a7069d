# SPDX-License-Identifier: Apache-2.0
"""The drafter's context cache: projected, normed, rotated K/V of committed rows, in pages shared by all requests.

One :class:`~dspark.kv.pool.PagePool` hands out pages; each draft layer has a K and a V cache
``(num_pages, page_size, kv_heads, D)``, written by ``paged_kv_append`` and read by ``paged_verify_attention``
(non-causal) — the target's layout, so a whole batch's block attention is one op call per layer instead of one
attention call per request, and a draft round has fixed shapes for a given request count (what a CUDA graph
needs: ``DrafterGraphs``). Request ``rid``'s rows ``[0, length)`` are its committed context at absolute
positions ``first_position + [0, length)``. A draft round appends its block K/V as scratch rows
``[length, length + g)`` (:meth:`PagedContexts.open_block`) and drops them afterwards (:meth:`close_block`),
so block K/V never persist. Requests are independent: a batch of requests with different lengths gives, row
for row, what each request gives alone.

A drafter that reads context row ``a - 1`` (``context_projection``) also keeps the rows themselves,
``(num_pages, page_size, H)``, indexed by the same slots.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from dspark.kv.pool import PagePool, grow_pages
from dspark.ops import paged_kv_append

PAGE_SIZE = 16


class PagedContexts:
    """Context K/V (and rows) of every request of one drafter (see the module docstring).

    Parameters
    ----------
    layers, kv_heads, head_dim : int
        The drafter's layer count and K/V shape.
    dtype, device
        Of the caches (the drafter's).
    row_width : int
        ``H`` to keep the context rows (``context_projection``), 0 not to.
    num_pages : int
        Pages to start with; the pool doubles (and the caches with it) when it runs out.
    """

    def __init__(
        self,
        layers: int,
        kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device | str,
        row_width: int = 0,
        num_pages: int = 16,
    ) -> None:
        self.dtype, self.device = dtype, torch.device(device)
        self.pool = PagePool(PAGE_SIZE, num_pages, None)
        shape = (num_pages, PAGE_SIZE, kv_heads, head_dim)
        self.k = [torch.zeros(shape, dtype=dtype, device=self.device) for _ in range(layers)]
        self.v = [torch.zeros(shape, dtype=dtype, device=self.device) for _ in range(layers)]
        # the rows themselves by slot, paged like K/V (context_projection); None when not kept
        self.rows = (
            torch.zeros(num_pages, PAGE_SIZE, row_width, dtype=dtype, device=self.device)
            if row_width
            else None
        )
        self._first: dict[int, int] = {}

    # ---- per request ----------------------------------------------------------------------------------------
    def __contains__(self, rid: int) -> bool:
        return rid in self._first

    @property
    def requests(self) -> list[int]:
        """The requests that hold a context."""
        return list(self._first)

    def start(self, rid: int, first_position: int) -> None:
        """A new, empty context whose first row will be at ``first_position``."""
        self.pool.add_request(rid)
        self._first[rid] = first_position

    def length(self, rid: int) -> int:
        """Committed rows of ``rid`` (0 without a context)."""
        return self.pool.length(rid) if rid in self._first else 0

    def next_position(self, rid: int) -> int:
        """Absolute position of the first row after the context (the anchor's position; 0 without one)."""
        return self._first[rid] + self.pool.length(rid) if rid in self._first else 0

    def truncate(self, rid: int, length: int) -> None:
        """Keep the first ``length`` rows (``ValueError`` outside ``[0, length(rid)]``)."""
        if not 0 <= length <= self.pool.length(rid):
            raise ValueError(f"length: must be in [0, {self.pool.length(rid)}], got {length}")
        self.pool.truncate(rid, length)

    def finish(self, rid: int) -> None:
        """Free ``rid``'s pages (no-op for an unknown request)."""
        if self._first.pop(rid, None) is not None:
            self.pool.finish(rid)

    def clear(self) -> None:
        for rid in list(self._first):
            self.finish(rid)

    # ---- rows ----------------------------------------------------------------------------------------------
    def append_slots(self, rid: int, n: int) -> list[int]:
        """Extend ``rid`` by ``n`` rows and return their slots (host ints; caches grown to fit)."""
        slots = self.pool.append_slot_list(rid, n)
        self._grow()
        return slots

    def write(self, layer: int, slots: Tensor, k: Tensor, v: Tensor) -> None:
        """Write ``k, v`` ``(n, kv_heads, D)`` of one layer into ``slots`` ``(n,)`` int64 on the device
        (``-1``: skipped)."""
        paged_kv_append(k, v, self.k[layer], self.v[layer], slots)

    def write_rows(self, slots: Tensor, rows: Tensor) -> None:
        """Keep context rows ``(n, H)`` at ``slots`` ``(n,)`` on the device, when rows are kept (else a no-op)."""
        if self.rows is not None:
            self.rows.view(-1, self.rows.shape[-1])[slots] = rows.to(self.rows.dtype)

    def last_row_slots(self, rids: Sequence[int], lengths: Sequence[int]) -> list[int]:
        """The slot of row ``lengths[i] - 1`` of each request (its last committed row while a block is open),
        ``-1`` where ``lengths[i]`` is 0."""
        return [-1 if n == 0 else self.pool.slot_of(rid, n - 1) for rid, n in zip(rids, lengths, strict=True)]

    def last_rows(self, last_slots: Tensor) -> Tensor:
        """Rows ``(R, H)`` at ``last_slots`` ``(R,)`` int64 on the device, zeros where the slot is ``-1``."""
        rows = self.rows.view(-1, self.rows.shape[-1])[last_slots.clamp_min(0)]
        return rows * (last_slots >= 0).unsqueeze(1).to(rows.dtype)

    def context_kv(self, rid: int) -> tuple[Tensor, Tensor]:
        """Copies of ``rid``'s committed K and V, ``(layers, length, kv_heads, D)`` each (for checks)."""
        n = self.length(rid)
        slots = torch.tensor(
            [self.pool.slot_of(rid, i) for i in range(n)], dtype=torch.int64, device=self.device
        )
        flat = lambda c: c.view(-1, *c.shape[2:])[slots]  # noqa: E731
        return torch.stack([flat(c) for c in self.k]), torch.stack([flat(c) for c in self.v])

    # ---- a draft round's block ------------------------------------------------------------------------------
    def open_block(self, rids: Sequence[int], g: int) -> list[int]:
        """Append ``g`` scratch rows to each request (after its context) for a round's block and return the
        ``R · g`` block slots in request order (host ints); the batch's page index then covers context + block
        (:meth:`host_index`). :meth:`close_block` drops them."""
        slots = [s for rid in rids for s in self.pool.append_slot_list(rid, g)]
        self._grow()
        return slots

    def close_block(self, rids: Sequence[int], lengths: Sequence[int]) -> None:
        """Drop the scratch rows: each request back to its committed ``lengths``."""
        for rid, n in zip(rids, lengths, strict=True):
            if self.pool.length(rid) > n:
                self.pool.truncate(rid, n)

    def host_index(self, rids: Sequence[int]) -> tuple[list[int], list[int], list[int]]:
        """``(kv_indptr (R + 1,), kv_indices, kv_last_page_len (R,))`` of ``rids`` as host lists."""
        return self.pool.host_batch_index(rids)

    # ---- internals ----------------------------------------------------------------------------------------
    def _grow(self) -> None:
        """Give the caches the pool's page count (after the pool doubled); the old rows keep their slots."""
        pages = self.pool.total_pages
        self.k = [grow_pages(c, pages) for c in self.k]
        self.v = [grow_pages(c, pages) for c in self.v]
        if self.rows is not None:
            self.rows = grow_pages(self.rows, pages)
