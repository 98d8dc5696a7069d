# SPDX-License-Identifier: Apache-2.0
"""The plain engine's decode step with and without ``decoder.compile(target=True)`` (the target's RMSNorm and MLP
modules through ``torch.compile``), on bench_e2e_gpu's random targets; interleaved repeats, medians, and whether
both gave the same tokens.

    python benchmarks/bench_compile_target.py [--device cpu|cuda] [--models A B] [--batch 1 32] [--graphs]
    python benchmarks/bench_compile_target.py --quick          # CI: the scaled-down (A), 8 tokens, one repeat

(A) is the SmolLM2-135M-shaped Llama (fp32), (B) the Qwen3-8B-shaped one (bf16, CUDA only). ``--graphs`` runs
both with ``cuda_graphs=True`` (CUDA only), where a replayed graph skips the compiled modules' Python guards and
keeps only their fused kernels.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import env_info  # noqa: E402
from benchmarks.e2e_gpu.models import build_target, model_specs, random_prompts  # noqa: E402
from benchmarks.e2e_gpu.timing import kv_pages  # noqa: E402
from dspark import DSparkDecoder  # noqa: E402


def step_ms(target, prompts, tokens: int, graphs: bool, compiled: bool) -> tuple[float, list]:
    """ms per decode step of one ``generate`` call after a warm-up call (which compiles and captures)."""
    dec = DSparkDecoder(
        target,
        None,
        max_batch_size=len(prompts),
        max_kv_pages=kv_pages(len(prompts), len(prompts[0]), tokens + 8),
        cuda_graphs=graphs,
    )
    if compiled:
        dec.compile(target=True)
    cuda = target.device.type == "cuda"
    try:
        dec.generate(prompts, max_new_tokens=8, eos_token_id=[])
        if cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        out = dec.generate(prompts, max_new_tokens=tokens, eos_token_id=[])
        if cuda:
            torch.cuda.synchronize()
        return (time.perf_counter() - t0) / tokens * 1e3, out.sequences
    finally:
        dec.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument(
        "--models", nargs="+", default=None, choices=["A", "B"], help="default: A (and B on CUDA)"
    )
    ap.add_argument("--batch", type=int, nargs="+", default=[1])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--context", type=int, default=64)
    ap.add_argument("--graphs", action="store_true")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    if args.graphs and args.device != "cuda":
        raise SystemExit("--graphs: CUDA only")
    if args.quick:
        args.repeats, args.tokens, args.context = 1, 8, 16
    if args.threads:
        torch.set_num_threads(args.threads)
    env = env_info(args.device)
    print(
        f"{env['cpu']['model']}; {env.get('gpu', 'no GPU')}; {torch.get_num_threads()} threads; torch {torch.__version__}"
    )
    print("\n| model | batch | graphs | eager step ms | compiled step ms | eager / compiled | same tokens |")
    print("|---|---|---|---|---|---|---|")
    for spec in model_specs(args.quick, args.device, torch.float32):
        if args.models and spec.key not in args.models:
            continue
        target = build_target(spec, torch.device(args.device))
        for R in args.batch:
            prompts = random_prompts(R, args.context, int(spec.config["vocab_size"]), seed=R)
            ms: dict[bool, list[float]] = {False: [], True: []}
            tokens = {}
            for _ in range(args.repeats):
                for compiled in (False, True):
                    t, tokens[compiled] = step_ms(target, prompts, args.tokens, args.graphs, compiled)
                    ms[compiled].append(t)
            eager, comp = statistics.median(ms[False]), statistics.median(ms[True])
            print(
                f"| {spec.key} | {R} | {args.graphs} | {eager:.2f} | {comp:.2f} | {eager / comp:.3f} | "
                f"{tokens[False] == tokens[True]} |",
                flush=True,
            )
        del target


if __name__ == "__main__":
    main()
