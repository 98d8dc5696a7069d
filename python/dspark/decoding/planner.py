# SPDX-License-Identifier: Apache-2.0
"""The verify planner: owns the SPS table, the ring of earlier rounds' survival and the planning mode."""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from dspark.decoding.measured_costs import MeasuredCosts
from dspark.decoding.tables import CostTable, SpsTable, read_json
from dspark.host_sync import to_device
from dspark.ops.plan_verify import PLAN_MODES, plan_verify

# SpsTable: read from here by older imports
__all__ = ["PlanResult", "Planner", "SpsTable", "finish_together_weights"]

logger = logging.getLogger("dspark.planner")

COST_DRIVEN_MODES = ("early_stop", "lagged_topk")  # the modes that price verify lengths with a cost curve


# how fast the weight of a request predicted to finish before the last one falls: 0.43 at 0.9 of the last one's
# rounds, 0.17 at 0.8, 0.04 at 2/3 (docs/decoder.md "When no prompt waits")
FINISH_TOGETHER_POWER = 8.0


def finish_together_weights(
    remaining: Sequence[int], rates: Sequence[float], power: float = FINISH_TOGETHER_POWER
) -> Tensor:
    """Weights ``(R,)`` float32 in ``[0, 1]`` of each request's survival when the running requests are the last.

    Request ``r`` is predicted to need ``f_r = remaining[r] / rates[r]`` more rounds (tokens it may still emit
    over the tokens per round it has emitted so far); the call ends with the last of them, so a verified row pays
    for the call in proportion to how likely its request is to be that one: ``w_r = (f_r / max f) ** power``.
    Requests far ahead then verify their anchors (and only sure drafts) and fall back; the last ones keep their
    full plans. History only (no draft is read): the output distribution is unchanged.
    """
    if len(remaining) != len(rates):
        raise ValueError(f"finish_together_weights: {len(remaining)} remaining counts for {len(rates)} rates")
    if any(n < 0 for n in remaining) or any(not rate > 0 for rate in rates):
        raise ValueError("finish_together_weights: remaining counts must be >= 0 and rates > 0")
    rounds = torch.tensor([n / rate for n, rate in zip(remaining, rates, strict=True)], dtype=torch.float32)
    last = float(rounds.max()) if len(rounds) else 0.0
    if last <= 0.0:
        return torch.ones(len(rounds))
    return (rounds / last) ** power


@dataclass
class PlanResult:
    """One round's plan: ``verify_len`` ``(R,)`` int32 in [1, gamma + 1] and ``budget`` ``()`` int64."""

    verify_len: Tensor
    budget: Tensor
    mode: str


