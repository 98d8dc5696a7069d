# SPDX-License-Identifier: Apache-2.0
"""The copy head's greedy table, fitted by counting (docs/drafter.md, "Greedy table").

A greedy round accepts drafts while each is the target's argmax ``y``. At slot ``j`` of an anchor whose copy
``c`` (class ``n``) is draftable, let ``z`` be the served draft logits (the LM head, the copy head's bonus, the
Markov bias of the teacher-forced previous token) and ``m = z[c] − max_{v≠c} z[v]`` the copy's margin. With an
extra offset ``β`` at ``c`` the greedy draft is ``c`` when ``m + β > 0`` and the best other token ``o``
otherwise, so it hits ``y`` when ``m + β > 0 and c = y`` or ``m + β ≤ 0 and o = y``; a slot without a copy hits
when ``argmax z = y``. Slot ``j`` counts only while slots ``1 .. j − 1`` hit, as in a round, so the table is
fitted slot by slot: for each cell ``(j, n)`` the ``β`` of :data:`GRID` with the most hits among the anchors
still accepted after the fitted slots before it (ties: the smallest ``|β|``; 0 in cells with fewer than
``min_count`` anchors). The total is then the expected number of accepted drafts, teacher-forced. A
cross-entropy to ``y`` fits calibrated probabilities instead, which is not what a greedy round rewards: on the
same data it moved the table the wrong way (docs/training.md).

Teacher forcing is exact here: a slot's draft counts only while every draft before it was accepted, i.e. equal
to the teacher-forced tokens.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from dspark.models.drafter import DSparkDrafter
from dspark.training.features import FeatureCache
from dspark.training.objective import block_hidden, block_labels, packed_copy_inputs

# offsets tried per cell: 0 and ±0.25 .. ±24 (a margin beyond ±24 decides the same way at any tried offset)
GRID = torch.cat([torch.zeros(1), torch.arange(0.25, 24.01, 0.25), -torch.arange(0.25, 24.01, 0.25)])


@dataclass
class CopyMargins:
    """Per anchor (``N`` rows, ``γ`` slots): ``cls`` ``(N,)`` its copy class; ``margin`` ``(N, γ)`` the copy's
    margin (-inf where the slot has no draftable copy); ``copy_right`` / ``other_right`` ``(N, γ)`` whether the
    copy / the best other token (the drafter's argmax where there is no copy) is the target's argmax;
    ``counted`` ``(N, γ)`` whether the slot's label is a response token."""

    cls: Tensor
    margin: Tensor
    copy_right: Tensor
    other_right: Tensor
    counted: Tensor


@torch.no_grad()
def copy_margins(
    drafter: DSparkDrafter, cache: FeatureCache, indices: list[int], progress: bool = False
) -> CopyMargins:
    """The :class:`CopyMargins` of every response anchor of the cached sequences ``indices`` (module
    docstring), with the drafter's draft vocabulary as served; ``progress`` shows a bar."""
    from tqdm.auto import tqdm

    c, dev = drafter.config, drafter.device
    dv = drafter.draft_vocab
    dv = None if dv is None else dv.to(dev)
    W = drafter.lm_head_weight if dv is None else drafter.lm_head_weight.index_select(0, dv)
    parts: list[list[Tensor]] = [[] for _ in range(5)]
    for i in tqdm(indices, desc="greedy margins", unit="seq", disable=not progress):
        s = cache[i]
        ids, mask = s.input_ids.to(dev), s.loss_mask.to(dev).bool()
        anchors = torch.nonzero(mask[:-1] & mask[1:]).view(-1)
        if anchors.numel() == 0:
            continue
        copy = packed_copy_inputs(c, [ids], [anchors], dev)
        hidden = block_hidden(drafter, s.features.to(dev), ids, anchors)  # [A, g, H]
        U = drafter.copy_head.add_to_logits(F.linear(hidden, W.to(hidden.dtype)), hidden, *copy, dv).float()
        _, counted, prev = block_labels(ids, mask, anchors, c.block_size)
        z = U if drafter.markov_head is None else _with_markov(drafter, U, prev, hidden, dv)
        rows = (anchors.unsqueeze(1) + torch.arange(c.block_size, device=dev)).clamp(max=ids.numel() - 1)
        # the target's argmax once per position (the anchors' blocks overlap γ-fold)
        y = F.linear(s.last_hidden.to(dev).float(), drafter.lm_head_weight.float()).argmax(-1)[rows]  # [A, g]
        tok = copy[0][:, : c.block_size]
        pos = tok.clamp_min(0)
        if dv is not None:
            pos = torch.searchsorted(dv, pos).clamp(max=dv.numel() - 1)
        draftable = (tok >= 0) & ((pos == tok) if dv is None else (dv[pos] == tok))
        at_copy = z.gather(-1, pos.unsqueeze(-1)).squeeze(-1)
        others = torch.where(draftable.unsqueeze(-1), z.scatter(-1, pos.unsqueeze(-1), float("-inf")), z)
        best, best_pos = others.max(-1)
        other_tok = best_pos if dv is None else dv[best_pos]
        margin = torch.where(draftable, at_copy - best, float("-inf"))
        for k, t in enumerate((copy[1], margin, draftable & (tok == y), other_tok == y, counted)):
            parts[k].append(t.cpu())
    if not parts[0]:
        raise ValueError(
            f"indices: the cached sequences {list(indices)[:8]} have no response anchors to count"
        )
    cls, margin, copy_right, other_right, counted = (torch.cat(p) for p in parts)
    return CopyMargins(cls.long(), margin.float(), copy_right.bool(), other_right.bool(), counted.bool())


def _with_markov(
    drafter: DSparkDrafter, U: Tensor, prev: Tensor, hidden: Tensor, dv: Tensor | None
) -> Tensor:
    """``U`` plus the Markov head's bias of the teacher-forced previous tokens ``prev``, over the draft ids."""
    head = drafter.markov_head
    if dv is None:
        return head(U, prev, hidden).float()
    w2 = head.markov_w2.weight.index_select(0, dv)
    return U + F.linear(head.markov_w1(prev), w2).float()


@dataclass
class GreedyTable:
    """The fitted table ``(γ, C)`` and, per cell, its accepted anchors with a copy and their greedy hits
    without and with the cell's offset (given the fitted slots before it)."""

    table: Tensor
    count: Tensor
    hits_before: Tensor
    hits_after: Tensor


def fit_greedy_table(m: CopyMargins, num_classes: int, min_count: int = 30) -> GreedyTable:
    """The table ``(γ, C)`` fitted slot by slot on the anchors still accepted (module docstring)."""
    g = m.margin.shape[1]
    table, count, before, after = (torch.zeros(g, num_classes) for _ in range(4))
    order = GRID.abs().argsort(stable=True)  # ties go to the smallest |offset|: the first of this order
    alive = m.counted[:, 0].clone()
    for j in range(g):
        # hits[k, i]: whether anchor i's draft at slot j hits with offset GRID[k]
        takes_copy = m.margin[:, j].unsqueeze(0) + GRID.unsqueeze(1) > 0
        hits = torch.where(takes_copy, m.copy_right[:, j], m.other_right[:, j])
        chosen = hits[0].clone()
        for n in range(num_classes):
            cell = alive & (m.cls == n) & torch.isfinite(m.margin[:, j])
            k = int(cell.sum())
            if k == 0:
                continue
            per = hits[:, cell].sum(1)
            best = int(order[per[order].argmax()]) if k >= min_count else 0
            table[j, n], count[j, n] = GRID[best], k
            before[j, n], after[j, n] = per[0], per[best]
            chosen[cell] = hits[best, cell]
        if j + 1 < g:
            alive &= chosen & m.counted[:, j + 1]
    return GreedyTable(table, count, before, after)


def write_greedy_table(src: str | os.PathLike, out: str | os.PathLike, table: Tensor) -> None:
    """Copy the drafter folder ``src`` to the new folder ``out`` with ``table`` ``(γ, C)`` as its copy head's
    greedy table (``copy_greedy_bias`` on); every other tensor (dtype included) and file as it was."""
    from dspark.models.checkpoint import check_tensors, read_config, read_tensors, write_checkpoint

    cfg = read_config(src)
    if not cfg.copy_head:
        raise ValueError(f"src: {src} has no copy head (copy_head: true); the greedy table is part of it")
    want = (cfg.block_size, cfg.num_copy_classes)
    if tuple(table.shape) != want:
        raise ValueError(f"table: expected shape {want} (slots, copy classes), got {tuple(table.shape)}")
    cfg.copy_greedy_bias = True
    tensors = {**read_tensors(src), "copy_head.greedy_bias": table.detach().float().cpu()}
    check_tensors(cfg, tensors, where=f"out: {out}")
    shutil.copytree(src, out)
    write_checkpoint(out, cfg, tensors)  # config.json and the weights (shards, if any, rewritten as one file)
