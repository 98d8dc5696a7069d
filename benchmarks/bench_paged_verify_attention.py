# SPDX-License-Identifier: Apache-2.0
"""paged_verify_attention against gather-then-SDPA (per request: gather its pages, explicit-mask SDPA).

python benchmarks/bench_paged_verify_attention.py [--quick] [--device cuda] [--json out.json]

Cases: a verify round (R requests, 1-8 query rows each, 100-1000 keys each), a decode step and a 2-row verify
of 8 requests over 256 keys each (the batch-8 rounds of docs/benchmarks.md), one request over 2,000 / 4,000
keys (batch 1 on a long prompt), and prefill (long query blocks); on CUDA also 8 requests × 6 rows × 3,800
keys and 64 × 4 × 2,000 (the GPU goals' shapes).
On CPU the op is also timed with its scalar loops (``DSPARK_CPU_SIMD=0``, read per call) against its vector
loops (AVX-512, or AVX2 + FMA), in the same process; on CUDA with the split plan given (``split_base``, what a
forward computes once for all its layers) against planning per call, and, for bf16 / fp16, its tensor-core
kernel against its CUDA-core one (``DSPARK_CUDA_TENSOR_CORES=0``, read per call).

Each row is printed to stderr as soon as it is measured (a run stopped by a time limit still shows what it
measured); the table at the end lists them all. On CUDA each timing takes about its budget (the reference's
per-request loop takes tens of ms a call at R = 64; ``benchmarks.common.time_fn``), and each case's inputs are
drawn once and converted to each dtype on the device.
"""

from __future__ import annotations

import random
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import dspark  # noqa: E402
from benchmarks.common import Row, parse_args, report, time_fn, time_fn_with_env  # noqa: E402
from benchmarks.inputs import paged_inputs  # noqa: E402
from dspark.reference import gather_request_kv  # noqa: E402


def gather_sdpa(q, k_cache, v_cache, qo, kvp, idx, last, scale, causal=True):
    """Reference path: gather each request's KV from its pages, then SDPA with a bottom-right causal mask."""
    outs = []
    qo_l = qo.tolist()
    Hq, Hkv = q.shape[1], k_cache.shape[2]
    for r in range(len(qo_l) - 1):
        k, v = gather_request_kv(k_cache, v_cache, kvp, idx, last, r)
        qr = q[qo_l[r] : qo_l[r + 1]].transpose(0, 1)  # (Hq, n_q, D)
        n_q, n_kv = qr.shape[1], k.shape[0]
        mask = None
        if causal:
            i = torch.arange(n_q, device=q.device).unsqueeze(1)
            mask = torch.arange(n_kv, device=q.device).unsqueeze(0) <= n_kv - n_q + i
        o = F.scaled_dot_product_attention(
            qr, k.transpose(0, 1), v.transpose(0, 1), attn_mask=mask, scale=scale, enable_gqa=Hq != Hkv
        )
        outs.append(o.transpose(0, 1))
    return torch.cat(outs)


