# SPDX-License-Identifier: Apache-2.0
"""Measure the costs the planner trades off: target verify time by ``(R, B)`` and drafter round time by ``R``.

Every request first gets a context of ``context_length`` tokens in the target's paged KV cache (and the
matching drafter context), so attention reads a realistic amount of KV. A verify point runs one packed forward
of ``B`` new tokens from ``R`` requests through :meth:`TargetAdapter.forward` (logits of every row, the
drafter's feature taps captured, as a decode round does) and truncates the KV back afterwards, so every repeat
sees the same context. A drafter round is :meth:`DSparkDrafter.draft` for ``R`` requests plus
:meth:`DSparkDrafter.append_context` of one round's committed rows (rolled back after timing).

Repeats are interleaved: each pass times every point once, and the table keeps each point's median over the
passes. On a shared machine a burst of foreign load then lands on all points of a pass alike rather than on the
few points that happened to be measured during it.
"""

from __future__ import annotations

import datetime
import itertools
import math
import platform
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from dspark.decoding.machine import machine_name
from dspark.models.target import TargetAdapter, TargetInput
from dspark.profiling.table import CostTable, DraftCost, VerifyCost

# request ids of the profiler's own requests (far from ids a caller's decoder would use)
_RID_BASE = 3 << 30  # sampling keys take ids below 2^32


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _time_ms(fn: Callable[[], Any], device: torch.device) -> float:
    """Wall time of one call (CUDA: events around it, after draining the queue)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        return float(start.elapsed_time(end))
    t0 = time.perf_counter()
    fn()
    return (time.perf_counter() - t0) * 1e3


def split_tokens(batch_tokens: int, num_requests: int) -> list[int]:
    """Per-request verify lengths summing to ``batch_tokens``, as even as possible (longer ones first)."""
    q, r = divmod(int(batch_tokens), int(num_requests))
    return [q + 1] * r + [q] * (num_requests - r)


def default_batch_tokens(num_requests: int, block_size: int) -> list[int]:
    """``R * l`` for every per-request verify length ``l`` in ``1 .. γ + 1``."""
    return [num_requests * n for n in range(1, block_size + 2)]


def describe_device(device: torch.device) -> dict:
    """Device, library versions and threads, for the table's metadata."""
    from dspark import _version as dspark  # only the version: the package top is a layer above

    info: dict[str, Any] = {
        "device": str(device),
        "device_name": machine_name(device),
        "torch_version": torch.__version__,
        "dspark_version": dspark.__version__,
        "python_version": platform.python_version(),
        "threads": torch.get_num_threads(),
        "timer": "cuda events" if device.type == "cuda" else "time.perf_counter",
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }
    if device.type == "cuda":
        info["cuda_version"] = torch.version.cuda
    return info


# a timed job: (label, the call timed, the reset run after it so every repeat starts from the same state)
_Job = tuple[str, Callable[[], Any], Callable[[], None]]


@dataclass
class _Grid:
    """What a profile measures: request counts ``R``, their ``(R, B)`` verify points, ``γ``, rows per round."""

    sizes: list[int]
    points: list[tuple[int, int]]
    gamma: int
    rows_per_round: int


@dataclass
class _Requests:
    """The profiler's own requests: their ids, the adapter holding their KV, and the shared random source."""

    adapter: TargetAdapter
    rids: list[int]
    ctx_len: int
    vocab: int
    taps: list[int]
    gen: torch.Generator

    def truncate(self, n: int) -> None:
        """Roll the first ``n`` requests' KV back to their context."""
        for rid in self.rids[:n]:
            self.adapter.truncate(rid, self.ctx_len)


