# SPDX-License-Identifier: Apache-2.0
"""Per-request drafter context cache: projected, normed, rotated K/V of committed tokens, per draft layer.

Each request owns two growable buffers ``k, v`` of shape ``[L, capacity, kv_heads, D]``; rows ``[0, length)``
are committed context at absolute positions ``first_position + [0, length)``. A draft round writes its block
K/V into the scratch rows ``[length, length + gamma)`` and attends to ``[0, length + gamma)`` without advancing
``length``, so block K/V never persist. Requests are independent (no padding, no cross-request mask): a batch
of requests with different lengths gives, row for row, what each request gives alone.

A paged layout (``paged_kv_append`` + ``paged_verify_attention`` with a non-causal block mask) can replace this
class behind the same three calls: ``reserve``, ``append`` and ``keys_values``.
"""

from __future__ import annotations

import torch
from torch import Tensor


class RequestContext:
    """Context K/V of one request (see the module docstring)."""

    def __init__(
        self,
        layers: int,
        kv_heads: int,
        head_dim: int,
        dtype,
        device,
        first_position: int,
        row_width: int = 0,
    ) -> None:
        self.shape = (layers, kv_heads, head_dim)
        self.dtype, self.device = dtype, device
        self.first_position = first_position
        self.length = 0
        self.k = torch.empty(layers, 0, kv_heads, head_dim, dtype=dtype, device=device)
        self.v = torch.empty_like(self.k)
        # the context rows themselves (row_width = H), for a drafter that reads row a-1 (context_projection)
        self.rows = torch.empty(0, row_width, dtype=dtype, device=device) if row_width else None

    @property
    def next_position(self) -> int:
        """Absolute position of the first row after the context (the anchor's position)."""
        return self.first_position + self.length

    def reserve(self, rows: int) -> None:
        """Make room for ``rows`` rows in total (doubling, so appends are amortised O(1) per row)."""
        cap = self.k.shape[1]
        if rows <= cap:
            return
        new_cap = max(rows, 2 * cap, 16)
        L, kvh, D = self.shape
        k = torch.empty(L, new_cap, kvh, D, dtype=self.dtype, device=self.device)
        v = torch.empty_like(k)
        k[:, : self.length] = self.k[:, : self.length]
        v[:, : self.length] = self.v[:, : self.length]
        self.k, self.v = k, v
        if self.rows is not None:
            rows = self.rows.new_empty(new_cap, self.rows.shape[1])
            rows[: self.length] = self.rows[: self.length]
            self.rows = rows

    def write(self, layer: int, start: int, k: Tensor, v: Tensor) -> None:
        """Write rows ``[start, start + n)`` of one layer (``k, v``: ``(n, kv_heads, D)``)."""
        n = k.shape[0]
        self.k[layer, start : start + n] = k
        self.v[layer, start : start + n] = v

    def write_rows(self, start: int, rows: Tensor) -> None:
        """Keep context rows ``[start, start + n)`` (``(n, H)``) when this context holds rows (else a no-op)."""
        if self.rows is not None:
            self.rows[start : start + rows.shape[0]] = rows

    def last_row(self) -> Tensor | None:
        """Row ``length - 1`` ``(H,)`` (zeros for an empty context); None when rows are not kept."""
        if self.rows is None:
            return None
        if self.length == 0:
            return self.rows.new_zeros(self.rows.shape[1])
        return self.rows[self.length - 1]

    def keys_values(self, layer: int, rows: int) -> tuple[Tensor, Tensor]:
        """Rows ``[0, rows)`` of one layer: ``(rows, kv_heads, D)`` each (views)."""
        return self.k[layer, :rows], self.v[layer, :rows]

    def truncate(self, length: int) -> None:
        if not 0 <= length <= self.length:
            raise ValueError(f"length: must be in [0, {self.length}], got {length}")
        self.length = length
