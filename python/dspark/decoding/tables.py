# SPDX-License-Identifier: Apache-2.0
"""The planner's cost tables: SGLang's 1-D SPS curve (:class:`SpsTable`) and dspark's :class:`CostTable`.

The cost table holds what :func:`dspark.profiling.profile_costs` measured; :meth:`CostTable.to_sps` turns it into
the 1-D steps-per-second curve that the planner prices verify budgets with. Both JSON layouts are described in
docs/file-formats.md.
"""

from __future__ import annotations

import bisect
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from dspark.decoding.costs import (
    FORMAT_NAME,
    FORMAT_VERSION,
    DraftCost,
    VerifyCost,
    check_measurements,
    interp,
    isotonic,
    parse_fields,
)
from dspark.host_sync import to_device

__all__ = [
    "FORMAT_NAME",
    "FORMAT_VERSION",
    "CostTable",
    "DraftCost",
    "SpsTable",
    "VerifyCost",
    "isotonic",
    "read_json",
]


@dataclass(frozen=True)
class SpsTable:
    """Target steps per second against packed verify tokens (SGLang's 1-D SPS JSON).

    Parameters
    ----------
    sample_batch_tokens : Sequence[int]
        Strictly increasing packed-token probes ``B`` (>= 1).
    sample_steps_per_sec : Sequence[float]
        Measured steps per second at each probe (> 0).
    max_batch_tokens : int
        The largest ``B`` the engine runs (>= the last probe).
    """

    sample_batch_tokens: tuple[int, ...]
    sample_steps_per_sec: tuple[float, ...]
    max_batch_tokens: int

    def __post_init__(self) -> None:
        tokens, rates = tuple(self.sample_batch_tokens), tuple(self.sample_steps_per_sec)
        object.__setattr__(self, "sample_batch_tokens", tokens)
        object.__setattr__(self, "sample_steps_per_sec", rates)
        if not tokens or len(tokens) != len(rates):
            raise ValueError(
                "SpsTable: sample_batch_tokens and sample_steps_per_sec must be non-empty and of equal length, "
                f"got {len(tokens)} and {len(rates)}"
            )
        for i, t in enumerate(tokens):
            if int(t) != t or t < 1 or (i > 0 and t <= tokens[i - 1]):
                raise ValueError(
                    f"SpsTable: sample_batch_tokens must be strictly increasing integers >= 1, got {list(tokens)}"
                )
        for i, r in enumerate(rates):
            if not (isinstance(r, (int, float)) and math.isfinite(r) and r > 0):
                raise ValueError(f"SpsTable: sample_steps_per_sec[{i}] = {r!r} must be a finite rate > 0")
        if int(self.max_batch_tokens) < tokens[-1]:
            raise ValueError(
                f"SpsTable: max_batch_tokens ({self.max_batch_tokens}) is below the last probe ({tokens[-1]})"
            )

    @property
    def is_flat(self) -> bool:
        """A table with one rate everywhere carries no cost information (verify-all is optimal)."""
        return len(set(self.sample_steps_per_sec)) == 1

    @classmethod
    def flat(cls, max_batch_tokens: int = 1) -> SpsTable:
        """SGLang's uninitialised table: ``{[1], [1.0], max_batch_tokens}``."""
        return cls((1,), (1.0,), max(1, int(max_batch_tokens)))

    @classmethod
    def from_dict(cls, d: dict, source: str = "SpsTable") -> SpsTable:
        """Parse SGLang's 1-D SPS object, or dspark's cost table (turned into its 1-D curve).

        ``source`` (e.g. the file name) starts every error message.
        """
        if not isinstance(d, dict):
            raise ValueError(f"{source}: must hold a JSON object")
        if CostTable.is_cost_table_dict(d):
            return CostTable.from_dict(d, "CostTable" if source == "SpsTable" else source).to_sps()
        missing = {"sample_batch_tokens", "sample_steps_per_sec"} - set(d)
        if missing:
            raise ValueError(
                f"{source}: missing keys {sorted(missing)} (SGLang 1-D SPS JSON or a dspark cost table "
                'with "format": "dspark-cost-table" expected)'
            )
        try:
            tokens = [int(t) for t in d["sample_batch_tokens"]]
            rates = [float(r) for r in d["sample_steps_per_sec"]]
            top = int(d.get("max_batch_tokens", tokens[-1] if tokens else 1))
            return cls(tuple(tokens), tuple(rates), top)
        except (TypeError, ValueError) as e:  # non-numbers, or a check of __post_init__
            raise ValueError(f"{source}: {str(e).removeprefix('SpsTable: ')}") from e

    @classmethod
    def load(cls, path: str | Path) -> SpsTable:
        """Read SGLang's ``{"sample_batch_tokens", "sample_steps_per_sec", "max_batch_tokens"}`` JSON.

        A dspark cost table (``dspark profile``'s ``costs.json``) is accepted too and turned into its 1-D curve
        (:meth:`CostTable.to_sps`). Errors name the file.
        """
        d = read_json(path)
        return cls.from_dict(d, source=f"SpsTable: {path}")

    def steps_per_sec(self, batch_tokens: int) -> float:
        """The rate at ``batch_tokens`` packed tokens, priced as ``plan_verify`` prices it.

        Between probes the next probe up (the ceiling: conservative); past the last probe, the last probe's
        tokens per second (``rate_last * B_last / B``).
        """
        tokens, rates = self.sample_batch_tokens, self.sample_steps_per_sec
        i = bisect.bisect_left(tokens, int(batch_tokens))
        if i < len(tokens):
            return rates[i]
        return rates[-1] * tokens[-1] / int(batch_tokens)

    def to_dict(self) -> dict:
        """SGLang's JSON object."""
        return {
            "sample_batch_tokens": list(self.sample_batch_tokens),
            "sample_steps_per_sec": list(self.sample_steps_per_sec),
            "max_batch_tokens": int(self.max_batch_tokens),
        }

    def save(self, path: str | Path) -> None:
        """Write SGLang's 1-D SPS JSON."""
        Path(path).write_text(json.dumps(self.to_dict(), indent=2) + "\n")

    def tensors(self, device: torch.device | str = "cpu") -> tuple[Tensor, Tensor]:
        """(tokens int64, rates float64) on ``device``, as ``plan_verify`` takes them (copied without a wait)."""
        return (
            to_device(self.sample_batch_tokens, device, torch.int64),
            to_device(self.sample_steps_per_sec, device, torch.float64),
        )


