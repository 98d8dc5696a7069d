# SPDX-License-Identifier: Apache-2.0
"""``dspark profile``: load the models, run :func:`profile_costs`, write the tables and the plot."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

import torch

from dspark.decoding.tables import CostTable
from dspark.models import loading
from dspark.models.draft_vocab import add_draft_vocab_argument, draft_vocab_option
from dspark.models.loading import SMOLLM2_GGUF

COSTS_JSON = "costs.json"
SPS_JSON = "sps.json"
PLOT_PNG = "profile.png"

logger = logging.getLogger("dspark.profiling")


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The ``dspark profile`` options."""
    p.add_argument("--target", required=True, help="'smollm2', a .gguf file or a Hugging Face model folder")
    p.add_argument(
        "--drafter",
        default="random",
        help="a DSpark checkpoint folder, 'random' (a fresh drafter of the shape below) or 'none' (target only)",
    )
    p.add_argument("--out", required=True, type=Path, help="output folder (created)")
    p.add_argument("--batch-sizes", default="1,2,4,8", help="request counts R, comma-separated")
    p.add_argument("--context", type=int, default=256, help="tokens already in each request's KV cache")
    p.add_argument("--repeats", type=int, default=5, help="timed calls per point (the median is kept)")
    p.add_argument("--warmup", type=int, default=2, help="untimed calls before each point")
    p.add_argument("--temperature", type=float, default=0.0, help="draft sampling temperature (0: greedy)")
    p.add_argument("--block-size", type=int, default=7, help="random drafter: block size γ")
    p.add_argument("--drafter-layers", type=int, default=1, help="random drafter: layers")
    p.add_argument("--markov-rank", type=int, default=64, help="random drafter: Markov head rank")
    p.add_argument(
        "--drafter-dtype",
        default=None,
        choices=["float32", "bfloat16", "float16"],
        help="checkpoint drafter's dtype (default: the target's); time the dtype you will decode with",
    )
    add_draft_vocab_argument(p)
    p.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads for CPU timing")
    p.add_argument("--no-plot", action="store_true", help="skip the PNG")
    p.add_argument("--quiet", action="store_true", help="no progress bar")


def _parse_sizes(text: str) -> list[int]:
    try:
        sizes = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        sizes = []
    if not sizes or min(sizes) < 1:
        raise SystemExit(
            f"dspark profile: --batch-sizes must be positive integers like 1,2,4,8, got {text!r}"
        )
    return sizes


def load_model(spec: str) -> tuple[torch.nn.Module, str]:
    """``smollm2``, a ``.gguf`` file or a Hugging Face model folder -> (model in eval mode, display name)."""
    model, _ = loading.load_target(spec, with_tokenizer=False)  # looked up per call (tests replace it)
    if spec == "smollm2":
        return model, SMOLLM2_GGUF.removesuffix(".gguf")
    path = Path(spec)
    return model, path.stem if path.suffix == ".gguf" else (path.name or spec)


def format_summary(table: CostTable) -> str:
    """Verify ms by (R, B), drafter ms by R and the 1-D SPS curve as plain-text tables."""
    lines = ["verify forward (ms), median:"]
    for r in table.batch_sizes:
        cells = [f"B={v.batch_tokens}: {v.ms:.1f}" for v in table.verify if v.num_requests == r]
        lines.append(f"  R={r:<3d} " + "  ".join(cells))
    if table.draft:
        lines.append("drafter round (ms), median: draft + append_context")
        for d in table.draft:
            parts = ""
            if d.draft_ms is not None and d.append_ms is not None:
                parts = f"  (draft {d.draft_ms:.1f} + append {d.append_ms:.1f})"
            lines.append(f"  R={d.num_requests:<3d} {d.ms:.1f}{parts}")
    sps = table.to_sps()
    lines.append("SPS 1-D export (B: rounds/s):")
    pairs = [f"{b}:{s:.2f}" for b, s in zip(sps.sample_batch_tokens, sps.sample_steps_per_sec, strict=True)]
    for i in range(0, len(pairs), 10):
        lines.append("  " + "  ".join(pairs[i : i + 10]))
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    """Run ``dspark profile`` with parsed arguments; returns the exit code."""
    from dspark.models import DSparkDrafter
    from dspark.profiling.plot import save_plot
    from dspark.profiling.profiler import profile_costs

    sizes = _parse_sizes(args.batch_sizes)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    target, name = load_model(args.target)
    target.to(device)
    drafter = None
    drafter_name = "none"
    if args.drafter == "random":
        drafter = DSparkDrafter.from_config(
            target, block_size=args.block_size, num_layers=args.drafter_layers, markov_rank=args.markov_rank
        ).eval()
        drafter_name = (
            f"random (layers {args.drafter_layers}, markov_rank {args.markov_rank}, block {args.block_size})"
        )
    elif args.drafter != "none":
        vocab = draft_vocab_option(args.draft_vocab)
        drafter = DSparkDrafter.from_pretrained(
            args.drafter, target=target, dtype=args.drafter_dtype, draft_vocab=vocab
        )
        drafter_name = str(args.drafter)
    table = profile_costs(
        target,
        drafter,
        sizes,
        context_length=args.context,
        repeats=args.repeats,
        warmup=args.warmup,
        block_size=None if drafter is not None else args.block_size,
        temperature=args.temperature,
        progress=not args.quiet,
        metadata={"target": name, "drafter_name": drafter_name},
    )
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    table.save_json(out / COSTS_JSON)
    table.to_sps().save(out / SPS_JSON)
    written = [out / COSTS_JSON, out / SPS_JSON]
    if not args.no_plot:
        try:
            written.append(save_plot(table, out / PLOT_PNG))
        except ImportError:
            print("matplotlib is not installed: no plot (pip install matplotlib)", file=sys.stderr)
    print(format_summary(table))
    print("wrote " + ", ".join(str(p) for p in written))
    return 0


def add_profile_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Register ``dspark profile`` on the CLI's subparsers."""
    p = sub.add_parser(
        "profile",
        help="measure verify and drafter costs on this device; write sps.json, costs.json and a plot",
        description="Measure target verify time by (R, B) and drafter round time by R (docs/profiling.md).",
    )
    add_arguments(p)
    p.set_defaults(fn=run)
    return p
