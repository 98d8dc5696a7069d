# SPDX-License-Identifier: Apache-2.0
"""bench_e2e_gpu's clocks and timed runs: per-stage marks inside the engine's rounds, and the three methods.

The library is not changed: for the duration of :func:`instrumented` the benchmark replaces
``DSparkStats.stage`` (the context manager every step of a round runs under), the paged attention and KV-append
ops as the target adapter calls them (``dspark.models.target.paged_verify_attention`` / ``paged_kv_append``), and,
per run, the decoder's ``_round`` and the drafter's ``append_context``. Each records a pair of marks: CUDA
events (``enable_timing=True``) on the current stream on CUDA, ``time.perf_counter`` on CPU. Events are read
once, after a synchronisation at the end of each ``generate`` call, so the marks add no host waits to a round.
Marks are taken only inside a decoding round (the prefill, which also runs under the ``verify`` stage, is not
counted).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch

import dspark.models.target as target_module
from dspark import DSparkDecoder
from dspark.decoding.stats import DSparkStats
from dspark.models.target_graphs import describe


class Clock:
    """Marks on the device's timeline: CUDA events on CUDA, ``perf_counter`` seconds elsewhere."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.kind = "cuda events" if self.cuda else "time.perf_counter"

    def mark(self) -> Any:
        if self.cuda:
            e = torch.cuda.Event(enable_timing=True)
            e.record()
            return e
        return time.perf_counter()

    def ms(self, a: Any, b: Any) -> float:
        """Milliseconds from mark ``a`` to mark ``b`` (after :meth:`sync` on CUDA)."""
        return float(a.elapsed_time(b)) if self.cuda else (b - a) * 1e3

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()


@dataclass
class RoundMarks:
    """The marks of one engine round (``R`` requests, verify length ``l``; ``timed``: counted in the results)."""

    R: int
    verify_len: int
    timed: bool
    start: Any = None
    end: Any = None
    host_s: float = 0.0
    syncs: int = 0
    stages: dict[str, list[tuple[Any, Any]]] = field(default_factory=dict)
    subs: dict[str, list[tuple[Any, Any]]] = field(default_factory=dict)  # attention, kv_append, append


@dataclass
class RoundTime:
    """One round in milliseconds: the whole round, each stage, and the sub-steps timed inside them."""

    R: int
    verify_len: int
    round_ms: float
    host_ms: float
    syncs: int
    stages: dict[str, float]
    subs: dict[str, float]


