# SPDX-License-Identifier: Apache-2.0
"""CUDA graphs for the drafter's context append (docs/drafter.md, "CUDA graphs of the draft round").

After each round the committed rows' target features enter the drafter's contexts
(``DSparkDrafter.append_context``): ``fc``, the norms, and per draft layer the K / V projections, RoPE and the
paged write — a few dozen small launches that cost milliseconds of host time on a GPU whatever the row count
(on an H100, 3.8 ms a round for a 5-layer Qwen3-8B-shaped drafter at batch 1, more than its block forward in a
graph). Its shapes depend on the row count ``n`` alone, so :class:`ContextGraphs` captures it once per row
bucket (``GraphBuckets.tokens``) and replays it:

* the features, positions and slots live in static buffers, refilled by queued copies (no host sync);
* a batch smaller than its bucket is padded with copies of its last row (same features, position and slot):
  every step is row by row (GEMM rows, norms, RoPE), so the padding rows compute the last row's bits and write
  them to its slot — the same bytes, whichever write lands last — and no other slot is touched;
* the graphs hold the addresses of the context caches, so they are dropped when the page pool grows (the caches
  are reallocated then) and captured again at the next append; a failed capture turns them off with a warning
  (``stats.disabled``), and the appends run eagerly from then on. Appends past the largest bucket (a prefill's
  prompt rows) run eagerly.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from dspark.host_sync import to_device
from dspark.models.block_inputs import context_rows, write_context
from dspark.models.target_graphs import GraphBuckets, GraphSet, GraphStats


class ContextGraphs:
    """Captured context appends of one ``DSparkDrafter`` (see the module docstring).

    Parameters
    ----------
    drafter, buckets, capture
        As ``DrafterGraphs`` takes them (it builds these graphs as its ``context``); ``buckets.tokens`` are the
        captured row counts. ``capture=False`` runs the padded append eagerly (tests the padding on any device).
    """

    def __init__(self, drafter: Any, buckets: GraphBuckets, capture: bool = True) -> None:
        self.drafter = drafter
        self.buckets = buckets
        self.capture = bool(capture)
        self.stats = GraphStats()
        c, dev = drafter.config, drafter.device
        n_max = buckets.tokens[-1]
        self.features = torch.zeros(n_max, c.num_taps * c.hidden_size, dtype=drafter.dtype, device=dev)
        self.positions = torch.zeros(n_max, dtype=torch.int64, device=dev)
        self.slots = torch.zeros(n_max, dtype=torch.int64, device=dev)
        self._no_pages = torch.zeros(0, dtype=torch.int32, device=dev)
        self._graphs = GraphSet(buckets.max_graphs, dev, self.stats)

    def reset(self) -> None:
        """Drop every captured graph (the next append of each bucket captures again)."""
        self._graphs.clear()

    def fits(self, n: int) -> bool:
        """Whether an append of ``n`` rows replays a graph; if not, the reason is counted in ``stats.eager``."""
        if self.stats.disabled is not None:
            self.stats.count_eager("disabled")
            return False
        if self._bucket(n) is None:
            self.stats.count_eager("too large")
            return False
        return True

    def run(self, features: Tensor, slots: Tensor, positions: Tensor) -> bool:
        """Append ``features`` ``(n, m·H)`` (on the drafter's device and dtype) at ``slots`` and ``positions``
        ``(n,)`` int64 on the host, already allocated in the contexts. False when the capture failed: the caller
        then appends them eagerly (the capture's warm-up may have written the same rows already)."""
        n_b = self._bucket(features.shape[0])
        # the caches' addresses are in the graphs: reallocated caches (the pool grew) drop them
        self._graphs.follow(self.drafter.contexts.k[0], 0, self._no_pages)
        self.slots[:n_b].copy_(to_device(self._padded(slots, n_b), self.slots.device))
        self.positions[:n_b].copy_(to_device(self._padded(positions, n_b), self.positions.device))
        self.features[:n_b].copy_(self._padded(features, n_b))
        out = self._graphs.replay(n_b, lambda: self._append(n_b)) if self.capture else self._append(n_b)
        if out is None:
            return False
        self.stats.replays += 1
        return True

    # ---- internals ----------------------------------------------------------------------------------------------
    @staticmethod
    def _padded(x: Tensor, n_b: int) -> Tensor:
        """``x`` ``(n, ...)`` with its last row repeated up to ``n_b`` rows (the padding of the module docstring)."""
        return torch.cat([x, x[-1:].expand(n_b - x.shape[0], *x.shape[1:])])

    def _bucket(self, n: int) -> int | None:
        return next((b for b in self.buckets.tokens if b >= n), None)

    def _append(self, n_b: int) -> Tensor:
        """The append of bucket ``n_b`` on the static buffers (eager, or recorded under capture)."""
        rows = context_rows(self.drafter, self.features[:n_b])
        write_context(self.drafter, rows, self.positions[:n_b], self.slots[:n_b])
        return rows  # not read: GraphSet.replay takes None for a failed capture
