# SPDX-License-Identifier: Apache-2.0
"""Round costs measured while decoding, blended with a profiled cost table (the planner's prior).

A cost table profiled on another machine, at another context length or with another drafter dtype can be far
from what a round costs here: on one 2-core CPU, verifying two rows per request at batch 8 cost nearly twice
one row while the bundled table priced it at 1.3× (docs/benchmarks.md "Lookup and hybrid rounds"). The
planner then admits drafts that lose time. :class:`MeasuredCosts` keeps a running mean of the verify time of
every ``(R, B)`` the decoder ran and of the drafter round of every ``R``, starting from the table's values as
``prior_weight`` pseudo-measurements. Cells never run are priced from the table, scaled by how far the
measured cells of the same ``R`` (or of any ``R``) are from it. Only what the planner chooses gets measured: a
cell priced too cheaply is run and corrected, one priced too dearly may stay so (a loss of speed, never of
time against plain decoding).

The decoder feeds it host wall times, which measure the work on CPU only (on CUDA the host runs ahead of the
device). Verify lengths then depend on timings, so a seeded sampled run is no longer reproducible run to run
(its distribution is unchanged: the plan never reads a drafted token).
"""

from __future__ import annotations

import math

from dspark.decoding.tables import CostTable, SpsTable

__all__ = ["MeasuredCosts"]


class MeasuredCosts:
    """Verify and drafter times of this machine: a prior :class:`CostTable` corrected by measurements.

    Parameters
    ----------
    prior : CostTable
        The profiled table the estimates start from (``dspark profile``'s ``costs.json``).
    prior_weight : float
        Pseudo-measurements the prior's value counts as in each cell (> 0).
    window : int
        Most measurements a cell's mean weighs (>= 1): later ones replace earlier ones at rate ``1 / window``,
        so the estimate follows a context that grows.
    refresh : int
        Measurements between two updates of :attr:`version` (>= 1); the planner rebuilds its curves then.

    Examples
    --------
    >>> from dspark.decoding.tables import CostTable, VerifyCost
    >>> costs = MeasuredCosts(CostTable((VerifyCost(1, 1, 10.0), VerifyCost(1, 2, 11.0))), refresh=1)
    >>> for _ in range(8):
    ...     costs.observe_verify(1, 2, 20.0)
    >>> round(costs.verify_ms(1, 2), 1)  # mostly measured: the second row costs ~10 ms here, not 1
    18.2
    """

    def __init__(
        self, prior: CostTable, prior_weight: float = 2.0, window: int = 32, refresh: int = 4
    ) -> None:
        if not isinstance(prior, CostTable):
            raise TypeError(f"prior: expected a CostTable, got {type(prior).__name__}")
        if isinstance(prior_weight, bool) or not (
            isinstance(prior_weight, (int, float)) and math.isfinite(prior_weight) and prior_weight > 0
        ):
            raise ValueError(f"prior_weight: must be a finite number > 0, got {prior_weight!r}")
        for name, value in (("window", window), ("refresh", refresh)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}: must be an integer >= 1, got {value!r}")
        self.prior, self.prior_weight, self.window, self.refresh = prior, float(prior_weight), window, refresh
        self._verify: dict[tuple[int, int], tuple[float, float]] = {}  # (R, B) -> (mean ms, weight)
        self._draft: dict[int, tuple[float, float]] = {}  # R -> (mean ms, weight)
        self.measurements = 0

    # ------------------------------------------------------------------ measurements
    def observe_verify(self, num_requests: int, batch_tokens: int, ms: float) -> None:
        """One verify forward of ``batch_tokens`` packed rows from ``num_requests`` requests took ``ms``."""
        key = (int(num_requests), int(batch_tokens))
        self._add(self._verify, key, self.prior.verify_ms(*key), ms)

    def observe_draft(self, num_requests: int, ms: float) -> None:
        """One drafter round (backbone, Markov sampling, confidence) for ``num_requests`` requests took ``ms``."""
        r = int(num_requests)
        self._add(self._draft, r, self.prior.draft_ms(r), ms)

    def _add(self, cells: dict, key, prior_ms: float, ms: float) -> None:
        if not (math.isfinite(ms) and ms > 0):
            return  # a clock glitch teaches nothing
        mean, weight = cells.get(key, (prior_ms, self.prior_weight))
        weight = min(weight + 1.0, float(self.window))
        cells[key] = (mean + (ms - mean) / weight, weight)
        self.measurements += 1

    @property
    def version(self) -> int:
        """Moves on every ``refresh`` measurements (the planner rebuilds its curves then)."""
        return self.measurements // self.refresh

    # ------------------------------------------------------------------ estimates
    def _scale(self, cells: dict, prior_of, keep) -> float:
        """Weighted mean ratio measured / prior over the measured cells that ``keep`` selects (1 without)."""
        num = den = 0.0
        for key, (mean, weight) in cells.items():
            if keep(key):
                base = prior_of(key)
                if base > 0:
                    num += weight * mean / base
                    den += weight
        return num / den if den else 1.0

    def _verify_scale(self, r: int) -> float:
        """Measured / prior verify time over the measured cells of ``R = r`` (of every ``R`` when none)."""
        same_r = any(k[0] == r for k in self._verify)
        keep = (lambda k: k[0] == r) if same_r else (lambda k: True)
        return self._scale(self._verify, lambda k: self.prior.verify_ms(*k), keep)

    def verify_ms(self, num_requests: int, batch_tokens: int, scale: float | None = None) -> float:
        """Estimated verify time (ms): the cell's running mean, or the table's scaled by the measured ratio of
        the same ``R`` (of every ``R`` when none of it was measured; ``scale`` passes that ratio in)."""
        key = (int(num_requests), int(batch_tokens))
        if key in self._verify:
            return self._verify[key][0]
        if scale is None:
            scale = self._verify_scale(key[0])
        return self.prior.verify_ms(*key) * scale

    def draft_ms(self, num_requests: int) -> float:
        """Estimated drafter round time (ms) for ``num_requests`` requests (0 when the table has none)."""
        r = int(num_requests)
        if r in self._draft:
            return self._draft[r][0]
        return self.prior.draft_ms(r) * self._scale(self._draft, self.prior.draft_ms, lambda k: True)

    def to_sps(self, num_requests: int, include_draft: bool = True, max_tokens: int = 0) -> SpsTable:
        """Rounds per second of ``num_requests`` requests against packed verify tokens ``B`` (``R .. R (γ+1)``,
        at least the table's range for ``R`` and ``max_tokens``), as :meth:`CostTable.to_sps` builds it, from
        these estimates; non-increasing in ``B``."""
        r = max(1, int(num_requests))
        top = max(self.prior.max_batch_tokens, r * ((self.prior.block_size or 0) + 1), int(max_tokens))
        d = self.draft_ms(r) if include_draft else 0.0
        scale = self._verify_scale(r)
        tokens, rates, best = list(range(r, top + 1)), [], math.inf
        for b in tokens:
            best = min(best, 1000.0 / (d + self.verify_ms(r, b, scale)))  # more rows never run faster
            rates.append(best)
        return SpsTable(tuple(tokens), tuple(rates), top)