class Recorder:
    """Collects the marks of the rounds of one ``generate`` call."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.rounds: list[RoundMarks] = []
        self.current: RoundMarks | None = None
        self.stage: str | None = None

    def sub(self, name: str, inside: str, fn: Callable, *args: Any, **kwargs: Any) -> Any:
        """Call ``fn``, marking it under ``name`` when it runs inside stage ``inside`` of a round."""
        r = self.current
        if r is None or self.stage != inside:
            return fn(*args, **kwargs)
        a = self.clock.mark()
        out = fn(*args, **kwargs)
        r.subs.setdefault(name, []).append((a, self.clock.mark()))
        return out

    def resolve(self) -> list[RoundTime]:
        """The timed rounds in ms (synchronises once)."""
        self.clock.sync()
        ms = self.clock.ms
        out = []
        for r in self.rounds:
            if not r.timed:
                continue
            out.append(
                RoundTime(
                    r.R,
                    r.verify_len,
                    ms(r.start, r.end),
                    r.host_s * 1e3,
                    r.syncs,
                    {k: sum(ms(a, b) for a, b in v) for k, v in r.stages.items()},
                    {k: sum(ms(a, b) for a, b in v) for k, v in r.subs.items()},
                )
            )
        return out


_ACTIVE: list[Recorder] = []  # the recorder of the generate call running now (at most one)


@contextmanager
def instrumented(ops: bool = True) -> Iterator[None]:
    """Replace the stage context manager (and with ``ops`` the target's attention / KV-append ops) by marking
    versions. Each mark costs a few microseconds of host time (an event record on CUDA); ``ops`` adds two per
    layer and round."""
    orig_stage = DSparkStats.stage
    orig_attn = target_module.paged_verify_attention
    orig_kv = target_module.paged_kv_append

    @contextmanager
    def stage(self: DSparkStats, name: str) -> Iterator[None]:
        rec = _ACTIVE[-1] if _ACTIVE else None
        r = rec.current if rec is not None else None
        if r is None:  # outside a round (prefill) or no recorder: the library's own behaviour
            with orig_stage(self, name):
                yield
            return
        a = rec.clock.mark()
        rec.stage = name
        try:
            with orig_stage(self, name):
                yield
        finally:
            rec.stage = None
            r.stages.setdefault(name, []).append((a, rec.clock.mark()))

    def attention(*args: Any, **kwargs: Any) -> Any:
        if not _ACTIVE:
            return orig_attn(*args, **kwargs)
        return _ACTIVE[-1].sub("attention", "verify", orig_attn, *args, **kwargs)

    def kv_append(*args: Any, **kwargs: Any) -> Any:
        if not _ACTIVE:
            return orig_kv(*args, **kwargs)
        return _ACTIVE[-1].sub("kv_append", "verify", orig_kv, *args, **kwargs)

    DSparkStats.stage = stage
    if ops:
        target_module.paged_verify_attention = attention
        target_module.paged_kv_append = kv_append
    try:
        yield
    finally:
        DSparkStats.stage = orig_stage
        target_module.paged_verify_attention = orig_attn
        target_module.paged_kv_append = orig_kv


@dataclass
class EngineRun:
    """One DSparkDecoder.generate call: its tokens, its timed rounds, wall time and peak device memory."""

    sequences: list[list[int]]
    rounds: list[RoundTime]
    wall_s: float
    peak_mb: float | None
    rounds_run: int
    accepted_drafts: int
    graphs: dict | None = None  # GraphStats of a run with CUDA graphs (target_graphs.describe)


def peak_reset(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()


def peak_mb(device: torch.device) -> float | None:
    """``torch.cuda.max_memory_allocated`` since :func:`peak_reset`, MiB (None off CUDA)."""
    if device.type != "cuda":
        return None
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() / 2**20


def kv_pages(R: int, prompt_len: int, new_tokens: int, page: int = 16) -> int:
    """A pool that holds every request's whole run (allocated up front: no growth inside a timed round)."""
    return R * (-(-(prompt_len + new_tokens + 8 + 1) // page) + 1)


def run_engine(
    target: torch.nn.Module,
    drafter: Any,
    prompts: list[list[int]],
    schedule: Sequence[tuple[int, bool]],
    max_new_tokens: int,
    clock: Clock,
    planner: Any = None,
    cuda_graphs: bool = False,
    compile_models: bool = False,
) -> EngineRun:
    """``DSparkDecoder.generate`` (greedy, EOS ignored) of all ``prompts`` at once, round ``i`` run with verify
    length ``schedule[i][0]`` and counted when ``schedule[i][1]`` (later rounds: not counted).

    With ``drafter`` None this is plain decoding through the engine (the schedule's lengths are ignored: 1).
    The drafter drafts all γ slots every round (``adaptive_slots=False``), so the draft stages cost the same at
    every verify length. ``cuda_graphs``: the target's forwards and the drafter's block forward replay from CUDA graphs (the first rounds of
    each verify length, untimed, capture them); ``EngineRun.graphs`` then says what they did. ``compile_models``:
    ``decoder.compile(target=True)`` (the target's norms and MLPs, the drafter's dense modules; compiled in the
    untimed first rounds, restored by ``close``).
    """
    R = len(prompts)
    device = target.device
    kwargs: dict[str, Any] = {}
    if drafter is not None:
        kwargs = {"planner": planner, "block_size": drafter.config.block_size, "adaptive_slots": False}
    dec = DSparkDecoder(
        target,
        drafter,
        max_batch_size=R,
        max_kv_pages=kv_pages(R, max(len(p) for p in prompts), max_new_tokens),
        cuda_graphs=cuda_graphs,
        **kwargs,
    )
    if compile_models:
        dec.compile(target=True)
    rec = Recorder(clock)
    orig_round = dec._round
    orig_append = drafter.append_context if drafter is not None else None

    def timed_round(call: Any, running: list) -> None:
        i = len(rec.rounds)
        n, timed = schedule[i] if i < len(schedule) else (schedule[-1][0], False)
        if planner is not None:
            planner.verify_len = n
        r = RoundMarks(len(running), n if drafter is not None else 1, timed and len(running) == R)
        syncs = dec.host.syncs
        rec.current = r
        t0 = time.perf_counter()
        r.start = clock.mark()
        try:
            orig_round(call, running)
        finally:
            r.end = clock.mark()
            r.host_s = time.perf_counter() - t0
            r.syncs = dec.host.syncs - syncs
            rec.current = None
            rec.rounds.append(r)

    def append_context(*args: Any, **kw: Any) -> Any:
        return rec.sub("append", "commit", orig_append, *args, **kw)

    dec._round = timed_round
    if drafter is not None:
        drafter.append_context = append_context
    _ACTIVE.append(rec)
    peak_reset(device)
    try:
        clock.sync()
        t0 = time.perf_counter()
        out = dec.generate(
            prompts,
            max_new_tokens=max_new_tokens,
            temperature=0.0,
            top_k=0,
            top_p=1.0,
            repetition_penalty=1.0,
            eos_token_id=[],
            seed=0,
        )
        clock.sync()
        wall = time.perf_counter() - t0
        mem = peak_mb(device)
        rounds = rec.resolve()
        graphs = describe(dec.adapter.graph_stats) if cuda_graphs else None
        if graphs is not None and dec.drafter_graphs is not None:  # the drafter's block forward
            graphs["drafter"] = describe(dec.drafter_graphs.stats)
            graphs["drafter_heads"] = describe(dec.drafter_graphs.heads.stats)  # LM head + draw, confidence
            graphs["drafter_context"] = describe(dec.drafter_graphs.context.stats)  # context append
    finally:
        _ACTIVE.remove(rec)
        if drafter is not None:
            del drafter.append_context  # back to the class's method
        dec.close()
    accepted = sum(k * n for k, n in enumerate(out.stats.accepted_hist))
    return EngineRun(out.sequences, rounds, wall, mem, len(rec.rounds), accepted, graphs)


@dataclass
class HFRun:
    """HF ``generate``: greedy tokens and the decode-step time from two calls of different lengths."""

    sequences: list[list[int]]
    step_ms: float
    cache: str
    peak_mb: float | None
    note: str = ""


def _hf_generate(
    target: torch.nn.Module, ids: torch.Tensor, n: int, cache: str, compile_: bool
) -> torch.Tensor:
    kw: dict[str, Any] = {
        "do_sample": False,
        "max_new_tokens": n,
        "pad_token_id": 0,
        "eos_token_id": None,
    }
    if cache == "static":
        kw["cache_implementation"] = "static"
        kw["disable_compile"] = not compile_
    return target.generate(ids, attention_mask=torch.ones_like(ids), **kw)


def run_hf(
    target: torch.nn.Module, prompts: list[list[int]], max_new_tokens: int, cache: str, compile_: bool
) -> HFRun:
    """Greedy HF ``generate`` of the (equal-length, so unpadded) prompts as one batch.

    Step time = (t(max_new_tokens) - t(1)) / (max_new_tokens - 1): the prefill and the first token cancel out.
    ``cache``: ``static`` (``cache_implementation="static"``; ``disable_compile`` unless ``compile_``) falls back
    to ``dynamic`` when it raises, and says so in ``note``.
    """
    device = target.device
    ids = torch.tensor(prompts, device=device)
    note = ""
    try:
        _hf_generate(target, ids, 2, cache, compile_)  # warm-up (and the check that this cache works)
    except Exception as e:  # noqa: BLE001 - any failure of the static path falls back to HF's default
        if cache != "static":
            raise
        note = f"static cache failed ({type(e).__name__}: {str(e)[:120]}); dynamic"
        cache = "dynamic"
        _hf_generate(target, ids, 2, cache, compile_)

    def timed(n: int) -> tuple[torch.Tensor, float]:
        if device.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        out = _hf_generate(target, ids, n, cache, compile_)
        if device.type == "cuda":
            torch.cuda.synchronize()
        return out, time.perf_counter() - t0

    peak_reset(device)
    _, t1 = timed(1)
    out, tn = timed(max_new_tokens)
    mem = peak_mb(device)
    L = ids.shape[1]
    step = (tn - t1) / max(1, max_new_tokens - 1) * 1e3
    return HFRun(out[:, L:].tolist(), step, cache, mem, note)


def tie_gap(target: torch.nn.Module, prompt: list[int], prefix: list[int], a: int, b: int) -> float:
    """``|logit(a) - logit(b)|`` of the target's next-token logits after ``prompt + prefix`` (HF forward).

    Where two greedy decodings part at a token, a gap at rounding level says the target's top two logits tie
    there and the two forwards (paged verify vs HF's own) rounded differently; a real error parts with a gap
    as large as any other.
    """
    ids = torch.tensor([prompt + prefix], device=target.device)
    logits = target(ids).logits[0, -1].float()
    return float((logits[a] - logits[b]).abs())
