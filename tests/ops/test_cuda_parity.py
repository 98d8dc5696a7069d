# SPDX-License-Identifier: Apache-2.0
"""CUDA kernels against the CPU ops on the same inputs (skipped without a GPU and a CUDA build of dspark).

philox_draw and plan_verify must be bit-identical to the CPU (shared math in include/dspark); confidence may
differ only by the dot products' summation order. Also: opcheck on CUDA, no host sync, CUDA-graph replay.
"""

import pytest
import torch

import dspark
from tests.ops.cuda_switches import kernel_names
from tests.ops.samples import confidence_inputs, sps_table, survival_batch

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

MODES = ["full", "threshold", "early_stop", "lagged_topk"]
CUDA = "cuda"


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.int32).cpu()


def _cuda(*ts):
    return tuple(t.to(CUDA) if isinstance(t, torch.Tensor) else t for t in ts)


def test_build_has_cuda_kernels():
    info = dspark.build_info()
    assert info["cuda"] is True, info
    for op in ("philox_draw", "confidence", "plan_verify"):
        assert torch._C._dispatch_has_kernel_for_dispatch_key(f"dspark::{op}", "CUDA"), op


# --- philox_draw ---------------------------------------------------------------------------------------------


def _philox_keys(n: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    request = torch.randint(0, 2**32, (n,), generator=g, dtype=torch.int64)
    position = torch.randint(0, 2**16, (n,), generator=g, dtype=torch.int64)
    index = torch.randint(0, 2**34, (n,), generator=g, dtype=torch.int64)
    # the edges of every field
    k = min(n, 4)
    request[:k] = torch.tensor([0, 2**32 - 1, 1, 2**31])[:k]
    position[:k] = torch.tensor([0, 2**16 - 1, 1, 2**15])[:k]
    index[:k] = torch.tensor([0, 2**34 - 1, 3, 4])[:k]
    return request, position, index


@pytest.mark.parametrize("n", [1, 7, 4096, 100_003])
@pytest.mark.parametrize("seed, offset", [(0, 0), (1234, 7), (2**63 - 1, 2**40 + 5), (-1, -(2**62))])
@pytest.mark.parametrize("purpose", [0, 1, 2, 3, 65535])
def test_philox_draw_bit_identical(n, seed, offset, purpose):
    request, position, index = _philox_keys(n, seed=n + purpose)
    u_cpu, g_cpu = dspark.ops.philox_draw(seed, offset, request, position, purpose, index)
    u_gpu, g_gpu = dspark.ops.philox_draw(seed, offset, *_cuda(request, position), purpose, index.to(CUDA))
    assert u_gpu.is_cuda and u_gpu.dtype == torch.float32 and u_gpu.shape == (n,)
    assert torch.equal(_bits(u_gpu), _bits(u_cpu))
    assert torch.equal(_bits(g_gpu), _bits(g_cpu))


def test_philox_draw_non_contiguous_and_empty():
    request, position, index = _philox_keys(2000, seed=3)
    args_cpu = (request[::2], position[::2], index[::2])
    args_gpu = tuple(t.to(CUDA)[::2] for t in (request, position, index))
    assert not args_gpu[0].is_contiguous()
    u_cpu, g_cpu = dspark.ops.philox_draw(5, 6, args_cpu[0], args_cpu[1], 2, args_cpu[2])
    u_gpu, g_gpu = dspark.ops.philox_draw(5, 6, args_gpu[0], args_gpu[1], 2, args_gpu[2])
    assert torch.equal(_bits(u_gpu), _bits(u_cpu)) and torch.equal(_bits(g_gpu), _bits(g_cpu))
    e = torch.empty(0, dtype=torch.int64, device=CUDA)
    u, g = dspark.ops.philox_draw(0, 0, e, e, 0, e)
    assert u.shape == (0,) and g.shape == (0,) and u.is_cuda


# --- plan_verify ---------------------------------------------------------------------------------------------


# R * gamma up to 4,096 runs in one CTA (sort, scan and admit in shared memory); 1000 x 7 and 1000 x 15 take
# the two-kernel path (rank, then the sequential walk).
@pytest.mark.parametrize("R", [1, 3, 64, 256, 1000])
@pytest.mark.parametrize("gamma", [1, 4, 7, 15])
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("sps_kind", ["decaying", "jagged", "flat", "steep"])
def test_plan_verify_identical(R, gamma, mode, sps_kind):
    seed = R * 1000 + gamma * 10 + MODES.index(mode)
    surv = survival_batch(R, gamma, seed=seed)
    lagged = survival_batch(R, gamma, seed=seed + 1)
    tokens, rate = sps_table(sps_kind, seed=seed)
    for threshold in (0.0, 0.7) if mode == "threshold" else (0.7,):
        vl_cpu, b_cpu = dspark.ops.plan_verify(surv, tokens, rate, mode, lagged, threshold)
        vl_gpu, b_gpu = dspark.ops.plan_verify(*_cuda(surv, tokens, rate), mode, lagged.to(CUDA), threshold)
        assert vl_gpu.is_cuda and vl_gpu.dtype == torch.int32 and vl_gpu.shape == (R,)
        assert b_gpu.is_cuda and b_gpu.dtype == torch.int64 and b_gpu.shape == ()
        assert torch.equal(vl_gpu.cpu(), vl_cpu), (mode, threshold, vl_gpu.cpu(), vl_cpu)
        assert torch.equal(b_gpu.cpu(), b_cpu), (mode, threshold, b_gpu.cpu(), b_cpu)


@pytest.mark.parametrize("mode", ["early_stop", "lagged_topk"])
def test_plan_verify_ties_and_quantised_survival(mode):
    # survivals from a handful of confidence values: many exact ties across requests and positions
    g = torch.Generator().manual_seed(11)
    levels = torch.tensor([0.0, 0.5, 0.75, 1.0])
    for R, gamma in [(4, 3), (37, 5), (200, 8), (512, 8), (600, 8)]:
        conf = levels[torch.randint(0, 4, (R, gamma), generator=g)]
        surv = torch.cumprod(conf, dim=1)
        lagged = torch.cumprod(levels[torch.randint(1, 4, (R, gamma), generator=g)], dim=1)
        for kind in ("decaying", "flat"):
            tokens, rate = sps_table(kind, seed=R)
            cpu = dspark.ops.plan_verify(surv, tokens, rate, mode, lagged)
            gpu = dspark.ops.plan_verify(*_cuda(surv, tokens, rate), mode, lagged.to(CUDA))
            assert torch.equal(gpu[0].cpu(), cpu[0]) and torch.equal(gpu[1].cpu(), cpu[1]), (R, gamma, kind)
    # all equal: admission goes by position, then request (as on the CPU)
    surv = torch.full((4, 3), 0.5)
    lagged = torch.zeros(4, 3)
    lagged[0, :2] = 1.0
    tokens, rate = torch.tensor([1, 100]), torch.tensor([10.0, 10.0], dtype=torch.float64)
    vl, k = dspark.ops.plan_verify(*_cuda(surv, tokens, rate), "lagged_topk", lagged.to(CUDA))
    assert int(k) == 2 and vl.cpu().tolist() == [2, 2, 1, 1]


@pytest.mark.parametrize("mode", ["early_stop", "lagged_topk"])
@pytest.mark.parametrize(
    ("R", "gamma", "kernel"),
    [(1, 7, "PlanOneBlock"), (256, 15, "PlanOneBlock"), (512, 8, "PlanOneBlock"), (513, 8, "PlanRank")],
)
def test_plan_verify_kernel_by_batch_size(mode, R, gamma, kernel):
    surv, lagged = survival_batch(R, gamma, seed=R), survival_batch(R, gamma, seed=R + 1)
    tokens, rate = sps_table("jagged", seed=R)
    args = (*_cuda(surv, tokens, rate), mode, lagged.to(CUDA))
    names = kernel_names(lambda: dspark.ops.plan_verify(*args))
    assert kernel in names, names
    if kernel == "PlanOneBlock":
        assert "PlanRank" not in names and "PlanFinalize" not in names, names
    cpu = dspark.ops.plan_verify(surv, tokens, rate, mode, lagged)
    gpu = dspark.ops.plan_verify(*args)
    assert torch.equal(gpu[0].cpu(), cpu[0]) and torch.equal(gpu[1].cpu(), cpu[1])


@pytest.mark.parametrize("mode", MODES)
def test_plan_verify_empty_batch_and_large_table(mode):
    # R = 0: empty verify_len, budget 0
    tokens, rate = sps_table("decaying")
    surv = torch.empty(0, 4)
    vl, b = dspark.ops.plan_verify(*_cuda(surv, tokens, rate), mode, surv.to(CUDA), 0.5)
    assert vl.shape == (0,) and vl.dtype == torch.int32 and int(b) == 0
    # an SPS table too long to stage in shared memory (read from global memory instead)
    tokens = torch.arange(1, 3001, dtype=torch.int64)
    rate = 100.0 / (1.0 + tokens.double() / 64.0)
    surv, lagged = survival_batch(32, 6, seed=5), survival_batch(32, 6, seed=6)
    cpu = dspark.ops.plan_verify(surv, tokens, rate, mode, lagged, 0.5)
    gpu = dspark.ops.plan_verify(*_cuda(surv, tokens, rate), mode, lagged.to(CUDA), 0.5)
    assert torch.equal(gpu[0].cpu(), cpu[0]) and torch.equal(gpu[1].cpu(), cpu[1])


def test_plan_verify_non_contiguous():
    surv = survival_batch(50, 7, seed=9)
    lagged = survival_batch(50, 7, seed=10)
    tokens, rate = sps_table("jagged", seed=2)
    surv_t = surv.t().contiguous().to(CUDA).t()  # same values, column-major
    assert not surv_t.is_contiguous()
    for mode in MODES:
        cpu = dspark.ops.plan_verify(surv, tokens, rate, mode, lagged, 0.6)
        gpu = dspark.ops.plan_verify(surv_t, *_cuda(tokens, rate), mode, lagged.to(CUDA), 0.6)
        assert torch.equal(gpu[0].cpu(), cpu[0]) and torch.equal(gpu[1].cpu(), cpu[1]), mode


# --- confidence ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize(
    "R, gamma, H, r", [(1, 1, 64, 8), (3, 4, 1000, 3), (5, 7, 4096, 16), (33, 16, 257, 0)]
)
def test_confidence_close(dtype, R, gamma, H, r):
    hidden, prev_emb, weight, bias, sts = confidence_inputs(R, gamma, H=H, r=r, dtype=dtype, seed=R + H)
    cpu = dspark.ops.confidence(hidden, prev_emb, weight, bias, sts)
    gpu = dspark.ops.confidence(*_cuda(hidden, prev_emb, weight, bias, sts))
    for name, c, gt in zip(("logit", "conf", "survival"), cpu, gpu, strict=True):
        assert gt.is_cuda and gt.dtype == torch.float32 and gt.shape == (R, gamma)
        torch.testing.assert_close(gt.cpu(), c, atol=1e-5, rtol=1e-5, msg=lambda m, n=name: f"{n}: {m}")
    surv = gpu[2]
    assert bool((surv[:, 1:] <= surv[:, :-1]).all()) and bool((surv <= 1).all()) and bool((surv >= 0).all())


