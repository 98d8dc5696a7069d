# SPDX-License-Identifier: Apache-2.0
"""The methods bench_e2e times (HF generate, HF prompt lookup, the DSpark engine) and one case's sweep."""

from __future__ import annotations

import functools
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from dspark import DSparkDecoder, DSparkDrafter
from dspark.decoding.lookup import LookupConfig
from dspark.decoding.stats import DSparkStats

HF = "HF generate"
PLAIN = "dspark plain (γ = 0)"
PROMPT_LOOKUP = "HF prompt lookup"
PROMPT_LOOKUP_TOKENS = 10
LOOKUP = "lookup (dspark engine)"  # prompt-lookup drafts through the dspark engine, no drafter
HYBRID = "hybrid (DSpark + lookup)"
STAGES = ("lookup", "draft", "plan", "verify", "accept", "commit")
WARMUP_TOKENS = 4  # a short generate per method first, so one-time setup is not timed


@dataclass
class Run:
    """One method at one batch size on one prompt set and temperature."""

    method: str
    batch: int
    sequences: list[list[int]]
    seconds_each: list[float]  # wall time of every timed run (--repeats), in order; empty when not run
    planner: str | None = None  # requested planner (DSpark / DFlash)
    effective_planner: str | None = None  # what ran: cost-driven planners need an SPS table
    stats: DSparkStats | None = None
    note: str = ""
    available: bool = True
    ratio: float | None = None  # tokens/s over HF generate's at the same batch
    matches_hf: bool | None = None  # greedy only
    mismatch: str = ""

    @property
    def tokens(self) -> int:
        return sum(len(s) for s in self.sequences)

    @property
    def seconds(self) -> float:
        """The median timed run (0 when the method did not run)."""
        return statistics.median(self.seconds_each) if self.seconds_each else 0.0

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / self.seconds if self.available and self.seconds > 0 else 0.0

    def to_dict(self) -> dict:
        return {
            "method": self.method,
            "batch": self.batch,
            "planner": self.planner,
            "effective_planner": self.effective_planner,
            "available": self.available,
            "note": self.note,
            "tokens": self.tokens,
            "sequence_lengths": [len(s) for s in self.sequences],
            "seconds": self.seconds,
            "seconds_each": self.seconds_each,
            "tokens_per_second": self.tokens_per_second,
            "ratio_to_hf": self.ratio,
            "matches_hf": self.matches_hf,
            "mismatch": self.mismatch or None,
            "stats": self.stats.to_dict() if self.stats is not None else None,
        }


@dataclass
class Case:
    """All runs of one prompt set at one temperature."""

    prompt_set: str
    temperature: float
    num_prompts: int
    runs: list[Run]


# ---------------------------------------------------------------------------------------------------- helpers
def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _timed(fn: Callable[[], Any], device: torch.device, repeats: int) -> tuple[Any, list[float]]:
    """``fn()``'s last result and the wall time of each of its ``repeats`` calls."""
    times, out = [], None
    for _ in range(max(1, repeats)):
        _sync(device)
        t0 = time.perf_counter()
        out = fn()
        _sync(device)
        times.append(time.perf_counter() - t0)
    return out, times


def _trim(seq: list[int], eos_ids: Sequence[int]) -> list[int]:
    """Up to and including the first EOS (HF pads finished rows; DSpark keeps the EOS and stops)."""
    for i, t in enumerate(seq):
        if t in eos_ids:
            return seq[: i + 1]
    return seq


def _hf_kwargs(temperature: float, max_new_tokens: int, pad_id: int, eos_ids: list[int]) -> dict:
    # eos_token_id=None really disables stopping (an explicit kwarg overrides the model's generation config);
    # top_k=0 / top_p=1 undo HF's default top-k 50 so sampling draws from the same distribution as DSpark's
    kw: dict[str, Any] = {
        "max_new_tokens": max_new_tokens,
        "pad_token_id": pad_id,
        "eos_token_id": eos_ids or None,
        "do_sample": temperature > 0,
    }
    if temperature > 0:
        kw.update(temperature=temperature, top_k=0, top_p=1.0)
    return kw


