# SPDX-License-Identifier: Apache-2.0
"""The rows of dspark's cost table: verify and drafter measurements, their checks, their JSON, their smoothing.

:class:`dspark.decoding.tables.CostTable` is built from these; the JSON layout is described in
docs/file-formats.md.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

FORMAT_NAME = "dspark-cost-table"
FORMAT_VERSION = 1


def is_count(x: Any, lo: int = 1) -> bool:
    """True for an ``int`` (not a ``bool``) ``>= lo``."""
    return isinstance(x, int) and not isinstance(x, bool) and x >= lo


def is_ms(x: Any) -> bool:
    """True for a finite time ``> 0`` (a number, not a ``bool``)."""
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x > 0


def check_samples(samples: Any, where: str) -> tuple[float, ...]:
    """The timed repeats as floats; ``ValueError`` naming ``where`` unless all are finite times > 0."""
    if not isinstance(samples, (list, tuple)) or not all(is_ms(s) for s in samples):
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


def interp(xs: Sequence[int], ys: Sequence[float], x: float) -> float:
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


def check_measurements(
    verify: Sequence[VerifyCost], draft: Sequence[DraftCost], block_size: Any, metadata: Any
) -> None:
    """Validate a cost table's fields (``verify`` and ``draft`` sorted); errors start with ``CostTable:``."""
    if not verify:
        raise ValueError("CostTable: verify must hold at least one measurement")
    seen: set[tuple[int, int]] = set()
    for i, v in enumerate(verify):
        where = f"CostTable: verify entry (num_requests={v.num_requests}, batch_tokens={v.batch_tokens})"
        if not is_count(v.num_requests):
            raise ValueError(f"{where}: num_requests must be an integer >= 1")
        if not is_count(v.batch_tokens, v.num_requests):
            raise ValueError(f"{where}: batch_tokens must be an integer >= num_requests")
        if block_size is not None and v.batch_tokens > v.num_requests * (block_size + 1):
            raise ValueError(
                f"{where}: batch_tokens exceeds num_requests * (block_size + 1) = "
                f"{v.num_requests * (block_size + 1)}"
            )
        if not is_ms(v.ms):
            raise ValueError(f"{where}: ms = {v.ms!r} must be a finite time > 0")
        if (v.num_requests, v.batch_tokens) in seen:
            raise ValueError(f"{where}: measured twice")
        seen.add((v.num_requests, v.batch_tokens))
        check_samples(list(v.samples_ms), f"CostTable: verify[{i}]")
    for i, d in enumerate(draft):
        where = f"CostTable: draft entry (num_requests={d.num_requests})"
        if not is_count(d.num_requests):
            raise ValueError(f"{where}: num_requests must be an integer >= 1")
        if not is_ms(d.ms):
            raise ValueError(f"{where}: ms = {d.ms!r} must be a finite time > 0")
        for name in ("draft_ms", "append_ms"):
            x = getattr(d, name)
            if x is not None and not (is_ms(x) or x == 0):
                raise ValueError(f"{where}: {name} = {x!r} must be a finite time >= 0")
        if i and d.num_requests == draft[i - 1].num_requests:
            raise ValueError(f"{where}: measured twice")
        check_samples(list(d.samples_ms), f"CostTable: draft[{i}]")
    if block_size is not None and not is_count(block_size):
        raise ValueError(f"CostTable: block_size = {block_size!r} must be an integer >= 1")
    if not isinstance(metadata, Mapping):
        raise ValueError("CostTable: metadata must be a JSON object")


def parse_fields(
    d: Any, source: str
) -> tuple[tuple[VerifyCost, ...], tuple[DraftCost, ...], int | None, dict]:
    """A cost table's JSON object -> ``(verify, draft, block_size, metadata)``.

    Checks what each row must hold; every error names ``source`` (e.g. the file) and the offending field.
    """

    def fail(msg: str) -> ValueError:
        return ValueError(f"{source}: {msg}")

    if not isinstance(d, dict):
        raise fail("must hold a JSON object")
    if d.get("format") != FORMAT_NAME:
        raise fail(f"field 'format' must be {FORMAT_NAME!r}, got {d.get('format')!r}")
    if d.get("version") != FORMAT_VERSION:
        raise fail(
            f"field 'version' must be {FORMAT_VERSION} (the version this dspark reads), got {d.get('version')!r}"
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
        if not is_count(row["num_requests"]):
            raise fail(f"{where}.num_requests = {row['num_requests']!r} must be an integer >= 1")
        if not is_count(row["batch_tokens"], row["num_requests"]):
            raise fail(
                f"{where}.batch_tokens = {row['batch_tokens']!r} must be an integer >= num_requests "
                f"({row['num_requests']})"
            )
        if not is_ms(row["ms"]):
            raise fail(f"{where}.ms = {row['ms']!r} must be a finite time > 0 (milliseconds)")
        samples = check_samples(row.get("samples_ms", []), f"{source}: {where}")
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
        if not is_count(row["num_requests"]):
            raise fail(f"{where}.num_requests = {row['num_requests']!r} must be an integer >= 1")
        if not is_ms(row["ms"]):
            raise fail(f"{where}.ms = {row['ms']!r} must be a finite time > 0 (milliseconds)")
        parts = {}
        for key in ("draft_ms", "append_ms"):
            x = row.get(key)
            if x is not None and not (is_ms(x) or x == 0):
                raise fail(f"{where}.{key} = {x!r} must be a finite time >= 0 (milliseconds)")
            parts[key] = None if x is None else float(x)
        samples = check_samples(row.get("samples_ms", []), f"{source}: {where}")
        draft.append(DraftCost(row["num_requests"], float(row["ms"]), samples_ms=samples, **parts))
    block_size = d.get("block_size")
    if block_size is not None and not is_count(block_size):
        raise fail(f"field 'block_size' = {block_size!r} must be an integer >= 1 (or null)")
    metadata = d.get("metadata", {})
    if not isinstance(metadata, dict):
        raise fail("field 'metadata' must be a JSON object")
    return tuple(verify), tuple(draft), block_size, metadata
