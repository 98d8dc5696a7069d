# SPDX-License-Identifier: Apache-2.0
"""few_row_linear on CUDA: against the float64 reference (vector and scalar paths, row tiles), the same floats
on every run, opcheck, bad input."""

import pytest
import torch
import torch.nn.functional as F

import dspark
from dspark.reference import few_row_linear_ref
from tests.ops.test_few_row_linear import _inputs

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def _cuda(*ts):
    return [None if t is None else t.cuda() for t in ts]


# rows across the 8-row tiles, K across the 4-wide loads (K % 4 != 0 takes the scalar path), N across blocks
@pytest.mark.parametrize("M", [1, 3, 8, 9, 17, 32, 48])
@pytest.mark.parametrize("N,K", [(4, 16), (7, 9), (130, 64), (97, 577), (2048, 1536)])
@pytest.mark.parametrize("bias", [False, True])
def test_cuda_matches_reference(M, N, K, bias):
    x, w, b = _inputs(M, N, K, bias, seed=M * 1000 + N + K)
    y = dspark.ops.few_row_linear(*_cuda(x, w, b))
    assert y.is_cuda and y.shape == (M, N) and y.dtype == torch.float32 and y.is_contiguous()
    torch.testing.assert_close(y.cpu(), few_row_linear_ref(x, w, b), atol=2e-5 * K**0.5, rtol=1e-5)


def test_cuda_comparison_sees_one_wrong_output():
    x, w, b = _inputs(5, 97, 577, seed=3)
    y = dspark.ops.few_row_linear(*_cuda(x, w, b)).cpu()
    y[2, 41] += 1e-3
    with pytest.raises(AssertionError):
        torch.testing.assert_close(y, few_row_linear_ref(x, w, b), atol=2e-5 * 577**0.5, rtol=1e-5)


def test_cuda_misaligned_weight_takes_the_scalar_path():
    x, w, b = _inputs(6, 300, 64, seed=9)
    flat = torch.empty(w.numel() + 1, device="cuda")
    w_gpu = flat[1:].view_as(w)  # 4 bytes past a 16-byte boundary
    w_gpu.copy_(w)
    y = dspark.ops.few_row_linear(x.cuda(), w_gpu, b.cuda())
    torch.testing.assert_close(y.cpu(), few_row_linear_ref(x, w, b), atol=2e-5 * 8, rtol=1e-5)


def test_cuda_runs_give_the_same_floats_and_agree_with_f_linear():
    x, w, b = _cuda(*_inputs(16, 4096, 576, seed=1))
    first = dspark.ops.few_row_linear(x, w, b)
    assert torch.equal(first, dspark.ops.few_row_linear(x, w, b))  # C2: fixed order, no atomics
    torch.testing.assert_close(first, F.linear(x, w, b), atol=1e-4, rtol=1e-4)


def test_cuda_empty_shapes():
    w, b = torch.randn(5, 3, device="cuda"), torch.randn(5, device="cuda")
    assert dspark.ops.few_row_linear(torch.zeros(0, 3, device="cuda"), w, b).shape == (0, 5)
    y = dspark.ops.few_row_linear(torch.zeros(2, 0, device="cuda"), torch.zeros(5, 0, device="cuda"), b)
    assert torch.equal(y, b.expand(2, 5))


def test_cuda_opcheck():
    torch.library.opcheck(
        torch.ops.dspark.few_row_linear.default, _cuda(*_inputs(3, 20, 17, bias=True, seed=6))
    )
    torch.library.opcheck(
        torch.ops.dspark.few_row_linear.default, _cuda(*_inputs(5, 8, 32, bias=False, seed=7))
    )


def test_cuda_mixed_devices_are_refused():
    with pytest.raises(ValueError, match="weight"):
        dspark.ops.few_row_linear(torch.randn(2, 8, device="cuda"), torch.randn(16, 8))
