# SPDX-License-Identifier: Apache-2.0
"""bench_e2e_gpu's results: per-stage medians, the measured cost table, projected tokens/s, tables and JSON."""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.e2e_gpu.timing import EngineRun, HFRun, RoundTime
from dspark.decoding.stats import STAGES
from dspark.decoding.tables import CostTable, DraftCost, VerifyCost
from dspark.profiling.profiler import describe_device

SUBS = ("attention", "kv_append", "append")
DRAFT_STAGES = ("draft", "markov_sample", "confidence")


@dataclass
class Cell:
    """Medians over the timed rounds of one (R, l): the DSpark engine at verify length l, or plain (l = 1)."""

    R: int
    verify_len: int
    rounds: int
    round_ms: float
    host_ms: float
    syncs_per_round: float
    stages: dict[str, float]
    subs: dict[str, float]
    samples_round_ms: list[float] = field(default_factory=list)
    samples_verify_ms: list[float] = field(default_factory=list)
    samples_draft_ms: list[float] = field(default_factory=list)  # draft + markov_sample + confidence

    @property
    def attention_share(self) -> float | None:
        v, a = self.stages.get("verify", 0.0), self.subs.get("attention", 0.0)
        return a / v if v > 0 and a > 0 else None  # None: not marked (--no-op-marks)


def _median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def cells(rounds: list[RoundTime]) -> dict[int, Cell]:
    """One :class:`Cell` per verify length among ``rounds``."""
    out = {}
    for n in sorted({r.verify_len for r in rounds}):
        rs = [r for r in rounds if r.verify_len == n]
        out[n] = Cell(
            rs[0].R,
            n,
            len(rs),
            _median([r.round_ms for r in rs]),
            _median([r.host_ms for r in rs]),
            sum(r.syncs for r in rs) / len(rs),
            {s: _median([r.stages.get(s, 0.0) for r in rs]) for s in STAGES},
            {s: _median([r.subs.get(s, 0.0) for r in rs]) for s in SUBS},
            [r.round_ms for r in rs],
            [r.stages.get("verify", 0.0) for r in rs],
            [sum(r.stages.get(s, 0.0) for s in DRAFT_STAGES) for r in rs],
        )
    return out


@dataclass
class GraphRuns:
    """The same two engine runs with the target's forwards replayed from CUDA graphs."""

    spec: dict[int, Cell]
    plain: Cell | None
    spec_run: EngineRun
    plain_run: EngineRun

    def to_dict(self) -> dict:
        return {
            "speculative": {str(k): asdict(c) for k, c in self.spec.items()},
            "plain": asdict(self.plain) if self.plain else None,
            "peak_mb": {"dspark": self.spec_run.peak_mb, "plain": self.plain_run.peak_mb},
            "stats": {"dspark": self.spec_run.graphs, "plain": self.plain_run.graphs},
        }


@dataclass
class Batch:
    """Everything measured at one batch size R."""

    R: int
    spec: dict[int, Cell]
    plain: Cell | None
    hf: HFRun
    spec_run: EngineRun
    plain_run: EngineRun
    canary: dict[str, Any]
    graphs: GraphRuns | None = None

    def to_dict(self) -> dict:
        return {
            "graphs": self.graphs.to_dict() if self.graphs else None,
            "R": self.R,
            "speculative": {str(k): asdict(c) for k, c in self.spec.items()},
            "plain": asdict(self.plain) if self.plain else None,
            "hf": {k: v for k, v in asdict(self.hf).items() if k != "sequences"},
            "peak_mb": {
                "dspark": self.spec_run.peak_mb,
                "plain": self.plain_run.peak_mb,
                "hf": self.hf.peak_mb,
            },
            "wall_s": {"dspark": self.spec_run.wall_s, "plain": self.plain_run.wall_s},
            "rounds_run": {"dspark": self.spec_run.rounds_run, "plain": self.plain_run.rounds_run},
            "accepted_drafts": self.spec_run.accepted_drafts,
            "canary": self.canary,
        }


