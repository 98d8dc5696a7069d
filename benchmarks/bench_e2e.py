# SPDX-License-Identifier: Apache-2.0
"""End to end: plain decoding, HF prompt lookup and DSpark on the same prompts and target, as ratios.

Full run (the published table; SPS and STS come from the drafter's folder unless given; drop ``--dflash``
when there is no DFlash checkpoint, use ``--device cuda`` instead of ``--threads 2`` on a GPU):

    python benchmarks/bench_e2e.py --drafter bundled --dflash DFLASH_DIR \\
        --prompts ../shared/data/prompts/mt-bench.jsonl ../shared/data/prompts/humaneval.jsonl \\
        --n 20 --max-new-tokens 128 --batch 1 4 8 --temperatures 0 1.0 --threads 2 \\
        --json bench-results/e2e.json --plots bench-results/e2e

CI mode (2 prompts x 16 tokens, batch 1 and 2, planners full and early_stop, greedy; falls back to a random
drafter when none is bundled):

    python benchmarks/bench_e2e.py --quick

Methods, all on the same target, prompts (chat template applied to the first user turn) and token budget:

- ``HF generate``: Hugging Face ``generate`` with its DynamicCache, prompts in left-padded batches of ``--batch``
  with an explicit attention mask; the baseline of every ratio (at the same batch size).
- ``HF prompt lookup``: ``generate(prompt_lookup_num_tokens=10)``. HF runs it at batch size 1 only, so it runs
  prompt by prompt; at larger batch sizes its row says n/a.
- ``DSpark <planner>``: ``DSparkDecoder`` with ``--planners`` (default full, early_stop, lagged_topk), the
  drafter's STS temperatures and the SPS cost table (without a table the cost-driven planners verify every draft;
  the table says so).
- ``DFlash full`` (with ``--dflash``): a drafter without a confidence head, so every draft is verified.
- ``dspark plain (γ = 0)`` (``--plain``, on by default): the same engine without drafting (paged KV cache,
  ragged batches, ``rejection_sample`` picking the token). It separates what speculation gains from what the
  engine itself costs or saves against HF ``generate``: ``DSpark x`` over ``dspark plain`` is the speculative
  speedup alone.

With ``--ignore-eos`` (the default) EOS does not stop generation (``eos_token_id=[]`` for DSpark,
``eos_token_id=None`` for HF): every method produces exactly ``--max-new-tokens`` tokens per prompt, so tokens/s
compare equal work. Greedy runs check that every speculative method produced HF's tokens (a correctness canary).
With a random (untrained) drafter tau is about 1 and the ratio measures the round's overhead, not a speedup.
"""

from __future__ import annotations

import argparse
import functools
import json
import logging
import math
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import env_info  # noqa: E402
from dspark import DSparkDecoder, DSparkDrafter  # noqa: E402
from dspark.cli import load_target  # noqa: E402
from dspark.decoding.decoder import chat_token_ids  # noqa: E402
from dspark.decoding.stats import DSparkStats  # noqa: E402
from dspark.models.draft_vocab import (  # noqa: E402
    add_draft_vocab_argument,
    draft_vocab_option,
    resolve_draft_vocab,
)
from dspark.training.data import read_prompt_file  # noqa: E402

PROMPTS_DIR = Path(__file__).resolve().parents[2] / "shared" / "data" / "prompts"
DEFAULT_PROMPT_SETS = ("mt-bench", "humaneval")
FALLBACK_PROMPTS = [
    "Write a Python function that returns the n-th Fibonacci number.",
    "Explain in two sentences what a hash map is.",
    "Write a function that checks whether a string is a palindrome.",
    "List three uses of the binary search algorithm.",
]
HF = "HF generate"
PLAIN = "dspark plain (γ = 0)"
PROMPT_LOOKUP = "HF prompt lookup"
PROMPT_LOOKUP_TOKENS = 10
STAGES = ("draft", "plan", "verify", "accept", "commit")
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


def _clean(x: Any) -> Any:
    """NaN is not JSON: unobserved values become null."""
    if isinstance(x, float) and math.isnan(x):
        return None
    if isinstance(x, list):
        return [_clean(v) for v in x]
    if isinstance(x, dict):
        return {k: _clean(v) for k, v in x.items()}
    return x


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
) -> Run:
    """``DSparkDecoder.generate`` on all prompts, ``batch`` requests at a time (finished ones are replaced).

    ``speculative=False`` runs plain decoding through the same engine (no drafts; the row has no planner).
    """
    has_conf = drafter.confidence_head is not None
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

        if warmup:
            once(prompts[:batch], WARMUP_TOKENS)
        out, times = _timed(lambda: once(prompts, max_new_tokens), target.device, repeats)
        effective = dec.planner.effective_mode if has_conf else "full"
    finally:
        dec.close()
    if not speculative:  # plain decoding: no planner ran
        planner = effective = None
    return Run(method, batch, out.sequences, times, planner, effective, out.stats)


