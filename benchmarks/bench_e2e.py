# SPDX-License-Identifier: Apache-2.0
"""End to end: plain decoding, HF prompt lookup and DSpark on the same prompts and target, as ratios.

Full run (the published table, on the MT-Bench and HumanEval prompt sets as ``{"turns": [...]}`` JSONL files
in PROMPTS_DIR; SPS and STS come from the drafter's folder unless given; drop ``--dflash`` when there is no
DFlash checkpoint, use ``--device cuda`` instead of ``--threads 2`` on a GPU):

    python benchmarks/bench_e2e.py --drafter bundled --dflash DFLASH_DIR \\
        --prompts PROMPTS_DIR/mt-bench.jsonl PROMPTS_DIR/humaneval.jsonl \\
        --n 20 --max-new-tokens 128 --batch 1 4 8 --temperatures 0 1.0 --threads 2 \\
        --json bench-results/e2e.json --plots bench-results/e2e

Without ``--prompts`` it runs the dozen short chat and code prompts in ``benchmarks/data/prompts_small.jsonl``.
CI mode (the first 2 of those x 16 tokens, batch 1 and 2, planners full and early_stop, greedy; falls back to a
random drafter when none is bundled):

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
- ``lookup (dspark engine)`` and ``hybrid (DSpark + lookup)`` (``--lookup``, on by default): lookup decoding
  through the dspark engine without a drafter, and hybrid rounds (the drafter and lookup drafts, the better
  block per request and round, docs/lookup.md), both with ``--lookup-planner`` (default early_stop), the SPS
  table and the drafter folder's ``lookup_prior.json`` when it has one; the lines under each table give their
  tokens/s over the engine without drafts, HF prompt lookup and DSpark alone.
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
import logging
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import env_info  # noqa: E402
from benchmarks.e2e.inputs import (  # noqa: E402
    optional_path,
    pad_token_id,
    read_prompt_sets,
    resolve_dflash,
    resolve_drafter,
)
from benchmarks.e2e.plots import plots  # noqa: E402
from benchmarks.e2e.report import (  # noqa: E402
    case_table,
    check_tokens,
    fill_ratios,
    lookup_lines,
    write_json,
)
from benchmarks.e2e.runners import Bench, run_case  # noqa: E402
from dspark.decoding.inputs import chat_token_ids  # noqa: E402
from dspark.models.draft_vocab import (  # noqa: E402
    add_draft_vocab_argument,
    draft_vocab_option,
    resolve_draft_vocab,
)
from dspark.models.loading import load_target  # noqa: E402


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line; ``--quick`` shrinks the sweep to CI size."""
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
        "--measure-costs",
        action="store_true",
        help="speculative rows correct the cost table with the round times they measure (DSparkDecoder "
        "measure_costs; CPU)",
    )
    ap.add_argument(
        "--plain",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also run the dspark engine without drafts (γ = 0), to separate engine from speculation (default: on)",
    )
    ap.add_argument(
        "--lookup",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also run lookup decoding (no drafter) and hybrid rounds (drafter + lookup) (default: on)",
    )
    ap.add_argument(
        "--lookup-planner",
        default="early_stop",
        choices=["full", "threshold", "early_stop", "lagged_topk"],
        help="planner of the lookup and hybrid rows",
    )
    ap.add_argument(
        "--lookup-prior",
        default=None,
        help="lookup acceptance prior JSON (default: the drafter folder's lookup_prior.json; 'none')",
    )
    ap.add_argument(
        "--prompts",
        type=Path,
        nargs="+",
        default=None,
        help="prompt sets ({'turns': [...]} JSONL; default: benchmarks/data/prompts_small.jsonl)",
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


def _drafter_dtype(choice: str, device: str, target_dtype: torch.dtype) -> torch.dtype:
    """``--drafter-dtype``: auto is bfloat16 on CPUs with fast bf16 matmuls, else the target's dtype."""
    if choice != "auto":
        return getattr(torch, choice)
    if device == "cpu":
        from dspark.demo import fast_drafter_dtype

        return fast_drafter_dtype(target_dtype)
    return target_dtype


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
    ddtype = _drafter_dtype(args.drafter_dtype, args.device, target.dtype)
    drafter, drafter_name, sps, sts = resolve_drafter(args.drafter, target, tok, args.quick, ddtype)
    vocab_option = draft_vocab_option(args.draft_vocab)
    if vocab_option is not True:  # resolve_drafter loaded the folder's own
        drafter.set_draft_vocab(resolve_draft_vocab(vocab_option, None, drafter.config.vocab_size))
    draft_vocab = drafter.draft_vocab
    sps, sts = optional_path(args.sps, sps), optional_path(args.sts, sts)
    folder_prior = Path(sts).parent / "lookup_prior.json" if sts is not None else None
    if folder_prior is not None and not folder_prior.exists():
        folder_prior = None
    lookup_prior = optional_path(args.lookup_prior, folder_prior)

    pad_id = pad_token_id(tok)
    eos = target.generation_config.eos_token_id
    eos = tok.eos_token_id if eos is None else eos
    eos_ids = [] if args.ignore_eos else ([eos] if isinstance(eos, int) else list(eos))
    sets = [
        (name, [chat_token_ids(tok, t) for t in texts])
        for name, texts in read_prompt_sets(args.prompts, args.n)
    ]
    bench = Bench(
        target,
        tok,
        drafter,
        pad_id=pad_id,
        eos_ids=eos_ids,
        max_new_tokens=args.max_new_tokens,
        batches=args.batch,
        planners=args.planners,
        dflash=resolve_dflash(args.dflash, target, tok, ddtype),
        sps=sps,
        sts=sts,
        block_size=args.block_size,
        plain=args.plain,
        lookup=args.lookup,
        lookup_planner=args.lookup_planner,
        lookup_prior=lookup_prior,
        also_whole_vocab=args.also_whole_vocab,
        linear_max_rows=args.linear_max_rows,
        measure_costs=args.measure_costs,
        seed=args.seed,
        repeats=args.repeats,
        warmup=args.warmup,
    )

    setup = (
        f"{args.target} ({args.dtype}, {args.device}, {torch.get_num_threads()} threads), drafter {drafter_name} ({drafter.dtype}), "
        f"draft vocabulary {'whole' if draft_vocab is None else f'{draft_vocab.numel()} ids'}, "
        f"SPS {sps or 'none'}, STS {sts or 'none'}, lookup prior {lookup_prior or 'none'}, few-row linears "
        f"{'default' if args.linear_max_rows is None else f'up to {args.linear_max_rows} rows'}"
        f"{', measured costs' if args.measure_costs else ''}"
    )
    eos_rule = "EOS ignored" if args.ignore_eos else "EOS stops"
    cases, warnings = [], []
    with torch.no_grad():
        for set_name, prompts in sets:
            for temp in args.temperatures:
                case = run_case(bench, set_name, prompts, temp)
                fill_ratios(case)
                case_warnings = check_tokens(case) if temp == 0 else []
                cases.append(case)
                header = f"{setup}, {len(prompts)} prompts × {args.max_new_tokens} new tokens, {eos_rule}"
                print(case_table(case, header) + "\n")
                for line in lookup_lines(case):
                    print(line)
                for w in case_warnings:
                    print(w + "\n")
                warnings += case_warnings
                sys.stdout.flush()

    if warnings:
        print(f"!!! {len(warnings)} CORRECTNESS WARNING(S): see above")
    if args.json:
        about_drafter = {
            "name": drafter_name,
            "dtype": str(drafter.dtype).removeprefix("torch."),
            "sps": str(sps) if sps else None,
            "sts": str(sts) if sts else None,
            "draft_vocab": None if draft_vocab is None else int(draft_vocab.numel()),
        }
        write_json(args.json, env_info(args.device), vars(args), about_drafter, cases, warnings)
        print(f"wrote {args.json}")
    if args.plots:
        for p in plots(cases, args.plots):
            print(f"wrote {p}")
    return 1 if warnings and args.strict else 0


if __name__ == "__main__":
    sys.exit(main())
