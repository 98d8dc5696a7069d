# SPDX-License-Identifier: Apache-2.0
"""Where a round's time goes on the device: ``torch.profiler`` over a few DSpark rounds of bench_e2e_gpu's
random models, with CUDA graphs on (on CUDA).

    python benchmarks/bench_round_profile.py --device cuda [--models A B] [--batch 1 64] [--rounds 6]
    python benchmarks/bench_round_profile.py --quick        # CPU, the scaled-down (A): the profiler path only

Per model and batch size R (γ = 7, every request verifying l = 4 rows, greedy): the round's host time, the
device's busy time per round (the union of its kernel and copy intervals), their ratio — a round whose device
is busy a small share of it waits for the host — the device operations per round, and the operations that took
the most device time (per round). The prefill and the first rounds (which capture the graphs) are left out of
the profile. On CPU there is no device: the table lists the CPU operators by self time instead.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import torch
from torch.autograd import DeviceType

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import env_info  # noqa: E402
from benchmarks.e2e_gpu.models import (  # noqa: E402
    GAMMA,
    FixedVerifyPlanner,
    build_drafter,
    build_target,
    model_specs,
    random_prompts,
)
from benchmarks.e2e_gpu.timing import kv_pages  # noqa: E402
from dspark import DSparkDecoder  # noqa: E402

VERIFY_LEN = 4
SKIPPED_ROUNDS = (
    2  # the prefill and the first round (which captures this batch size's graphs) are not profiled
)


def device_intervals(events: list[Any]) -> list[tuple[float, float, str]]:
    """(start µs, end µs, name) of every device-side event (kernels, copies, sets)."""
    return [
        (e.time_range.start, e.time_range.end, e.name)
        for e in events
        if e.device_type != DeviceType.CPU and e.time_range.end > e.time_range.start
    ]


def busy_us(intervals: list[tuple[float, float, str]]) -> float:
    """The length of the union of the intervals."""
    total, end = 0.0, float("-inf")
    for s, e, _ in sorted(intervals):
        if e > end:
            total += e - max(s, end)
            end = e
    return total


def profile_rounds(dec: DSparkDecoder, prompts: list[list[int]], rounds: int, device: str) -> dict:
    """Profile ``rounds`` rounds of one ``generate`` call after its prefill and first rounds."""
    wall: list[float] = []
    orig = dec._round
    prof = torch.profiler.profile(
        activities=[torch.profiler.ProfilerActivity.CPU]
        + ([torch.profiler.ProfilerActivity.CUDA] if device == "cuda" else []),
        schedule=torch.profiler.schedule(wait=SKIPPED_ROUNDS, warmup=1, active=rounds, repeat=1),
    )

    def round_(*args: Any) -> Any:
        prof.step()  # each round is one profiler step; the prefill falls into the first, skipped one
        t0 = time.perf_counter()
        out = orig(*args)
        if device == "cuda":
            torch.cuda.synchronize()
        wall.append(time.perf_counter() - t0)
        return out

    dec._round = round_
    try:
        with prof:
            dec.generate(prompts, max_new_tokens=SKIPPED_ROUNDS + rounds + 6, eos_token_id=[])
    finally:
        del dec._round
    # profiler steps: 0 the prefill, 1 .. SKIPPED_ROUNDS - 1 the first rounds (skipped), then one warm-up round,
    # then the `rounds` profiled ones: wall[i] is round i + 1
    timed = wall[SKIPPED_ROUNDS : SKIPPED_ROUNDS + rounds]
    if len(timed) < rounds:
        raise SystemExit(f"bench_round_profile: {len(timed)} of {rounds} rounds ran (drafts were accepted?)")
    events = list(prof.events())
    out: dict[str, Any] = {"rounds": rounds, "round_ms": 1e3 * sum(timed) / rounds}
    per: dict[str, float] = defaultdict(float)
    calls: dict[str, int] = defaultdict(int)
    if device == "cuda":
        spans = device_intervals(events)
        out["busy_ms"] = busy_us(spans) / 1e3 / rounds
        out["device_ops"] = len(spans) / rounds
        for s, e, name in spans:
            per[name] += (e - s) / 1e3 / rounds
            calls[name] += 1
    else:
        for e in events:
            if e.device_type == DeviceType.CPU and e.name.startswith(("aten::", "dspark::")):
                per[e.name] += e.self_cpu_time_total / 1e3 / rounds
                calls[e.name] += 1
    out["top"] = sorted(((n, ms, calls[n] / rounds) for n, ms in per.items()), key=lambda x: -x[1])[:12]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--quick", action="store_true", help="CPU CI: the scaled-down (A), R = 1, 3 rounds")
    ap.add_argument("--models", nargs="+", default=None, choices=["A", "B"])
    ap.add_argument("--batch", type=int, nargs="+", default=None, help="R values (default 1 64; quick 1)")
    ap.add_argument("--rounds", type=int, default=None, help="profiled rounds (default 6; quick 3)")
    ap.add_argument("--context", type=int, default=None, help="prompt tokens (default 256; quick 16)")
    args = ap.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: no CUDA GPU is visible")
    quick = args.quick or args.device == "cpu"
    batches = args.batch or ([1] if quick else [1, 64])
    rounds = args.rounds or (3 if quick else 6)
    context = args.context or (16 if quick else 256)
    device = torch.device(args.device)
    env = env_info(args.device)
    print(f"{env['cpu']['model']}; {env.get('gpu', 'no GPU')}; torch {torch.__version__}")
    for spec in model_specs(quick, args.device, torch.float32):
        if args.models and spec.key not in args.models:
            continue
        target = build_target(spec, device)
        drafter = build_drafter(spec, target)
        print(f"\n## ({spec.key}) {spec.name}, {str(spec.dtype)[6:]}, {args.device}, l = {VERIFY_LEN}")
        for R in batches:
            planner = FixedVerifyPlanner(GAMMA)
            planner.verify_len = VERIFY_LEN
            dec = DSparkDecoder(
                target,
                drafter,
                planner=planner,
                block_size=drafter.config.block_size,
                adaptive_slots=False,
                max_batch_size=R,
                max_kv_pages=kv_pages(R, context, SKIPPED_ROUNDS + rounds + 8),
                cuda_graphs=args.device == "cuda",
            )
            try:
                prompts = random_prompts(R, context, int(spec.config["vocab_size"]), seed=R)
                res = profile_rounds(dec, prompts, rounds, args.device)
            finally:
                dec.close()
            if args.device == "cuda":
                print(
                    f"\nR = {R}: round {res['round_ms']:.2f} ms (host clock), device busy "
                    f"{res['busy_ms']:.2f} ms ({100 * res['busy_ms'] / res['round_ms']:.0f} %), "
                    f"{res['device_ops']:.0f} device operations per round\n"
                )
                head = "| device operation | ms per round | calls per round |"
            else:
                print(f"\nR = {R}: round {res['round_ms']:.2f} ms; CPU operators by self time\n")
                head = "| operator | self ms per round | calls per round |"
            print(head + "\n|---|---|---|")
            for name, ms, n in res["top"]:
                print(f"| `{name[:90]}` | {ms:.3f} | {n:.1f} |")


if __name__ == "__main__":
    main()
