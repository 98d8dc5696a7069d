# SPDX-License-Identifier: Apache-2.0
"""What bench_e2e runs on: prompt sets (files given, or the small set shipped here) and the drafters."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import torch

from dspark import DSparkDrafter
from dspark.prompts import read_prompt_file

# a dozen short chat and code prompts, so the benchmark runs from the repository alone
DEFAULT_PROMPTS = Path(__file__).resolve().parents[1] / "data" / "prompts_small.jsonl"


def read_prompt_sets(paths: list[Path] | None, n: int | None, skip: int = 0) -> list[tuple[str, list[str]]]:
    """``(name, first user turns)`` of rows ``skip .. skip + n - 1`` of every prompt file (default: the shipped
    set; ``n`` None: every row from ``skip``)."""
    paths = paths or [DEFAULT_PROMPTS]
    for p in paths:
        if not p.is_file():
            sys.exit(f"bench_e2e: prompt file {p} not found")
    return [(p.stem, [q.text for q in read_prompt_file(p, limit=n, skip=skip)]) for p in paths]


def random_drafter(target: torch.nn.Module, markov_rank: int) -> DSparkDrafter:
    """An untrained one-layer drafter (seeded): measures the round's overhead, not a speedup."""
    torch.manual_seed(0)
    return DSparkDrafter.from_config(target, block_size=7, num_layers=1, markov_rank=markov_rank)


def resolve_drafter(
    spec: str, target: torch.nn.Module, tokenizer: Any, quick: bool, dtype: torch.dtype | None = None
) -> tuple[DSparkDrafter, str, Path | None, Path | None]:
    """``(drafter, description, sps path, sts path)`` for ``--drafter bundled|random|PATH`` in ``dtype``."""
    if spec == "bundled":
        try:
            from dspark.models.bundled import bundled_drafter

            info = bundled_drafter()
        except (ImportError, FileNotFoundError) as e:
            if not quick:
                sys.exit(
                    f"bench_e2e: {e}. Train one with `dspark train`, or pass --drafter PATH (a checkpoint "
                    "folder) or --drafter random (an untrained drafter: measures overhead, not speedup)."
                )
            print(f"({e}: quick mode uses --drafter random)")
            spec = "random"
        else:
            drafter = DSparkDrafter.from_pretrained(
                info.path, target=target, tokenizer=tokenizer, dtype=dtype
            )
            return drafter, f"bundled {info.name}", info.sps, info.sts
    if spec == "random":
        return random_drafter(target, markov_rank=64), "random (untrained)", None, None
    path = Path(spec)
    drafter = DSparkDrafter.from_pretrained(path, target=target, tokenizer=tokenizer, dtype=dtype)
    sps = next((path / n for n in ("costs.json", "sps.json") if (path / n).is_file()), None)
    sts = path / "sts.json"
    return drafter, str(path), sps, sts if sts.is_file() else None


def resolve_dflash(
    spec: str | None, target: torch.nn.Module, tokenizer: Any, dtype: torch.dtype | None = None
) -> DSparkDrafter | None:
    """The DFlash ablation's drafter for ``--dflash PATH|random`` (None without the flag)."""
    if spec == "random":
        return random_drafter(target, markov_rank=0)
    if spec:
        return DSparkDrafter.from_pretrained(spec, target=target, tokenizer=tokenizer, dtype=dtype)
    return None


def pad_token_id(tokenizer: Any) -> int:
    """The id HF ``generate`` pads batches with: the tokenizer's pad token, else its EOS."""
    return tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id


def optional_path(value: str | None, default: Path | None) -> Path | None:
    """``--sps`` / ``--sts``: not given keeps ``default``, ``none`` turns it off, else a path."""
    if value is None:
        return default
    return None if value == "none" else Path(value)
