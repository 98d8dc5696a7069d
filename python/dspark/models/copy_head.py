# SPDX-License-Identifier: Apache-2.0
"""The copy head: a learned pointer from each draft slot to the token the history's lookup continuation puts
there (docs/drafter.md, "Copy head").

The copy channel (``block_inputs``) hands the backbone the continuation and leaves it to learn to copy; the copy
head copies directly, in logit space. At slot ``j`` with a copied token ``c_j`` (entry ``j`` of the
continuation) and copy class ``n`` (the match length; with ``copy_extent_bounds`` a ``copy_max_match`` match is
split further by how far it extends, ``dspark.decoding.lookup.match_class``):

* the draft logits get a bonus at ``c_j``: ``U[j, c_j] += logit_bias[j, n] + h_j · logit_gate / √H`` (the gate lets
  the hidden state say when to override the copy; ``1/√H`` keeps one optimiser step on it as large as one on a
  bias);
* the confidence head's logit gets ``conf_bias[j, follows, n]``, ``follows`` = whether the previous token
  ``x_{j-1}`` is the copy's ``c_{j-1}`` (always at the first slot, whose previous token is the anchor): how often
  a copy is right depends on the slot, the copy class and whether the draft is still on the copied path,
  which the hidden state does not see (nor how long a passage the history is copying). Like the Markov
  feature ``W1[x_{j-1}]`` it reads only draws before ``x_j``, so the confidence of slot ``j`` never looks at
  ``x_j`` (the planner may admit ``x_j`` by it: ``dspark.ops.confidence``).

With ``copy_greedy_bias`` a second table ``greedy_bias[j, n]`` is added to the bonus of **greedy** rows only
(temperature 0), at sampling (``DraftSteps.sample``): a greedy round accepts a draft by whether it is the
target's argmax, so there the copy should win whenever it is more often the argmax than the drafter's own
choice, while at T > 0 the bonus is also the mass ``q`` puts on the copy, which the L1 term keeps moderate. It
is fitted by counting greedy hits (``dspark.training.greedy_table``).

Zeros (the fresh values) leave the drafter as it was. Like the copy channel the inputs are a function of the
history alone, so the round stays exact (DESIGN §4.5): the bonus is part of ``q``, which the verifier reads.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from dspark.models.layers import Float32Module


class CopyHead(Float32Module):
    """``logit_bias`` ``(γ, C)``, ``logit_gate`` ``(H,)``, ``conf_bias`` ``(γ, 2, C)`` (C = the config's
    ``num_copy_classes``), kept in float32 when the drafter is cast, like the confidence head."""

    def __init__(self, block_size: int, hidden_size: int, num_classes: int, greedy: bool = False) -> None:
        super().__init__()
        n = num_classes
        self.logit_bias = nn.Parameter(torch.zeros(block_size, n))
        self.logit_gate = nn.Parameter(torch.zeros(hidden_size))
        self.conf_bias = nn.Parameter(torch.zeros(block_size, 2, n))
        # added to the bonus of greedy rows only (copy_greedy_bias; module docstring)
        self.greedy_bias = nn.Parameter(torch.zeros(block_size, n)) if greedy else None
        self.gate_scale = hidden_size**-0.5

    def logit_bonus(self, hidden: Tensor, copy_tokens: Tensor, copy_match: Tensor) -> Tensor:
        """Bonus ``(R, g)`` float32 at each slot's copied token (0 where the slot has none).

        ``hidden`` ``(R, g, H)`` final-normed (``g ≤ γ``); ``copy_tokens`` ``(R, γ)`` int64, -1 for none;
        ``copy_match`` ``(R,)`` int64 copy class.
        """
        tok, slot, n = slot_classes(copy_tokens, copy_match, hidden.shape[1], self.logit_bias.shape[1])
        bonus = (
            self.logit_bias[slot, n] + (hidden.float() * self.logit_gate.float()).sum(-1) * self.gate_scale
        )
        return bonus * (tok >= 0)

    def add_to_logits(
        self,
        logits: Tensor,
        hidden: Tensor,
        copy_tokens: Tensor,
        copy_match: Tensor,
        draft_ids: Tensor | None = None,
    ) -> Tensor:
        """``logits`` ``(R, g, V)`` (``(R, g, V')`` over the sorted draft ids ``draft_ids`` ``(V',)``) with the
        bonus added at each slot's copied token; a copy outside the draft vocabulary gets none. Out of place
        (differentiable)."""
        return scatter_bonus(
            logits, copy_tokens, self.logit_bonus(hidden, copy_tokens, copy_match), draft_ids
        )

    def add_greedy_bonus(
        self,
        logits: Tensor,
        copy_tokens: Tensor,
        copy_match: Tensor,
        rows: Tensor | None = None,
        draft_ids: Tensor | None = None,
    ) -> Tensor:
        """``logits`` ``(R, g, V)`` (or ``(R, g, V')`` over ``draft_ids``) plus ``greedy_bias[j, n]`` at each
        slot's copied token, in the rows ``rows`` ``(R,)`` bool (all when None): the greedy rows' extra pull
        towards the copy (module docstring). ``logits`` unchanged without a greedy table. Out of place."""
        if self.greedy_bias is None:
            return logits
        tok, slot, n = slot_classes(copy_tokens, copy_match, logits.shape[1], self.greedy_bias.shape[1])
        bonus = self.greedy_bias[slot, n] * (tok >= 0)
        if rows is not None:
            bonus = bonus * rows.to(bonus.device, bonus.dtype).unsqueeze(1)
        return scatter_bonus(logits, copy_tokens, bonus, draft_ids)

    def confidence_inputs(
        self, prev_tokens: Tensor, copy_tokens: Tensor, copy_match: Tensor
    ) -> tuple[Tensor, Tensor]:
        """Extra confidence inputs: one-hot features ``(R, g, γ·2·C)`` of (slot, follows, copy class) — all
        zero where the slot has no copy — and their weights ``(γ·2·C,)``, so that ``w · [h; e; f]`` adds
        ``conf_bias[j, follows, n]``. ``prev_tokens`` ``(R, g)``: the token before each slot (the anchor,
        then the drafts ``x_1 .. x_{g-1}``; the teacher-forced ones in training)."""
        g = prev_tokens.shape[1]
        G, _, n_max = self.conf_bias.shape
        tok, slot, n = slot_classes(copy_tokens, copy_match, g, n_max)
        follows = torch.ones_like(tok)
        follows[:, 1:] = (prev_tokens[:, 1:] == copy_tokens[:, : g - 1]).to(tok.dtype)
        index = (slot * 2 + follows) * n_max + n
        feats = F.one_hot(index, G * 2 * n_max).float() * (tok >= 0).unsqueeze(-1)
        return feats, self.conf_bias.reshape(-1)


def slot_classes(
    copy_tokens: Tensor, copy_match: Tensor, g: int, num_classes: int
) -> tuple[Tensor, Tensor, Tensor]:
    """The first ``g`` slots' copied tokens ``(R, g)`` (-1: none), slot indices and copy classes (clamped to
    the tables' ``num_classes``), both ``(R, g)``: the cells of the copy head's tables."""
    tok = copy_tokens[:, :g]
    n = copy_match.clamp(0, num_classes - 1).unsqueeze(1).expand_as(tok)
    slot = torch.arange(g, device=tok.device).unsqueeze(0).expand_as(tok)
    return tok, slot, n


def scatter_bonus(
    logits: Tensor, copy_tokens: Tensor, bonus: Tensor, draft_ids: Tensor | None = None
) -> Tensor:
    """``logits`` ``(R, g, V)`` plus ``bonus`` ``(R, g)`` at each slot's copied token ``copy_tokens[:, :g]`` (-1:
    none); over a draft vocabulary (``logits`` ``(R, g, V')``, sorted ids ``draft_ids`` ``(V',)``) a copy
    outside it gets none. Out of place (differentiable)."""
    g = logits.shape[1]
    tok = copy_tokens[:, :g]
    if draft_ids is not None:
        pos = torch.searchsorted(draft_ids, tok.clamp_min(0))
        inside = (tok >= 0) & (pos < draft_ids.numel())
        inside &= draft_ids[pos.clamp(max=draft_ids.numel() - 1)] == tok
        tok = torch.where(inside, pos, -1)
        bonus = bonus * inside
    add = torch.zeros_like(logits).scatter_(
        -1, tok.clamp_min(0).unsqueeze(-1), bonus.unsqueeze(-1).to(logits.dtype)
    )
    return logits + add
