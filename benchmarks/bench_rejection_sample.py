# SPDX-License-Identifier: Apache-2.0
"""rejection_sample against an eager PyTorch verifier (softmax of every row, accept/residual/bonus in torch).

The bit-exact reference (dspark.reference.rejection_sample_ref) is checked first on a small case.

python benchmarks/bench_rejection_sample.py [--quick] [--device cuda] [--json out.json]
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import dspark  # noqa: E402
from benchmarks.common import Row, parse_args, report, time_fn  # noqa: E402
from benchmarks.inputs import ragged_verify_inputs, verify_inputs  # noqa: E402
from dspark.reference import rejection_sample_ref  # noqa: E402

GAMMA = 7


def eager(tl, qo, z, drafts, vl, temp, gen_seed):
    """Plain torch: p and q for every row, then the chain per request (torch RNG)."""
    g = torch.Generator(device=tl.device).manual_seed(gen_seed)
    R = z.shape[0]
    p_all = torch.softmax(tl.float() / temp.repeat_interleave(vl.long())[:, None], -1)
    q_all = torch.softmax(z / temp[:, None, None], -1)
    u = torch.rand(R, GAMMA, generator=g, device=tl.device)
    out = []
    for r in range(R):
        base, n = int(qo[r]), int(vl[r])
        tok = None
        for i in range(n - 1):
            p, q, x = p_all[base + i], q_all[r, i], int(drafts[r, i])
            if u[r, i] * q[x] >= p[x]:
                tok = torch.multinomial((p - q).clamp_min(0), 1, generator=g)
                break
        if tok is None:
            tok = torch.multinomial(p_all[base + n - 1], 1, generator=g)
        out.append(tok)
    return out


def main() -> None:
    args = parse_args(__doc__)
    dev = args.device
    small = ragged_verify_inputs(seed=0)
    o, r = dspark.ops.rejection_sample(*small, 1, 2), rejection_sample_ref(*small, 1, 2)
    assert torch.equal(o[0], r[0]) and torch.equal(o[1], r[1])
    if args.quick:
        cases, budget = [(8, 49152)], 0.05
    elif dev == "cuda":
        cases, budget = [(R, V) for R in (1, 8, 64) for V in (49152, 151936)], 0.3
    else:
        cases, budget = [(1, 49152), (8, 49152), (64, 49152), (8, 151936)], 0.2
    rows = []
    for R, V in cases:
        a = verify_inputs(R, V, GAMMA, torch.float32, dev, seed=R)
        acc, _ = dspark.ops.rejection_sample(*a, 1, 2)
        t_op = time_fn(lambda a=a: dspark.ops.rejection_sample(*a, 1, 2), dev, budget)
        t_ref = time_fn(lambda a=a: eager(*a, 0), dev, budget)
        verified = int((acc.cpu() + 1).sum())  # rows whose softmax was computed (at most)
        extra = {"mean_accepted": float(acc.float().mean()), "rows_read": verified}
        rows.append(Row({"R": R, "V": V, "gamma": GAMMA}, dev, t_op, t_ref, extra))
    report("rejection_sample vs eager verifier", rows, args, ["R", "V", "gamma"])


if __name__ == "__main__":
    main()
