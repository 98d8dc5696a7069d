# SPDX-License-Identifier: Apache-2.0
"""The ``dspark`` command line: ``dspark info``, ``dspark demo``, ``dspark generate`` and ``dspark convert``."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

from dspark.models import loading
from dspark.models.draft_vocab import add_draft_vocab_argument, draft_vocab_option


def _info(_: argparse.Namespace) -> int:
    import dspark

    print(json.dumps(dspark.build_info(), indent=2))
    return 0


def _demo(args: argparse.Namespace) -> int:
    """SmolLM2-135M-Instruct with the bundled drafter: answers, then plain decoding vs DSpark."""
    from dspark.demo import DEMO_PROMPTS, run_demo

    run_demo(
        args.prompt or DEMO_PROMPTS,
        max_new_tokens=args.max_new_tokens,
        planner=args.planner,
        dtype=getattr(torch, args.dtype),
        drafter_dtype=None if args.drafter_dtype == "auto" else getattr(torch, args.drafter_dtype),
        costs=args.costs,
    )
    return 0


def _tour(args: argparse.Namespace) -> int:
    """A short tour of the planner ops on synthetic drafter outputs: confidence -> survival -> verify plan."""
    import dspark
    from dspark import Planner, SpsTable

    info = dspark.build_info()
    cuda = "CUDA kernels for " + ", ".join(info["cuda_archs"]) if info["cuda"] else "CPU kernels only"
    print(f"dspark {info['version']} (built against torch {info['torch_version']}; {cuda})")
    g = torch.Generator().manual_seed(args.seed)
    R, gamma, H, r = args.requests, args.gamma, 64, 8
    hidden = torch.randn(R, gamma, H, generator=g)
    prev_emb = torch.randn(R, gamma, r, generator=g)
    weight = torch.randn(H + r, generator=g) * 0.3
    # request-specific offsets so some requests look easy to draft and others hard
    bias = torch.tensor(1.5)
    hidden += torch.linspace(2.0, -2.0, R).view(R, 1, 1) * weight[:H] / weight[:H].norm() ** 2
    _, conf, surv = dspark.ops.confidence(hidden, prev_emb, weight, bias, torch.ones(gamma))
    # a cost curve shaped like a small model on a CPU: 8 tokens cost ~2 decode steps
    table = SpsTable((1, 2, 4, 8, 16, 32, 64, 128), (25.0, 24.0, 16.0, 13.0, 12.0, 9.0, 6.0, 3.5), 128)
    print(f"\n{R} requests, gamma = {gamma}; survival a[r, j] = prod c (rows: requests):")
    for i in range(R):
        print(f"  r{i:<2d} " + " ".join(f"{x:5.2f}" for x in surv[i].tolist()))
    print("\nverify lengths (anchor + admitted drafts) per planner mode, with the SPS table above:")
    lagged = surv.roll(1, dims=0)  # stands in for the previous round's survival
    for mode in ("full", "threshold", "early_stop", "lagged_topk"):
        p = Planner(mode, table, threshold=0.6)
        if mode == "lagged_topk":
            p.plan(lagged)
        res = p.plan(surv)
        vl = res.verify_len
        B = int(vl.sum())
        tau = R + sum(float(surv[i, : int(vl[i]) - 1].double().sum()) for i in range(R))
        print(
            f"  {mode:12s} {vl.tolist()}  B = {B:3d}  expected tokens/round = {tau:5.2f}  "
            f"expected tokens/s = {tau * table.steps_per_sec(B):6.1f}"
        )
    return 0


def _generate(args: argparse.Namespace) -> int:
    from dspark import DSparkDecoder, DSparkDrafter
    from dspark.decoding.lookup import LookupConfig

    if args.drafter is None and not args.lookup:
        print("dspark generate: --drafter is required (or --lookup for lookup decoding)", file=sys.stderr)
        return 2
    if args.measure_costs and args.sps is None:
        print(
            "dspark generate: --measure-costs needs --sps COSTS.json (a dspark cost table)", file=sys.stderr
        )
        return 2
    # checked before the target loads (minutes for a large model)
    try:
        lookup = (
            LookupConfig(args.min_match, args.max_match, args.lookup_tokens, corpus_tokens=args.lookup_corpus)
            if args.lookup
            else False
        )
    except ValueError as e:  # the config names the field; say which flag sets it
        flags = {
            "min_match": "--min-match",
            "max_match": "--max-match",
            "max_tokens": "--lookup-tokens",
            "corpus_tokens": "--lookup-corpus",
        }
        field = str(e).split(":")[0]
        print(
            f"dspark generate: {flags.get(field, field)} ({field}): {str(e).split(': ', 1)[-1]}",
            file=sys.stderr,
        )
        return 2
    prior = args.lookup_prior
    if prior is None and args.lookup and args.drafter not in (None, "none", "random"):
        folder_prior = Path(args.drafter) / "lookup_prior.json"
        prior = str(folder_prior) if folder_prior.is_file() else None
    target, tok = loading.load_target(args.target)  # looked up per call (tests replace it)
    if args.drafter in (None, "none"):
        drafter = None
    elif args.drafter == "random":
        drafter = DSparkDrafter.from_config(
            target, block_size=args.block_size or 7, num_layers=1, markov_rank=64
        )
    else:
        drafter = DSparkDrafter.from_pretrained(
            args.drafter, target=target, tokenizer=tok, draft_vocab=draft_vocab_option(args.draft_vocab)
        )
    sps = args.sps
    if sps == "auto":  # this machine's table: cached, or profiled now (about a minute for a small model)
        from dspark.profiling.local import local_cost_table

        sps = local_cost_table(target, drafter)
        print(f"cost table: {sps.metadata['cache_path']}", file=sys.stderr)
    dec = DSparkDecoder(
        target,
        drafter,
        planner=args.planner,
        sps_table=sps,
        sts=args.sts,
        block_size=args.block_size,
        tokenizer=tok,
        lookup=lookup,
        lookup_prior=prior,
        measure_costs=args.measure_costs,
    )
    try:
        for ev in dec.generate(
            args.prompt,
            max_new_tokens=args.max_new_tokens,
            temperature=args.temperature,
            top_k=args.top_k,
            top_p=args.top_p,
            seed=args.seed,
            stream=True,
            speculative=not args.no_speculation,
        ):
            print(ev.text or "", end="", flush=True)
        print()
        print("\n" + dec.stats.summary(), file=sys.stderr)
    finally:
        dec.close()
    return 0


def _convert(args: argparse.Namespace) -> int:
    """Convert a drafter checkpoint folder between packagings (docs/file-formats.md)."""
    from dspark.models.packagings import convert
    from dspark.models.packagings.sglang import VERSION, serving_notes

    try:
        written = convert(args.src, args.dst, args.format, force=args.force, verifier=args.verifier)
    except (ValueError, FileExistsError, FileNotFoundError) as e:
        print(f"dspark convert: {e}", file=sys.stderr)
        return 2
    print(f"dspark convert: {args.src} ({written.source}) -> {args.dst} ({args.format})")
    for note in serving_notes(written, args.format):  # the checkpoint as read: no second read of dst
        print(f"dspark convert: note (SGLang {VERSION}): {note}", file=sys.stderr)
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="dspark", description=__doc__)
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("info", help="print how the extension was built").set_defaults(fn=_info)
    d = sub.add_parser("demo", help="SmolLM2-135M + the bundled drafter: plain decoding vs DSpark")
    d.add_argument(
        "--prompt", action="append", default=None, help="a prompt (repeatable); default: 3 built in"
    )
    d.add_argument("--max-new-tokens", type=int, default=128)
    d.add_argument(
        "--planner", default="early_stop", choices=["full", "threshold", "early_stop", "lagged_topk"]
    )
    d.add_argument(
        "--dtype",
        default="float32",
        choices=["float32", "bfloat16"],
        help="target dtype (bfloat16: faster on CPUs with AMX, but greedy texts can part at near-ties)",
    )
    d.add_argument(
        "--drafter-dtype",
        default="auto",
        choices=["auto", "float32", "bfloat16"],
        help="auto: bfloat16 on CPUs with AMX / AVX-512 BF16, else the target's (exactness holds either way)",
    )
    d.add_argument(
        "--costs",
        default="bundled",
        choices=["bundled", "auto"],
        help="the planner's cost table: the bundled drafter's, or auto: this machine's (profiled once, about "
        "a minute, and cached)",
    )
    d.set_defaults(fn=_demo)
    o = sub.add_parser("tour", help="a tour of the planner ops on synthetic drafter outputs")
    o.add_argument("--requests", type=int, default=6)
    o.add_argument("--gamma", type=int, default=7)
    o.add_argument("--seed", type=int, default=0)
    o.set_defaults(fn=_tour)
    g = sub.add_parser("generate", help="generate text with DSpark speculative decoding (streams the text)")
    g.add_argument("--target", required=True, help="'smollm2', a .gguf file or a Hugging Face model folder")
    g.add_argument(
        "--drafter",
        default=None,
        help="a DSpark checkpoint folder, 'random' (overhead tests) or 'none' (with --lookup: lookup decoding)",
    )
    g.add_argument("--prompt", required=True, help="the user message (the chat template is applied)")
    g.add_argument("--max-new-tokens", type=int, default=256)
    g.add_argument("--temperature", type=float, default=0.0)
    g.add_argument("--top-k", type=int, default=None)
    g.add_argument("--top-p", type=float, default=None)
    g.add_argument("--seed", type=int, default=0)
    g.add_argument(
        "--planner", default="early_stop", choices=["full", "threshold", "early_stop", "lagged_topk"]
    )
    g.add_argument(
        "--sps",
        default=None,
        help="cost table: dspark profile's costs.json, SGLang's 1-D SPS JSON, or 'auto' (this machine's, "
        "profiled once and cached: docs/profiling.md)",
    )
    g.add_argument(
        "--measure-costs",
        action="store_true",
        help="correct the --sps cost table with the round times measured while generating (CPU)",
    )
    g.add_argument(
        "--sts", default=None, help="STS JSON of the confidence head (dspark calibrate's or SGLang's)"
    )
    g.add_argument("--block-size", type=int, default=None)
    add_draft_vocab_argument(g)
    g.add_argument("--no-speculation", action="store_true", help="plain decoding through the same engine")
    g.add_argument(
        "--lookup",
        action="store_true",
        help="also draft by lookup in the prompt and answer (hybrid rounds; without a drafter, lookup decoding)",
    )
    g.add_argument("--min-match", type=int, default=2, help="--lookup: shortest suffix that may match")
    g.add_argument("--max-match", type=int, default=4, help="--lookup: longest suffix, tried first")
    g.add_argument(
        "--lookup-tokens",
        type=int,
        default=None,
        help="--lookup: most tokens a lookup block holds (default 16 with a drafter, never fewer than its "
        "block; 8 for lookup decoding alone)",
    )
    g.add_argument(
        "--lookup-corpus",
        type=int,
        default=0,
        metavar="TOKENS",
        help="--lookup: also draft from earlier answers of this run, keeping up to TOKENS tokens of them "
        "(e.g. 262144, about 90 MB; default 0: off)",
    )
    g.add_argument(
        "--lookup-prior",
        default=None,
        help="--lookup: lookup_prior.json (default: the drafter folder's, when it has one)",
    )
    g.set_defaults(fn=_generate)
    c = sub.add_parser("convert", help="convert a drafter checkpoint between packagings")
    c.add_argument("src", help="drafter folder: deepspec, speculators, specforge or dflash (detected)")
    c.add_argument("dst", help="output folder (new or empty unless --force)")
    c.add_argument("--format", required=True, choices=["deepspec", "speculators", "specforge"])
    c.add_argument("--force", action="store_true", help="replace a non-empty output folder")
    c.add_argument("--verifier", default=None, help="speculators: the target's name or path")
    c.set_defaults(fn=_convert)
    from dspark.training.cli import add_train_parser

    add_train_parser(sub)
    from dspark.calibration.cli import add_calibrate_parser

    add_calibrate_parser(sub)
    from dspark.profiling.command import add_profile_parser

    add_profile_parser(sub)
    args = ap.parse_args(argv)
    return args.fn(args)


if __name__ == "__main__":
    sys.exit(main())
