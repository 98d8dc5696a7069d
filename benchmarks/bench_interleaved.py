# SPDX-License-Identifier: Apache-2.0
"""Speculation against the engine without drafts, with the methods interleaved.

``bench_e2e.py`` runs each method's repeats back to back; on a shared host whose speed drifts by tens of
percent within minutes, two methods then meet different machines. Here every repeat runs every method once
(in an order rotated per repeat), and each method's ratio to the engine is taken within its repeat: drift
slows both sides of a ratio alike. Reported per method: median tokens/s, the median, minimum and maximum of
its per-repeat ratio to ``engine``, τ and verify length. Greedy runs also check every method's tokens against
the engine's.

    python benchmarks/bench_interleaved.py --prompts PROMPTS/humaneval.jsonl PROMPTS/mt-bench.jsonl \\
        --n 8 --max-new-tokens 128 --batch 8 --temperature 0 --repeats 5 --threads 2

``--skip K`` starts each set at row K (past rows a drafter was trained or calibrated on) and
``--min-prompt-tokens N`` keeps only prompts of at least N tokens (long inputs, where lookup copies most).

Methods (``--methods``): ``engine`` (no drafts), ``dspark`` (the drafter, ``early_stop``), ``lookup`` (lookup
decoding), ``hybrid`` (drafter + lookup), and the two Hugging Face baselines ``hf`` (``generate``, left-padded
batches) and ``hf_lookup`` (``generate(prompt_lookup_num_tokens=10)``, batch 1 only: HF refuses more).
Suffixes of the dspark methods: ``+measured`` adds ``measure_costs=True``; ``+always`` runs the drafter in
every round (the rule of docs/lookup.md "Whether the drafter runs" switched off, for an A/B of it); ``+local``
plans with this machine's cost table (``dspark.profiling.local_cost_table``: cached, or profiled before the
first repeat) instead of ``--costs``; ``+w<N>`` caps lookup proposals at ``N`` tokens
(``LookupConfig(max_tokens=N)``; default 16 for hybrid, 8 for lookup); ``+noextent`` classes lookup acceptance
by match length alone (``LookupConfig(extent_bounds=())``: the prior's extent classes pooled); ``+corpus`` also
drafts from the run's earlier answers (``LookupConfig(corpus_tokens=DEFAULT_CORPUS_TOKENS)``; emptied before
each timed run); ``+throughput`` plans every round for throughput (``finish_together=False``: docs/decoder.md
"When no prompt waits"). The drafter is the bundled one (its cost table, STS and lookup prior).
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
from pathlib import Path
from unittest import mock

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import dspark.decoding.round as round_module  # noqa: E402
from benchmarks.common import cpu_description  # noqa: E402
from benchmarks.e2e.inputs import pad_token_id, read_prompt_sets, resolve_drafter  # noqa: E402
from benchmarks.e2e.runners import run_dspark, run_hf, run_prompt_lookup  # noqa: E402
from dspark.decoding.inputs import chat_token_ids  # noqa: E402
from dspark.decoding.lookup import LookupConfig  # noqa: E402
from dspark.decoding.lookup_corpus import DEFAULT_CORPUS_TOKENS  # noqa: E402
from dspark.demo import fast_drafter_dtype  # noqa: E402
from dspark.models.loading import load_target  # noqa: E402

METHODS = ("engine", "dspark", "lookup", "hybrid")
HF_METHODS = ("hf", "hf_lookup")  # Hugging Face transformers' own decoding; no method options


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompts", type=Path, nargs="+", default=None, help="prompt sets (JSONL)")
    ap.add_argument("--n", type=int, default=8, help="prompts per set")
    ap.add_argument("--skip", type=int, default=0, help="first row of each set (rows before it are not read)")
    ap.add_argument(
        "--min-prompt-tokens",
        type=int,
        default=0,
        help="only prompts of at least this many tokens (chat template applied): the first --n of them",
    )
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument(
        "--methods",
        nargs="+",
        default=list(METHODS),
        help="engine dspark lookup hybrid [+measured] [+always] [+local] [+noextent] [+corpus] [+throughput] "
        "[+w<N>], hf, hf_lookup",
    )
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument(
        "--costs",
        type=Path,
        default=None,
        help="the planner's cost table (costs.json of `dspark profile`); default: the bundled drafter's",
    )
    ap.add_argument(
        "--drafter-dtype",
        choices=["float32", "bfloat16"],
        default=None,
        help="the drafter's dtype (default: dspark.demo.fast_drafter_dtype)",
    )
    ap.add_argument(
        "--quick",
        action="store_true",
        help="CI size: 2 prompts x 8 tokens, batch 2 (1 with hf_lookup), 1 repeat",
    )
    args = ap.parse_args(argv)
    for m in args.methods:
        if m in HF_METHODS:
            continue
        options = {o for o in m.split("+")[1:] if not _width_option(o)}
        if m.split("+")[0] not in METHODS or not options <= {
            "measured",
            "always",
            "local",
            "noextent",
            "corpus",
            "throughput",
        }:
            ap.error(
                f"--methods: {m!r} is not one of {METHODS} (optionally with +measured / +always / +local / "
                "+noextent / +corpus / +throughput / +w<N>, N >= 1)"
            )
    if "engine" not in args.methods:
        args.methods.insert(0, "engine")  # every ratio is to it
    if args.quick:
        args.n, args.max_new_tokens, args.repeats = 2, 8, 1
        args.batch = 1 if "hf_lookup" in args.methods else 2  # HF prompt lookup: batch 1 only
    if min(args.n, args.max_new_tokens, args.batch, args.repeats) < 1:
        ap.error("--n, --max-new-tokens, --batch and --repeats must be >= 1")
    if min(args.skip, args.min_prompt_tokens) < 0:
        ap.error("--skip and --min-prompt-tokens must be >= 0")
    if "hf_lookup" in args.methods and args.batch != 1:
        ap.error(f"--methods hf_lookup: HF prompt lookup runs at batch 1 only, got --batch {args.batch}")
    return args


def _width_option(option: str) -> int | None:
    """N of a ``w<N>`` method option (N >= 1), else None."""
    n = option[1:]
    return int(n) if option.startswith("w") and n.isdigit() and int(n) >= 1 else None


def run_method(name: str, bench: dict, prompts: list[list[int]], args: argparse.Namespace):
    """One timed run (after a short warm-up) of method ``name`` on ``prompts``."""
    if name in HF_METHODS:
        common = {
            "temperature": args.temperature,
            "max_new_tokens": args.max_new_tokens,
            "pad_id": bench["pad_id"],
            "eos_ids": [],
        }
        if name == "hf":
            return run_hf(bench["target"], prompts, batch=args.batch, **common)
        return run_prompt_lookup(bench["target"], prompts, **common)
    base, options = name.split("+")[0], set(name.split("+")[1:])
    drafter = bench["drafter"] if base in ("dspark", "hybrid") else None
    widths = [w for w in map(_width_option, options) if w is not None]
    config = {"max_tokens": widths[-1]} if widths else {}
    if "noextent" in options:
        config["extent_bounds"] = ()
    if "corpus" in options:
        config["corpus_tokens"] = DEFAULT_CORPUS_TOKENS
    lookup = base in ("lookup", "hybrid") and LookupConfig(**config)
    with contextlib.ExitStack() as stack:
        if "always" in options:  # the drafter runs whatever it is predicted to return
            stack.enter_context(mock.patch.object(round_module, "drafter_pays", lambda *a, **k: True))
        return run_dspark(
            bench["target"],
            bench["tokenizer"],
            drafter,
            prompts,
            method=name,
            planner="full" if base == "engine" else "early_stop",
            batch=args.batch,
            temperature=args.temperature,
            max_new_tokens=args.max_new_tokens,
            eos_ids=[],
            sps=None if base == "engine" else bench["local_sps" if "local" in options else "sps"],
            sts=bench["sts"],
            lookup=lookup,
            lookup_prior=bench["prior"] if lookup else None,
            measure_costs="measured" in options,
            finish_together="throughput" not in options,
        )


def summary(runs: dict[str, list], methods: list[str]) -> list[str]:
    """One markdown row per method: median tok/s, per-repeat ratio to the engine (median [min, max]), τ."""
    engine = runs["engine"]
    lines = [
        "| method | tok/s (median) | × engine, median [min, max] | τ | verify len |",
        "|---|---|---|---|---|",
    ]
    for m in methods:
        tps = [r.tokens_per_second for r in runs[m]]
        ratios = [r.tokens_per_second / e.tokens_per_second for r, e in zip(runs[m], engine, strict=True)]
        stats = runs[m][-1].stats
        # HF's runs keep no round stats: "—"; the engine's rounds verify their anchor alone
        tau = "—" if stats is None else f"{stats.tau:.2f}" if stats.rounds else "1.00"
        vlen = "—" if stats is None else f"{stats.mean_verify_len:.2f}" if stats.rounds else "1.00"
        lines.append(
            f"| {m} | {statistics.median(tps):.1f} | {statistics.median(ratios):.2f}× "
            f"[{min(ratios):.2f}, {max(ratios):.2f}] | {tau} | {vlen} |"
        )
    return lines


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    import transformers

    transformers.logging.set_verbosity_error()
    target, tok = load_target("smollm2")
    dtype = getattr(torch, args.drafter_dtype) if args.drafter_dtype else fast_drafter_dtype(target.dtype)
    drafter, name, sps, sts = resolve_drafter("bundled", target, tok, args.quick, dtype)
    sps = args.costs or sps
    prior = Path(sts).parent / "lookup_prior.json" if sts is not None else None
    bench = {
        "target": target,
        "tokenizer": tok,
        "drafter": drafter,
        "sps": sps,
        "sts": sts,
        "prior": prior if prior is not None and prior.exists() else None,
        "pad_id": pad_token_id(tok),
    }
    if any("local" in m.split("+")[1:] for m in args.methods):
        from dspark.profiling.local import local_cost_table

        bench["local_sps"] = local_cost_table(target, drafter)
    cpu = cpu_description()
    print(
        f"CPU: {cpu['model']} ({' '.join(cpu['flags'])}), torch {torch.__version__}, {torch.get_num_threads()} threads"
    )
    print(
        f"drafter {name} ({drafter.dtype}), cost table {sps}"
        + (f" (+local: {bench['local_sps'].metadata['cache_path']})" if "local_sps" in bench else "")
        + f", batch {args.batch}, T = {args.temperature:g}, "
        f"{args.repeats} repeats"
    )
    failed = False
    for set_name, texts in read_prompt_sets(
        args.prompts, None if args.min_prompt_tokens else args.n, args.skip
    ):
        prompts = [chat_token_ids(tok, t) for t in texts]
        prompts = [p for p in prompts if len(p) >= args.min_prompt_tokens][: args.n]
        if not prompts:
            print(
                f"\n### {set_name}: no prompt of at least {args.min_prompt_tokens} tokens from row {args.skip}"
            )
            continue
        runs: dict[str, list] = {m: [] for m in args.methods}
        for rep in range(args.repeats):
            k = rep % len(args.methods)
            for m in args.methods[k:] + args.methods[:k]:  # rotated: no method always runs first
                run = run_method(m, bench, prompts, args)
                runs[m].append(run)
                print(
                    f"  [{set_name}, repeat {rep + 1}] {m}: {run.tokens_per_second:.1f} tok/s",
                    file=sys.stderr,
                )
        lengths = sorted(len(p) for p in prompts)
        print(
            f"\n### {set_name}: {len(prompts)} prompts ({lengths[0]}–{lengths[-1]} tokens) × "
            f"{args.max_new_tokens} new tokens, EOS ignored\n"
        )
        print("\n".join(summary(runs, args.methods)))
        if args.temperature == 0:
            want = runs["engine"][0].sequences
            bad = [m for m in args.methods if any(r.sequences != want for r in runs[m])]
            if bad:
                failed = True
                print(f"\nGREEDY CANARY FAILED: {bad} differ from the engine's tokens")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