def test_confidence_variants():
    # bias of shape [1], prev_emb of another dtype than hidden, non-contiguous hidden, a long block (gamma past
    # the shared-memory staging) and an empty batch
    hidden, prev_emb, weight, bias, sts = confidence_inputs(6, 5, H=128, r=4, dtype=torch.bfloat16, seed=1)
    prev32 = prev_emb.float()
    cpu = dspark.ops.confidence(hidden, prev32, weight, bias.reshape(1), sts)
    hidden_nc = hidden.transpose(0, 1).contiguous().to(CUDA).transpose(0, 1)
    assert not hidden_nc.is_contiguous()
    gpu = dspark.ops.confidence(hidden_nc, *_cuda(prev32, weight, bias.reshape(1), sts))
    for c, gt in zip(cpu, gpu, strict=True):
        torch.testing.assert_close(gt.cpu(), c, atol=1e-5, rtol=1e-5)

    hidden, prev_emb, weight, bias, sts = confidence_inputs(2, 9000, H=8, r=2, seed=2)
    cpu = dspark.ops.confidence(hidden, prev_emb, weight, bias, sts)
    gpu = dspark.ops.confidence(*_cuda(hidden, prev_emb, weight, bias, sts))
    for c, gt in zip(cpu, gpu, strict=True):
        torch.testing.assert_close(gt.cpu(), c, atol=1e-5, rtol=1e-5)
    assert bool((gpu[2][:, 1:] <= gpu[2][:, :-1]).all())

    hidden, prev_emb, weight, bias, sts = confidence_inputs(0, 4, seed=3)
    out = dspark.ops.confidence(*_cuda(hidden, prev_emb, weight, bias, sts))
    assert all(t.shape == (0, 4) and t.is_cuda for t in out)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_confidence_sts_bias_close(dtype):
    # affine STS offsets: same values as the CPU op; None equals zeros bit for bit on the device too
    args = confidence_inputs(9, 7, H=576, r=16, dtype=dtype, seed=11)
    offsets = torch.linspace(-1.5, 1.0, 7)
    cpu = dspark.ops.confidence(*args, offsets)
    gpu = dspark.ops.confidence(*_cuda(*args, offsets))
    for c, gt in zip(cpu, gpu, strict=True):
        torch.testing.assert_close(gt.cpu(), c, atol=1e-5, rtol=1e-5)
    plain = dspark.ops.confidence(*_cuda(*args))
    zero = dspark.ops.confidence(*_cuda(*args, torch.zeros(7)))
    for a, b in zip(plain, zero, strict=True):
        assert torch.equal(a, b)


