# SPDX-License-Identifier: Apache-2.0
"""``dspark::few_row_linear`` against ``F.linear`` on the weights of a whole SmolLM2-135M.

The weights are random fp32 matrices with the shapes of every linear layer of SmolLM2-135M (30 decoder layers
and the 49,152 × 576 LM head; 537 MB, more than the caches), so one call of each side multiplies M rows by all
of them once: what a decode (M = 1) or verify step reads. The op streams each weight once for all rows; MKL's
few-row GEMMs grow with the rows. The "used by default" column is ``cpu_linear``'s routing rule
(:func:`dspark.models.cpu_linear.op_applies`, where the weight-stationary path is off).

python benchmarks/bench_few_row_linear.py [--quick] [--device cuda] [--threads N] [--json out.json]
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import dspark  # noqa: E402
from benchmarks.bench_cpu_linear import INTER, H, weights  # noqa: E402
from benchmarks.common import Row, parse_args, report, time_fn  # noqa: E402
from dspark.models import cpu_linear  # noqa: E402


def main() -> None:
    args = parse_args(__doc__)
    dev = args.device
    g = torch.Generator().manual_seed(0)
    ws = [w.to(dev) for w in weights(4 if args.quick else 30, g)]
    budget = 0.3 if args.quick else 2.0
    row_counts = [1, 4, 8] if args.quick else [1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64]
    # models route only CPU linears to the op
    by_default = dev == "cpu" and cpu_linear.default_max_rows() == 0 and cpu_linear._simd_x86()
    rows = []
    for m in row_counts:
        xs = {k: torch.randn(m, k, generator=g).to(dev) for k in (H, INTER)}

        def op(xs=xs):
            return [dspark.ops.few_row_linear(xs[w.shape[1]], w) for w in ws]

        def ref(xs=xs):
            return [F.linear(xs[w.shape[1]], w) for w in ws]

        with torch.no_grad():
            for a, b in zip(op(), ref(), strict=True):  # correctness first: same products, other order
                torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)
            t_op, t_ref = time_fn(op, dev, budget), time_fn(ref, dev, budget)
        used = by_default and cpu_linear.OP_MIN_ROWS <= m <= cpu_linear.OP_MAX_ROWS
        rows.append(Row({"rows M": m, "used by default": "yes" if used else "no"}, dev, t_op, t_ref))
    n_w = sum(w.numel() for w in ws) * 4 / 1e6
    report(
        f"fp32 linear of M rows by {len(ws)} weights ({n_w:.0f} MB): dspark::few_row_linear (op) against "
        f"F.linear (reference); CPU capability {torch.backends.cpu.get_cpu_capability()}",
        rows,
        args,
        ["rows M", "used by default"],
    )


if __name__ == "__main__":
    main()
