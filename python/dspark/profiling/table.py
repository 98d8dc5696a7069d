# SPDX-License-Identifier: Apache-2.0
"""dspark's cost table: drafter round cost by batch size ``R`` and target verify cost by ``(R, B)``.

The table holds what :func:`dspark.profiling.profile_costs` measured; :meth:`CostTable.to_sps` turns it into the
1-D steps-per-second curve (SGLang's SPS JSON) that the planner prices verify budgets with. The JSON layout is
described in docs/file-formats.md.
"""

from __future__ import annotations

import bisect
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dspark.decoding.planner import SpsTable

FORMAT_NAME = "dspark-cost-table"
FORMAT_VERSION = 1


def _is_count(x: Any, lo: int = 1) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x >= lo


def _is_ms(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x > 0


def _check_samples(samples: Any, where: str) -> tuple[float, ...]:
    if not isinstance(samples, (list, tuple)) or not all(_is_ms(s) for s in samples):
        raise ValueError(f"{where}.samples_ms must be a list of finite times > 0 (ms), got {samples!r}")
    return tuple(float(s) for s in samples)


@dataclass(frozen=True)
class VerifyCost:
    """One target verify measurement.

    Attributes
    ----------
    num_requests : int
        ``R``: requests packed in the forward.
    batch_tokens : int
        ``B``: packed new tokens (``R <= B``), spread over the requests as evenly as possible.
    ms : float
        Median wall time of the forward, milliseconds.
    samples_ms : tuple of float
        The individual timed repeats (may be empty).
    """

    num_requests: int
    batch_tokens: int
    ms: float
    samples_ms: tuple[float, ...] = ()


@dataclass(frozen=True)
class DraftCost:
    """One drafter round measurement for ``R`` requests.

    Attributes
    ----------
    num_requests : int
        ``R``.
    ms : float
        Median wall time of a whole drafter round (``draft_ms + append_ms``), milliseconds: the cost the
        planner adds to every verify forward of ``R`` requests.
    draft_ms : float or None
        Median of :meth:`DSparkDrafter.draft` alone.
    append_ms : float or None
        Median of :meth:`DSparkDrafter.append_context` of the committed rows of one round.
    samples_ms : tuple of float
        The individual timed rounds (may be empty).
    """

    num_requests: int
    ms: float
    draft_ms: float | None = None
    append_ms: float | None = None
    samples_ms: tuple[float, ...] = ()


def _interp(xs: Sequence[int], ys: Sequence[float], x: float) -> float:
    """Piecewise-linear through ``(xs, ys)`` (xs sorted), clamped to the end values outside the range."""
    if x <= xs[0]:
        return ys[0]
    if x >= xs[-1]:
        return ys[-1]
    i = bisect.bisect_right(xs, x)
    x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
    return y0 + (y1 - y0) * (x - x0) / (x1 - x0)


def isotonic(values: Sequence[float]) -> list[float]:
    """Least-squares non-decreasing fit (pool adjacent violators): each dip is averaged with what it undercuts.

    Costs never really fall as the batch grows; a measured fall is timing noise, which the planner would
    otherwise chase (Algorithm 1 stops at the first ``B`` whose score drops).
    """
    blocks: list[list[float]] = []  # [sum, count] of pooled runs
    for v in values:
        blocks.append([float(v), 1.0])
        while len(blocks) > 1 and blocks[-2][0] / blocks[-2][1] > blocks[-1][0] / blocks[-1][1]:
            total, n = blocks.pop()
            blocks[-1][0] += total
            blocks[-1][1] += n
    out: list[float] = []
    for total, n in blocks:
        out += [total / n] * int(n)
    return out


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
        if not verify:
            raise ValueError("CostTable: verify must hold at least one measurement")
        seen: set[tuple[int, int]] = set()
        for i, v in enumerate(verify):
            where = f"CostTable: verify entry (num_requests={v.num_requests}, batch_tokens={v.batch_tokens})"
            if not _is_count(v.num_requests):
                raise ValueError(f"{where}: num_requests must be an integer >= 1")
            if not _is_count(v.batch_tokens, v.num_requests):
                raise ValueError(f"{where}: batch_tokens must be an integer >= num_requests")
            if self.block_size is not None and v.batch_tokens > v.num_requests * (self.block_size + 1):
                raise ValueError(
                    f"{where}: batch_tokens exceeds num_requests * (block_size + 1) = "
                    f"{v.num_requests * (self.block_size + 1)}"
                )
            if not _is_ms(v.ms):
                raise ValueError(f"{where}: ms = {v.ms!r} must be a finite time > 0")
            if (v.num_requests, v.batch_tokens) in seen:
                raise ValueError(f"{where}: measured twice")
            seen.add((v.num_requests, v.batch_tokens))
            _check_samples(list(v.samples_ms), f"CostTable: verify[{i}]")
        for i, d in enumerate(draft):
            where = f"CostTable: draft entry (num_requests={d.num_requests})"
            if not _is_count(d.num_requests):
                raise ValueError(f"{where}: num_requests must be an integer >= 1")
            if not _is_ms(d.ms):
                raise ValueError(f"{where}: ms = {d.ms!r} must be a finite time > 0")
            for name in ("draft_ms", "append_ms"):
                x = getattr(d, name)
                if x is not None and not (_is_ms(x) or x == 0):
                    raise ValueError(f"{where}: {name} = {x!r} must be a finite time >= 0")
            if i and d.num_requests == draft[i - 1].num_requests:
                raise ValueError(f"{where}: measured twice")
            _check_samples(list(d.samples_ms), f"CostTable: draft[{i}]")
        if self.block_size is not None and not _is_count(self.block_size):
            raise ValueError(f"CostTable: block_size = {self.block_size!r} must be an integer >= 1")
        if not isinstance(self.metadata, Mapping):
            raise ValueError("CostTable: metadata must be a JSON object")

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
        ``B``; below its first ``B`` the first time is used, past its last ``B`` the time grows in proportion.
        """
        xs, ys = self._points(self._ceil_r(self.batch_sizes, int(num_requests)))
        b = int(batch_tokens)
        if b > xs[-1]:
            return ys[-1] * b / xs[-1]  # constant tokens/s past the last probe, as SpsTable prices it
        return _interp(xs, ys, b)

    # ---- the planner's curve ------------------------------------------------------------------------------------
    def to_sps(self, num_requests: int | None = None) -> SpsTable:
        """The 1-D SPS curve: rounds per second against packed verify tokens ``B``.

        ``steps/sec(B) = 1000 / (draft_ms(R) + verify_ms(R, B))`` at every integer ``B`` of the measured range
        (both smoothed, see the class notes), so the curve never rises with ``B``.

        Parameters
        ----------
        num_requests : int or None
            With ``R``: the curve for rounds of ``R`` requests (what :class:`dspark.Planner` uses each round),
            over ``B`` in the profiled range of the smallest profiled batch size ``>= R``. With None: one curve
            for every batch in SGLang's sense, where a step of ``B`` tokens is run by the fewest profiled
            requests that can carry ``B`` (the smallest ``R`` whose measured ``B`` range reaches it).

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
            d = self.draft_ms(int(num_requests))
            tokens = list(range(xs[0], xs[-1] + 1))
            times = [d + _interp(xs, ys, b) for b in tokens]
        else:
            spans = [(r, *self._points(r)) for r in self.batch_sizes]
            tokens = list(range(min(v.batch_tokens for v in self.verify), top + 1))
            times = []
            for b in tokens:
                # the smallest R reaching B; B below its first probe is priced at that probe (ceiling)
                r, xs, ys = next((s for s in spans if s[1][-1] >= b), spans[-1])
                times.append(self.draft_ms(r) + _interp(xs, ys, b))
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

        def fail(msg: str) -> ValueError:
            return ValueError(f"{source}: {msg}")

        if not isinstance(d, dict):
            raise fail("must hold a JSON object")
        if d.get("format") != FORMAT_NAME:
            raise fail(f"field 'format' must be {FORMAT_NAME!r}, got {d.get('format')!r}")
        if d.get("version") != FORMAT_VERSION:
            raise fail(
                f"field 'version' must be {FORMAT_VERSION} (the version this dspark reads), got "
                f"{d.get('version')!r}"
            )
        if "verify" not in d:
            raise fail("missing field 'verify'")
        rows = d["verify"]
        if not isinstance(rows, list) or not rows:
            raise fail("field 'verify' must be a non-empty list of measurements")
        verify = []
        for i, row in enumerate(rows):
            where = f"verify[{i}]"
            if not isinstance(row, dict):
                raise fail(f"{where} must be an object")
            for key in ("num_requests", "batch_tokens", "ms"):
                if key not in row:
                    raise fail(f"{where} is missing field '{key}'")
            if not _is_count(row["num_requests"]):
                raise fail(f"{where}.num_requests = {row['num_requests']!r} must be an integer >= 1")
            if not _is_count(row["batch_tokens"], row["num_requests"]):
                raise fail(
                    f"{where}.batch_tokens = {row['batch_tokens']!r} must be an integer >= num_requests "
                    f"({row['num_requests']})"
                )
            if not _is_ms(row["ms"]):
                raise fail(f"{where}.ms = {row['ms']!r} must be a finite time > 0 (milliseconds)")
            samples = _check_samples(row.get("samples_ms", []), f"{source}: {where}")
            verify.append(VerifyCost(row["num_requests"], row["batch_tokens"], float(row["ms"]), samples))
        rows = d.get("draft", [])
        if not isinstance(rows, list):
            raise fail("field 'draft' must be a list of measurements")
        draft = []
        for i, row in enumerate(rows):
            where = f"draft[{i}]"
            if not isinstance(row, dict):
                raise fail(f"{where} must be an object")
            for key in ("num_requests", "ms"):
                if key not in row:
                    raise fail(f"{where} is missing field '{key}'")
            if not _is_count(row["num_requests"]):
                raise fail(f"{where}.num_requests = {row['num_requests']!r} must be an integer >= 1")
            if not _is_ms(row["ms"]):
                raise fail(f"{where}.ms = {row['ms']!r} must be a finite time > 0 (milliseconds)")
            parts = {}
            for key in ("draft_ms", "append_ms"):
                x = row.get(key)
                if x is not None and not (_is_ms(x) or x == 0):
                    raise fail(f"{where}.{key} = {x!r} must be a finite time >= 0 (milliseconds)")
                parts[key] = None if x is None else float(x)
            samples = _check_samples(row.get("samples_ms", []), f"{source}: {where}")
            draft.append(DraftCost(row["num_requests"], float(row["ms"]), samples_ms=samples, **parts))
        block_size = d.get("block_size")
        if block_size is not None and not _is_count(block_size):
            raise fail(f"field 'block_size' = {block_size!r} must be an integer >= 1 (or null)")
        metadata = d.get("metadata", {})
        if not isinstance(metadata, dict):
            raise fail("field 'metadata' must be a JSON object")
        try:
            return cls(tuple(verify), tuple(draft), block_size, metadata)
        except ValueError as e:
            raise fail(str(e).removeprefix("CostTable: ")) from e

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


def load(path: str | Path) -> CostTable | SpsTable:
    """Read either cost file: dspark's cost table (``"format": "dspark-cost-table"``) or SGLang's SPS JSON.

    Raises
    ------
    ValueError
        Invalid JSON, an unknown layout, or an invalid field (the message names the file and the field).
    """
    try:
        d = json.loads(Path(path).read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not valid JSON: {e}") from e
    if CostTable.is_cost_table_dict(d):
        return CostTable.from_dict(d, source=str(path))
    return SpsTable.from_dict(d, source=str(path))
