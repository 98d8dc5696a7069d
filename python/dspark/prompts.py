# SPDX-License-Identifier: Apache-2.0
"""Prompt files: the first user turns of a ``{"turns": [...]}`` JSONL file, for training and calibration."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path


@dataclass
class Prompt:
    """One prompt: a stable id and the first user turn."""

    id: str
    text: str


def read_prompt_file(path: str | os.PathLike, limit: int | None = None, skip: int = 0) -> list[Prompt]:
    """First user turns of a ``{"turns": [...]}`` JSONL file (ids ``<file stem>:<line>``).

    ``skip`` / ``limit`` select rows ``skip .. skip + limit - 1`` (for train / calibration splits).

    Raises
    ------
    ValueError
        A line that is not a JSON object with a non-empty ``"turns"`` list of strings (names the line).
    """
    path = Path(path)
    out: list[Prompt] = []
    with open(path, encoding="utf-8") as f:
        for i, line in enumerate(f):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{i + 1}: not a JSON object ({e.msg})") from None
            turns = row.get("turns") if isinstance(row, dict) else None
            if not isinstance(turns, list) or not turns or not isinstance(turns[0], str):
                raise ValueError(f'{path}:{i + 1}: expected {{"turns": ["first user turn", ...]}}')
            out.append(Prompt(f"{path.stem}:{i}", turns[0]))
    out = out[skip:]
    return out if limit is None else out[:limit]