class Planner:
    """Chooses each request's verify length every round.

    Parameters
    ----------
    mode : str
        ``"full"``, ``"threshold"``, ``"early_stop"`` (default) or ``"lagged_topk"``.
    sps_table : SpsTable | CostTable | dict | str | Path | None
        The cost table: SGLang's 1-D SPS table, or dspark's cost table (``dspark profile``), as an object, a
        dict or a path to its JSON. With a cost table each round of R requests is priced with the curve for R
        (:meth:`dspark.profiling.CostTable.to_sps`), drafter cost included. Missing or flat means "verify
        everything": the planner then runs ``full`` and says so once in the log.
    threshold : float
        Per-position confidence threshold of ``threshold`` mode.
    lag : int
        For ``lagged_topk``: how many rounds old the survival that sets the budget is (>= 1).
    draft_cost : bool
        With a cost table, price each round with the drafter's time (default); False for rounds that run no
        drafter (lookup decoding), whose cost is the verify alone.
    measure_costs : bool
        Correct the cost table with the round times the decoder measures (:meth:`observe`;
        :class:`dspark.decoding.measured_costs.MeasuredCosts`). Needs a cost table. Default off: verify lengths
        then depend on timings, so seeded sampled runs stop being reproducible run to run.

    Examples
    --------
    >>> import torch
    >>> from dspark import Planner, SpsTable
    >>> p = Planner("early_stop", SpsTable((1, 2, 4), (100.0, 95.0, 60.0), 8))
    >>> p.plan(torch.tensor([[0.9, 0.5, 0.1]])).verify_len
    tensor([2], dtype=torch.int32)
    """

    def __init__(
        self,
        mode: str = "early_stop",
        sps_table: SpsTable | CostTable | dict | str | Path | None = None,
        threshold: float = 0.0,
        lag: int = 1,
        draft_cost: bool = True,
        measure_costs: bool = False,
    ) -> None:
        if mode not in PLAN_MODES:
            raise ValueError(f"Planner: mode must be one of {PLAN_MODES}, got {mode!r}")
        if int(lag) < 1:
            raise ValueError(
                f"Planner: lag must be >= 1 (a budget from this round would anticipate), got {lag}"
            )
        source = "SpsTable"
        if isinstance(sps_table, (str, Path)):
            source = f"SpsTable: {sps_table}"
            sps_table = read_json(sps_table)
            if not isinstance(sps_table, dict):
                raise ValueError(f"{source}: must hold a JSON object")
        if CostTable.is_cost_table_dict(sps_table):
            sps_table = CostTable.from_dict(sps_table, "CostTable" if source == "SpsTable" else source)
        elif isinstance(sps_table, dict):
            sps_table = SpsTable.from_dict(sps_table, source)
        self.cost_table: CostTable | None = None
        self.draft_cost = bool(draft_cost)
        if sps_table is not None and not isinstance(sps_table, SpsTable):
            if not isinstance(sps_table, CostTable):
                raise TypeError(
                    "Planner: sps_table must be an SpsTable, a CostTable, a dict or a path, got "
                    f"{type(sps_table).__name__}"
                )
            self.cost_table = sps_table
            sps_table = sps_table.to_sps(include_draft=self.draft_cost)
        if measure_costs and self.cost_table is None:
            raise ValueError(
                "measure_costs: needs a dspark cost table to start from (sps_table: the costs.json that "
                "`dspark profile` writes, or a CostTable)"
            )
        # the cost table corrected by measured round times, or None (the table as profiled)
        self.measured = MeasuredCosts(self.cost_table) if measure_costs else None
        self.mode = mode
        self.threshold = float(threshold)
        self.lag = int(lag)
        # the 1-D curve (for a cost table: its every-batch curve; rounds use the curve of their own R)
        self.sps_table: SpsTable | None = sps_table
        # curves and what is derived from them, for the measured costs' ``version`` they were built at
        self._tensors: dict[tuple[torch.device, int, bool, int], tuple[Tensor, Tensor]] = {}
        self._rates: dict[tuple[int, int], Tensor] = {}
        self._curves: dict[tuple[int, bool, int], SpsTable] = {}
        self._version = 0
        # ring of earlier rounds: (request ids, survival [R, gamma] detached)
        self._history: deque[tuple[tuple[int, ...], Tensor]] = deque(maxlen=self.lag)
        self._warned_flat = False

    @property
    def effective_mode(self) -> str:
        """The mode actually run: cost-driven modes fall back to ``full`` without a usable table."""
        if self.mode in COST_DRIVEN_MODES and (self.sps_table is None or self.sps_table.is_flat):
            return "full"
        return self.mode

    @property
    def cost_driven(self) -> bool:
        """Whether the mode run prices verify lengths with a cost curve (``early_stop``, ``lagged_topk``)."""
        return self.effective_mode in COST_DRIVEN_MODES

    def _drop_stale(self) -> None:
        """Forget every cached curve once the measured costs have moved on."""
        if self.measured is not None and self.measured.version != self._version:
            self._version = self.measured.version
            self._tensors.clear()
            self._rates.clear()
            self._curves.clear()

    def _curve(self, num_requests: int, include_draft: bool, width: int = 0) -> SpsTable:
        """The SPS curve of rounds of ``num_requests`` requests (with or without the drafter's time), reaching
        ``num_requests · (width + 1)`` tokens (blocks of ``width`` drafts) when the table stops short of it."""
        if self.cost_table is None:
            return self.sps_table or SpsTable.flat()
        self._drop_stale()
        r = max(1, num_requests)
        key = (r, bool(include_draft), int(width))
        if key not in self._curves:
            source = self.measured if self.measured is not None else self.cost_table
            self._curves[key] = source.to_sps(r, include_draft=key[1], max_tokens=r * (key[2] + 1))
        return self._curves[key]

    def _sps(
        self, device: torch.device, num_requests: int, drafter: bool = True, width: int = 0
    ) -> tuple[Tensor, Tensor]:
        # a cost table prices each batch size with its own curve (draft cost depends on R); one curve otherwise
        self._drop_stale()
        with_draft = self.draft_cost and drafter
        own = self.cost_table is not None
        key = (device, num_requests if own else 0, with_draft, width if own else 0)
        if key not in self._tensors:
            self._tensors[key] = self._curve(num_requests, with_draft, width).tensors(device)
        return self._tensors[key]

    def _lagged(self, request_ids: tuple[int, ...], survival: Tensor) -> Tensor:
        """Survival of each current request from ``lag`` rounds ago; 1.0 (optimistic) where unknown.

        Rounds may draft different numbers of slots (the decoder's ``adaptive_slots``): the slots both rounds
        have are copied, and later slots keep the last copied value (confidence 1: optimistic, and the row stays
        a non-increasing cumulative product).
        """
        lagged = torch.ones_like(survival)
        if len(self._history) == self.lag:
            old_ids, old = self._history[0]
            w = min(old.shape[1], survival.shape[1])
            pos = {rid: i for i, rid in enumerate(old_ids)}
            dst = [i for i, rid in enumerate(request_ids) if rid in pos]
            if dst and w > 0:
                src = to_device([pos[request_ids[i]] for i in dst], survival.device, torch.int64)
                rows = old.index_select(0, src)[:, :w]
                fill = rows[:, -1:].expand(-1, survival.shape[1] - w)
                lagged[to_device(dst, survival.device, torch.int64)] = torch.cat([rows, fill], 1)
        return lagged

    def relative_rates(self, num_requests: int, width: int) -> Tensor:
        """``(width + 1,)`` float32 (host): target steps per second when one request of ``num_requests`` verifies
        ``l = 0 .. width`` drafts, relative to ``l = 0``; all 1 without a cost curve (cost-free modes).

        What choosing between two blocks of one request weighs their expected tokens by (docs/lookup.md).
        """
        self._drop_stale()
        key = (num_requests, width)
        if key not in self._rates:
            if self.cost_driven:
                table = self._curve(num_requests, self.draft_cost, width)
                base = max(1, num_requests)
                rel = [table.steps_per_sec(base + n) / table.steps_per_sec(base) for n in range(width + 1)]
            else:
                rel = [1.0] * (width + 1)
            self._rates[key] = torch.tensor(rel, dtype=torch.float32)
        return self._rates[key]

    @property
    def prices_drafter(self) -> bool:
        """Whether rounds with and without the drafter can be priced apart (a cost table with drafter times
        and a cost-driven mode)."""
        return self.cost_table is not None and bool(self.cost_table.draft) and self.cost_driven

    def round_value(
        self, survival: Tensor, drafter: bool, extra_tokens: float = 0.0, extra_rows: float = 0.0
    ) -> float:
        """Predicted tokens per second ``Θ = τ · SPS(B)`` of the ``early_stop`` plan of ``survival``
        ``(R, g)`` (host, float32), priced with (``drafter``) or without the drafter's time; ``extra_tokens``
        and ``extra_rows`` add blocks whose yield is known without a plan (the drafter's realised one).

        Compares running the drafter this round against verifying lookup blocks alone (docs/lookup.md
        "Whether the drafter runs"); needs :attr:`prices_drafter`.
        """
        if not self.prices_drafter:
            raise RuntimeError(
                "Planner.round_value: needs a cost table with drafter times and a cost-driven mode"
            )
        R, g = survival.shape
        table = self._curve(R, drafter, g)
        tokens, rates = self._sps(torch.device("cpu"), R, drafter, g)  # cached: asked twice a round
        verify_len, _ = plan_verify(survival.float().contiguous(), tokens, rates, "early_stop")
        lens = verify_len.tolist()
        expected = sum(1.0 + float(survival[i, : n - 1].sum()) for i, n in enumerate(lens)) + extra_tokens
        return expected * table.steps_per_sec(round(sum(lens) + extra_rows))

    def observe(self, num_requests: int, batch_tokens: int, verify_ms: float, draft_ms: float | None) -> None:
        """A round's measured times (host wall ms): its verify of ``batch_tokens`` rows from ``num_requests``
        requests and, when the drafter ran (for ``num_requests`` requests), its drafter round. Ignored unless
        ``measure_costs``."""
        if self.measured is None:
            return
        self.measured.observe_verify(num_requests, batch_tokens, verify_ms)
        if draft_ms is not None:
            self.measured.observe_draft(num_requests, draft_ms)

    def plan(
        self, survival: Tensor, request_ids: Sequence[int] | None = None, drafter: bool = True
    ) -> PlanResult:
        """Plan one round from this round's survival ``(R, gamma)`` float32.

        ``request_ids`` (default ``0..R-1``) ties rows to requests across rounds for ``lagged_topk``.
        ``drafter=False``: the round ran no drafter (lookup blocks alone), so a cost table prices it by the
        verify alone.
        """
        if survival.dim() != 2:
            raise ValueError(f"Planner.plan: survival must be [R, gamma], got shape {tuple(survival.shape)}")
        ids = tuple(range(survival.shape[0])) if request_ids is None else tuple(int(i) for i in request_ids)
        if len(ids) != survival.shape[0]:
            raise ValueError(f"Planner.plan: {len(ids)} request_ids for {survival.shape[0]} survival rows")
        mode = self.effective_mode
        if mode != self.mode and not self._warned_flat:
            logger.warning(
                "dspark planner: %s SPS table, so mode %r verifies every draft (mode 'full'); profile one with "
                "`dspark profile` to let the planner trade verify cost against acceptance",
                "no" if self.sps_table is None else "a flat",
                self.mode,
            )
            self._warned_flat = True
        tokens, rate = self._sps(survival.device, survival.shape[0], drafter, survival.shape[1])
        lagged = self._lagged(ids, survival) if mode == "lagged_topk" else None
        verify_len, budget = plan_verify(survival, tokens, rate, mode, lagged, self.threshold)
        if self.mode == "lagged_topk":
            self._history.append((ids, survival.detach().clone()))
        return PlanResult(verify_len, budget, mode)

    def reset(self) -> None:
        """Forget earlier rounds (e.g. between independent generate calls)."""
        self._history.clear()
