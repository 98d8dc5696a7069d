# SPDX-License-Identifier: Apache-2.0
"""plan_verify against its pure-PyTorch reference (the paper's Algorithm 1 written plainly), per mode and R.

python benchmarks/bench_plan_verify.py [--quick] [--device cuda] [--json out.json]
"""

from __future__ import annotations

import sys
from functools import partial
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import dspark  # noqa: E402
from benchmarks.common import Row, parse_args, report, time_fn  # noqa: E402
from benchmarks.inputs import decaying_cost_table, survival_rows  # noqa: E402
from dspark.reference import plan_verify_ref  # noqa: E402

GAMMA = 7


def main() -> None:
    args = parse_args(__doc__)
    budget = 0.05 if args.quick else 0.5
    rs = [1, 8, 64] if args.quick else [1, 8, 64, 256, 1024]  # 1024 x 7: past one CTA
    modes = (
        ["early_stop", "lagged_topk"] if args.quick else ["full", "threshold", "early_stop", "lagged_topk"]
    )
    rows = []
    for mode in modes:
        for R in rs:
            surv = survival_rows(R, GAMMA, seed=R, zero_frac=0.02)
            lagged = survival_rows(R, GAMMA, seed=R + 1, zero_frac=0.02)
            tokens, rate = decaying_cost_table()
            ref = plan_verify_ref(surv, tokens, rate, mode, lagged, 0.6)
            d = args.device
            dsurv, dlag, dtok, drate = (t.to(d) for t in (surv, lagged, tokens, rate))
            out = dspark.ops.plan_verify(dsurv, dtok, drate, mode, dlag, 0.6)
            if not (torch.equal(out[0].cpu(), ref[0]) and torch.equal(out[1].cpu(), ref[1])):
                raise SystemExit(f"plan_verify differs from the reference at mode={mode} R={R}")
            op_call = partial(dspark.ops.plan_verify, dsurv, dtok, drate, mode, dlag, 0.6)
            ref_call = partial(plan_verify_ref, surv, tokens, rate, mode, lagged, 0.6)
            t_op, t_ref = time_fn(op_call, d, budget), time_fn(ref_call, "cpu", budget)
            rows.append(Row({"mode": mode, "R": R, "gamma": GAMMA}, d, t_op, t_ref))
    report("plan_verify vs reference", rows, args, ["mode", "R", "gamma"])


if __name__ == "__main__":
    main()
