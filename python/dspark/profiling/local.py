# SPDX-License-Identifier: Apache-2.0
"""This machine's cost table: profiled once per (machine, threads, target shape, drafter shape) and cached.

The planner prices verifies and drafter rounds from a cost table. A table profiled on another machine — another
CPU generation or vector ISA, another thread count, another GPU — prices them wrong: the bundled table of a
2-core AVX-512 machine has a 1-row verify at 29 ms and 8 rows at 71 ms, a 2-core AVX2 machine measures 52 and
83 ms (docs/profiling.md, "This machine's table"). :func:`local_cost_table` returns the table of this machine:
from the cache when it was profiled before, else profiled now (about a minute for SmolLM2-135M on two CPU
cores, with a progress bar) and written to the cache atomically, so an interrupted profile leaves nothing
half-written.

>>> from dspark.profiling import local_cost_table            # doctest: +SKIP
>>> DSparkDecoder(model, drafter, sps_table=local_cost_table(model, drafter))  # doctest: +SKIP
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import tempfile
import warnings
from collections.abc import Sequence
from pathlib import Path

import torch
from torch import nn

from dspark import _C
from dspark._version import __version__
from dspark.decoding.machine import machine_name
from dspark.decoding.tables import CostTable
from dspark.profiling.profiler import profile_costs

__all__ = ["CACHE_ENV", "cache_dir", "cache_key", "cached_table_path", "local_cost_table"]

# where the cached tables live (default: $XDG_CACHE_HOME/dspark/costs, else ~/.cache/dspark/costs)
CACHE_ENV = "DSPARK_CACHE_DIR"


def cache_dir() -> Path:
    """The folder of cached cost tables: ``$DSPARK_CACHE_DIR``, else ``$XDG_CACHE_HOME/dspark/costs``, else
    ``~/.cache/dspark/costs``."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "dspark" / "costs"


@functools.cache
def kernels_digest() -> str:
    """The compiled extension's identity (sha256 of its library file): a build from other sources prices the
    same version's rounds differently."""
    digest = hashlib.sha256()
    with open(_C.__file__, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()[:16]


def cache_key(
    target: nn.Module, drafter: nn.Module | None, batch_sizes: Sequence[int], context_length: int
) -> dict:
    """What a profile's times depend on: the machine (name with family and ISA, or the GPU), torch's CPU
    threads, the torch and dspark versions and the compiled kernels, the target's and the drafter's shapes and
    dtypes (not their weight values: a retrained drafter of the same shape costs the same), and the profile's
    settings."""
    param = next(target.parameters())
    device = param.device
    key = {
        "machine": machine_name(device),
        "threads": torch.get_num_threads() if device.type == "cpu" else None,
        "torch": torch.__version__,
        "dspark": __version__,
        "kernels": kernels_digest(),
        "target": {
            "class": type(target).__name__,
            "config": json.loads(target.config.to_json_string()),
            "dtype": str(param.dtype).removeprefix("torch."),
        },
        "drafter": None,
        "batch_sizes": sorted({int(r) for r in batch_sizes}),  # the profiler's grid: order and repeats moot
        "context_length": int(context_length),
    }
    if drafter is not None:
        vocab = drafter.draft_vocab
        key["drafter"] = {
            "config": drafter.config.to_dict(),
            "dtype": str(drafter.dtype).removeprefix("torch."),
            "draft_vocab": None if vocab is None else int(vocab.numel()),
        }
    return key


def cached_table_path(key: dict, folder: str | Path | None = None) -> Path:
    """``costs-<hash>.json`` in ``folder`` (default :func:`cache_dir`) for a :func:`cache_key`."""
    digest = hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()[:20]
    return Path(folder if folder is not None else cache_dir()) / f"costs-{digest}.json"


def _write_atomically(table: CostTable, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(json.dumps(table.to_dict(), indent=2) + "\n")
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def local_cost_table(
    target: nn.Module,
    drafter: nn.Module | None = None,
    *,
    batch_sizes: Sequence[int] = (1, 2, 4, 8),
    context_length: int = 256,
    cache: str | Path | None = None,
    refresh: bool = False,
    progress: bool = True,
    **profile_kwargs,
) -> CostTable:
    """The cost table of this machine for ``target`` and ``drafter``, profiled at most once per key.

    Parameters
    ----------
    target : transformers.PreTrainedModel
        The causal LM, on the device it will decode on.
    drafter : DSparkDrafter or None
        The drafter it will decode with, in the dtype it will run in; None for lookup-only decoding (the table
        then prices verifies only).
    batch_sizes : sequence of int
        Request counts to profile (the planner extrapolates beyond the largest).
    context_length : int
        Tokens in each request's cache while timing.
    cache : str or Path or None
        The cache folder; default :func:`cache_dir`.
    refresh : bool
        Profile again even when a cached table exists (and replace it).
    progress : bool
        Show the profiler's progress bar.
    **profile_kwargs
        More :func:`~dspark.profiling.profile_costs` arguments (``repeats``, ``warmup``, ...); they are not part
        of the cache key.

    Returns
    -------
    CostTable
        Its ``metadata["cache_path"]`` says where it is cached.

    Raises
    ------
    ValueError
        ``target`` has no ``config`` (not a Hugging Face model) or bad profile arguments (before any timing).
    """
    if not hasattr(target, "config") or not hasattr(target.config, "to_json_string"):
        raise ValueError(
            f"target: expected a Hugging Face causal LM with a config, got {type(target).__name__}"
        )
    sizes = [int(r) for r in batch_sizes]
    if not sizes or any(r < 1 for r in sizes):
        raise ValueError(f"batch_sizes: expected request counts >= 1, got {list(batch_sizes)}")
    if int(context_length) < 1:
        raise ValueError(f"context_length: expected >= 1, got {context_length}")
    path = cached_table_path(cache_key(target, drafter, sizes, context_length), cache)
    if path.is_file() and not refresh:
        try:
            table = CostTable.load(path)
            table.metadata["cache_path"] = str(path)
            return table
        except (ValueError, OSError) as e:  # a damaged cache entry is profiled again, never trusted
            warnings.warn(f"cache: {path} is unreadable ({e}); profiling again", UserWarning, stacklevel=2)
    table = profile_costs(
        target,
        drafter,
        sizes,
        context_length=int(context_length),
        progress=progress,
        **profile_kwargs,
    )
    _write_atomically(table, path)
    table.metadata["cache_path"] = str(path)
    return table
