# SPDX-License-Identifier: Apache-2.0
"""confidence against its pure-PyTorch reference (cat + matmul + sigmoid + cumprod), per R and dtype.

python benchmarks/bench_confidence.py [--quick] [--device cuda] [--json out.json]
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import dspark  # noqa: E402
from benchmarks.common import Row, parse_args, report, time_fn  # noqa: E402
from benchmarks.inputs import confidence_inputs  # noqa: E402
from dspark.reference import confidence_ref  # noqa: E402

GAMMA, HIDDEN, RANK = 7, 576, 64  # SmolLM2-135M hidden size, a typical Markov rank


def main() -> None:
    args = parse_args(__doc__)
    budget = 0.05 if args.quick else 0.5
    rs = [1, 8, 64] if args.quick else [1, 8, 64, 256]
    dtypes = [torch.float32] if args.quick else [torch.float32, torch.bfloat16]
    rows = []
    for dtype in dtypes:
        for R in rs:
            inputs = [t.to(args.device) for t in confidence_inputs(R, GAMMA, HIDDEN, RANK, dtype, seed=R)]
            out = dspark.ops.confidence(*inputs)
            ref = confidence_ref(*inputs)
            for o, r in zip(out, ref, strict=True):
                torch.testing.assert_close(o, r, atol=2e-5, rtol=1e-4)
            t_op = time_fn(lambda inputs=inputs: dspark.ops.confidence(*inputs), args.device, budget)
            t_ref = time_fn(lambda inputs=inputs: confidence_ref(*inputs), args.device, budget)
            nbytes = sum(t.numel() * t.element_size() for t in inputs) + 3 * R * GAMMA * 4
            extra = {"bytes": nbytes, "GB/s": nbytes / (t_op.median_us * 1e3)}
            case = {
                "dtype": str(dtype).removeprefix("torch."),
                "R": R,
                "gamma": GAMMA,
                "H": HIDDEN,
                "r": RANK,
            }
            rows.append(Row(case, args.device, t_op, t_ref, extra))
    report("confidence vs reference", rows, args, ["dtype", "R", "gamma", "H", "r"])


if __name__ == "__main__":
    main()