# ---------------------------------------------------------------------------------------------------- methods
def run_hf(
    target: torch.nn.Module,
    prompts: list[list[int]],
    *,
    batch: int,
    temperature: float,
    max_new_tokens: int,
    pad_id: int,
    eos_ids: list[int],
    seed: int = 0,
    repeats: int = 1,
    warmup: bool = True,
) -> Run:
    """Plain HF ``generate`` (DynamicCache) over left-padded batches of ``batch`` prompts."""
    device = target.device

    def once(ps: list[list[int]], max_new: int) -> list[list[int]]:
        torch.manual_seed(seed)
        seqs = []
        for i in range(0, len(ps), batch):
            chunk = ps[i : i + batch]
            L = max(len(p) for p in chunk)
            ids = torch.tensor([[pad_id] * (L - len(p)) + p for p in chunk], device=device)
            mask = torch.tensor([[0] * (L - len(p)) + [1] * len(p) for p in chunk], device=device)
            out = target.generate(
                ids, attention_mask=mask, **_hf_kwargs(temperature, max_new, pad_id, eos_ids)
            )
            seqs += [_trim(row, eos_ids) for row in out[:, L:].tolist()]
        return seqs

    if warmup:
        once(prompts[:batch], WARMUP_TOKENS)
    seqs, times = _timed(lambda: once(prompts, max_new_tokens), device, repeats)
    return Run(HF, batch, seqs, times)


def run_prompt_lookup(
    target: torch.nn.Module,
    prompts: list[list[int]],
    *,
    temperature: float,
    max_new_tokens: int,
    pad_id: int,
    eos_ids: list[int],
    num_tokens: int = PROMPT_LOOKUP_TOKENS,
    seed: int = 0,
    repeats: int = 1,
    warmup: bool = True,
) -> Run:
    """HF prompt-lookup decoding, one prompt at a time (HF supports it at batch size 1 only)."""
    device = target.device
    kw = _hf_kwargs(temperature, max_new_tokens, pad_id, eos_ids)

    def once(ps: list[list[int]], max_new: int) -> list[list[int]]:
        torch.manual_seed(seed)
        seqs = []
        for p in ps:
            ids = torch.tensor([p], device=device)
            out = target.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                prompt_lookup_num_tokens=num_tokens,
                **{**kw, "max_new_tokens": max_new},
            )
            seqs.append(_trim(out[0, len(p) :].tolist(), eos_ids))
        return seqs

    if warmup:
        once(prompts[:1], WARMUP_TOKENS)
    seqs, times = _timed(lambda: once(prompts, max_new_tokens), device, repeats)
    return Run(PROMPT_LOOKUP, 1, seqs, times, note=f"{num_tokens} lookup tokens, prompt by prompt")


def run_dspark(
    target: torch.nn.Module,
    tokenizer: Any,
    drafter: DSparkDrafter,
    prompts: list[list[int]],
    *,
    method: str,
    planner: str,
    batch: int,
    temperature: float,
    max_new_tokens: int,
    eos_ids: list[int],
    sps: Path | None = None,
    sts: Path | None = None,
    block_size: int | None = None,
    seed: int = 0,
    repeats: int = 1,
    warmup: bool = True,
    speculative: bool = True,
    linear_max_rows: int | None = None,
    lookup: bool | LookupConfig = False,
    lookup_prior: Path | None = None,
    measure_costs: bool = False,
    finish_together: bool = True,
) -> Run:
    """``DSparkDecoder.generate`` on all prompts, ``batch`` requests at a time (finished ones are replaced).

    ``drafter=None`` (or ``speculative=False``) runs plain decoding through the same engine (no drafts; the row
    has no planner); with ``lookup`` it runs lookup decoding. ``lookup`` with a drafter: hybrid rounds.
    """
    has_conf = drafter is not None and drafter.confidence_head is not None
    dec = DSparkDecoder(
        target,
        drafter,
        planner=planner,
        sps_table=sps,
        sts=sts if has_conf else None,
        block_size=block_size,
        max_batch_size=batch,
        tokenizer=tokenizer,
        linear_max_rows=linear_max_rows,
        lookup=lookup,
        lookup_prior=lookup_prior if lookup else None,
        # measured costs correct a cost table; plain decoding has none to correct
        measure_costs=bool(measure_costs and sps is not None and (drafter is not None or lookup)),
        finish_together=finish_together,
    )
    try:
        # explicit sampling settings: the target's generation config must not add top-k / top-p / penalties
        def once(ps: list[list[int]], max_new: int):
            return dec.generate(
                ps,
                max_new_tokens=max_new,
                temperature=temperature,
                top_k=0,
                top_p=1.0,
                repetition_penalty=1.0,
                eos_token_id=eos_ids,
                seed=seed,
                speculative=speculative,
            )

        def timed_once():
            if dec.lookup_corpus is not None:  # each timed run drafts only from its own earlier answers
                dec.lookup_corpus.clear()
            return once(prompts, max_new_tokens)

        if warmup:
            once(prompts[:batch], WARMUP_TOKENS)
        out, times = _timed(timed_once, target.device, repeats)
        effective = dec.planner.effective_mode if has_conf or lookup else "full"
    finally:
        dec.close()
    if not speculative or (drafter is None and not lookup):  # plain decoding: no planner ran
        planner = effective = None
    return Run(method, batch, out.sequences, times, planner, effective, out.stats)


