# SPDX-License-Identifier: Apache-2.0
"""markov_sample on CUDA: the CUDA-core kernel equals the CPU op bit for bit (tokens, z, prev_emb); the
tensor-core kernel (bf16 / fp16 tables, rank % 16 == 0) meets contract C4 against it (tests/ops/markov_c4.py);
opcheck on CUDA."""

import pytest
import torch

import dspark
from tests.ops.cuda_switches import kernel_names, set_switch
from tests.ops.graph_replay import assert_replays_follow_the_counter
from tests.ops.markov_c4 import assert_c4
from tests.ops.test_markov_sample import markov_inputs

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


@pytest.mark.parametrize("R,G,V,r", [(1, 1, 7, 1), (3, 4, 300, 12), (9, 7, 5000, 64), (64, 7, 49152, 256)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("kernel", ["tensor_cores", "cuda_cores"])
def test_cuda_against_cpu(R, G, V, r, dtype, kernel, monkeypatch):
    set_switch(monkeypatch, "DSPARK_CUDA_TENSOR_CORES", kernel != "cuda_cores")
    args = markov_inputs(R, G, V, r, dtype, dtype, seed=R)
    ids = torch.randint(0, 2**32, (R,))
    cpu = dspark.ops.markov_sample(*args, 7, 3, ids)
    gpu = dspark.ops.markov_sample(*(a.cuda() for a in args), 7, 3, ids.cuda())
    if kernel == "tensor_cores" and dtype != torch.float32 and r % 16 == 0:
        assert assert_c4(args, cpu, gpu, 7, 3, ids) <= max(1, R // 16)  # near-ties are rare
        return
    for name, c, g in zip(("tokens", "draft_logits", "prev_emb"), cpu, gpu, strict=True):
        assert torch.equal(c, g.cpu()), name


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_cuda_16_bit_tables_run_on_tensor_cores(dtype, monkeypatch):
    # the tensor-core kernel is the one that runs for 16-bit tables of rank % 16 == 0 (a silent fallback to the
    # CUDA-core kernel would pass every accuracy test); DSPARK_CUDA_TENSOR_CORES=0 switches it off
    args = [a.cuda() for a in markov_inputs(8, 3, 4000, 64, dtype, dtype, seed=1)]

    def kernels_run():
        return kernel_names(lambda: dspark.ops.markov_sample(*args, 1, 2, None))

    set_switch(monkeypatch, "DSPARK_CUDA_TENSOR_CORES", True)
    assert "MarkovMmaStepKernel" in kernels_run()
    set_switch(monkeypatch, "DSPARK_CUDA_TENSOR_CORES", False)
    names = kernels_run()
    assert "MarkovStepKernel" in names and "MarkovMmaStepKernel" not in names, names


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cuda_w2_off_16_byte_alignment_equals_cpu(dtype):
    """A W2 whose data starts one element past a 16-byte boundary takes the CUDA-core kernel's scalar path
    (its 8-wide loads need the alignment; the tensor-core kernel's pair loads need 4 bytes); it matches the
    CPU op bit for bit."""
    U, anchor, w1, w2, temp = markov_inputs(9, 5, 3000, 64, dtype, dtype, seed=4)
    flat = torch.empty(w2.numel() + 1, dtype=dtype, device="cuda")
    w2_gpu = flat[1:].view_as(w2)
    w2_gpu.copy_(w2)
    assert w2_gpu.is_contiguous() and w2_gpu.data_ptr() % 16 != 0
    ids = torch.randint(0, 2**32, (9,))
    cpu = dspark.ops.markov_sample(U, anchor, w1, w2, temp, 7, 3, ids)
    gpu = dspark.ops.markov_sample(U.cuda(), anchor.cuda(), w1.cuda(), w2_gpu, temp.cuda(), 7, 3, ids.cuda())
    for name, c, g in zip(("tokens", "draft_logits", "prev_emb"), cpu, gpu, strict=True):
        assert torch.equal(c, g.cpu()), name


def test_opcheck_cuda():
    args = [a.cuda() for a in markov_inputs(2, 3, 40, 4)]
    torch.library.opcheck(torch.ops.dspark.markov_sample.default, (*args, 1, 2, None))


@pytest.mark.parametrize("dtype,r", [(torch.float32, 12), (torch.bfloat16, 64)])
def test_graph_replays_draw_with_the_refilled_round_offset(dtype, r):
    # fp32 runs the CUDA-core kernel, bf16 with r % 16 == 0 the tensor-core one: both read the counter
    args = [a.cuda() for a in markov_inputs(8, 4, 3000, r, dtype, dtype, seed=5)]
    args[4] = torch.ones(8, device="cuda")  # sampled rows: the offset keys their noise
    assert_replays_follow_the_counter(dspark.ops.markov_sample, args, 7, 3)
