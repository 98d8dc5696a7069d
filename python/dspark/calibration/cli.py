# SPDX-License-Identifier: Apache-2.0
"""``dspark calibrate``: collect uncensored labels on a prompt file, fit STS, write sts.json + metrics + plot
(and the lookup drafter's acceptance prior, lookup_prior.json, counted on the generated outputs)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from dspark.calibration.data import CalibrationData


def add_calibrate_parser(sub: argparse._SubParsersAction) -> None:
    """Register the ``calibrate`` subcommand on the ``dspark`` parser."""
    c = sub.add_parser(
        "calibrate",
        help="fit the confidence head's STS (writes sts.json, calibration_metrics.json, reliability.png) and "
        "count the lookup drafter's acceptance on the generated outputs (lookup_prior.json)",
        description="Collect uncensored labels on a prompt file, fit STS and write sts.json, "
        "calibration_metrics.json and reliability.png to --out. A run that generates also writes "
        "lookup_prior.json: the lookup drafter's acceptance counts by match class (length and extent) and "
        "position, counted on the prompts and the outputs it generated (default lookup config; as many positions as a hybrid decoder's "
        "lookup blocks hold, at least the run's gamma; the run's temperature). "
        "--data collections carry no sequences, so they write no lookup prior.",
    )
    c.add_argument("--target", help="'smollm2', a .gguf file or a Hugging Face model folder")
    c.add_argument("--drafter", help="the DSpark checkpoint folder to calibrate")
    c.add_argument("--prompts", help='a JSONL prompt file of {"turns": ["first user turn", ...]} rows')
    c.add_argument("--skip", type=int, default=0, help="skip the first N prompts (keep training prompts out)")
    c.add_argument("--limit", type=int, default=None, help="use at most N prompts")
    c.add_argument("--temperature", type=float, default=1.0, help="sampling temperature (0 = greedy)")
    c.add_argument(
        "--label",
        choices=["prob", "greedy"],
        default="prob",
        help="per-position label: 'prob' = sum(min(p, q)), 'greedy' = argmax match (forced at temperature 0)",
    )
    c.add_argument("--max-new-tokens", type=int, default=128)
    c.add_argument("--batch-size", type=int, default=8, help="requests decoded together")
    c.add_argument("--block-size", type=int, default=None, help="drafts per round (default: the drafter's)")
    c.add_argument("--seed", type=int, default=0)
    c.add_argument("--bins", type=int, default=20, help="equal-width ECE bins")
    c.add_argument(
        "--sts",
        choices=["affine", "temperature"],
        default="affine",
        help="'affine' fits a temperature and an offset per position (sts.json gains 'biases'); "
        "'temperature' is SGLang's STS (temperatures only)",
    )
    c.add_argument(
        "--folds",
        type=int,
        default=2,
        help="request folds of the held-out (cross-fitted) metrics; 0 skips them",
    )
    c.add_argument("--out", required=True, help="output folder")
    c.add_argument(
        "--save-data", action="store_true", help="also write the collected rows to calibration_data.pt"
    )
    c.add_argument(
        "--data",
        nargs="+",
        default=None,
        help="fit from saved calibration_data.pt / .npz files instead of generating (several are pooled; "
        "they keep no sequences, so no lookup_prior.json)",
    )
    c.set_defaults(fn=run_calibrate)


def _fitting_prompts(dec, texts: list[str], args: argparse.Namespace) -> list[list[int]]:
    """Chat token ids of the prompts that fit the target's context with ``--max-new-tokens`` (a note names the
    rest); tokenised once here, the decoder takes the ids as they are."""
    from dspark.decoding.inputs import chat_token_ids

    ids = [chat_token_ids(dec.tokenizer, t) for t in texts]
    keep = [dec.fits_context(len(p), args.max_new_tokens) for p in ids]
    dropped = [args.skip + i for i, k in enumerate(keep) if not k]
    if dropped:
        print(
            f"note: skipping {len(dropped)} prompt(s) longer than the target's context allows with "
            f"--max-new-tokens {args.max_new_tokens} ({dec.max_positions} positions): rows {dropped}",
            file=sys.stderr,
        )
    out = [p for p, k in zip(ids, keep, strict=True) if k]
    if not out:
        raise ValueError(f"--prompts: no prompt in {args.prompts} fits the target's context")
    return out


def _collect(args: argparse.Namespace):
    from dspark.calibration.data import collect_calibration_data
    from dspark.decoding.decoder import DSparkDecoder
    from dspark.models.drafter import DSparkDrafter
    from dspark.models.loading import load_target
    from dspark.prompts import read_prompt_file

    prompts = read_prompt_file(args.prompts, limit=args.limit, skip=args.skip)
    if not prompts:
        raise ValueError(f"--prompts: no prompts left in {args.prompts} after --skip {args.skip}")
    target, tok = load_target(args.target)
    drafter = DSparkDrafter.from_pretrained(args.drafter, target=target, tokenizer=tok)
    dec = DSparkDecoder(
        target,
        drafter,
        planner="full",
        block_size=args.block_size,
        tokenizer=tok,
        max_batch_size=args.batch_size,
    )
    try:
        prompt_ids = _fitting_prompts(dec, [p.text for p in prompts], args)
        print(
            f"collecting on {len(prompt_ids)} prompts (gamma {dec.gamma}, temperature {args.temperature}, "
            f"max {args.max_new_tokens} new tokens)",
            file=sys.stderr,
        )
        return collect_calibration_data(
            dec,
            prompt_ids,
            max_new_tokens=args.max_new_tokens,
            temperature=args.temperature,
            label=args.label,
            seed=args.seed,
            progress=True,
            meta={"dataset": str(args.prompts), "skip": args.skip, "drafter": str(args.drafter)},
        )
    finally:
        dec.close()


def _load_pooled(paths: list[str]) -> CalibrationData:
    """One :class:`CalibrationData` from saved collections; each file's request ids are shifted past the
    previous files', so that the held-out folds never take requests of different collections for one."""
    from dspark.calibration.data import CalibrationData

    parts, shift = [], 0
    for path in paths:
        d = CalibrationData.load(path)
        d.request_ids = d.request_ids + shift
        if d.num_samples:
            shift = int(d.request_ids.max()) + 1
        parts.append(d)
    return parts[0] if len(parts) == 1 else CalibrationData.concatenate(parts)


