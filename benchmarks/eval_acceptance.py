# SPDX-License-Identifier: Apache-2.0
"""Acceptance of one or more drafters on prompt sets: τ, per-position acceptance, verify length.

    python benchmarks/eval_acceptance.py --drafter dspark=PATH --drafter dflash=PATH \
        --prompts PROMPTS_DIR/mt-bench.jsonl PROMPTS_DIR/humaneval.jsonl \
        [--limit 40] [--temperatures 0 1] [--max-new-tokens 256] [--batch 8] [--planner full] [--seed S] \
        [--draft-vocab dspark=draft_vocab.json | dspark=none] [--lookup] [--json out.json] [--plot acceptance.png]

DeepSpec's protocol: the first user turn of each row, chat template, EOS ends a sequence, the prefill token is
not counted. τ is pooled over all rounds of a prompt set (micro average) and macro-averaged over the sets.
With the ``full`` planner every request verifies all γ drafts, so acceptance is uncensored. ``--lookup`` runs the
hybrid round (each request's block from the drafter or its lookup continuation, DESIGN §4) instead.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dspark import DSparkDecoder, DSparkDrafter  # noqa: E402
from dspark.decoding.inputs import chat_token_ids  # noqa: E402
from dspark.models.draft_vocab import draft_vocab_option  # noqa: E402
from dspark.models.loading import load_target  # noqa: E402
from dspark.prompts import read_prompt_file  # noqa: E402


def evaluate(
    target,
    tok,
    drafter,
    prompts: list[list[int]],
    *,
    temperature: float,
    max_new_tokens: int,
    batch: int,
    planner: str,
    sts=None,
    seed: int = 980406,
    lookup: bool = False,
    lookup_prior=None,
) -> dict:
    """One drafter on one prompt set at one temperature; returns τ, acceptance and timing."""
    dec = DSparkDecoder(
        target,
        drafter,
        planner=planner,
        max_batch_size=batch,
        tokenizer=tok,
        sts=sts,
        lookup=lookup,
        lookup_prior=lookup_prior,
    )
    try:
        t0 = time.perf_counter()
        out = dec.generate(prompts, max_new_tokens=max_new_tokens, temperature=temperature, seed=seed)
        wall = time.perf_counter() - t0
    finally:
        dec.close()
    st = out.stats
    return {
        "tau": st.tau,
        "rounds": st.request_rounds if hasattr(st, "request_rounds") else None,
        "accept_rate_at": st.accept_rate_at,
        "conditional_acceptance": st.conditional_acceptance,
        "mean_verify_len": st.mean_verify_len,
        "tokens": sum(len(s) for s in out.sequences),
        "seconds": wall,
    }


def print_table(
    results: dict, names: list[str], temperatures: list[float], sets: list[str], value, digits: int
):
    """A markdown table: one row per (drafter, T), ``value(result)`` per prompt set and their mean (macro)."""
    print("| drafter | T | " + " | ".join(sets) + " | macro |")
    print("|---|---|" + "---|" * (len(sets) + 1))
    for name in names:
        for T in temperatures:
            vals = [value(results[name][str(T)][s]) for s in sets]
            cells = " | ".join(f"{x:.{digits}f}" for x in vals)
            print(f"| {name} | {T} | {cells} | {sum(vals) / len(vals):.{digits}f} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default="smollm2")
    ap.add_argument("--drafter", action="append", required=True, help="NAME=PATH (repeatable)")
    ap.add_argument(
        "--sts",
        action="append",
        default=[],
        help="NAME=STS.json for a drafter (default: the folder's sts-greedy.json at T = 0, else its sts.json)",
    )
    ap.add_argument(
        "--draft-vocab",
        action="append",
        default=[],
        help="NAME=draft_vocab.json, or NAME=none for the whole vocabulary (default: the drafter folder's file)",
    )
    ap.add_argument("--prompts", nargs="+", type=Path, required=True)
    ap.add_argument("--limit", type=int, default=None, help="first N rows of each prompt file")
    ap.add_argument("--temperatures", nargs="+", type=float, default=[0.0, 1.0])
    ap.add_argument("--max-new-tokens", type=int, default=256)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--planner", default="full")
    ap.add_argument("--seed", type=int, default=980406, help="sampling seed of every run (T > 0)")
    ap.add_argument(
        "--drafter-dtype",
        default=None,
        choices=["float32", "bfloat16"],
        help="drafter dtype (default: the target's); bf16 drafts faster on CPUs with AMX",
    )
    ap.add_argument(
        "--lookup", action="store_true", help="hybrid rounds: lookup continuations as a draft source"
    )
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--plot", type=Path, default=None)
    args = ap.parse_args()
    target, tok = load_target(args.target)
    vocabs = dict(s.split("=", 1) for s in args.draft_vocab)
    drafters = {}
    for spec in args.drafter:
        name, _, path = spec.partition("=")
        drafters[name] = DSparkDrafter.from_pretrained(
            path,
            target=target,
            tokenizer=tok,
            dtype=args.drafter_dtype,
            draft_vocab=draft_vocab_option(vocabs.get(name, "auto")),
        )
    sts = dict(s.split("=", 1) for s in args.sts)
    folders = {name: Path(spec.partition("=")[2]) for name, spec in zip(drafters, args.drafter, strict=True)}

    def folder_file(name: str, *files: str) -> str | None:
        found = [folders[name] / f for f in files if (folders[name] / f).is_file()]
        return str(found[0]) if found else None

    sets = {
        p.stem: [chat_token_ids(tok, x.text) for x in read_prompt_file(p, limit=args.limit)]
        for p in args.prompts
    }
    results: dict = {}
    for name, d in drafters.items():
        for T in args.temperatures:
            for set_name, prompts in sets.items():
                r = evaluate(
                    target,
                    tok,
                    d,
                    prompts,
                    temperature=T,
                    max_new_tokens=args.max_new_tokens,
                    batch=args.batch,
                    planner=args.planner,
                    seed=args.seed,
                    sts=sts.get(name)
                    or folder_file(name, *(("sts-greedy.json",) if T == 0 else ()), "sts.json"),
                    lookup=args.lookup,
                    lookup_prior=folder_file(name, "lookup_prior.json") if args.lookup else None,
                )
                results.setdefault(name, {}).setdefault(str(T), {})[set_name] = r
                print(
                    f"{name:10s} T={T:<4} {set_name:12s} tau={r['tau']:.3f}  tokens={r['tokens']}  "
                    f"{r['seconds']:.0f}s",
                    flush=True,
                )
            per = results[name][str(T)]
            per["macro_tau"] = sum(per[s]["tau"] for s in sets) / len(sets)
    print(
        f"\n### τ ({args.planner} planner{', hybrid rounds' if args.lookup else ''}, {args.max_new_tokens} new "
        f"tokens, first {args.limit or 'all'} prompts per set)\n"
    )
    names = list(drafters)
    print_table(results, names, args.temperatures, list(sets), lambda r: r["tau"], 2)
    print("\nfirst-slot acceptance (accept_rate_at[0]):\n")
    print_table(results, names, args.temperatures, list(sets), lambda r: r["accept_rate_at"][0], 3)
    if len(names) >= 2:
        a, b = names[0], names[1]
        for T in args.temperatures:
            ra, rb = results[a][str(T)]["macro_tau"], results[b][str(T)]["macro_tau"]
            print(f"\nT={T}: {a} / {b} macro τ = {ra / rb:.3f}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(
            json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "results": results}, indent=2)
        )
    if args.plot:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, axes = plt.subplots(
            1, len(args.temperatures), figsize=(5 * len(args.temperatures), 3.6), squeeze=False
        )
        for ax, T in zip(axes[0], args.temperatures, strict=True):
            for name in names:
                for set_name in sets:
                    ca = results[name][str(T)][set_name]["conditional_acceptance"]
                    ax.plot(range(1, len(ca) + 1), ca, marker="o", label=f"{name} / {set_name}")
            ax.set_title(f"conditional acceptance, T = {T}")
            ax.set_xlabel("draft position")
            ax.set_ylim(0, 1)
            ax.grid(alpha=0.3)
        axes[0][0].set_ylabel("P(accept k | prefix accepted)")
        axes[0][-1].legend(fontsize=7)
        fig.tight_layout()
        args.plot.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(args.plot, dpi=120)


if __name__ == "__main__":
    main()
