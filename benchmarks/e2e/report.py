# SPDX-License-Identifier: Apache-2.0
"""bench_e2e's results: ratios to HF generate, the greedy correctness canary, markdown tables and JSON."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from benchmarks.e2e.runners import HF, HYBRID, LOOKUP, PLAIN, PROMPT_LOOKUP, STAGES, Case


def check_tokens(case: Case) -> list[str]:
    """Greedy: every speculative method must reproduce HF generate's tokens; returns warning lines.

    A sequence counts as matching when it equals HF's at the same batch size or at batch 1 (padding alone can
    flip a near-tie in HF's batched forward).
    """
    hf = {r.batch: r.sequences for r in case.runs if r.method == HF}
    warnings = []
    for r in case.runs:
        if r.method == HF or not r.available:
            continue
        refs = [hf[b] for b in (r.batch, 1) if b in hf]
        if not refs:
            continue
        bad = []
        for i, seq in enumerate(r.sequences):
            if all(seq != ref[i] for ref in refs):
                ref = refs[0][i]
                pos = next((k for k, (a, b) in enumerate(zip(seq, ref, strict=False)) if a != b), None)
                pos = min(len(seq), len(ref)) if pos is None else pos
                bad.append(f"prompt {i} differs from token {pos}")
        r.matches_hf = not bad
        if bad:
            r.mismatch = f"{len(bad)}/{len(r.sequences)} sequences differ ({'; '.join(bad[:3])})"
            warnings.append(
                f"!!! CORRECTNESS WARNING: {case.prompt_set}, T = 0, {r.method} at batch {r.batch} did not "
                f"reproduce HF generate's greedy tokens: {r.mismatch}"
            )
    return warnings


def fill_ratios(case: Case) -> None:
    """Set every run's tokens/s over HF generate's at the same batch size."""
    hf = {r.batch: r.tokens_per_second for r in case.runs if r.method == HF}
    for r in case.runs:
        if r.available and hf.get(r.batch):
            r.ratio = r.tokens_per_second / hf[r.batch]


def case_table(case: Case, header: str) -> str:
    """The markdown table of one (prompt set, temperature)."""
    lines = [
        f"### {case.prompt_set}, T = {case.temperature:g}: {header}",
        "",
        "| method | batch | tokens | tok/s | × HF | τ | verify len / budget | "
        + " / ".join(STAGES)
        + " (s) | tokens = HF |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in sorted(case.runs, key=lambda r: r.batch):
        name = r.method
        if r.planner is not None and r.effective_planner != r.planner:
            name += f" (ran {r.effective_planner}: no SPS table)"
        if not r.available:
            lines.append(f"| {name} ({r.note}) | {r.batch} | n/a | n/a | n/a | - | - | - | - |")
            continue
        if r.note:
            name += f" ({r.note})"
        st = r.stats
        tau = f"{st.tau:.2f}" if st else "-"
        vl = f"{st.mean_verify_len:.2f} / {st.mean_budget:.1f}" if st else "-"
        br = " / ".join(f"{st.seconds.get(k, 0.0):.2f}" for k in STAGES) if st else "-"
        ratio = f"{r.ratio:.2f}×" if r.ratio is not None else "-"
        same = {None: "-", True: "yes", False: f"**NO**: {r.mismatch}"}[r.matches_hf]
        lines.append(
            f"| {name} | {r.batch} | {r.tokens} | {r.tokens_per_second:.1f} | {ratio} | {tau} | {vl} | {br} "
            f"| {same} |"
        )
    return "\n".join(lines)


def lookup_lines(case: Case) -> list[str]:
    """The lookup methods against their baselines at each batch size (tokens/s ratios in one process, τ and
    the lookup's share of the hybrid's tokens); empty without lookup runs."""
    lines = []
    for b in sorted({r.batch for r in case.runs}):
        at = {r.method: r for r in case.runs if r.batch == b and r.available}
        hyb, look = at.get(HYBRID), at.get(LOOKUP)
        if hyb is None and look is None:
            continue
        pl = [r for r in case.runs if r.method == PROMPT_LOOKUP and r.batch == 1 and r.available]
        hf_pl = pl[0] if pl and b == 1 else None
        # DSpark alone with the hybrid's planner (else the first DSpark row)
        same = [r for m, r in at.items() if m.startswith("DSpark") and "whole" not in m]
        dspark = next((r for r in same if hyb and r.planner == hyb.planner), same[0] if same else None)

        def ratio(a, base):
            return f"{a.tokens_per_second / base.tokens_per_second:.2f}×" if a and base else "n/a"

        share = hyb.stats.sources.get("lookup", {}).get("token_share", 0.0) if hyb and hyb.stats else 0.0
        lines.append(
            f"- batch {b}: hybrid {ratio(hyb, at.get(PLAIN))} the engine without drafts, "
            f"{ratio(hyb, hf_pl)} HF prompt lookup, {ratio(hyb, dspark)} DSpark alone; lookup alone "
            f"{ratio(look, hf_pl)} HF prompt lookup, {ratio(look, at.get(PLAIN))} the engine; τ hybrid "
            f"{hyb.stats.tau if hyb else float('nan'):.2f} (lookup {100 * share:.0f}% of its tokens), DSpark "
            f"{dspark.stats.tau if dspark else float('nan'):.2f}, lookup {look.stats.tau if look else float('nan'):.2f}"
        )
    return lines


def _clean(x: Any) -> Any:
    """NaN is not JSON: unobserved values become null."""
    if isinstance(x, float) and math.isnan(x):
        return None
    if isinstance(x, list):
        return [_clean(v) for v in x]
    if isinstance(x, dict):
        return {k: _clean(v) for k, v in x.items()}
    return x


def write_json(
    path: Path, env: dict, args: dict, drafter: dict, cases: list[Case], warnings: list[str]
) -> None:
    """Every run of every case, with the environment, the arguments and the drafter's description."""
    payload = {
        "env": env,
        "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in args.items()},
        "drafter": drafter,
        "cases": [
            {
                "prompt_set": c.prompt_set,
                "temperature": c.temperature,
                "num_prompts": c.num_prompts,
                "runs": [r.to_dict() for r in c.runs],
            }
            for c in cases
        ],
        "warnings": warnings,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(_clean(payload), indent=2, default=str) + "\n")
