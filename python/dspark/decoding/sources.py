# SPDX-License-Identifier: Apache-2.0
"""Where each request's block comes from in a round: the trained drafter, the lookup index, or neither.

Each request's history proposes a lookup block (:class:`dspark.decoding.lookup.LookupIndex`); its survival —
the predicted probability that its first ``j + 1`` drafts are all accepted — comes from an
:class:`~dspark.decoding.acceptance.AcceptanceTable` by (match class, position), the class being the match
length and, for the longest matches, how far the match extends (:func:`~dspark.decoding.lookup.match_class`).
The drafter's block is scored from its first slot's survival (confidence head + STS: a function of the anchor
alone) times the drafter's own conditional acceptance of the later slots, kept in a second table. A request takes the block with the larger
predicted tokens per unit of verify cost.

Exactness (DESIGN §4.5): the choice reads the history, the lookup match and the first slot's confidence, never
a randomly drafted token, so it cannot select the drafter's block *because* its tokens look good. A request
whose lookup block wins even against a drafter certain of its first slot (``s_1 = 1``) is decided before the
drafter runs; when every request of a round is, the drafter does not run at all.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from dspark.decoding.acceptance import AcceptanceTable
from dspark.decoding.lookup import LookupConfig, LookupIndex, match_class
from dspark.decoding.planner import Planner
from dspark.decoding.request import Request
from dspark.models.config import DrafterConfig

__all__ = [
    "LookupBlock",
    "block_scores",
    "copy_continuations",
    "copy_proposal",
    "DrafterYield",
    "drafter_pays",
    "drafter_survival",
    "look_up",
    "new_copy_index",
]

# the drafter's conditional acceptance has one class (lookup tables have one per match class)
DRAFTER_CLASS = 0
# a drafter skipped because it does not pay runs again after this many rounds: its acceptance is learnt only
# from rounds it drafts, so a pessimistic estimate must not lock it out
DRAFTER_PROBE_ROUNDS = 16
# the drafter is skipped only when predicted to return this much less than a round without it: a near tie is
# within the error of a cost table profiled elsewhere and of the yield's running mean, and a skipped round
# learns nothing about the drafter
DRAFTER_SKIP_MARGIN = 0.15
# the same with a cost table profiled on this machine: only the yield's error is left (on a 2-core Xeon at
# batch 8 the hybrid ran 4-5 % faster with it than with 0.15; at batch 1 both decided every round alike;
# docs/lookup.md "Whether the drafter runs")
DRAFTER_SKIP_MARGIN_LOCAL = 0.05


@dataclass
class LookupBlock:
    """One round's lookup proposals for R requests, ``g`` slots wide (all on the host).

    Attributes
    ----------
    tokens : Tensor
        ``(R, g)`` int64: each row's proposal, then zeros (never verified: ``lengths`` bound the plan).
    lengths : list of int
        Tokens proposed per request (0: no match).
    classes : list of int
        Each proposal's acceptance class (:func:`~dspark.decoding.lookup.match_class`: match length and
        extent; 0: no match).
    proposals : list of list of int
        The proposals themselves (for the shadow observation at commit).
    survival : Tensor
        ``(R, g)`` float32: predicted survival of the lookup drafts, 0 past each proposal.
    from_corpus : list of bool
        Whether each proposal came from earlier requests' outputs rather than the request's own history.
    """

    tokens: Tensor
    lengths: list[int]
    classes: list[int]
    proposals: list[list[int]]
    survival: Tensor
    from_corpus: list[bool]

    @property
    def any(self) -> bool:
        return any(self.lengths)


def look_up(requests: list[Request], width: int, table: AcceptanceTable) -> LookupBlock:
    """Each request's lookup proposal of up to ``width`` tokens and its predicted survival ``(R, width)``."""
    proposals, classes, from_corpus = [], [], []
    for req in requests:
        index = req.lookup
        proposals.append(index.propose(width) if index is not None else [])
        classes.append(match_class(index.config, index.match_length, index.match_extent) if index else 0)
        from_corpus.append(index is not None and index.from_corpus)
    lengths = [len(p) for p in proposals]
    tokens = torch.zeros(len(requests), width, dtype=torch.int64)
    for i, p in enumerate(proposals):
        if p:
            tokens[i, : len(p)] = torch.tensor(p, dtype=torch.int64)
    survival = table.survival(classes, lengths, width)
    return LookupBlock(tokens, lengths, classes, proposals, survival, from_corpus)


def new_copy_index(config: DrafterConfig, history: list[int]) -> LookupIndex:
    """A request's index for a drafter that reads copies: the drafter's own match rule (and its copy classes'
    extent bounds) over ``history``."""
    rule = LookupConfig(
        config.copy_min_match, config.copy_max_match, extent_bounds=tuple(config.copy_extent_bounds)
    )
    index = LookupIndex(rule)
    index.extend(history)
    return index


