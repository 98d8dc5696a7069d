# SPDX-License-Identifier: Apache-2.0
"""A drafter round (backbone + Markov sampling + confidence) as a fraction of one target decode step, on CPU.

The target is a random-weight LlamaForCausalLM with SmolLM2-135M's config (hidden 576, 30 layers, 9 heads / 3 KV
heads, head_dim 64, intermediate 1536, vocab 49152, tied embeddings); its decode step (one token per request
with a KV cache of ``--context`` tokens) is timed in the same run. Drafters share its embedding and LM head and
have 1, 2 or 3 layers and Markov rank 64 or 256 (block 7), with ``--context`` committed context rows per request.

``--draft-vocabs 0,16384`` also times each drafter restricted to a draft vocabulary of that many ids (0: the
whole vocabulary; docs/drafter.md "Draft vocabulary").

python benchmarks/bench_drafter.py [--quick] [--context 256] [--reps 7] [--json out.json] [--threads N]
    [--layers 1,2,3] [--ranks 64,256] [--draft-vocabs 0,16384,8192]
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import dspark  # noqa: E402
from dspark import DSparkDrafter  # noqa: E402

SMOLLM2_135M = dict(
    vocab_size=49152,
    hidden_size=576,
    intermediate_size=1536,
    num_hidden_layers=30,
    num_attention_heads=9,
    num_key_value_heads=3,
    head_dim=64,
    max_position_embeddings=8192,
    rms_norm_eps=1e-5,
    rope_theta=100000.0,
    tie_word_embeddings=True,
)


def smollm2_target():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(**SMOLLM2_135M)
    return LlamaForCausalLM(cfg).eval()


def decode_step_fn(target, R: int, context: int):
    """One decode step for R requests over a ``context``-token KV cache (the cache is cropped back each call)."""
    from transformers import DynamicCache

    gen = torch.Generator().manual_seed(R)
    cache = DynamicCache()
    with torch.no_grad():
        target(torch.randint(0, 49152, (R, context), generator=gen), past_key_values=cache, use_cache=True)
    tok = torch.randint(0, 49152, (R, 1), generator=gen)

    @torch.no_grad()
    def step():
        target(tok, past_key_values=cache, use_cache=True)
        cache.crop(-1)  # drop the token just appended

    return step


def interleaved_min(fns, reps: int) -> list[float]:
    """Microseconds per call of each fn: the minimum over ``reps`` rounds that call every fn once in turn.

    Interleaving and taking the minimum keeps the ratio meaningful on a machine shared with other work.
    """
    for fn in fns:
        fn()  # warm-up
    best = [float("inf")] * len(fns)
    for _ in range(reps):
        for i, fn in enumerate(fns):
            t = time.perf_counter()
            fn()
            best[i] = min(best[i], (time.perf_counter() - t) * 1e6)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="a CI-sized sweep with short timing budgets")
    ap.add_argument("--context", type=int, default=256, help="committed tokens per request (default 256)")
    ap.add_argument("--reps", type=int, default=7, help="interleaved repetitions per case (default 7)")
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument(
        "--drafter-dtypes",
        default="float32,bfloat16",
        help="drafter dtypes to time against the fp32 target (bf16 keeps its own cast LM head copy)",
    )
    ap.add_argument("--layers", default="1,2,3", help="drafter depths (default 1,2,3)")
    ap.add_argument("--ranks", default="64,256", help="Markov ranks (default 64,256)")
    ap.add_argument(
        "--draft-vocabs", default="0", help="draft vocabulary sizes, 0 = the whole vocabulary (default 0)"
    )
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    reps = 2 if args.quick else args.reps
    context = min(args.context, 32) if args.quick else args.context
    layers_list = [1] if args.quick else [int(x) for x in args.layers.split(",")]
    ranks = [64] if args.quick else [int(x) for x in args.ranks.split(",")]
    vocab_sizes = [0, 8192] if args.quick else [int(x) for x in args.draft_vocabs.split(",")]
    rs = [1] if args.quick else [1, 8]

    target = smollm2_target()
    decode = {R: decode_step_fn(target, R, context) for R in rs}
    rows = []
    dtypes = [getattr(torch, d.strip()) for d in args.drafter_dtypes.split(",") if d.strip()]
    for layers, rank, dt in ((a, b, c) for a in layers_list for b in ranks for c in dtypes):
        drafter = DSparkDrafter.from_config(
            target,
            block_size=7,
            num_layers=layers,
            markov_rank=rank,
            target_layer_ids=[1, 9, 17, 25],
            dtype=dt,
            share_embeddings=dt == torch.float32,  # another dtype needs its own cast copy
        )
        width = drafter.config.num_taps * drafter.config.hidden_size
        for R, nv in ((a, b) for a in rs for b in vocab_sizes):
            subset = torch.randperm(49152, generator=torch.Generator().manual_seed(nv))[:nv] if nv else None
            drafter.set_draft_vocab(subset)
            drafter.finish_all()
            gen = torch.Generator().manual_seed(R)
            ids = list(range(R))
            drafter.append_context(ids, [torch.randn(context, width, generator=gen) for _ in ids])
            anchors = torch.randint(0, 49152, (R,), generator=gen)
            # check: greedy tokens are the argmax of the corrected logits, survival is the conf cumprod
            out = drafter.draft(ids, anchors, 0.0)
            assert torch.equal(out.tokens[:, 0], out.draft_logits[:, 0].argmax(-1))
            torch.testing.assert_close(out.survival, out.conf.cumprod(-1))
            if subset is not None:  # drafts only from the draft vocabulary
                assert torch.isin(out.tokens, subset).all()

            def greedy(d=drafter, ids=ids, anchors=anchors):
                d.draft(ids, anchors, 0.0, seed=1, offset=0)

            def sampled(d=drafter, ids=ids, anchors=anchors):
                d.draft(ids, anchors, 1.0, seed=1, offset=0)

            best = interleaved_min([decode[R], greedy, sampled], reps)
            row = dict(layers=layers, rank=rank, dtype=str(dt).removeprefix("torch."), R=R, context=context)
            row.update(draft_vocab=nv or 49152)
            row.update(decode_us=best[0], greedy_us=best[1], sampled_us=best[2])
            row.update(greedy_frac=best[1] / best[0], sampled_frac=best[2] / best[0])
            rows.append(row)
        del drafter

    print(
        f"\n## drafter round vs SmolLM2-135M decode step (CPU, {torch.get_num_threads()} threads, fp32 target, "
        f"context {context}, block 7, min of {reps} interleaved runs)\n"
    )
    print(
        "| layers | r | drafter dtype | draft vocab | R | decode step (ms) | round greedy (ms) | / decode | round T=1 (ms) | / decode |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['layers']} | {r['rank']} | {r['dtype']} | {r['draft_vocab']} | {r['R']} | {r['decode_us'] / 1e3:.2f} | {r['greedy_us'] / 1e3:.2f} | "
            f"{r['greedy_frac']:.2f} | {r['sampled_us'] / 1e3:.2f} | {r['sampled_frac']:.2f} |"
        )
    if args.json:
        meta = dict(
            torch=torch.__version__,
            dspark=dspark.__version__,
            machine=platform.machine(),
            threads=torch.get_num_threads(),
        )
        args.json.write_text(json.dumps(dict(meta=meta, rows=rows), indent=2))


if __name__ == "__main__":
    main()
