# SPDX-License-Identifier: Apache-2.0
"""The extension loads, reports how it was built, and registers every op with a fake implementation."""

import sys

import pytest
import torch

import dspark

OPS = ("philox_draw", "confidence", "plan_verify")


def test_build_info_matches_runtime():
    info = dspark.build_info()
    assert info["version"] == dspark.__version__
    # built against the torch we run with (the reason for --no-build-isolation)
    assert info["torch_version"] == torch.__version__
    assert isinstance(info["cuda"], bool)
    if info["cuda"]:
        assert {"sm_80", "sm_90a"} <= set(info["cuda_archs"])
    else:
        assert info["cuda_archs"] == []


def test_every_op_has_a_cpu_kernel_and_a_fake():
    from torch._subclasses.fake_tensor import FakeTensorMode

    from tests.ops.samples import confidence_inputs, sps_table, survival_batch

    for name in OPS:
        assert torch._C._dispatch_has_kernel_for_dispatch_key(f"dspark::{name}", "CPU"), name
    i = torch.arange(5)
    surv = survival_batch(4, 3)
    tokens, rate = sps_table()
    calls = {
        "philox_draw": ((1, 2, i, i, 0, i), [(5,), (5,)]),
        "confidence": (confidence_inputs(4, 3), [(4, 3)] * 3),
        "plan_verify": ((surv, surv, tokens, rate, "lagged_topk", 0.0), [(4,), ()]),
    }
    assert set(calls) == set(OPS)
    with FakeTensorMode(allow_non_fake_inputs=True) as mode:
        for name, (args, shapes) in calls.items():
            fake_args = [mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in args]
            out = getattr(torch.ops.dspark, name).default(*fake_args)
            assert [tuple(o.shape) for o in out] == shapes, name


def test_cpu_kernels_follow_torch_thread_count():
    # at::parallel_for compiled without OpenMP runs every CPU kernel on one thread whatever torch says
    if sys.platform.startswith("linux"):  # GCC and its libgomp, as torch's own wheels use
        assert dspark.build_info()["openmp"] is True
    elif not dspark.build_info()["openmp"]:
        pytest.skip("built without OpenMP: the CPU kernels run on one thread")
    old = torch.get_num_threads()
    try:
        for n in (1, 2, 3):
            torch.set_num_threads(n)
            assert dspark._C.parallel_threads(64) == n
        assert dspark._C.parallel_threads(1) == 1  # one item: no second thread
    finally:
        torch.set_num_threads(old)