# ---------------------------------------------------------------------------------------------------- checks
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
    hf = {r.batch: r.tokens_per_second for r in case.runs if r.method == HF}
    for r in case.runs:
        if r.available and hf.get(r.batch):
            r.ratio = r.tokens_per_second / hf[r.batch]


# ---------------------------------------------------------------------------------------------------- output
def report(case: Case, header: str) -> str:
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


def _pooled(runs: list[Run]) -> DSparkStats | None:
    stats = [r.stats for r in runs if r.stats is not None]
    if not stats:
        return None
    total = DSparkStats(gamma=stats[0].gamma)
    for s in stats:
        total.merge(s)
    return total


def _wilson(successes: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """95% Wilson score interval of a binomial proportion (stays inside [0, 1], sane at 0 and n)."""
    p = successes / n
    d = 1 + z * z / n
    c = (p + z * z / (2 * n)) / d
    h = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / d
    return max(0.0, c - h), min(1.0, c + h)


def plots(cases: list[Case], out_dir: Path) -> list[Path]:
    """acceptance.png, verify_budget.png and speedup.png: one panel per (prompt set, temperature)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import ScalarFormatter

    out_dir.mkdir(parents=True, exist_ok=True)
    sets = list(dict.fromkeys(c.prompt_set for c in cases))
    temps = list(dict.fromkeys(c.temperature for c in cases))
    written = []

    def panels(title: str):
        # yields (case, axes) to draw on; the figure is saved once the caller's loop has drawn them all
        fig, axes = plt.subplots(
            len(sets), len(temps), figsize=(6 * len(temps), 4 * len(sets)), squeeze=False
        )
        fig.suptitle(title, fontsize="medium", wrap=True)
        for c in cases:
            ax = axes[sets.index(c.prompt_set)][temps.index(c.temperature)]
            ax.set_title(f"{c.prompt_set}, T = {c.temperature:g}", fontsize="medium")
            yield c, ax
        fig.tight_layout()
        path = out_dir / f"{title.split(':')[0]}.png"
        fig.savefig(path, dpi=120)
        plt.close(fig)
        written.append(path)

    def batch_axis(ax, runs: list[Run], ylabel: str) -> None:
        ax.set_xscale("log", base=2)
        ax.set_xticks(sorted({r.batch for r in runs}) or [1])
        ax.xaxis.set_major_formatter(ScalarFormatter())
        ax.set(xlabel="batch size", ylabel=ylabel)
        ax.legend(fontsize="small")

    # (1) conditional acceptance per draft position, pooled over batch sizes; the full planner is uncensored
    for c, ax in panels(
        "acceptance: P(accept draft k | drafts before k accepted), full planner, 95% Wilson intervals"
    ):
        dspark_runs = [r for r in c.runs if r.method.startswith("DSpark") and "whole vocab" not in r.method]
        full = [r for r in dspark_runs if r.planner == "full"]
        for label, runs in (
            (
                "DSpark" if full else "DSpark (other planners: fewer late positions verified)",
                full or dspark_runs,
            ),
            ("DFlash", [r for r in c.runs if r.method.startswith("DFlash")]),
        ):
            st = _pooled(runs)
            if st is not None and st.gamma:
                # late positions are reached rarely: 95% Wilson intervals and the counts keep that visible
                ks = [k for k in range(st.gamma) if st.reached[k]]
                p = [st.conditional_acceptance[k] for k in ks]
                ci = [_wilson(st.accepted_at[k], st.reached[k]) for k in ks]
                x = [k + 1 for k in ks]
                bars = ax.errorbar(
                    x,
                    p,
                    yerr=[
                        [pk - lo for pk, (lo, _) in zip(p, ci, strict=True)],
                        [hi - pk for pk, (_, hi) in zip(p, ci, strict=True)],
                    ],
                    marker="o",
                    capsize=3,
                    label=label,
                )
                for xk, pk, k in zip(x, p, ks, strict=True):
                    ax.annotate(
                        f"{st.reached[k]}",
                        (xk, pk),
                        textcoords="offset points",
                        xytext=(5, 4),
                        fontsize="x-small",
                        color=bars[0].get_color(),
                    )
                ax.set_xticks(range(1, st.gamma + 1))
                ax.set_xlim(0.5, st.gamma + 0.5)
        ax.set(
            xlabel="draft position k (numbers: drafts that reached k)",
            ylabel="conditional acceptance",
            ylim=(0, 1.02),
        )
        ax.legend(fontsize="small")

    # (2) drafts admitted to verification per round against batch size, per planner
    for c, ax in panels("verify_budget: drafts verified per round"):
        spec = [r for r in c.runs if r.stats is not None and r.planner is not None]
        if spec:  # what verifying everything costs: batch x gamma
            bs = sorted({r.batch for r in spec})
            ax.plot(bs, [b * spec[0].stats.gamma for b in bs], color="0.7", linestyle=":", label="batch × γ")
        for method in dict.fromkeys(r.method for r in spec):
            rs = sorted((r for r in spec if r.method == method), key=lambda r: r.batch)
            ax.plot([r.batch for r in rs], [r.stats.mean_budget for r in rs], marker="o", label=method)
        batch_axis(ax, spec, "drafts / round")

    # (3) tokens/s over HF generate's at the same batch size
    for c, ax in panels("speedup: tokens per second relative to HF generate at the same batch size"):
        done = [r for r in c.runs if r.method != HF and r.ratio is not None]
        ax.axhline(1.0, color="0.7", linestyle=":", label="HF generate")
        for method in dict.fromkeys(r.method for r in done):
            rs = sorted((r for r in done if r.method == method), key=lambda r: r.batch)
            ax.plot([r.batch for r in rs], [r.ratio for r in rs], marker="o", label=method)
        batch_axis(ax, done, "× HF generate")
    return written


# ---------------------------------------------------------------------------------------------------- setup
def read_prompt_sets(paths: list[Path] | None, n: int, quick: bool) -> list[tuple[str, list[str]]]:
    """``(name, first user turns)`` per prompt file; the shared evaluation sets (or built-in prompts) by default."""
    if paths:
        for p in paths:
            if not p.is_file():
                sys.exit(f"bench_e2e: prompt file {p} not found")
        return [(p.stem, [q.text for q in read_prompt_file(p, limit=n)]) for p in paths]
    names = DEFAULT_PROMPT_SETS[-1:] if quick else DEFAULT_PROMPT_SETS
    found = [PROMPTS_DIR / f"{s}.jsonl" for s in names if (PROMPTS_DIR / f"{s}.jsonl").is_file()]
    if found:
        return [(p.stem, [q.text for q in read_prompt_file(p, limit=n)]) for p in found]
    print(f"(no prompt files under {PROMPTS_DIR}: using {len(FALLBACK_PROMPTS)} built-in prompts)")
    return [("built-in", (FALLBACK_PROMPTS * n)[:n])]


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
        torch.manual_seed(0)
        drafter = DSparkDrafter.from_config(target, block_size=7, num_layers=1, markov_rank=64)
        return drafter, "random (untrained)", None, None
    path = Path(spec)
    drafter = DSparkDrafter.from_pretrained(path, target=target, tokenizer=tokenizer, dtype=dtype)
    sps = next((path / n for n in ("costs.json", "sps.json") if (path / n).is_file()), None)
    sts = path / "sts.json"
    return drafter, str(path), sps, sts if sts.is_file() else None


def _optional_path(value: str | None, default: Path | None) -> Path | None:
    if value is None:
        return default
    return None if value == "none" else Path(value)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default="smollm2", help="'smollm2', a .gguf file or a HF model folder")
    ap.add_argument(
        "--drafter", default="bundled", help="'bundled' (default), a checkpoint folder, or 'random'"
    )
    ap.add_argument(
        "--dflash", default=None, help="a DFlash checkpoint folder (or 'random') for the ablation"
    )
    ap.add_argument(
        "--sps", default=None, help="SPS / cost table JSON (default: the drafter folder's; 'none')"
    )
    ap.add_argument("--sts", default=None, help="STS JSON (default: the drafter folder's; 'none')")
    ap.add_argument(
        "--planners",
        nargs="+",
        default=["full", "early_stop", "lagged_topk"],
        choices=["full", "threshold", "early_stop", "lagged_topk"],
        help="DSpark planners to run",
    )
    ap.add_argument("--block-size", type=int, default=None, help="drafts per round (default: the drafter's)")
    add_draft_vocab_argument(ap)
    ap.add_argument(
        "--also-whole-vocab",
        action="store_true",
        help="also run each planner drafting from the whole vocabulary (when a draft vocabulary is in use)",
    )
    ap.add_argument(
        "--linear-max-rows",
        type=int,
        default=None,
        help="the engine's few-row fp32 CPU linears (TargetAdapter linear_max_rows; default: its own; 0: off)",
    )
    ap.add_argument(
        "--plain",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also run the dspark engine without drafts (γ = 0), to separate engine from speculation (default: on)",
    )
    ap.add_argument(
        "--prompts", type=Path, nargs="+", default=None, help="prompt sets ({'turns': [...]} JSONL)"
    )
    ap.add_argument("--n", type=int, default=8, help="prompts per set (the first n rows)")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 4, 8])
    ap.add_argument("--temperatures", type=float, nargs="+", default=[0.0, 1.0])
    ap.add_argument(
        "--ignore-eos",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="EOS does not stop generation, so every method makes max-new-tokens per prompt (default: on)",
    )
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--repeats", type=int, default=1, help="timed runs per method (the median is reported)")
    ap.add_argument("--no-warmup", dest="warmup", action="store_false", help="skip the short untimed runs")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    ap.add_argument(
        "--drafter-dtype",
        default="auto",
        choices=["auto", "float32", "bfloat16", "float16"],
        help="auto: bfloat16 on CPUs with AMX / AVX-512 BF16 (the demo's choice), else the target's",
    )
    ap.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (CPU)")
    ap.add_argument(
        "--quick", action="store_true", help="CI size: 2 prompts x 16 tokens, batch 1 2, T = 0, no warm-up"
    )
    ap.add_argument("--strict", action="store_true", help="exit with status 1 when a greedy canary fails")
    ap.add_argument("--json", type=Path, default=None, help="write every result here")
    ap.add_argument("--plots", type=Path, default=None, help="write the plots into this folder")
    args = ap.parse_args(argv)
    if args.quick:
        args.n, args.max_new_tokens, args.batch, args.temperatures = 2, 16, [1, 2], [0.0]
        args.warmup = False  # CI checks that every path runs; its timings are not read
        args.planners = [p for p in args.planners if p in ("full", "early_stop")] or ["full"]
    if min(args.batch) < 1 or args.n < 1 or args.max_new_tokens < 1:
        ap.error("--batch, --n and --max-new-tokens must be >= 1")
    if min(args.temperatures) < 0:
        ap.error("--temperatures must be >= 0")
    if args.device == "cuda" and not torch.cuda.is_available():
        print("no CUDA device: nothing to run on cuda", file=sys.stderr)
        sys.exit(0)
    return args


# ---------------------------------------------------------------------------------------------------- main


def _add(runs: list[Run], where: str, run: Run) -> None:
    """Append ``run``, printing one progress line to stderr: a full run takes tens of minutes on a CPU."""
    runs.append(run)
    if run.available:
        print(
            f"  [{where}, batch {run.batch}] {run.method}: {run.tokens_per_second:.1f} tok/s ({run.seconds:.1f} s)",
            file=sys.stderr,
            flush=True,
        )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    # the tables say which planner really ran; HF's per-call notices would drown them
    logging.getLogger("dspark.planner").setLevel(logging.ERROR)
    import transformers

    transformers.logging.set_verbosity_error()

    target, tok = load_target(args.target)
    target.to(device=args.device, dtype=getattr(torch, args.dtype))
    if args.drafter_dtype != "auto":
        ddtype = getattr(torch, args.drafter_dtype)
    elif args.device == "cpu":
        from dspark.demo import fast_drafter_dtype

        ddtype = fast_drafter_dtype(target.dtype)
    else:
        ddtype = target.dtype
    drafter, drafter_name, sps, sts = resolve_drafter(args.drafter, target, tok, args.quick, ddtype)
    vocab_option = draft_vocab_option(args.draft_vocab)
    if vocab_option is not True:  # resolve_drafter loaded the folder's own
        drafter.set_draft_vocab(resolve_draft_vocab(vocab_option, None, drafter.config.vocab_size))
    draft_vocab = drafter.draft_vocab
    sps, sts = _optional_path(args.sps, sps), _optional_path(args.sts, sts)
    dflash = None
    if args.dflash == "random":
        torch.manual_seed(0)
        dflash = DSparkDrafter.from_config(target, block_size=7, num_layers=1, markov_rank=0)
    elif args.dflash:
        dflash = DSparkDrafter.from_pretrained(args.dflash, target=target, tokenizer=tok, dtype=ddtype)

    pad_id = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    eos = target.generation_config.eos_token_id
    eos = tok.eos_token_id if eos is None else eos
    eos_ids = [] if args.ignore_eos else ([eos] if isinstance(eos, int) else list(eos))
    sets = [
        (name, [chat_token_ids(tok, t) for t in texts])
        for name, texts in read_prompt_sets(args.prompts, args.n, args.quick)
    ]

    setup = (
        f"{args.target} ({args.dtype}, {args.device}, {torch.get_num_threads()} threads), drafter {drafter_name} ({drafter.dtype}), "
        f"draft vocabulary {'whole' if draft_vocab is None else f'{draft_vocab.numel()} ids'}, "
        f"SPS {sps or 'none'}, STS {sts or 'none'}, few-row linears "
        f"{'default' if args.linear_max_rows is None else f'up to {args.linear_max_rows} rows'}"
    )
    eos_rule = "EOS ignored" if args.ignore_eos else "EOS stops"
    common = {
        "max_new_tokens": args.max_new_tokens,
        "eos_ids": eos_ids,
        "seed": args.seed,
        "repeats": args.repeats,
        "warmup": args.warmup,
    }
    cases, warnings = [], []
    with torch.no_grad():
        for set_name, prompts in sets:
            for temp in args.temperatures:
                runs: list[Run] = []
                where = f"{set_name}, T = {temp:g}"
                for b in args.batch:
                    _add(
                        runs,
                        where,
                        run_hf(target, prompts, batch=b, temperature=temp, pad_id=pad_id, **common),
                    )
                    if b == 1:
                        _add(
                            runs,
                            where,
                            run_prompt_lookup(target, prompts, temperature=temp, pad_id=pad_id, **common),
                        )
                    else:
                        _add(
                            runs,
                            where,
                            Run(
                                PROMPT_LOOKUP,
                                b,
                                [],
                                [],
                                available=False,
                                note="HF runs it at batch 1 only: see the batch-1 row",
                            ),
                        )
                    # the same target, batch size and sampling settings for every DSpark-engine row
                    engine = functools.partial(
                        run_dspark,
                        target,
                        tok,
                        batch=b,
                        temperature=temp,
                        linear_max_rows=args.linear_max_rows,
                        **common,
                    )
                    if args.plain:
                        _add(
                            runs,
                            where,
                            engine(drafter, prompts, method=PLAIN, planner="full", speculative=False),
                        )
                    planned = functools.partial(
                        engine, drafter, prompts, sps=sps, sts=sts, block_size=args.block_size
                    )
                    for planner in args.planners:
                        _add(runs, where, planned(method=f"DSpark {planner}", planner=planner))
                    for planner in args.planners if args.also_whole_vocab and draft_vocab is not None else []:
                        drafter.set_draft_vocab(None)
                        try:
                            run = planned(method=f"DSpark {planner}, whole vocab", planner=planner)
                        finally:
                            drafter.set_draft_vocab(draft_vocab)
                        _add(runs, where, run)
                    if dflash is not None:
                        _add(
                            runs,
                            where,
                            engine(
                                dflash,
                                prompts,
                                method="DFlash full",
                                planner="full",
                                block_size=args.block_size,
                            ),
                        )
                case = Case(set_name, temp, len(prompts), runs)
                fill_ratios(case)
                case_warnings = check_tokens(case) if temp == 0 else []
                cases.append(case)
                header = f"{setup}, {len(prompts)} prompts × {args.max_new_tokens} new tokens, {eos_rule}"
                print(report(case, header) + "\n")
                for w in case_warnings:
                    print(w + "\n")
                warnings += case_warnings
                sys.stdout.flush()

    if warnings:
        print(f"!!! {len(warnings)} CORRECTNESS WARNING(S): see above")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        payload = {
            "env": env_info(args.device),
            "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
            "drafter": {
                "name": drafter_name,
                "dtype": str(drafter.dtype).removeprefix("torch."),
                "sps": str(sps) if sps else None,
                "sts": str(sts) if sts else None,
                "draft_vocab": None if draft_vocab is None else int(draft_vocab.numel()),
            },
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
        args.json.write_text(json.dumps(_clean(payload), indent=2, default=str) + "\n")
        print(f"wrote {args.json}")
    if args.plots:
        for p in plots(cases, args.plots):
            print(f"wrote {p}")
    return 1 if warnings and args.strict else 0


if __name__ == "__main__":
    sys.exit(main())