def main() -> None:
    args = parse_args(__doc__)
    cuda = args.device == "cuda"
    if cuda:
        budget = 0.02 if args.quick else 0.1
    else:
        budget = 0.1 if args.quick else 0.5
    rng = random.Random(0)
    R = 8
    mixed_q = [rng.randint(1, 8) for _ in range(R)]
    mixed_kv = [rng.randint(100, 1000) for _ in range(R)]
    cases = [
        ("verify mixed", mixed_q, mixed_kv),
        ("verify uniform", [4] * R, [550] * R),
        ("decode 256", [1] * R, [256] * R),
        ("verify 2 x 256", [2] * R, [256] * R),
        # one request over a long context: its Hkv chunks alone would leave threads idle (split over keys)
        ("decode 1 x 2000", [1], [2000]),
        ("verify 1 x 4 x 4000", [4], [4000]),
        ("prefill", [512, 256], [512, 256]),
    ]
    if cuda:  # the GPU goals' shapes (docs/ops.md)
        cases += [
            ("verify 8 x 6 x 3800", [6] * 8, [3800] * 8),
            ("verify 64 x 4 x 2000", [4] * 64, [2000] * 64),
        ]
    heads = [(9, 3, 64)] if args.quick else [(9, 3, 64), (32, 8, 128)]
    dtypes = [torch.float32] if args.quick or args.device == "cpu" else [torch.float16, torch.bfloat16]
    if args.device == "cpu" and not args.quick:
        dtypes = [torch.float32, torch.bfloat16]
    n_rows = len(dtypes) * len(heads) * len(cases)
    t0 = time.perf_counter()
    print(f"paged_verify_attention: {n_rows} rows on {args.device}", file=sys.stderr, flush=True)
    measured: dict[tuple[int, int, int], Row] = {}  # (dtype, heads, case) index -> row, for the table's order
    # each case's inputs are drawn once (fp32) and converted per dtype: drawing the 64 x 2,000-key caches at
    # 32/8/128 (2 x 131 M values) on the CPU takes seconds
    for hi, (Hq, Hkv, D) in enumerate(heads):
        for ci, (name, n_q, n_kv) in enumerate(cases):
            base = paged_inputs(n_q, n_kv, (Hq, Hkv, D), 16, torch.float32, seed=1, device=args.device)
            for di, dtype in enumerate(dtypes):
                inputs = tuple(t.to(dtype) if t.is_floating_point() else t for t in base)
                scale = D**-0.5
                op = lambda i=inputs, s=scale: dspark.ops.paged_verify_attention(*i, s, True)  # noqa: E731
                out = op()
                ref = gather_sdpa(*inputs, scale, True)
                tol = 2e-5 if dtype == torch.float32 else 2e-2
                torch.testing.assert_close(out, ref, atol=tol, rtol=tol)
                t_op = time_fn(op, args.device, budget)
                t_ref = time_fn(lambda i=inputs, s=scale: gather_sdpa(*i, s, True), args.device, budget)
                extra = {}
                if not cuda:  # the vector loops against the scalar ones
                    t_scalar = time_fn_with_env("DSPARK_CPU_SIMD", "0", op, args.device, budget)
                    extra = {
                        "scalar loops (us)": t_scalar.median_us,
                        "vector vs scalar": t_scalar.median_us / t_op.median_us,
                    }
                else:  # the split plan given once (as a forward hands it to every layer) against per call
                    qo = [0, *torch.tensor(n_q).cumsum(0).tolist()]
                    plan = dspark.ops.paged_verify_attention_split_base(qo)
                    plan = torch.tensor(plan, dtype=torch.int32, device=args.device)
                    t_plan = time_fn(
                        lambda i=inputs, s=scale, b=plan: dspark.ops.paged_verify_attention(*i, s, True, b),
                        args.device,
                        budget,
                    )
                    extra = {
                        "split_base given (us)": t_plan.median_us,
                        "planned per call vs given": t_op.median_us / t_plan.median_us,
                    }
                if cuda and dtype != torch.float32:  # tensor cores against CUDA cores
                    t_cores = time_fn_with_env("DSPARK_CUDA_TENSOR_CORES", "0", op, args.device, budget)
                    extra |= {
                        "CUDA-core kernel (us)": t_cores.median_us,
                        "tensor vs CUDA cores": t_cores.median_us / t_op.median_us,
                    }
                kv_bytes = 2 * sum(n_kv) * Hkv * D * inputs[1].element_size()
                case = {
                    "case": name,
                    "dtype": str(dtype).removeprefix("torch."),
                    "Hq/Hkv/D": f"{Hq}/{Hkv}/{D}",
                    "R": len(n_q),
                    "rows": sum(n_q),
                    "keys": sum(n_kv),
                }
                row = Row(
                    case, args.device, t_op, t_ref, {"KV GB/s": kv_bytes / (t_op.median_us * 1e3), **extra}
                )
                measured[(di, hi, ci)] = row
                more = ", ".join(f"{k} {v:.2f}" for k, v in row.extra.items())
                print(
                    f"[{time.perf_counter() - t0:5.1f} s] {name} | {case['dtype']} | {case['Hq/Hkv/D']}: "
                    f"op {t_op.median_us:.1f} us, gather + SDPA {t_ref.median_us:.1f} us "
                    f"({row.speedup:.1f}x), {more}",
                    file=sys.stderr,
                    flush=True,
                )
                del inputs, out, ref
            del base
    rows = [measured[k] for k in sorted(measured)]  # dtype, then heads, then case, as before
    report(
        "paged_verify_attention vs gather + SDPA",
        rows,
        args,
        ["case", "dtype", "Hq/Hkv/D", "R", "rows", "keys"],
    )


if __name__ == "__main__":
    main()