def copy_proposal(index: LookupIndex, gamma: int) -> tuple[list[int], int]:
    """The copy inputs of one block: ``index``'s continuation (up to ``gamma`` tokens) and its copy class
    (:func:`~dspark.decoding.lookup.match_class` under the index's config; 0 when there is none)."""
    cont = index.propose(gamma)
    return cont, (match_class(index.config, index.match_length, index.match_extent) if cont else 0)


def copy_continuations(config: DrafterConfig, requests: list[Request]) -> dict:
    """The ``propose`` arguments of a drafter that reads copies (copy channel or copy head: each request's
    continuation over its history and its copy class, :func:`copy_proposal`), or none."""
    if not config.uses_copies:
        return {}
    pairs = [copy_proposal(req.copy_index, config.block_size) for req in requests]
    return {"copy_continuations": [c for c, _ in pairs], "copy_matches": [m for _, m in pairs]}


def drafter_survival(first: Tensor, table: AcceptanceTable, slots: int, width: int) -> Tensor:
    """Predicted survival ``(R, width)`` of a drafter block of ``slots`` drafts from its first slot's survival
    ``first`` ``(R,)``: ``first · a(2) · … · a(j + 1)`` with ``a`` the drafter's conditional acceptance of the
    later slots; 0 past ``slots``."""
    later = table.survival([DRAFTER_CLASS], [slots], width)[0].to(first.device)  # a(1)·…·a(j+1)
    tail = later / later[:1].clamp_min(1e-12)  # drop a(1): the first slot's survival is ``first``
    return first.float()[:, None] * tail[None, :]


def block_scores(survival: Tensor, rates: Tensor) -> Tensor:
    """Predicted tokens per unit of verify cost ``(R,)`` of blocks with ``survival`` ``(R, g)``.

    Verifying ``l`` drafts yields ``1 + S_1 + … + S_l`` tokens (the bonus or correction included) and runs at
    ``rates[l]`` ``(g + 1,)`` relative steps per second; the score is the best ratio over ``l``.
    """
    zero = torch.zeros(survival.shape[0], 1, dtype=torch.float32, device=survival.device)
    expected = 1.0 + torch.cat([zero, survival.float().cumsum(1)], 1)  # (R, g + 1)
    return (expected * rates.to(expected.device, torch.float32)[None, : expected.shape[1]]).amax(1)


class DrafterYield:
    """What the drafter's blocks have returned per request-round: emitted tokens and verified rows (running
    means that start at ``tokens`` / ``rows`` with ``weight`` pseudo-rounds and weigh at most ``window``).

    Realised values, not the confidence head's: they include the planner's choice of what to verify, so a
    drafter whose drafts are mostly left unverified is seen to yield little.
    """

    def __init__(self, tokens: float = 2.0, rows: float = 2.0, weight: float = 4.0, window: int = 64) -> None:
        self.tokens, self.rows, self.weight, self.window = float(tokens), float(rows), float(weight), window

    def observe(self, tokens: int, rows: int) -> None:
        """One request-round of a drafter block: ``tokens`` committed from ``rows`` verified rows."""
        self.weight = min(self.weight + 1.0, float(self.window))
        self.tokens += (tokens - self.tokens) / self.weight
        self.rows += (rows - self.rows) / self.weight


def drafter_pays(
    planner: Planner,
    drafter_yield: DrafterYield,
    num_requests: int,
    width: int,
    lookup: LookupBlock | None = None,
    decided: list[bool] | None = None,
    margin: float = DRAFTER_SKIP_MARGIN,
) -> bool:
    """Whether a round with the drafter is predicted to emit more tokens per second than one without it.

    Without it, each request verifies its lookup block (or its anchor alone), planned with ``early_stop``;
    with it, the ``decided`` requests keep their lookup blocks and every other one yields what the drafter's
    blocks have yielded so far (``drafter_yield``), and the round pays the drafter's time
    (:meth:`Planner.round_value`); it runs unless that is ``margin`` (:data:`DRAFTER_SKIP_MARGIN`, or
    :data:`DRAFTER_SKIP_MARGIN_LOCAL` with a cost table profiled on this machine) below the round without it.
    Reads the history only (no draft exists yet), so skipping the drafter is exact. True when the planner
    cannot price the drafter apart (no cost table with drafter times).
    """
    if not planner.prices_drafter:
        return True
    R = num_requests
    alone = torch.zeros(R, width) if lookup is None else lookup.survival
    take = torch.tensor(decided) if decided is not None else torch.zeros(R, dtype=torch.bool)
    kept = torch.where(take[:, None], alone, torch.zeros_like(alone))
    n = R - int(take.sum())
    with_drafter = planner.round_value(
        kept, True, n * (drafter_yield.tokens - 1.0), n * (drafter_yield.rows - 1.0)
    )
    return with_drafter > (1.0 - margin) * planner.round_value(alone, drafter=False)
