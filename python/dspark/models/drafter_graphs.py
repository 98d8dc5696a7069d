# SPDX-License-Identifier: Apache-2.0
"""CUDA graphs for the drafter's block forward (docs/drafter.md, "CUDA graphs").

A draft round's backbone is a few dozen small kernels per draft layer (norms, projections, RoPE, the paged K/V
write and attention, the MLP), so at small batches its launches cost more than its work. The block of every
request has the same ``s = block_slots`` rows and the contexts are paged (``dspark.models.context``), so the
forward's shapes depend on the request count ``R`` alone: :class:`DrafterGraphs` captures
``DSparkDrafter.block_forward`` once per request bucket (``GraphBuckets.requests``) and replays it.

* Every input it reads — anchors, positions, scratch slots, the page index, the copy inputs, the last context
  row's slot — lives in static buffers, refilled before each replay by queued copies (pinned host memory, or
  device to device): no host sync.
* A batch smaller than its bucket is padded with blocks that have no pages (their rows see no key and give
  zeros), scratch slots ``-1`` (``paged_kv_append`` skips them) and anchor 0; their rows are dropped.
* The graphs hold the addresses of the drafter's parameters and of the context caches: caches that grow (the
  page pool doubling) drop them, and they are captured again at the next round. At most ``max_graphs`` are kept,
  in one memory pool; a failed capture turns them off with a warning (the drafter runs eagerly from then on).

The round's later steps — the LM head with the Markov draw, and the confidence head — have graphs of their own,
``heads`` (:class:`dspark.models.drafter_head_graphs.DraftHeadGraphs`), and so has the append of the committed
rows to the contexts, ``context`` (:class:`dspark.models.context_graphs.ContextGraphs`).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from dspark.models.block_batch import BlockBatch, BlockLayout, block_split_base
from dspark.models.context_graphs import ContextGraphs
from dspark.models.drafter_head_graphs import DraftHeadGraphs
from dspark.models.target_graphs import GraphBuckets, GraphSet, GraphStats, copy_in


class DrafterGraphs:
    """Captured block forwards of one ``DSparkDrafter`` (see the module docstring).

    Parameters
    ----------
    drafter : DSparkDrafter
        On a CUDA device (unless ``capture`` is False).
    buckets : GraphBuckets
        Its ``requests`` are the captured request counts (``tokens`` is not read: a block has a fixed size).
    capture : bool
        False runs the padded forwards eagerly instead (any device; tests the padding where no GPU is).
    """

    def __init__(self, drafter: Any, buckets: GraphBuckets, capture: bool = True) -> None:
        if capture and drafter.device.type != "cuda":
            raise ValueError(f"cuda_graphs: the drafter must be on a CUDA device, got {drafter.device}")
        self.drafter = drafter
        self.buckets = buckets
        self.capture = bool(capture)
        self.stats = GraphStats()
        c, dev = drafter.config, drafter.device
        r_max, s = buckets.requests[-1], c.block_slots
        i32, i64 = torch.int32, torch.int64
        self.anchors = torch.zeros(r_max, dtype=i64, device=dev)
        self.positions = torch.zeros(r_max * s, dtype=i64, device=dev)
        self.slot_mapping = torch.full((r_max * s,), -1, dtype=i64, device=dev)
        self.qo_indptr = torch.arange(0, (r_max + 1) * s, s, dtype=i32, device=dev)  # a prefix per bucket
        self.kv_indptr = torch.zeros(r_max + 1, dtype=i32, device=dev)
        self.kv_last_page_len = torch.zeros(r_max, dtype=i32, device=dev)
        self.kv_indices = torch.zeros(0, dtype=i32, device=dev)
        self.last_slots = torch.full((r_max,), -1, dtype=i64, device=dev) if c.context_projection else None
        self.copy_tokens = torch.full((r_max, c.block_size), -1, dtype=i64, device=dev)
        self.copy_match = torch.zeros(r_max, dtype=i64, device=dev)
        self._graphs = GraphSet(buckets.max_graphs, dev, self.stats)
        self.heads = DraftHeadGraphs(drafter, buckets, capture)  # sampling and confidence; stats of their own
        self.context = ContextGraphs(drafter, buckets, capture)  # the committed rows' append; its own stats

    def reset(self) -> None:
        """Drop every captured graph (the next round of each bucket captures again)."""
        self._graphs.clear()
        self.heads.reset()
        self.context.reset()

    def run(self, anchors: Tensor, layout: BlockLayout, copy: tuple[Tensor, Tensor] | None) -> Tensor | None:
        """Replay (capturing first if needed) the block forward of ``layout``'s R blocks, or None to run it
        eagerly. ``anchors`` ``(R,)`` int64, ``copy`` as ``block_forward`` takes it. Returns the hidden
        ``(R, s, H)``, a copy that stays valid after the next replay."""
        if self.stats.disabled is not None:
            self.stats.count_eager("disabled")
            return None
        R = layout.num_blocks
        r_b = next((b for b in self.buckets.requests if b >= R), None)
        if r_b is None:
            self.stats.count_eager("too large")
            return None
        self._follow_caches()
        self._fill(r_b, anchors, layout, copy)
        has_copy = copy is not None
        if self.capture:
            hidden = self._graphs.replay(r_b, lambda: self._forward(r_b, has_copy))
            if hidden is None:
                return None
        else:
            hidden = self._forward(r_b, has_copy)
        self.stats.replays += 1
        return hidden[:R].clone()  # the graph's output is overwritten by its next replay

    # ---- internals ----------------------------------------------------------------------------------------------
    def _follow_caches(self) -> None:
        """Drop the graphs when the context caches were reallocated; keep the page list as long as the pool."""
        store = self.drafter.contexts
        self.kv_indices = self._graphs.follow(store.k[0], store.pool.total_pages, self.kv_indices)

    def _fill(
        self, r_b: int, anchors: Tensor, layout: BlockLayout, copy: tuple[Tensor, Tensor] | None
    ) -> None:
        """Queue the copies of this round's padded inputs into the static buffers (no sync)."""
        R, s = layout.num_blocks, layout.slots_per_block
        padded = layout.padded(r_b)
        copy_in(self.positions[: r_b * s], padded.positions)
        copy_in(self.slot_mapping[: r_b * s], padded.slot_mapping)
        copy_in(self.kv_indptr[: r_b + 1], padded.kv_indptr)
        copy_in(self.kv_last_page_len[:r_b], padded.kv_last_page_len)
        if padded.kv_indices:
            copy_in(self.kv_indices[: len(padded.kv_indices)], padded.kv_indices)
        if self.last_slots is not None:
            copy_in(self.last_slots[:r_b], padded.last_slots)
        self.anchors[:R].copy_(anchors)
        self.anchors[R:r_b].zero_()
        if copy is not None:
            self.copy_tokens[:R].copy_(copy[0])
            self.copy_tokens[R:r_b].fill_(-1)
            self.copy_match[:R].copy_(copy[1])
            self.copy_match[R:r_b].zero_()

    def _forward(self, r_b: int, has_copy: bool) -> Tensor:
        """The block forward of bucket ``r_b`` on the static buffers (eager, or recorded under capture)."""
        s = self.drafter.config.block_slots
        batch = BlockBatch(
            self.positions[: r_b * s],
            self.slot_mapping[: r_b * s],
            self.qo_indptr[: r_b + 1],
            self.kv_indptr[: r_b + 1],
            self.kv_indices,
            self.kv_last_page_len[:r_b],
            None if self.last_slots is None else self.last_slots[:r_b],
            block_split_base(self.qo_indptr[: r_b + 1], s),
        )
        copy = (self.copy_tokens[:r_b], self.copy_match[:r_b]) if has_copy else None
        return self.drafter.block_forward(self.anchors[:r_b], batch, copy)