def _grid(
    drafter: nn.Module | None,
    batch_sizes: Sequence[int],
    batch_tokens: Callable[[int, int], Sequence[int]] | None,
    context_length: int,
    repeats: int,
    warmup: int,
    block_size: int | None,
    append_rows: int | None,
) -> _Grid:
    """Check the arguments and list the points to time."""
    sizes = sorted({int(r) for r in batch_sizes})
    if not sizes or sizes[0] < 1:
        raise ValueError(f"profile_costs: batch_sizes must be integers >= 1, got {list(batch_sizes)}")
    if int(context_length) < 1:
        raise ValueError(f"profile_costs: context_length must be >= 1, got {context_length}")
    if int(repeats) < 1 or int(warmup) < 0:
        raise ValueError(f"profile_costs: need repeats >= 1 and warmup >= 0, got {repeats} and {warmup}")
    gamma = int(block_size or (drafter.config.block_size if drafter is not None else 7))
    if gamma < 1:
        raise ValueError(f"profile_costs: block_size must be >= 1, got {gamma}")
    rows_per_round = int(append_rows) if append_rows is not None else math.ceil((gamma + 1) / 2)
    points: list[tuple[int, int]] = []
    for r in sizes:
        bs = sorted({int(b) for b in (batch_tokens or default_batch_tokens)(r, gamma)})
        bad = [b for b in bs if not r <= b <= r * (gamma + 1)]
        if not bs or bad:
            raise ValueError(
                f"profile_costs: batch tokens for R = {r} must lie in [{r}, {r * (gamma + 1)}], got {bs}"
            )
        points += [(r, b) for b in bs]
    return _Grid(sizes, points, gamma, rows_per_round)


def _open_adapter(
    target: nn.Module | TargetAdapter, max_r: int, ctx_len: int, gamma: int
) -> tuple[TargetAdapter, bool]:
    """``(adapter, whether the profiler owns it)``: a model gets an adapter with pages for ``max_r`` requests."""
    if isinstance(target, TargetAdapter):
        return target, False
    page = 16
    pages = max_r * (math.ceil((ctx_len + gamma + 1) / page) + 1)
    return TargetAdapter(target, page_size=page, num_pages=pages), True


def _prefill_contexts(req: _Requests, drafter: nn.Module | None) -> None:
    """Give every request a random context in the KV cache (and the drafter's context from its taps)."""
    # one request at a time keeps the prefill's activations small
    for rid in req.rids:
        req.adapter.add_request(rid)
        ctx = torch.randint(0, req.vocab, (req.ctx_len,), generator=req.gen)
        out = req.adapter.forward([TargetInput(rid, ctx, logits="none")], layers=req.taps)
        if drafter is not None:
            feats = torch.cat([out.hidden[layer] for layer in req.taps], -1)
            drafter.append_context([rid], [feats], positions=[0])
    _sync(req.adapter.device)


def _verify_jobs(req: _Requests, points: list[tuple[int, int]]) -> list[_Job]:
    """One packed verify forward per ``(R, B)``, its KV truncated back to the context afterwards."""
    jobs: list[_Job] = []
    for r, b in points:
        batch = [
            TargetInput(rid, torch.randint(0, req.vocab, (n,), generator=req.gen), logits="all")
            for rid, n in zip(req.rids[:r], split_tokens(b, r), strict=True)
        ]
        jobs.append(
            (
                f"verify R={r} B={b}",
                lambda batch=batch: req.adapter.forward(batch, layers=req.taps),
                lambda r=r: req.truncate(r),
            )
        )
    return jobs


def _drafter_jobs(
    req: _Requests, drafter: nn.Module, grid: _Grid, temperature: float, seed: int
) -> list[_Job]:
    """Per ``R``: a draft call, and an append of one round's committed rows (rolled back afterwards)."""
    width = drafter.config.num_taps * drafter.config.hidden_size
    offsets = itertools.count()  # a fresh sampling offset per draft call, as successive rounds have
    jobs: list[_Job] = []
    for r in grid.sizes:
        ids = req.rids[:r]
        anchors = torch.randint(0, req.vocab, (r,), generator=req.gen)
        feats = [torch.randn(grid.rows_per_round, width, generator=req.gen) for _ in ids]

        def rollback(ids: list[int] = ids) -> None:
            for rid in ids:
                drafter.truncate(rid, req.ctx_len)

        jobs.append(
            (
                f"draft R={r}",
                lambda ids=ids, anchors=anchors: drafter.draft(
                    ids, anchors, temperature, int(seed), next(offsets), **no_copies(drafter, len(ids))
                ),
                lambda: None,
            )
        )
        jobs.append(
            (f"append R={r}", lambda ids=ids, feats=feats: drafter.append_context(ids, feats), rollback)
        )
    return jobs


