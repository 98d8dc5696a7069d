# SPDX-License-Identifier: Apache-2.0
"""CUDA paged_kv_append / paged_verify_attention: same results as the CPU ops and the flash-attention error rule."""

from __future__ import annotations

import pytest
import torch

import dspark
from tests.ops.cuda_switches import kernel_names, set_switch
from tests.ops.test_paged_verify_attention import (
    CASES,
    FLOOR,
    assert_alone_as_in_batch,
    assert_fa_rule,
    make_paged,
)

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

EXTRA = [
    # one request, long KV: many KV splits; GQA group of 8 with 16 rows: two row tiles per CTA
    ("split_long", [16], [5000], 32, 4, 128, 16),
    ("split_many_short", [1] * 40, [3] * 20 + [700] * 20, 8, 8, 64, 16),
    ("generic_d256", [3, 20], [40, 20], 2, 1, 256, 16),
    # split requests (16 and 2 splits) beside a prefill and an unsplit one: workspace rows packed past them
    ("split_beside_prefill", [40, 16, 1, 3], [40, 9000, 600, 200], 8, 2, 64, 16),
    # a prefill of 19 row tiles of 64 rows: the 16 CTAs of its (KV head, request) take tiles i, i + 16
    ("prefill_many_tiles", [300, 5], [300, 700], 8, 2, 64, 16),
]


# (dtype, kernel): bf16 / fp16 at head_dim 64 / 128 run on tensor cores unless DSPARK_CUDA_TENSOR_CORES=0
KERNELS = [
    (torch.float32, "cuda_cores"),
    (torch.bfloat16, "tensor_cores"),
    (torch.bfloat16, "cuda_cores"),
    (torch.float16, "tensor_cores"),
    (torch.float16, "cuda_cores"),
]


def choose_kernel(kernel, monkeypatch):
    set_switch(monkeypatch, "DSPARK_CUDA_TENSOR_CORES", kernel != "cuda_cores")


@pytest.mark.parametrize("name,n_q,n_kv,Hq,Hkv,D,ps", CASES + EXTRA, ids=[c[0] for c in CASES + EXTRA])
@pytest.mark.parametrize("dtype,kernel", KERNELS, ids=[f"{str(d)[6:]}-{k}" for d, k in KERNELS])
@pytest.mark.parametrize("causal", [True, False])
def test_cuda_matches_cpu_and_reference(name, n_q, n_kv, Hq, Hkv, D, ps, dtype, kernel, causal, monkeypatch):
    choose_kernel(kernel, monkeypatch)
    args = make_paged(n_q, n_kv, Hq, Hkv, D, ps, dtype, seed=len(name))
    scale = D**-0.5
    cpu = dspark.ops.paged_verify_attention(*args, scale, causal)
    cuda = dspark.ops.paged_verify_attention(*(t.cuda() for t in args), scale, causal).cpu()
    assert cuda.dtype == dtype and cuda.shape == cpu.shape
    assert_fa_rule(cuda, args, scale, causal, FLOOR[dtype])
    tol = 1e-5 if dtype == torch.float32 else 1e-2
    torch.testing.assert_close(cuda.float(), cpu.float(), atol=tol, rtol=tol)


