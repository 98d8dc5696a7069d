# SPDX-License-Identifier: Apache-2.0
"""rejection_sample against an eager PyTorch verifier (softmax of every row, accept/residual/bonus in torch).

Three kinds of rows: ``sampled`` (q = softmax of draft_logits), ``one-hot`` (deterministic proposals such as
looked-up tokens: draft_logits None, accept with p(x), residual p without x) and ``greedy`` (temperature 0:
argmax against the draft); the sampled rows again with top-k 50 and top-p 0.9, timed against the plain sampled
rows (no eager counterpart). On CUDA each kind is also timed with one block per request walking its rows
(``DSPARK_CUDA_REJECTION_SPLIT=0``) against the default split kernels. The bit-exact reference
(dspark.reference.rejection_sample_ref) is checked first on a small case of each kind (and a mixed batch).

python benchmarks/bench_rejection_sample.py [--quick] [--device cuda] [--json out.json]
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import dspark  # noqa: E402
from benchmarks.common import Row, parse_args, report, time_fn, time_fn_with_env  # noqa: E402
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


def eager_one_hot(tl, qo, drafts, vl, temp, gen_seed):
    """Plain torch for deterministic proposals: p for every row, accept iff u < p(x), residual p without x."""
    g = torch.Generator(device=tl.device).manual_seed(gen_seed)
    R = drafts.shape[0]
    p_all = torch.softmax(tl.float() / temp.repeat_interleave(vl.long())[:, None], -1)
    u = torch.rand(R, GAMMA, generator=g, device=tl.device)
    out = []
    for r in range(R):
        base, n = int(qo[r]), int(vl[r])
        tok = None
        for i in range(n - 1):
            p, x = p_all[base + i], int(drafts[r, i])
            if u[r, i] >= p[x]:
                tok = torch.multinomial(p.index_fill(0, drafts[r, i : i + 1], 0.0), 1, generator=g)
                break
        if tok is None:
            tok = torch.multinomial(p_all[base + n - 1], 1, generator=g)
        out.append(tok)
    return out


def check_against_reference() -> None:
    small = ragged_verify_inputs(seed=0)
    tl, qo, z, drafts, vl, temp = small
    mixed = torch.arange(z.shape[0]) % 2 == 0
    for zz, kw in ((z, {}), (None, {}), (z, {"draft_one_hot": mixed})):
        o = dspark.ops.rejection_sample(tl, qo, zz, drafts, vl, temp, 1, 2, **kw)
        r = rejection_sample_ref(tl, qo, zz, drafts, vl, temp, 1, 2, **kw)
        label = "one-hot" if zz is None else f"sampled {kw}"
        assert torch.equal(o[0], r[0]) and torch.equal(o[1], r[1]), label


def eager_greedy(tl, qo, drafts, vl):
    """Plain torch for greedy rows: every row's argmax, accepted while it equals the draft."""
    R, G = drafts.shape
    arg = tl.argmax(-1)
    steps = torch.arange(G + 1, device=tl.device)
    rows = torch.minimum(qo[:-1, None].long() + steps, qo[1:, None].long() - 1)
    out = arg[rows]
    match = (out[:, :G] == drafts) & (steps[None, :G] < vl[:, None].long() - 1)
    return match.long().cumprod(1).sum(1), out


def main() -> None:
    args = parse_args(__doc__)
    dev = args.device
    check_against_reference()
    if args.quick:
        cases, budget = [(8, 49152)], 0.05
    elif dev == "cuda":
        cases, budget = [(R, V) for R in (1, 8, 64) for V in (49152, 151936)], 0.3
    else:
        cases, budget = [(1, 49152), (8, 49152), (64, 49152), (8, 151936)], 0.2
    rows = []
    for R, V in cases:
        a = verify_inputs(R, V, GAMMA, torch.float32, dev, seed=R)
        tl, qo, _, drafts, vl, temp = a
        one_hot = [tl, qo, None, drafts, vl, temp]  # the same drafts as deterministic proposals
        greedy = [tl, qo, None, drafts, vl, torch.zeros_like(temp)]
        for kind, op_args, ref_fn in (
            ("sampled", a, lambda a=a: eager(*a, 0)),
            ("one-hot", one_hot, lambda t=(tl, qo, drafts, vl, temp): eager_one_hot(*t, 0)),
            ("greedy", greedy, lambda t=(tl, qo, drafts, vl): eager_greedy(*t)),
        ):
            acc, _ = dspark.ops.rejection_sample(*op_args, 1, 2)
            t_op = time_fn(lambda o=op_args: dspark.ops.rejection_sample(*o, 1, 2), dev, budget)
            t_ref = time_fn(ref_fn, dev, budget)
            verified = int((acc.cpu() + 1).sum())  # rows whose softmax was computed (at most)
            extra = {"mean_accepted": float(acc.float().mean()), "rows_read": verified}
            if kind == "greedy":  # the eager argmax chain gives the same accepted counts
                assert torch.equal(acc.long().cpu(), ref_fn()[0].cpu()), "greedy: accepted counts differ"
            if dev == "cuda":  # the split kernels (rows over the vocabulary) vs one block per request
                op = lambda o=op_args: dspark.ops.rejection_sample(*o, 1, 2)  # noqa: E731
                t_block = time_fn_with_env("DSPARK_CUDA_REJECTION_SPLIT", "0", op, dev, budget)
                extra |= {
                    "one-block kernel (us)": t_block.median_us,
                    "split vs one block": t_block.median_us / t_op.median_us,
                }
            rows.append(Row({"drafts": kind, "R": R, "V": V, "gamma": GAMMA}, dev, t_op, t_ref, extra))
            if kind == "sampled":
                t_plain = t_op
        # the same sampled rows with top-k / top-p (no eager counterpart): their cost against the plain rows
        for kind, procs in (
            ("sampled top-k 50", {"top_k": torch.full((R,), 50, device=dev)}),
            ("sampled top-p 0.9", {"top_p": torch.full((R,), 0.9, device=dev)}),
        ):
            op = lambda a=a, p=procs: dspark.ops.rejection_sample(*a, 1, 2, **p)  # noqa: E731
            t_op = time_fn(op, dev, budget)
            extra = {"vs plain sampled": t_op.median_us / t_plain.median_us}
            if dev == "cuda":
                t_block = time_fn_with_env("DSPARK_CUDA_REJECTION_SPLIT", "0", op, dev, budget)
                extra |= {
                    "one-block kernel (us)": t_block.median_us,
                    "split vs one block": t_block.median_us / t_op.median_us,
                }
            rows.append(Row({"drafts": kind, "R": R, "V": V, "gamma": GAMMA}, dev, t_op, None, extra))
    report("rejection_sample vs eager verifier", rows, args, ["drafts", "R", "V", "gamma"])


if __name__ == "__main__":
    main()