def no_copies(drafter, n: int) -> dict:
    """``draft`` arguments of a drafter that reads copies, with no continuation (its cost does not depend on
    them)."""
    return {"copy_continuations": [[]] * n, "copy_matches": [0] * n} if drafter.config.uses_copies else {}


def _time_passes(
    jobs: list[_Job], device: torch.device, warmup: int, repeats: int, bar: Any
) -> dict[str, list[float]]:
    """Every job's ms in each timed pass; a pass times each job once, after ``warmup`` untimed passes."""
    # interleaving puts a burst of foreign load on a shared machine on all points of a pass alike, instead of
    # skewing whichever points ran while it lasted
    samples: dict[str, list[float]] = {}
    for i in range(warmup + repeats):
        bar.set_postfix_str("warm-up" if i < warmup else f"repeat {i - warmup + 1}/{repeats}")
        for label, call, reset in jobs:
            ms = _time_ms(call, device)
            reset()
            if i >= warmup:
                samples.setdefault(label, []).append(ms)
        bar.update()
    return samples


def _release(req: _Requests, drafter: nn.Module | None, own_adapter: bool) -> None:
    """Finish the profiler's requests in the adapter and the drafter; close the adapter if it made one."""
    for rid in req.rids:
        if rid in req.adapter.pool:
            req.adapter.finish(rid)
        if drafter is not None:
            drafter.finish(rid)
    if own_adapter:
        req.adapter.close()


def _cost_rows(
    samples: dict[str, list[float]], grid: _Grid, with_drafter: bool
) -> tuple[list[VerifyCost], list[DraftCost]]:
    """Median verify ms per ``(R, B)`` and drafter round ms (draft + append) per ``R``, with their samples."""
    verify = [
        VerifyCost(r, b, statistics.median(t), tuple(t))
        for r, b in grid.points
        for t in [samples[f"verify R={r} B={b}"]]
    ]
    draft = []
    for r in grid.sizes if with_drafter else []:
        d_ms, a_ms = samples[f"draft R={r}"], samples[f"append R={r}"]
        rounds = [d + a for d, a in zip(d_ms, a_ms, strict=True)]
        draft.append(
            DraftCost(
                r,
                statistics.median(rounds),
                statistics.median(d_ms),
                statistics.median(a_ms),
                tuple(rounds),
            )
        )
    return verify, draft


def _metadata(
    req: _Requests,
    drafter: nn.Module | None,
    grid: _Grid,
    repeats: int,
    warmup: int,
    temperature: float,
    extra: dict | None,
) -> dict:
    """The table's metadata: device, target, drafter and the profile's settings (``extra`` merged last)."""
    model = req.adapter.model
    meta = describe_device(req.adapter.device)
    meta.update(
        target=getattr(model.config, "_name_or_path", None) or type(model).__name__,
        target_class=type(model).__name__,
        dtype=str(req.adapter.dtype).removeprefix("torch."),
        context_length=req.ctx_len,
        repeats=int(repeats),
        warmup=int(warmup),
        draft_temperature=float(temperature),
        append_rows=grid.rows_per_round if drafter is not None else None,
    )
    if drafter is not None:
        c = drafter.config
        meta["drafter"] = {
            "num_hidden_layers": c.num_hidden_layers,
            "dtype": str(drafter.dtype).removeprefix("torch."),
            "markov_rank": c.markov_rank,
            "block_size": c.block_size,
            "target_layer_ids": list(c.target_layer_ids),
            "draft_vocab": None if drafter.draft_vocab is None else int(drafter.draft_vocab.numel()),
        }
    meta.update(extra or {})
    return meta