def _write_lookup_prior(out: Path, data: CalibrationData) -> Path | None:
    """``lookup_prior.json`` from the collection's prompts and outputs (raw counts), or a note and ``None``."""
    if data.sequences is None or data.prompt_ids is None:
        print(
            "note: the --data collections carry no generated sequences; lookup_prior.json is not written "
            "(run calibrate with --prompts to count the lookup prior)",
            file=sys.stderr,
        )
        return None
    from dspark.calibration.lookup_prior import lookup_prior_from_sequences
    from dspark.decoding.lookup import LookupConfig, lookup_width

    config = LookupConfig()
    seqs = [list(p) + list(s) for p, s in zip(data.prompt_ids, data.sequences, strict=True)]
    starts = [len(p) for p in data.prompt_ids]
    # as wide as the lookup blocks of a hybrid decoder of this γ with the default config
    table = lookup_prior_from_sequences(seqs, starts, config, lookup_width(config, data.gamma, True))
    m = data.meta
    table.meta["temperature"] = float(data.temperature)
    table.meta["source"] = (
        f"dspark calibrate: {len(seqs)} prompts of {m.get('dataset', '?')} (skip {m.get('skip', 0)}), "
        f"drafter {m.get('drafter', '?')}, max_new_tokens {m.get('max_new_tokens', '?')}, "
        f"seed {m.get('seed', '?')}, {sum(len(s) for s in data.sequences)} generated tokens"
    )
    path = out / "lookup_prior.json"
    table.save(path)
    return path


def run_calibrate(args: argparse.Namespace) -> int:
    """Run ``dspark calibrate`` with parsed arguments; returns the exit status."""
    from dspark.calibration.report import calibrate, write_calibration_outputs

    if args.data is None:
        missing = [f"--{k}" for k in ("target", "drafter", "prompts") if getattr(args, k) is None]
        if missing:
            print(f"dspark calibrate: {', '.join(missing)} required (or --data)", file=sys.stderr)
            return 2
        data = _collect(args)
    else:
        data = _load_pooled(args.data)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.save_data:
        data.save(out / "calibration_data.pt")
    report = calibrate(data, mode=args.sts, n_bins=args.bins, folds=args.folds)
    paths = write_calibration_outputs(out, data, report)
    prior = _write_lookup_prior(out, data)
    if prior is not None:
        paths["lookup_prior"] = prior
    print(
        f"{data.num_samples} rows x {data.gamma} positions, label {data.label!r}, "
        f"temperature {data.temperature}; survival metrics before -> after {report.mode} STS "
        f"(AUROC against the {report.auroc_label}"
        + (f"; held out: {report.folds} request folds" if report.heldout is not None else "")
        + "):"
    )
    print(report.table())
    from dspark.calibration.sts import DEFAULT_GRID

    edge = [k for k, t in enumerate(report.temperatures) if t in (DEFAULT_GRID[0], DEFAULT_GRID[-1])]
    if edge and report.biases is None:  # a temperature cannot remove a bias: the offset of --sts affine can
        print(
            f"note: positions {edge} hit the edge of the temperature grid [0.1, 10]; the confidence head is "
            "biased there, not just over/under-confident (--sts affine fits an offset too)",
            file=sys.stderr,
        )
    if report.biases is not None:
        print(
            "note: sts.json has affine offsets ('biases'); SGLang reads its temperatures only "
            "(use --sts temperature for a file it applies in full)",
            file=sys.stderr,
        )
    for p in paths.values():
        print(f"wrote {p}")
    return 0