@pytest.mark.parametrize("dtype,kernel", KERNELS[:3], ids=[f"{str(d)[6:]}-{k}" for d, k in KERNELS[:3]])
@pytest.mark.parametrize("D", [64, 128])
def test_cuda_a_request_attends_alike_alone_and_in_a_batch(dtype, kernel, D, monkeypatch):
    choose_kernel(kernel, monkeypatch)
    # C2: a request's split count follows its own query and key counts, never R, T or the GPU's size, so its
    # rows are bit for bit the same alone and in a batch (with 8 KV heads a split count chosen to fill the SMs
    # differs between R = 1 and R = 5, so this fails for such a plan)
    assert_alone_as_in_batch(
        [3, 4, 1, 40, 16], [70, 1500, 2600, 60, 5000], Hq=16, Hkv=8, D=D, dtype=dtype, device="cuda"
    )


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_cuda_16_bit_inputs_run_on_tensor_cores(dtype, monkeypatch):
    # the tensor-core kernel is the one that runs for bf16 / fp16 (a launcher that silently fell back to the
    # CUDA-core kernel would pass every accuracy test); DSPARK_CUDA_TENSOR_CORES=0 switches it off
    args = tuple(t.cuda() for t in make_paged([4, 16], [300, 2000], 8, 2, 128, 16, dtype, seed=4))

    def kernels_run():
        return kernel_names(lambda: dspark.ops.paged_verify_attention(*args, 128**-0.5, True))

    set_switch(monkeypatch, "DSPARK_CUDA_TENSOR_CORES", True)
    names = kernels_run()
    assert "PvaMmaKernel" in names and "PvaSplitKernel" not in names, names
    set_switch(monkeypatch, "DSPARK_CUDA_TENSOR_CORES", False)
    names = kernels_run()
    assert "PvaSplitKernel" in names and "PvaMmaKernel" not in names, names


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cuda_empty_rows_are_zero(dtype):
    # request 1 has no keys; request 2 has 4 queries over 2 keys (causal: its first 2 rows see none)
    args = make_paged([0, 2, 4], [7, 0, 2], Hq=2, Hkv=1, D=64, page_size=4, dtype=dtype, seed=2)
    out = dspark.ops.paged_verify_attention(*(t.cuda() for t in args), 0.125, True).cpu()
    assert torch.equal(out[:4], torch.zeros_like(out[:4]))
    tol = 1e-5 if dtype == torch.float32 else 1e-2
    torch.testing.assert_close(out, dspark.ops.paged_verify_attention(*args, 0.125, True), atol=tol, rtol=tol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("D", [64, 3])
def test_cuda_kv_append_is_bit_exact(dtype, D):
    g = torch.Generator().manual_seed(D)
    k, v = torch.randn(9, 2, D, generator=g).to(dtype), torch.randn(9, 2, D, generator=g).to(dtype)
    kc, vc = torch.zeros(6, 4, 2, D, dtype=dtype), torch.zeros(6, 4, 2, D, dtype=dtype)
    slots = torch.randperm(24, generator=g)[:9]
    slots[3] = -1
    kcc, vcc = kc.cuda(), vc.cuda()
    dspark.ops.paged_kv_append(k.cuda(), v.cuda(), kcc, vcc, slots.cuda())
    dspark.ops.paged_kv_append(k, v, kc, vc, slots)
    assert torch.equal(kcc.cpu(), kc) and torch.equal(vcc.cpu(), vc)


@pytest.mark.parametrize("dtype,kernel", KERNELS, ids=[f"{str(d)[6:]}-{k}" for d, k in KERNELS])
def test_cuda_split_base_given_once_equals_the_op_planning_itself(dtype, kernel, monkeypatch):
    """A forward hands every layer the plan it computed once on the host: the same output, bit for bit, as the
    op planning on the device per call (same kernels, same plan), and the plan kernel no longer runs."""
    choose_kernel(kernel, monkeypatch)
    n_q, n_kv = [40, 16, 1, 3, 17, 8], [40, 9000, 600, 200, 300, 2500]  # split, unsplit and prefill rows
    args = tuple(t.cuda() for t in make_paged(n_q, n_kv, 8, 2, 128, 16, dtype, seed=9))
    qo = [0, *torch.tensor(n_q).cumsum(0).tolist()]
    plan = torch.tensor(dspark.ops.paged_verify_attention_split_base(qo), dtype=torch.int32, device="cuda")
    want = dspark.ops.paged_verify_attention(*args, 128**-0.5, True)
    got = dspark.ops.paged_verify_attention(*args, 128**-0.5, True, plan)
    assert torch.equal(got, want)
    names = kernel_names(lambda: dspark.ops.paged_verify_attention(*args, 128**-0.5, True, plan))
    assert "PvaPlanKernel" not in names and "PvaMergeKernel" in names, names
    assert "PvaPlanKernel" in kernel_names(lambda: dspark.ops.paged_verify_attention(*args, 128**-0.5, True))


def test_cuda_opcheck():
    args = tuple(t.cuda() for t in make_paged([2, 3], [9, 300], seed=5))
    torch.library.opcheck(torch.ops.dspark.paged_verify_attention.default, (*args, 0.125, True))
    plan = torch.tensor([0, 2], dtype=torch.int32, device="cuda")
    torch.library.opcheck(torch.ops.dspark.paged_verify_attention.default, (*args, 0.125, True, plan))