def first_differences(seqs: list[list[int]], ref: list[list[int]]) -> list[tuple[int, int]]:
    """``(request, position)`` of the first token where each differing sequence parts from the reference."""
    out = []
    for i, (a, b) in enumerate(zip(seqs, ref, strict=True)):
        if a != b:
            pos = next((k for k, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
            out.append((i, pos))
    return out


def canary(
    runs: dict[str, list[list[int]]],
    ref: list[list[int]],
    gap: Callable[[int, int, int, int], float],
    tol: float,
    strict: bool,
    max_checks: int = 32,
) -> dict[str, Any]:
    """Greedy canary: each run's tokens against the reference's (HF ``generate``, the target's own greedy).

    A sequence that parts from the reference where the target's two candidate logits lie within ``tol`` of each
    other (``gap(request, position, token, ref_token)``) is a near-tie, counted but not a failure; any other
    difference is. ``ok``: no unexplained difference.
    """
    out: dict[str, Any] = {"strict": strict, "tie_tolerance": tol, "ok": True}
    for name, seqs in runs.items():
        diffs = []
        for n, (i, pos) in enumerate(first_differences(seqs, ref)):
            # a length mismatch, or past max_checks (bf16 parts often: one forward each): not a near-tie
            if pos >= min(len(seqs[i]), len(ref[i])) or n >= max_checks:
                diffs.append({"request": i, "position": pos, "gap": None, "tie": False})
                continue
            g = gap(i, pos, seqs[i][pos], ref[i][pos])
            diffs.append({"request": i, "position": pos, "gap": g, "tie": g <= tol})
        out[name] = diffs
        out["ok"] = out["ok"] and all(d["tie"] for d in diffs)
    return out


def canary_cell(c: dict[str, Any], accepted: int) -> str:
    diffs = [d for k, v in c.items() if isinstance(v, list) for d in v]
    ties = sum(d["tie"] for d in diffs)
    if not diffs:
        return f"yes ({accepted} drafts accepted)"
    if c["ok"]:
        return f"yes, {ties} near-tie(s) (logit gap <= {c['tie_tolerance']:g}; {accepted} drafts accepted)"
    bad = [
        f"{k} request {d['request']} at token {d['position']} (gap {_f(d['gap'], '.3g')})"
        for k, v in c.items()
        if isinstance(v, list)
        for d in v
        if not d["tie"]
    ]
    return f"**NO**: {len(bad)} sequence(s) differ: " + "; ".join(bad[:3])


def cost_table(batches: list[Batch], gamma: int, meta: dict) -> CostTable | None:
    """The measured rounds as dspark's cost table: verify ms per (R, B = R·l), drafter round ms per R."""
    verify, draft = [], []
    for b in batches:
        for c in b.spec.values():
            if c.rounds and c.stages["verify"] > 0:
                verify.append(
                    VerifyCost(b.R, b.R * c.verify_len, c.stages["verify"], tuple(c.samples_verify_ms))
                )
        # the drafter drafts all γ slots at every l, so its cost is pooled over the verify lengths
        d = _median([x for c in b.spec.values() for x in c.samples_draft_ms])
        a = _median([c.subs["append"] for c in b.spec.values()])
        if d > 0:  # NaN (no timed round) compares False
            a_ms = None if math.isnan(a) else a
            draft.append(DraftCost(b.R, d + (a_ms or 0.0), d, a_ms))
    if not verify:
        return None
    return CostTable(tuple(verify), tuple(draft), gamma, meta)


def projection(batches: list[Batch], taus: list[float]) -> list[dict]:
    """Projected tokens/s = R·τ / t_round(R, l) for τ ≤ l, beside the engine's plain R / t_plain and HF's."""
    rows = []
    for b in batches:
        plain = b.R / (b.plain.round_ms / 1e3) if b.plain and b.plain.round_ms > 0 else None
        hf = b.R / (b.hf.step_ms / 1e3) if b.hf.step_ms > 0 else None
        for c in b.spec.values():
            tps = {
                str(t): (b.R * t / (c.round_ms / 1e3) if t <= c.verify_len and c.round_ms > 0 else None)
                for t in taus
            }
            rows.append(
                {
                    "R": b.R,
                    "l": c.verify_len,
                    "round_ms": c.round_ms,
                    "tokens_per_s": tps,
                    "x_plain": {k: (v / plain if v and plain else None) for k, v in tps.items()},
                    "plain_tokens_per_s": plain,
                    "hf_tokens_per_s": hf,
                }
            )
    return rows


# ---------------------------------------------------------------------------------------------------- markdown
def _f(x: float | None, fmt: str = ".2f") -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, fmt)


def stage_table(batches: list[Batch], clock: str) -> str:
    head = [
        "R",
        "l",
        *STAGES[:4],
        "verify (attention %)",
        "accept",
        "commit",
        "round",
        "host wall",
        "host syncs / round",
        "rounds",
    ]
    lines = [
        f"Per-stage time per round, ms (median over the timed rounds; {clock}); l = rows verified per request "
        "(anchor + l - 1 drafts); `plain` = the engine without a drafter",
        "",
        "| " + " | ".join(head) + " |",
        "|" + "---|" * len(head),
    ]
    for b in batches:
        for c in [*b.spec.values(), *([b.plain] if b.plain else [])]:
            plain = c is b.plain
            st = c.stages
            share = c.attention_share
            cellv = [
                str(b.R),
                "plain" if plain else str(c.verify_len),
                *(("-" if plain else _f(st[s])) for s in STAGES[:4]),
                f"{_f(st['verify'])} ({'-' if share is None else f'{100 * share:.0f} %'})",
                _f(st["accept"]),
                _f(st["commit"]),
                _f(c.round_ms),
                _f(c.host_ms),
                _f(c.syncs_per_round, ".1f"),
                str(c.rounds),
            ]
            lines.append("| " + " | ".join(cellv) + " |")
    return "\n".join(lines)


def baseline_table(batches: list[Batch]) -> str:
    head = [
        "R",
        "dspark plain step (ms)",
        "HF generate step (ms)",
        "HF cache",
        "plain tok/s",
        "HF tok/s",
        "peak MiB dspark / plain / HF",
        "greedy = target's",
    ]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for b in batches:
        p = b.plain.round_ms if b.plain else None
        cache = b.hf.cache + (f" ({b.hf.note})" if b.hf.note else "")
        mem = " / ".join(_f(m, ".0f") for m in (b.spec_run.peak_mb, b.plain_run.peak_mb, b.hf.peak_mb))
        ok = canary_cell(b.canary, b.spec_run.accepted_drafts)
        lines.append(
            f"| {b.R} | {_f(p)} | {_f(b.hf.step_ms)} | {cache} | {_f(b.R / p * 1e3 if p else None, '.1f')} | "
            f"{_f(b.R / b.hf.step_ms * 1e3 if b.hf.step_ms > 0 else None, '.1f')} | {mem} | {ok} |"
        )
    return "\n".join(lines)


def graphs_table(batches: list[Batch]) -> str | None:
    """Round (plain: step) time eager vs replayed from CUDA graphs, per R and l; None without graph runs."""
    if not any(b.graphs for b in batches):
        return None
    head = ["R", "l", "eager round ms", "graphs round ms", "eager / graphs", "verify eager / graphs ms"]
    head += [
        "draft eager / graphs ms",
        "commit eager / graphs ms",
        "captures (target + drafter block / heads / context)",
        "graph pool MiB",
    ]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for b in batches:
        g = b.graphs
        if g is None:
            continue
        pairs = [(b.spec.get(n), c, g.spec_run) for n, c in g.spec.items()]
        pairs.append((b.plain, g.plain, g.plain_run))
        for eager, graphed, run in pairs:
            if eager is None or graphed is None:
                continue
            stats = run.graphs or {}
            parts = [stats.get(k) or {} for k in ("drafter", "drafter_heads", "drafter_context")]
            ratio = eager.round_ms / graphed.round_ms if graphed.round_ms > 0 else None
            label = "plain" if run is g.plain_run else str(graphed.verify_len)
            draft = (
                "-" if run is g.plain_run else f"{_f(eager.stages['draft'])} / {_f(graphed.stages['draft'])}"
            )
            commit = f"{_f(eager.stages['commit'])} / {_f(graphed.stages['commit'])}"
            captures = f"{stats.get('captures', '-')} + " + " / ".join(
                str(p.get("captures", 0)) for p in parts
            )
            pool = (stats.get("pool_mib") or 0) + sum(p.get("pool_mib") or 0 for p in parts)
            lines.append(
                f"| {b.R} | {label} | {_f(eager.round_ms)} | {_f(graphed.round_ms)} | {_f(ratio)}x | "
                f"{_f(eager.stages['verify'])} / {_f(graphed.stages['verify'])} | {draft} | {commit} | "
                f"{captures} | {_f(pool)} |"
            )
    return "\n".join(lines)


def cost_markdown(batches: list[Batch]) -> str:
    head = ["R", "l", "B = R·l", "verify ms", "drafter round ms", "round ms", "rounds / s"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for b in batches:
        for c in b.spec.values():
            d = sum(c.stages[s] for s in DRAFT_STAGES) + c.subs["append"]
            rate = 1e3 / c.round_ms if c.round_ms > 0 else None
            lines.append(
                f"| {b.R} | {c.verify_len} | {b.R * c.verify_len} | {_f(c.stages['verify'])} | {_f(d)} | {_f(c.round_ms)} | "
                f"{_f(rate, '.1f')} |"
            )
    return "\n".join(lines)


def projection_markdown(rows: list[dict], taus: list[float]) -> str:
    head = ["R", "l", "round ms", *(f"τ = {t:g}" for t in taus), "plain tok/s", "HF tok/s"]
    lines = [
        "Projected tokens/s = R·τ / round time (only τ ≤ l; a round of l rows commits at most l tokens), "
        "with × the engine's plain tokens/s",
        "",
        "| " + " | ".join(head) + " |",
        "|" + "---|" * len(head),
    ]
    for r in rows:
        tau_cells = []
        for t in taus:
            v, x = r["tokens_per_s"][str(t)], r["x_plain"][str(t)]
            tau_cells.append("-" if v is None else f"{v:.1f} ({_f(x)}×)")
        lines.append(
            f"| {r['R']} | {r['l']} | {_f(r['round_ms'])} | " + " | ".join(tau_cells) + " | "
            f"{_f(r['plain_tokens_per_s'], '.1f')} | {_f(r['hf_tokens_per_s'], '.1f')} |"
        )
    return "\n".join(lines)


def cost_metadata(device: Any, model: dict, context: int, rounds: int) -> dict:
    meta = describe_device(device)
    meta.update(
        target=model["name"],
        dtype=model["dtype"],
        context_length=context,
        source="bench_e2e_gpu: medians of timed DSpark rounds at fixed verify lengths, random weights",
        timed_rounds_per_point=rounds,
        drafter=model["drafter"],
    )
    return meta


def _clean(x: Any) -> Any:
    if isinstance(x, float) and (math.isnan(x) or math.isinf(x)):
        return None
    if isinstance(x, (list, tuple)):
        return [_clean(v) for v in x]
    if isinstance(x, dict):
        return {str(k): _clean(v) for k, v in x.items()}
    return x


def write_json(path: Path, payload: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(_clean(payload), indent=1, default=str) + "\n")


def sps_path(path: Path, key: str, several: bool) -> Path:
    """``--sps PATH``: PATH itself for one model; with several, the model's key before the suffix."""
    return path if not several else path.with_name(f"{path.stem}.{key}{path.suffix or '.json'}")