# --- opcheck, no host sync, CUDA graphs ------------------------------------------------------------------------


def test_opcheck_cuda():
    request, position, index = _cuda(*_philox_keys(64, seed=1))
    torch.library.opcheck(torch.ops.dspark.philox_draw.default, (3, 4, request, position, 1, index))

    for dtype in (torch.float32, torch.bfloat16):
        args = _cuda(*confidence_inputs(3, 4, H=64, r=8, dtype=dtype))
        torch.library.opcheck(torch.ops.dspark.confidence.default, args)
    offsets = torch.tensor([0.5, -0.5, 0.25, 0.0], device=CUDA)
    torch.library.opcheck(torch.ops.dspark.confidence.default, (*args, offsets))

    surv, lagged = _cuda(survival_batch(5, 4, seed=1), survival_batch(5, 4, seed=2))
    tokens, rate = _cuda(*sps_table("decaying"))
    for mode in MODES:
        torch.library.opcheck(torch.ops.dspark.plan_verify.default, (surv, lagged, tokens, rate, mode, 0.5))
    torch.library.opcheck(torch.ops.dspark.plan_verify.default, (surv, None, tokens, rate, "early_stop", 0.0))


def test_no_host_sync():
    request, position, index = _cuda(*_philox_keys(256, seed=2))
    conf_args = _cuda(*confidence_inputs(4, 5, dtype=torch.bfloat16))
    surv, lagged = _cuda(survival_batch(16, 5, seed=1), survival_batch(16, 5, seed=2))
    tokens, rate = _cuda(*sps_table("decaying"))
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        dspark.ops.philox_draw(1, 2, request, position, 1, index)
        dspark.ops.confidence(*conf_args)
        for mode in MODES:
            dspark.ops.plan_verify(surv, tokens, rate, mode, lagged, 0.5)
    finally:
        torch.cuda.set_sync_debug_mode(0)


