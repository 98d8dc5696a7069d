# SPDX-License-Identifier: Apache-2.0
"""philox_draw against its pure-Python reference (uniform + Gumbel per element), per N.

python benchmarks/bench_philox_draw.py [--quick] [--device cuda] [--json out.json]
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import dspark  # noqa: E402
from benchmarks.common import Row, parse_args, report, time_fn  # noqa: E402
from dspark.reference import philox_draw_ref  # noqa: E402


def main() -> None:
    args = parse_args(__doc__)
    budget = 0.05 if args.quick else 0.5
    rows = []
    for n in [256, 4096] if args.quick else [256, 4096, 65536]:
        i = torch.arange(n, device=args.device)
        out = dspark.ops.philox_draw(1, 2, i % 8, i % 16, 1, i)
        ref = philox_draw_ref(1, 2, (i % 8).cpu(), (i % 16).cpu(), 1, i.cpu())
        assert torch.equal(out[0].cpu(), ref[0])
        t_op = time_fn(lambda i=i: dspark.ops.philox_draw(1, 2, i % 8, i % 16, 1, i), args.device, budget)
        t_ref = None
        if n <= 4096:  # the pure-Python reference is ~microseconds per element
            ic = i.cpu()
            t_ref = time_fn(lambda ic=ic: philox_draw_ref(1, 2, ic % 8, ic % 16, 1, ic), "cpu", budget)
        rows.append(Row({"N": n}, args.device, t_op, t_ref))
    report("philox_draw vs reference", rows, args, ["N"])


if __name__ == "__main__":
    main()
