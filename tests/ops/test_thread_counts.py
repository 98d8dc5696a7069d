# SPDX-License-Identifier: Apache-2.0
"""The CPU kernels split their loops over torch's threads; the results must not depend on how many there are.

Shapes are large enough that every op hands work to several threads (several vocabulary tiles, many requests and
KV heads), and the SIMD and scalar paths are both run.
"""

import pytest
import torch

import dspark
from tests.ops.test_markov_sample import markov_inputs
from tests.ops.test_paged_verify_attention import make_paged
from tests.ops.test_rejection_sample import rs_inputs


def _by_threads(fn):
    """fn() at 1, 2 and 3 threads."""
    old = torch.get_num_threads()
    try:
        outs = []
        for n in (1, 2, 3):
            torch.set_num_threads(n)
            assert dspark._C.parallel_threads(64) == n  # the kernels really run on n threads
            outs.append(fn())
        return outs
    finally:
        torch.set_num_threads(old)


def _assert_all_equal(outs):
    first = outs[0] if isinstance(outs[0], tuple) else (outs[0],)
    for other in outs[1:]:
        other = other if isinstance(other, tuple) else (other,)
        for a, b in zip(first, other, strict=True):
            assert torch.equal(a, b)


@pytest.fixture(params=["simd", "scalar"])
def simd_mode(request, monkeypatch):
    if request.param == "scalar":
        monkeypatch.setenv("DSPARK_CPU_SIMD", "0")
    return request.param


def test_markov_sample(simd_mode):
    args = markov_inputs(R=5, G=3, V=20000, r=32, seed=3)
    _assert_all_equal(_by_threads(lambda: dspark.ops.markov_sample(*args, 7, 11)))


def test_paged_verify_attention(simd_mode):
    args = make_paged([1, 3, 8, 2, 5, 1, 4, 7], [40, 90, 300, 17, 64, 1200, 33, 2129], Hq=8, Hkv=2, seed=5)
    for causal in (True, False):
        _assert_all_equal(_by_threads(lambda c=causal: dspark.ops.paged_verify_attention(*args, 0.125, c)))


def test_rejection_sample(simd_mode):
    tl, qo, z, drafts, vl, temp = rs_inputs(R=12, G=4, V=5000, seed=2, match=0.5)
    _assert_all_equal(_by_threads(lambda: dspark.ops.rejection_sample(tl, qo, z, drafts, vl, temp, 9, 4)))
