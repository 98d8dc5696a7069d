# SPDX-License-Identifier: Apache-2.0
"""The acceptance table's JSON structure (docs/file-formats.md, "Acceptance table"): checking a table dict, and
mapping a lookup prior's classes onto a table laid out by other match classes."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from dspark.decoding.lookup import class_index

__all__ = ["FORMAT", "VERSION", "check_extent_bounds", "class_map", "parse_table"]

FORMAT = "dspark-acceptance"
VERSION = 1


def _count_grid(where: str, key: str, value: object, gamma: int) -> list[list[float]]:
    """A list of rows of ``gamma`` finite non-negative numbers, or a ValueError naming ``where`` and the field."""
    if not isinstance(value, list) or not value:
        raise ValueError(
            f"{where}: field '{key}' must be a non-empty list of rows, got {type(value).__name__}"
        )
    rows = []
    for c, row in enumerate(value):
        if not isinstance(row, list) or len(row) != gamma:
            got = len(row) if isinstance(row, list) else type(row).__name__
            raise ValueError(
                f"{where}: field '{key}[{c}]' must be a list of gamma = {gamma} numbers, got {got}"
            )
        for j, x in enumerate(row):
            if isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x) or x < 0:
                raise ValueError(f"{where}: field '{key}[{c}][{j}]' must be a finite count >= 0, got {x!r}")
        rows.append([float(x) for x in row])
    return rows


def check_extent_bounds(where: str, value: object, max_match: int) -> list[int]:
    """``value`` as a list of strictly increasing ints above ``max_match`` (the extents where a class starts)."""
    ok = isinstance(value, (list, tuple)) and all(
        type(b) is int and b > lo for b, lo in zip(value, [max_match, *value], strict=False)
    )
    if not ok:
        raise ValueError(
            f"{where} 'extent_bounds' must be a list of strictly increasing ints > max_match = {max_match}, "
            f"got {value!r}"
        )
    return list(value)


def class_map(max_match: int, bounds: list[int], prior: Mapping[str, Any]) -> list[list[int]]:
    """For each class of a lookup table laid out by ``max_match`` and ``bounds``, the classes of a lookup
    ``prior`` (its parsed meta) to pool: those whose shortest ``(match length, extent)`` falls in the class
    (a coarser table merges finer prior classes), or else the one prior class holding the class's shortest
    ``(match length, extent)`` (a finer table starts each part from the class it was part of)."""

    def lowers(m: int, b: list[int]) -> list[tuple[int, int]]:
        return [(n, n) for n in range(m + 1)] + [(m, x) for x in b]

    pm, pb = prior["max_match"], prior["extent_bounds"]
    mine = [class_index(max_match, bounds, n, x) for n, x in lowers(pm, pb)]
    return [
        [p for p, c in enumerate(mine) if c == t] or [class_index(pm, pb, n, x)]
        for t, (n, x) in enumerate(lowers(max_match, bounds))
    ]


def parse_table(d: object, where: str) -> tuple[list[list[float]], list[list[float]], dict[str, Any]]:
    """Check a table dict (the JSON structure); returns ``(accepts, trials, meta)``."""
    if not isinstance(d, Mapping):
        raise ValueError(f"{where}: must be a JSON object, got {type(d).__name__}")
    for key in ("format", "version", "kind", "gamma", "accepts", "trials"):
        if key not in d:
            raise ValueError(f"{where}: missing field '{key}'")
    if d["format"] != FORMAT:
        raise ValueError(f"{where}: field 'format' must be {FORMAT!r}, got {d['format']!r}")
    if d["version"] != VERSION or isinstance(d["version"], bool):
        raise ValueError(f"{where}: field 'version' must be {VERSION}, got {d['version']!r}")
    kind = d["kind"]
    if not isinstance(kind, str) or not kind:
        raise ValueError(f"{where}: field 'kind' must be a non-empty string, got {kind!r}")
    gamma = d["gamma"]
    if isinstance(gamma, bool) or not isinstance(gamma, int) or gamma < 1:
        raise ValueError(f"{where}: field 'gamma' must be an int >= 1, got {gamma!r}")
    accepts = _count_grid(where, "accepts", d["accepts"], gamma)
    trials = _count_grid(where, "trials", d["trials"], gamma)
    if len(trials) != len(accepts):
        raise ValueError(f"{where}: field 'trials' has {len(trials)} rows, 'accepts' {len(accepts)}")
    for c, (ra, rt) in enumerate(zip(accepts, trials, strict=True)):
        for j, (a, t) in enumerate(zip(ra, rt, strict=True)):
            if a > t * (1 + 1e-9):
                raise ValueError(f"{where}: field 'accepts[{c}][{j}]' = {a} exceeds trials[{c}][{j}] = {t}")
    min_match, max_match = d.get("min_match"), d.get("max_match")
    bounds: list[int] = []
    if kind == "lookup":
        # classes: match lengths 0..max_match, then one per extent bound; the rows must be exactly those
        if "max_match" not in d or isinstance(max_match, bool) or not isinstance(max_match, int):
            raise ValueError(
                f"{where}: field 'max_match' must be an int for kind 'lookup', got {max_match!r}"
            )
        bounds = check_extent_bounds(f"{where}: field", d.get("extent_bounds", []), max_match)
        if max_match + 1 + len(bounds) != len(accepts):
            raise ValueError(
                f"{where}: field 'max_match' = {max_match} and {len(bounds)} 'extent_bounds' make "
                f"{max_match + 1 + len(bounds)} classes, but 'accepts' has {len(accepts)} rows"
            )
        if min_match is not None and (
            isinstance(min_match, bool) or not isinstance(min_match, int) or not 1 <= min_match <= max_match
        ):
            raise ValueError(
                f"{where}: field 'min_match' must be null or an int in [1, max_match], got {min_match!r}"
            )
    temperature = d.get("temperature")
    if temperature is not None and (
        isinstance(temperature, bool)
        or not isinstance(temperature, (int, float))
        or not math.isfinite(temperature)
        or temperature < 0
    ):
        raise ValueError(
            f"{where}: field 'temperature' must be null or a finite number >= 0, got {temperature!r}"
        )
    source = d.get("source", "")
    if not isinstance(source, str):
        raise ValueError(f"{where}: field 'source' must be a string, got {type(source).__name__}")
    meta = {
        "kind": kind,
        "min_match": min_match,
        "max_match": max_match,
        "extent_bounds": bounds,
        "temperature": None if temperature is None else float(temperature),
        "source": source,
    }
    return accepts, trials, meta