def read_json(path: str | Path) -> Any:
    """The JSON value of an SPS file; ``ValueError`` naming the file when it is not JSON."""
    try:
        return json.loads(Path(path).read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"SpsTable: {path} is not valid JSON: {e}") from e


def _verify_at(xs: list[int], ys: list[float], b: int) -> float:
    """Verify time (ms) at ``b`` rows from measured rows ``xs`` and smoothed times ``ys`` (``CostTable.verify_ms``):
    interpolated inside, the first time below, and past the last probe the slope from the middle probe to the
    last per further row (in proportion with one probe)."""
    if b <= xs[-1]:
        return interp(xs, ys, b)
    if len(xs) == 1:
        return ys[-1] * b / xs[-1]
    m = min(len(xs) // 2, len(xs) - 2)  # the upper half's first probe, before the last
    per_row = (ys[-1] - ys[m]) / (xs[-1] - xs[m])  # >= 0: the times are isotonic
    return ys[-1] + per_row * (b - xs[-1])


@dataclass(frozen=True)
class CostTable:
    """Measured drafter and verify costs on one device (dspark's richer cost table).

    Parameters
    ----------
    verify : sequence of VerifyCost
        Target verify time for each measured ``(R, B)`` (distinct pairs, at least one).
    draft : sequence of DraftCost
        Drafter round time for each measured ``R`` (distinct; may be empty: no drafter cost).
    block_size : int or None
        The drafter's block size ``γ`` the table was measured for (``B <= R (γ + 1)``).
    metadata : dict
        Free-form description: device, torch version, threads, model names, context length, date, ...

    Notes
    -----
    A batch of ``R`` requests is priced as the smallest profiled batch size ``>= R`` (the largest one past the
    end): a conservative choice, since cost grows with ``R``. The lookups smooth the measurements with
    :func:`isotonic` fits (verify time non-decreasing in ``B`` for each ``R``, drafter time non-decreasing in
    ``R``) and interpolate linearly between measured ``B`` (eager execution has no padding tiers; its cost is
    smooth in ``B``). The stored measurements stay as measured.
    """

    verify: tuple[VerifyCost, ...]
    draft: tuple[DraftCost, ...] = ()
    block_size: int | None = None
    metadata: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        verify = tuple(sorted(self.verify, key=lambda v: (v.num_requests, v.batch_tokens)))
        draft = tuple(sorted(self.draft, key=lambda d: d.num_requests))
        object.__setattr__(self, "verify", verify)
        object.__setattr__(self, "draft", draft)
        check_measurements(verify, draft, self.block_size, self.metadata)

    # ---- lookups ---------------------------------------------------------------------------------------------
    @property
    def batch_sizes(self) -> tuple[int, ...]:
        """The profiled request counts ``R`` of the verify measurements, ascending."""
        return tuple(sorted({v.num_requests for v in self.verify}))

    @property
    def max_batch_tokens(self) -> int:
        """The largest measured ``B``."""
        return max(v.batch_tokens for v in self.verify)

    @staticmethod
    def _ceil_r(profiled: Sequence[int], num_requests: int) -> int:
        i = bisect.bisect_left(profiled, num_requests)
        return profiled[min(i, len(profiled) - 1)]

    def _points(self, r: int) -> tuple[list[int], list[float]]:
        """Measured ``B`` of batch size ``r`` and their isotonic-smoothed verify times."""
        pts = [(v.batch_tokens, v.ms) for v in self.verify if v.num_requests == r]
        return [b for b, _ in pts], isotonic([ms for _, ms in pts])

    def draft_ms(self, num_requests: int) -> float:
        """Drafter round time (ms) for ``num_requests`` requests (smoothed); 0 without drafter measurements."""
        if not self.draft:
            return 0.0
        rs = [d.num_requests for d in self.draft]
        r = self._ceil_r(rs, int(num_requests))
        return isotonic([d.ms for d in self.draft])[rs.index(r)]

    def verify_ms(self, num_requests: int, batch_tokens: int) -> float:
        """Verify time (ms) of ``batch_tokens`` packed tokens from ``num_requests`` requests.

        Priced at the smallest profiled ``R >= num_requests`` and linearly interpolated between its measured
        ``B``; below its first ``B`` the first time is used. Past its last ``B`` each further row costs what a
        row cost over the upper half of the probes (a verify's time is a fixed part, the weights, plus a part
        per row; growing the whole time in proportion would price a 17-row block at batch 1 at twice what it
        costs); with one probe, in proportion.
        """
        return _verify_at(*self._points(self._ceil_r(self.batch_sizes, int(num_requests))), int(batch_tokens))

    # ---- the planner's curve ------------------------------------------------------------------------------------
    def to_sps(
        self, num_requests: int | None = None, include_draft: bool = True, max_tokens: int = 0
    ) -> SpsTable:
        """The 1-D SPS curve: rounds per second against packed verify tokens ``B``.

        ``steps/sec(B) = 1000 / (draft_ms(R) + verify_ms(R, B))`` at every integer ``B`` of the measured range
        (both smoothed, see the class notes), so the curve never rises with ``B``; with ``R`` and
        ``max_tokens`` past that range, up to ``max_tokens`` (priced as :meth:`verify_ms` prices it: rounds
        wider than the profiled γ, such as a hybrid decoder's lookup blocks).

        Parameters
        ----------
        num_requests : int or None
            With ``R``: the curve for rounds of ``R`` requests (what :class:`dspark.Planner` uses each round),
            over ``B`` in the profiled range of the smallest profiled batch size ``>= R``. With None: one curve
            for every batch in SGLang's sense, where a step of ``B`` tokens is run by the fewest profiled
            requests that can carry ``B`` (the smallest ``R`` whose measured ``B`` range reaches it).
        include_draft : bool
            False prices rounds that run no drafter (lookup decoding): verify time only.
        max_tokens : int
            With ``R``: the last ``B`` of the curve when past the measured range (0: the measured range).

        Returns
        -------
        SpsTable
            Integer probes, ``max_batch_tokens`` = the largest measured ``B``.
        """
        top = self.max_batch_tokens
        if num_requests is not None:
            if int(num_requests) < 1:
                raise ValueError(f"CostTable.to_sps: num_requests must be >= 1, got {num_requests}")
            r = self._ceil_r(self.batch_sizes, int(num_requests))
            xs, ys = self._points(r)
            d = self.draft_ms(int(num_requests)) if include_draft else 0.0
            tokens = list(range(xs[0], max(xs[-1], int(max_tokens)) + 1))
            times = [d + _verify_at(xs, ys, b) for b in tokens]  # one smoothing of R's points, not one per B
        else:
            spans = [(r, *self._points(r)) for r in self.batch_sizes]
            tokens = list(range(min(v.batch_tokens for v in self.verify), top + 1))
            times = []
            for b in tokens:
                # the smallest R reaching B; B below its first probe is priced at that probe (ceiling)
                r, xs, ys = next((s for s in spans if s[1][-1] >= b), spans[-1])
                times.append((self.draft_ms(r) if include_draft else 0.0) + interp(xs, ys, b))
            times = isotonic(times)  # where R steps up, a larger R's smaller-B time may undercut
        rates = [1000.0 / t for t in times]
        return SpsTable(tuple(tokens), tuple(rates), max(top, tokens[-1]))

    # ---- JSON ------------------------------------------------------------------------------------------------------
    def to_dict(self) -> dict:
        """The JSON object of docs/file-formats.md."""

        def clean(d: dict) -> dict:
            return {k: (list(v) if isinstance(v, tuple) else v) for k, v in d.items() if v is not None}

        return {
            "format": FORMAT_NAME,
            "version": FORMAT_VERSION,
            "block_size": self.block_size,
            "metadata": dict(self.metadata),
            "draft": [
                clean(
                    {
                        "num_requests": d.num_requests,
                        "ms": d.ms,
                        "draft_ms": d.draft_ms,
                        "append_ms": d.append_ms,
                        "samples_ms": d.samples_ms,
                    }
                )
                for d in self.draft
            ],
            "verify": [
                clean(
                    {
                        "num_requests": v.num_requests,
                        "batch_tokens": v.batch_tokens,
                        "ms": v.ms,
                        "samples_ms": v.samples_ms,
                    }
                )
                for v in self.verify
            ],
        }

    @staticmethod
    def is_cost_table_dict(d: Any) -> bool:
        """True for a JSON object that declares dspark's cost-table format."""
        return isinstance(d, dict) and d.get("format") == FORMAT_NAME

    @classmethod
    def from_dict(cls, d: Any, source: str = "CostTable") -> CostTable:
        """Parse and validate; every error names ``source`` (e.g. the file) and the offending field."""
        verify, draft, block_size, metadata = parse_fields(d, source)
        try:
            return cls(verify, draft, block_size, metadata)
        except ValueError as e:
            raise ValueError(f"{source}: {str(e).removeprefix('CostTable: ')}") from e

    def save_json(self, path: str | Path) -> None:
        """Write the table as JSON (docs/file-formats.md)."""
        Path(path).write_text(json.dumps(self.to_dict(), indent=2) + "\n")

    @classmethod
    def load(cls, path: str | Path) -> CostTable:
        """Read a table written by :meth:`save_json`.

        Raises
        ------
        ValueError
            Invalid JSON or an invalid field; the message names the file and the field.
        """
        try:
            d = json.loads(Path(path).read_text())
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}: not valid JSON: {e}") from e
        if isinstance(d, dict) and "sample_batch_tokens" in d and "format" not in d:
            raise ValueError(
                f"{path}: this is SGLang's 1-D SPS JSON, not a dspark cost table; read it with dspark.SpsTable.load"
            )
        return cls.from_dict(d, source=str(path))
