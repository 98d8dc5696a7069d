# SPDX-License-Identifier: Apache-2.0
"""few_row_linear: against the float64 reference on every CPU path, thread counts, opcheck, bad input."""

import pytest
import torch
import torch.nn.functional as F

import dspark
from dspark.reference import few_row_linear_ref

# the vector paths this CPU runs ("" = the widest it has; "avx2" = AVX2 on an AVX-512 CPU), and the scalar loop
CAPABILITY = torch.backends.cpu.get_cpu_capability()
PATHS = (
    ["0"]
    + (["avx2"] if CAPABILITY in ("AVX2", "AVX512") else [])
    + (["avx512"] if CAPABILITY == "AVX512" else [])
)


def _inputs(M, N, K, bias=True, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(M, K, generator=g)
    w = torch.randn(N, K, generator=g) * K**-0.5
    b = torch.randn(N, generator=g) if bias else None
    return x, w, b


@pytest.fixture(params=PATHS)
def cpu_path(request, monkeypatch):
    monkeypatch.setenv("DSPARK_CPU_SIMD", request.param)
    return request.param


# rows across the 6-row (AVX-512) / 4-row (AVX2) tiles and every remainder, outputs across the 4-output blocks
# and their remainder, columns across the 16 / 8-lane vectors and their masked / scalar tails
@pytest.mark.parametrize("M", [1, 2, 3, 4, 5, 6, 7, 8, 11, 13, 32, 48, 64])
@pytest.mark.parametrize("N,K", [(4, 16), (7, 9), (130, 64), (97, 577), (256, 1536)])
@pytest.mark.parametrize("bias", [False, True])
def test_matches_reference(cpu_path, M, N, K, bias):
    x, w, b = _inputs(M, N, K, bias, seed=M * 1000 + N + K)
    y = dspark.ops.few_row_linear(x, w, b)
    assert y.shape == (M, N) and y.dtype == torch.float32 and y.is_contiguous()
    # fp32 sums of K products of unit-scale terms: error ~ sqrt(K) * eps relative to the sum's magnitude
    torch.testing.assert_close(y, few_row_linear_ref(x, w, b), atol=2e-5 * K**0.5, rtol=1e-5)


def test_the_comparison_sees_one_wrong_output(cpu_path):
    # negative control: the tolerance above is tight enough to catch one output off by a small amount
    x, w, b = _inputs(5, 97, 577, seed=3)
    y = dspark.ops.few_row_linear(x, w, b)
    y[2, 41] += 1e-3
    with pytest.raises(AssertionError):
        torch.testing.assert_close(y, few_row_linear_ref(x, w, b), atol=2e-5 * 577**0.5, rtol=1e-5)


def test_agrees_with_f_linear_on_a_model_shape():
    x, w, b = _inputs(8, 1536, 576, seed=1)
    torch.testing.assert_close(dspark.ops.few_row_linear(x, w, b), F.linear(x, w, b), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("M", [6, 11, 16])
def test_a_row_gets_the_same_floats_alone_or_in_a_tile(cpu_path, M):
    # each (row, output) is summed in one order whatever tile it lands in: the first row of a 6-row tile,
    # a remainder tile and a lone row agree bit for bit
    x, w, b = _inputs(M, 130, 577, seed=M)
    together = dspark.ops.few_row_linear(x, w, b)
    for i in range(M):
        assert torch.equal(together[i], dspark.ops.few_row_linear(x[i : i + 1], w, b)[0]), f"row {i}"


def test_thread_count_does_not_change_a_bit(cpu_path):
    # threads split the outputs, never a sum: any thread count gives the same floats
    x, w, b = _inputs(6, 1000, 300, seed=4)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = dspark.ops.few_row_linear(x, w, b)
        torch.set_num_threads(max(2, before))
        many = dspark.ops.few_row_linear(x, w, b)
    finally:
        torch.set_num_threads(before)
    assert torch.equal(one, many)


def test_empty_and_degenerate_shapes():
    w, b = torch.randn(5, 3), torch.randn(5)
    assert dspark.ops.few_row_linear(torch.zeros(0, 3), w, b).shape == (0, 5)
    assert dspark.ops.few_row_linear(torch.randn(2, 3), torch.zeros(0, 3)).shape == (2, 0)
    y = dspark.ops.few_row_linear(torch.zeros(2, 0), torch.zeros(5, 0), b)  # K = 0: the bias alone
    assert torch.equal(y, b.expand(2, 5))
    assert torch.equal(dspark.ops.few_row_linear(torch.zeros(2, 0), torch.zeros(5, 0)), torch.zeros(2, 5))


def test_non_contiguous_inputs():
    x, w, b = _inputs(4, 40, 24, seed=5)
    xt = torch.randn(24, 4).t()  # a transposed view
    wt = torch.randn(24, 40).t()
    torch.testing.assert_close(
        dspark.ops.few_row_linear(xt, wt, b), few_row_linear_ref(xt, wt, b), atol=1e-4, rtol=1e-5
    )


def test_opcheck():
    torch.library.opcheck(torch.ops.dspark.few_row_linear.default, _inputs(3, 20, 17, bias=True, seed=6))
    torch.library.opcheck(torch.ops.dspark.few_row_linear.default, _inputs(5, 8, 32, bias=False, seed=7))


def test_compiles():
    x, w, b = _inputs(4, 24, 32, seed=8)
    f = torch.compile(lambda x, w, b: dspark.ops.few_row_linear(x, w, b) * 2, backend="eager", fullgraph=True)
    torch.testing.assert_close(f(x, w, b), 2 * few_row_linear_ref(x, w, b), atol=1e-4, rtol=1e-5)


@pytest.mark.parametrize(
    "change,match",
    [
        (dict(x=torch.randn(2, 3, 8)), "x must be 2-D"),
        (dict(weight=torch.randn(16)), "weight must be 2-D"),
        (dict(x=torch.randn(2, 9)), "K = weight's 8 columns"),
        (dict(x=torch.randn(2, 8).double()), "x must be torch.float32"),
        (dict(weight=torch.randn(16, 8).bfloat16()), "weight must be torch.float32"),
        (dict(bias=torch.randn(15)), "bias must be \\[N\\] with N = 16"),
        (dict(bias=torch.randn(16, 1)), "bias must be 1-D"),
        (dict(bias=torch.randn(16).half()), "bias must be torch.float32"),
    ],
)
def test_bad_input_names_the_argument(change, match):
    args = dict(x=torch.randn(2, 8), weight=torch.randn(16, 8), bias=torch.randn(16))
    args.update(change)
    with pytest.raises(ValueError, match=match):
        dspark.ops.few_row_linear(args["x"], args["weight"], args["bias"])
