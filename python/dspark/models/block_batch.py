# SPDX-License-Identifier: Apache-2.0
"""Where a draft round's blocks sit in the drafter's paged contexts: :class:`BlockLayout` (host lists, padded to a
CUDA graph's request count) and :class:`BlockBatch` (the same on the device), what
``DSparkDrafter.block_forward`` reads (``models/drafting.py``, ``models/drafter_graphs.py``).
"""

from __future__ import annotations

import dataclasses

import torch
from torch import Tensor

from dspark.host_sync import to_device
from dspark.ops.paged_verify_attention import SPLIT_MAX_QUERIES


@dataclasses.dataclass
class BlockBatch:
    """Where R blocks of ``s = config.block_slots`` rows sit in the paged contexts, on the drafter's device:
    ``positions`` ``(R·s,)`` int64 (RoPE), ``slot_mapping`` ``(R·s,)`` int64 (the scratch slots the block K/V go
    to; ``-1`` skips a row), ``qo_indptr`` ``(R + 1,)`` and the page index ``kv_indptr`` ``(R + 1,)`` /
    ``kv_indices`` / ``kv_last_page_len`` ``(R,)`` int32 covering context + block, ``last_slots`` ``(R,)`` int64
    the slot of each context's last row (``-1`` for none; only for ``context_projection``), ``split_base``
    ``(R,)`` int32 the attention's split plan (``paged_verify_attention_split_base``; None: each layer plans). A
    CUDA graph replays the block forward on static tensors of this shape (``DrafterGraphs``)."""

    positions: Tensor
    slot_mapping: Tensor
    qo_indptr: Tensor
    kv_indptr: Tensor
    kv_indices: Tensor
    kv_last_page_len: Tensor
    last_slots: Tensor | None = None
    split_base: Tensor | None = None  # the attention's split plan (R,) int32, one for every layer


@dataclasses.dataclass
class BlockLayout:
    """:class:`BlockBatch` as host lists (R requests, ``s`` rows each): what :meth:`padded` pads to a CUDA graph's
    request count and :meth:`to_device` sends (pinned, asynchronous)."""

    slots_per_block: int
    positions: list[int]
    slot_mapping: list[int]
    kv_indptr: list[int]
    kv_indices: list[int]
    kv_last_page_len: list[int]
    last_slots: list[int] | None = None

    @property
    def num_blocks(self) -> int:
        return len(self.kv_last_page_len)

    def qo_indptr(self) -> list[int]:
        s = self.slots_per_block
        return list(range(0, self.num_blocks * s + 1, s))

    def padded(self, num_blocks: int) -> BlockLayout:
        """The layout of ``num_blocks >= R`` blocks: the extra ones have no pages (their rows see no key and
        output zeros), scratch slots ``-1`` (nothing written) and position 0."""
        pad = num_blocks - self.num_blocks
        rows = pad * self.slots_per_block
        return BlockLayout(
            self.slots_per_block,
            self.positions + [0] * rows,
            self.slot_mapping + [-1] * rows,
            self.kv_indptr + [self.kv_indptr[-1]] * pad,
            self.kv_indices,
            self.kv_last_page_len + [0] * pad,
            None if self.last_slots is None else self.last_slots + [-1] * pad,
        )

    def to_device(self, device: torch.device) -> BlockBatch:
        i32, i64 = torch.int32, torch.int64
        qo = to_device(self.qo_indptr(), device, i32)
        return BlockBatch(
            to_device(self.positions, device, i64),
            to_device(self.slot_mapping, device, i64),
            qo,
            to_device(self.kv_indptr, device, i32),
            to_device(self.kv_indices, device, i32),
            to_device(self.kv_last_page_len, device, i32),
            None if self.last_slots is None else to_device(self.last_slots, device, i64),
            block_split_base(qo, self.slots_per_block),
        )


def block_split_base(qo_indptr: Tensor, slots_per_block: int) -> Tensor | None:
    """The attention's split plan of blocks of ``s`` rows each, from their ``qo_indptr`` ``(R + 1,)``: request r's
    rows start at ``r * s`` in the split workspace too (``paged_verify_attention_split_base``), so the plan is
    ``qo_indptr[:-1]``; blocks longer than the op splits take no workspace rows, and None lets the op plan."""
    return qo_indptr[:-1] if slots_per_block <= SPLIT_MAX_QUERIES else None
