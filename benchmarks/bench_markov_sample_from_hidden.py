# SPDX-License-Identifier: Apache-2.0
"""markov_sample_from_hidden against the unfused pair it replaces: the LM head (``F.linear`` in the operands'
dtype, as the drafter runs it) followed by ``markov_sample``, per R, V, H, r (gamma = 7).

On CUDA the operands are bf16: the op runs the fused tensor-core kernel (U for every slot and the first
slot's draw in one GEMM over the LM head, later slots in place) and is also timed with
``DSPARK_CUDA_TENSOR_CORES=0`` (its fallback: cuBLAS in fp32, then markov_sample). The bytes column counts
what one call must move at least: the LM head and W2 once, W2 again per later slot, h, and z written once
per slot (the GB/s column is that over the op's median time). On CPU (fp32) the op is one fp32 matmul plus
markov_sample, so the ratio shows the cost of composing them in C++ rather than a fusion.

python benchmarks/bench_markov_sample_from_hidden.py [--quick] [--device cuda] [--json out.json]
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import dspark  # noqa: E402
from benchmarks.common import Row, parse_args, report, time_fn, time_fn_with_env  # noqa: E402
from dspark.reference import markov_sample_from_hidden_ref  # noqa: E402

GAMMA = 7


def inputs(R, V, H, r, dtype, device, seed=0):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(R, GAMMA, H, generator=g).to(dtype)
    lm_head = (torch.randn(V, H, generator=g) / H**0.5).to(dtype)
    w1 = torch.randn(V, r, generator=g).to(dtype)
    w2 = (torch.randn(V, r, generator=g) / r**0.5).to(dtype)
    anchor = torch.randint(0, V, (R,), generator=g)
    temp = torch.ones(R)
    return [t.to(device) for t in (hidden, lm_head, anchor, w1, w2, temp)]


def unfused(hidden, lm_head, anchor, w1, w2, temp, seed, offset):
    R, G, H = hidden.shape
    U = F.linear(hidden.reshape(R * G, H), lm_head).view(R, G, -1)
    return dspark.ops.markov_sample(U, anchor, w1, w2, temp, seed, offset)


def main() -> None:
    args = parse_args(__doc__)
    dev = args.device
    small = inputs(3, 700, 32, 16, torch.float32, "cpu")
    out, ref = dspark.ops.markov_sample_from_hidden(*small, 1, 2), markov_sample_from_hidden_ref(*small, 1, 2)
    assert int((out[0][:, 0] != ref[0][:, 0]).sum()) <= 1, "first-slot tokens differ from the reference"
    if args.quick:
        cases, budget = [(8, 8192, 576, 64)], 0.05
    elif (
        dev == "cuda"
    ):  # SmolLM2-135M-shaped drafter (V 49,152, H 576) and Qwen3-8B-shaped (V 151,936, H 4,096)
        cases = [(R, V, H, r) for R in (1, 8, 64) for V, H, r in ((49152, 576, 64), (151936, 4096, 256))]
        budget = 0.3
    else:
        cases, budget = (
            [(1, 49152, 576, 64), (8, 49152, 576, 64), (1, 8192, 576, 64), (8, 8192, 576, 64)],
            0.2,
        )
    dtype = torch.bfloat16 if dev == "cuda" else torch.float32
    rows = []
    for R, V, H, r in cases:
        a = inputs(R, V, H, r, dtype, dev, seed=R)
        x = dspark.ops.markov_sample_from_hidden(*a, 1, 2)[0]
        xu = unfused(*a, 1, 2)[0]
        # the unfused pair rounds U to the operands' dtype on CUDA: first-slot tokens may differ at near-ties
        assert int((x[:, 0] != xu[:, 0]).sum()) <= max(1, R // 8), (
            "first-slot tokens differ from the unfused pair"
        )
        op = lambda a=a: dspark.ops.markov_sample_from_hidden(*a, 1, 2)  # noqa: E731
        t_op = time_fn(op, dev, budget)
        t_ref = time_fn(lambda a=a: unfused(*a, 1, 2), dev, budget)
        e = a[1].element_size()
        nbytes = V * H * e + GAMMA * V * r * e + R * GAMMA * H * e + GAMMA * R * V * 4
        extra = {"bytes": nbytes, "GB/s": nbytes / (t_op.median_us * 1e3)}
        if dev == "cuda":
            t_fb = time_fn_with_env("DSPARK_CUDA_TENSOR_CORES", "0", op, dev, budget)
            extra |= {"fallback (us)": t_fb.median_us, "fused vs fallback": t_fb.median_us / t_op.median_us}
        rows.append(Row({"R": R, "V": V, "H": H, "r": r, "dtype": str(dtype)[6:]}, dev, t_op, t_ref, extra))
    report("markov_sample_from_hidden vs F.linear + markov_sample", rows, args, ["R", "V", "H", "r", "dtype"])


if __name__ == "__main__":
    main()
