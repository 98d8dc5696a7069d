# SPDX-License-Identifier: Apache-2.0
"""The plain engine's decode step with and without ``decoder.compile(target=True)`` (the target's RMSNorm and MLP
modules through ``torch.compile``), on a randomly initialised SmolLM2-135M-shaped Llama; interleaved repeats,
medians, and whether both gave the same tokens.

    python benchmarks/bench_compile_target.py [--batch 1] [--device cpu|cuda] [--repeats 3] [--graphs] [--quick]

``--quick`` (CI): 4 layers, 8 tokens, one repeat.

``--graphs`` runs both with ``cuda_graphs=True`` (CUDA only), where a replayed graph skips the compiled
modules' Python guards and keeps only their fused kernels.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import env_info  # noqa: E402
from dspark import DSparkDecoder  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--graphs", action="store_true")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    if args.quick:
        args.repeats, args.tokens = 1, 8
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    cfg = LlamaConfig(
        hidden_size=576,
        intermediate_size=1536,
        num_hidden_layers=4 if args.quick else 30,
        num_attention_heads=9,
        num_key_value_heads=3,
        vocab_size=49152,
        tie_word_embeddings=True,
        max_position_embeddings=2048,
    )
    target = LlamaForCausalLM(cfg).eval().to(args.device)
    R = args.batch
    prompts = [torch.randint(0, cfg.vocab_size, (64,)).tolist() for _ in range(R)]

    def run(compiled: bool) -> tuple[float, list]:
        dec = DSparkDecoder(target, None, max_batch_size=R, cuda_graphs=args.graphs)
        if compiled:
            dec.compile(target=True)
        try:
            dec.generate(prompts, max_new_tokens=8, eos_token_id=[])  # compiles / captures
            if args.device == "cuda":
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            out = dec.generate(prompts, max_new_tokens=args.tokens, eos_token_id=[])
            if args.device == "cuda":
                torch.cuda.synchronize()
            return (time.perf_counter() - t0) / args.tokens * 1e3, out.sequences
        finally:
            dec.close()

    ms: dict[bool, list[float]] = {False: [], True: []}
    tokens = {}
    for _ in range(args.repeats):
        for compiled in (False, True):
            t, tokens[compiled] = run(compiled)
            ms[compiled].append(t)
    eager, comp = statistics.median(ms[False]), statistics.median(ms[True])
    env = env_info(args.device)
    print(
        f"{env['cpu']['model']} ({args.device}, {torch.get_num_threads()} threads, torch {torch.__version__})"
    )
    print("| batch | graphs | eager step ms | compiled step ms | eager / compiled | same tokens |")
    print("|---|---|---|---|---|---|")
    print(
        f"| {R} | {args.graphs} | {eager:.2f} | {comp:.2f} | {eager / comp:.3f} | "
        f"{tokens[False] == tokens[True]} |"
    )


if __name__ == "__main__":
    main()