def test_cuda_graph_replay():
    surv, lagged = _cuda(survival_batch(64, 7, seed=1), survival_batch(64, 7, seed=2))
    tokens, rate = _cuda(*sps_table("decaying"))
    request, position, index = _cuda(*_philox_keys(512, seed=4))
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):  # warm-up outside the capture
        dspark.ops.plan_verify(surv, tokens, rate, "lagged_topk", lagged)
        dspark.ops.philox_draw(1, 2, request, position, 1, index)
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        vl, budget = dspark.ops.plan_verify(surv, tokens, rate, "lagged_topk", lagged)
        u, _ = dspark.ops.philox_draw(1, 2, request, position, 1, index)
    new_surv, new_lagged = survival_batch(64, 7, seed=3), survival_batch(64, 7, seed=4)
    surv.copy_(new_surv)
    lagged.copy_(new_lagged)
    graph.replay()
    torch.cuda.synchronize()
    cpu = dspark.ops.plan_verify(new_surv, tokens.cpu(), rate.cpu(), "lagged_topk", new_lagged)
    assert torch.equal(vl.cpu(), cpu[0]) and torch.equal(budget.cpu(), cpu[1])
    u_cpu, _ = dspark.ops.philox_draw(1, 2, request.cpu(), position.cpu(), 1, index.cpu())
    assert torch.equal(_bits(u), _bits(u_cpu))
