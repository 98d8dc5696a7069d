# SPDX-License-Identifier: Apache-2.0
"""markov_sample_from_hidden on CUDA: the fused tensor-core kernel (bf16 / fp16, H % 8 == 0, r % 16 == 0)
equals the CPU op bit for bit where every sum of U is exact (integer inputs: any summation order gives the
same U, so a wrong fragment or k-permutation shows), meets contract C4 against the CPU op otherwise
(tests/ops/markov_c4.py), runs where it should and falls back to cuBLAS + markov_sample where it cannot;
opcheck on CUDA."""

import pytest
import torch

import dspark
from dspark.reference import base_logits_ref
from tests.ops.cuda_switches import kernel_names, set_switch
from tests.ops.graph_replay import assert_replays_follow_the_counter
from tests.ops.markov_c4 import assert_c4, u_tolerance
from tests.ops.test_markov_sample_from_hidden import hidden_inputs

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

# R G past one 64-row tile and V past one 128-id tile; H and r not multiples of the 64-column chunk
SHAPES = [(1, 1, 7, 8, 16), (3, 4, 300, 72, 16), (9, 7, 5000, 576, 80)]
BIG = (64, 7, 49152, 256, 256)  # seven 64-row tiles, 384 id tiles (one dtype: the CPU side is slow)


@pytest.mark.parametrize("R,G,V,H,r", SHAPES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("kernel", ["tensor_cores", "fallback"])
def test_cuda_equals_cpu_where_u_is_exact(R, G, V, H, r, dtype, kernel, monkeypatch):
    set_switch(monkeypatch, "DSPARK_CUDA_TENSOR_CORES", kernel == "tensor_cores")
    args = hidden_inputs(R, G, V, H, r, dtype, seed=R + H, integer=True)
    ids = torch.randint(0, 2**32, (R,))
    cpu = dspark.ops.markov_sample_from_hidden(*args, 7, 3, ids)
    gpu = dspark.ops.markov_sample_from_hidden(*(a.cuda() for a in args), 7, 3, ids.cuda())
    hidden, lm_head, anchor, w1, w2, temp = args
    u_args = (base_logits_ref(hidden, lm_head), anchor, w1, w2, temp)
    # U is exact on both sides; only the Markov bias's order differs on tensor cores (C4 with u_tol = 0)
    assert assert_c4(u_args, cpu, gpu, 7, 3, ids) <= max(1, R // 16)


@pytest.mark.parametrize(
    "R,G,V,H,r,dtype",
    [(*shape, dtype) for shape in SHAPES for dtype in (torch.float32, torch.bfloat16, torch.float16)]
    + [(*BIG, torch.bfloat16)],
)
def test_cuda_against_cpu_c4(R, G, V, H, r, dtype):
    args = hidden_inputs(R, G, V, H, r, dtype, seed=V + r)
    ids = torch.randint(0, 2**32, (R,))
    cpu = dspark.ops.markov_sample_from_hidden(*args, 7, 3, ids)
    gpu = dspark.ops.markov_sample_from_hidden(*(a.cuda() for a in args), 7, 3, ids.cuda())
    hidden, lm_head, anchor, w1, w2, temp = args
    u_args = (base_logits_ref(hidden, lm_head), anchor, w1, w2, temp)
    assert assert_c4(u_args, cpu, gpu, 7, 3, ids, u_tol=u_tolerance(hidden, lm_head)) <= max(1, R // 16)


def test_cuda_u_exact_check_catches_a_wrong_row():
    # negative control on the device: the fused kernel's output for a perturbed LM head fails the exact check
    hidden, lm_head, anchor, w1, w2, temp = hidden_inputs(
        4, 3, 700, 64, 16, torch.bfloat16, seed=2, integer=True
    )
    ids = torch.arange(4)
    cpu = dspark.ops.markov_sample_from_hidden(hidden, lm_head, anchor, w1, w2, temp, 7, 3, ids)
    wrong = lm_head.clone()
    wrong[300] += 1.0
    gpu = dspark.ops.markov_sample_from_hidden(
        hidden.cuda(), wrong.cuda(), anchor.cuda(), w1.cuda(), w2.cuda(), temp.cuda(), 7, 3, ids.cuda()
    )
    u_args = (base_logits_ref(hidden, lm_head), anchor, w1, w2, temp)
    with pytest.raises(AssertionError, match="z off by"):
        assert_c4(u_args, cpu, gpu, 7, 3, ids)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_cuda_fused_kernel_runs_where_it_applies(dtype, monkeypatch):
    # a silent fallback would pass every accuracy test: the fused kernel must be the one that runs for 16-bit
    # operands with H % 8 == 0 and r % 16 == 0, and must not run for fp32, H % 8 != 0 or tensor cores off
    def kernels_run(args):
        return kernel_names(lambda: dspark.ops.markov_sample_from_hidden(*args, 1, 2, None))

    fused = [a.cuda() for a in hidden_inputs(8, 3, 4000, 64, 64, dtype, seed=1)]
    names = kernels_run(fused)
    assert "MarkovHiddenMmaKernel" in names and "MarkovMmaStepKernel" in names, names
    odd_h = [a.cuda() for a in hidden_inputs(8, 3, 4000, 60, 64, dtype, seed=1)]
    fp32 = [a.cuda() for a in hidden_inputs(8, 3, 4000, 64, 64, torch.float32, seed=1)]
    for args in (odd_h, fp32):
        assert "MarkovHiddenMmaKernel" not in kernels_run(args)
    set_switch(monkeypatch, "DSPARK_CUDA_TENSOR_CORES", False)
    assert "MarkovHiddenMmaKernel" not in kernels_run(fused)


def test_cuda_bad_device_is_named():
    h, lm, a, w1, w2, t = hidden_inputs(2, 3, 20, 8, 16)
    with pytest.raises(ValueError, match="lm_head is on cpu but hidden is on cuda"):
        dspark.ops.markov_sample_from_hidden(h.cuda(), lm, a.cuda(), w1.cuda(), w2.cuda(), t.cuda(), 0, 0)


def test_opcheck_cuda():
    args = [a.cuda() for a in hidden_inputs(2, 3, 40, 16, 16, torch.bfloat16)]
    torch.library.opcheck(torch.ops.dspark.markov_sample_from_hidden.default, (*args, 1, 2, None))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_graph_replays_draw_with_the_refilled_round_offset(dtype):
    # bf16: the fused kernel (first slot) and the tensor-core steps; fp32: cuBLAS + markov_sample
    args = [a.cuda() for a in hidden_inputs(8, 4, 3000, 64, 64, dtype, seed=5)]
    args[5] = torch.ones(8, device="cuda")
    assert_replays_follow_the_counter(dspark.ops.markov_sample_from_hidden, args, 7, 3)