# ---------------------------------------------------------------------------------------------------- sweep
@dataclass
class Bench:
    """The models and settings every (prompt set, temperature) case runs with."""

    target: torch.nn.Module
    tokenizer: Any
    drafter: DSparkDrafter
    pad_id: int
    eos_ids: list[int]
    max_new_tokens: int
    batches: list[int]
    planners: list[str]
    dflash: DSparkDrafter | None = None
    sps: Path | None = None
    sts: Path | None = None
    block_size: int | None = None
    plain: bool = True
    lookup: bool = True  # also run lookup decoding and hybrid (drafter + lookup) rounds
    lookup_planner: str = "early_stop"
    lookup_prior: Path | None = None
    also_whole_vocab: bool = False
    linear_max_rows: int | None = None
    measure_costs: bool = False  # speculative rows correct the cost table with measured round times
    seed: int = 0
    repeats: int = 1
    warmup: bool = True
    common: dict = field(init=False)

    def __post_init__(self) -> None:
        # the token budget, stopping rule and timing settings every method shares
        self.common = {
            "max_new_tokens": self.max_new_tokens,
            "eos_ids": self.eos_ids,
            "seed": self.seed,
            "repeats": self.repeats,
            "warmup": self.warmup,
        }


def _add(runs: list[Run], where: str, run: Run) -> None:
    """Append ``run``, printing one progress line to stderr: a full run takes tens of minutes on a CPU."""
    runs.append(run)
    if run.available:
        print(
            f"  [{where}, batch {run.batch}] {run.method}: {run.tokens_per_second:.1f} tok/s ({run.seconds:.1f} s)",
            file=sys.stderr,
            flush=True,
        )


def _engine_runs(bench: Bench, prompts: list[list[int]], batch: int, temperature: float):
    """Yield the DSpark-engine runs at one batch size: plain, every planner (whole vocab too), DFlash."""
    # the same target, batch size and sampling settings for every DSpark-engine row
    engine = functools.partial(
        run_dspark,
        bench.target,
        bench.tokenizer,
        batch=batch,
        temperature=temperature,
        linear_max_rows=bench.linear_max_rows,
        **bench.common,
    )
    drafter = bench.drafter
    if bench.plain:
        yield engine(None, prompts, method=PLAIN, planner="full")
    planned = functools.partial(
        engine,
        drafter,
        prompts,
        sps=bench.sps,
        sts=bench.sts,
        block_size=bench.block_size,
        measure_costs=bench.measure_costs,
    )
    for planner in bench.planners:
        yield planned(method=f"DSpark {planner}", planner=planner)
    draft_vocab = drafter.draft_vocab
    for planner in bench.planners if bench.also_whole_vocab and draft_vocab is not None else []:
        drafter.set_draft_vocab(None)
        try:
            run = planned(method=f"DSpark {planner}, whole vocab", planner=planner)
        finally:
            drafter.set_draft_vocab(draft_vocab)
        yield run
    if bench.lookup:
        lk = {"planner": bench.lookup_planner, "lookup": True, "lookup_prior": bench.lookup_prior}
        yield engine(None, prompts, method=LOOKUP, sps=bench.sps, measure_costs=bench.measure_costs, **lk)
        yield planned(method=HYBRID, **lk)
    if bench.dflash is not None:
        yield engine(bench.dflash, prompts, method="DFlash full", planner="full", block_size=bench.block_size)


def run_case(bench: Bench, set_name: str, prompts: list[list[int]], temperature: float) -> Case:
    """Every method at every batch size on one prompt set and temperature."""
    runs: list[Run] = []
    where = f"{set_name}, T = {temperature:g}"
    for b in bench.batches:
        common = {"temperature": temperature, "pad_id": bench.pad_id, **bench.common}
        _add(runs, where, run_hf(bench.target, prompts, batch=b, **common))
        if b == 1:
            lookup = run_prompt_lookup(bench.target, prompts, **common)
        else:
            note = "HF runs it at batch 1 only: see the batch-1 row"
            lookup = Run(PROMPT_LOOKUP, b, [], [], available=False, note=note)
        _add(runs, where, lookup)
        for run in _engine_runs(bench, prompts, b, temperature):
            _add(runs, where, run)
    return Case(set_name, temperature, len(prompts), runs)