def profile_costs(
    target: nn.Module | TargetAdapter,
    drafter: nn.Module | None = None,
    batch_sizes: Sequence[int] = (1, 2, 4, 8),
    *,
    batch_tokens: Callable[[int, int], Sequence[int]] | None = None,
    context_length: int = 256,
    repeats: int = 5,
    warmup: int = 2,
    block_size: int | None = None,
    append_rows: int | None = None,
    temperature: float = 0.0,
    seed: int = 0,
    progress: bool = True,
    metadata: dict | None = None,
) -> CostTable:
    """Time target verify forwards and drafter rounds on the model's device.

    Parameters
    ----------
    target : transformers.PreTrainedModel or TargetAdapter
        The causal LM (an adapter is made and closed again), or a ready :class:`TargetAdapter` whose pool gets
        the profiler's requests for the duration of the call.
    drafter : DSparkDrafter or None
        The drafter paired with ``target``; None measures the target alone (the table then has no drafter
        cost, and verify forwards capture no feature taps).
    batch_sizes : sequence of int
        Request counts ``R`` to profile.
    batch_tokens : callable or None
        ``(R, γ) -> B`` values to profile for ``R`` requests (each in ``[R, R (γ + 1)]``); default
        :func:`default_batch_tokens`, ``R, 2R, ..., R (γ + 1)``.
    context_length : int
        Tokens already in every request's KV cache (and drafter context) when a forward is timed.
    repeats : int
        Timed passes over all points; the table keeps each point's median (and the samples).
    warmup : int
        Untimed passes before the timed ones.
    block_size : int or None
        ``γ``; default the drafter's block size, else 7.
    append_rows : int or None
        Committed rows per request appended to the drafter context in a timed round; default
        ``ceil((γ + 1) / 2)``, a typical accepted length.
    temperature : float
        Draft sampling temperature (0: greedy argmax; > 0 adds the Gumbel draws of sampled drafting).
    seed : int
        Seeds the random context and draft tokens.
    progress : bool
        Show a tqdm progress bar.
    metadata : dict or None
        Extra metadata merged into the table's (e.g. ``{"target": "smollm2"}``).

    Returns
    -------
    CostTable
        Median verify ms by ``(R, B)`` and drafter round ms by ``R`` with device metadata.

    Examples
    --------
    >>> table = profile_costs(model, drafter, batch_sizes=(1, 2), context_length=64, repeats=3)  # doctest: +SKIP
    >>> table.to_sps().save("sps.json")                                                        # doctest: +SKIP
    """
    from tqdm.auto import tqdm

    grid = _grid(drafter, batch_sizes, batch_tokens, context_length, repeats, warmup, block_size, append_rows)
    ctx_len, max_r = int(context_length), grid.sizes[-1]
    adapter, own_adapter = _open_adapter(target, max_r, ctx_len, grid.gamma)
    req = _Requests(
        adapter,
        rids=[_RID_BASE + i for i in range(max_r)],
        ctx_len=ctx_len,
        vocab=int(adapter.model.get_output_embeddings().weight.shape[0]),
        taps=list(drafter.config.target_layer_ids) if drafter is not None else [],
        gen=torch.Generator().manual_seed(int(seed)),
    )
    bar = tqdm(total=int(warmup) + int(repeats), disable=not progress, desc="profile", unit="pass")
    try:
        bar.set_postfix_str(f"prefill {max_r} x {ctx_len} tokens")
        _prefill_contexts(req, drafter)
        jobs = _verify_jobs(req, grid.points)
        if drafter is not None:
            jobs += _drafter_jobs(req, drafter, grid, temperature, seed)
        samples = _time_passes(jobs, adapter.device, int(warmup), int(repeats), bar)
    finally:
        bar.close()
        _release(req, drafter, own_adapter)
    verify, draft = _cost_rows(samples, grid, drafter is not None)
    meta = _metadata(req, drafter, grid, repeats, warmup, temperature, metadata)
    return CostTable(tuple(verify), tuple(draft), grid.gamma, meta)
