# SPDX-License-Identifier: Apache-2.0
"""The ``dspark`` command line: ``dspark info`` and ``dspark demo``."""

from __future__ import annotations

import argparse
import json
import sys

import torch


def _info(_: argparse.Namespace) -> int:
    import dspark

    print(json.dumps(dspark.build_info(), indent=2))
    return 0


def _demo(args: argparse.Namespace) -> int:
    """A short tour of the planner ops on synthetic drafter outputs: confidence -> survival -> verify plan."""
    import dspark
    from dspark import Planner, SpsTable

    info = dspark.build_info()
    cuda = "CUDA kernels for " + ", ".join(info["cuda_archs"]) if info["cuda"] else "CPU kernels only"
    print(f"dspark {info['version']} (built against torch {info['torch_version']}; {cuda})")
    g = torch.Generator().manual_seed(args.seed)
    R, gamma, H, r = args.requests, args.gamma, 64, 8
    hidden = torch.randn(R, gamma, H, generator=g)
    prev_emb = torch.randn(R, gamma, r, generator=g)
    weight = torch.randn(H + r, generator=g) * 0.3
    # request-specific offsets so some requests look easy to draft and others hard
    bias = torch.tensor(1.5)
    hidden += torch.linspace(2.0, -2.0, R).view(R, 1, 1) * weight[:H] / weight[:H].norm() ** 2
    _, conf, surv = dspark.ops.confidence(hidden, prev_emb, weight, bias, torch.ones(gamma))
    # a cost curve shaped like a small model on a CPU: 8 tokens cost ~2 decode steps
    table = SpsTable((1, 2, 4, 8, 16, 32, 64, 128), (25.0, 24.0, 16.0, 13.0, 12.0, 9.0, 6.0, 3.5), 128)
    print(f"\n{R} requests, gamma = {gamma}; survival a[r, j] = prod c (rows: requests):")
    for i in range(R):
        print(f"  r{i:<2d} " + " ".join(f"{x:5.2f}" for x in surv[i].tolist()))
    print("\nverify lengths (anchor + admitted drafts) per planner mode, with the SPS table above:")
    lagged = surv.roll(1, dims=0)  # stands in for the previous round's survival
    for mode in ("full", "threshold", "early_stop", "lagged_topk"):
        p = Planner(mode, table, threshold=0.6)
        if mode == "lagged_topk":
            p.plan(lagged)
        res = p.plan(surv)
        vl = res.verify_len
        B = int(vl.sum())
        tau = R + sum(float(surv[i, : int(vl[i]) - 1].double().sum()) for i in range(R))
        sps = dspark.reference.sps_ceil_ref(
            list(table.sample_batch_tokens), list(table.sample_steps_per_sec), B
        )
        print(
            f"  {mode:12s} {vl.tolist()}  B = {B:3d}  expected tokens/round = {tau:5.2f}  "
            f"expected tokens/s = {tau * sps:6.1f}"
        )
    print("\n(the end-to-end decoder demo on SmolLM2-135M-Instruct comes with DSparkDecoder)")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="dspark", description=__doc__)
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("info", help="print how the extension was built").set_defaults(fn=_info)
    d = sub.add_parser("demo", help="a short tour of the ops")
    d.add_argument("--requests", type=int, default=6)
    d.add_argument("--gamma", type=int, default=7)
    d.add_argument("--seed", type=int, default=0)
    d.set_defaults(fn=_demo)
    args = ap.parse_args(argv)
    return args.fn(args)


if __name__ == "__main__":
    sys.exit(main())
