# SPDX-License-Identifier: Apache-2.0
"""HostReader: one counted read point returns every tensor's values on the CPU; to_device copies without a wait;
all_finite / sanitized flag and neutralise non-finite logits without a read."""

import pytest
import torch

from dspark.host_sync import HostReader, all_finite, cat_to_device, sanitized, to_device


def _check(device):
    h = HostReader()
    a = torch.arange(6, device=device).view(2, 3)
    b = torch.tensor(True, device=device)
    x, none, y = h.fetch(a, None, b)
    assert none is None and x.device.type == "cpu" and y.device.type == "cpu"
    assert x.tolist() == [[0, 1, 2], [3, 4, 5]] and bool(y)
    h.fetch(a * 2)
    assert h.syncs == 2


def test_fetch_on_cpu():
    _check("cpu")


@pytest.mark.cuda
def test_fetch_on_cuda_waits_once_for_all_copies():
    _check("cuda")
    # a long queue of work before the read: the values must still be the final ones
    x = torch.zeros(1 << 20, device="cuda")
    for _ in range(50):
        x += 1
    (y,) = HostReader().fetch(x)
    assert float(y.min()) == 50.0 and float(y.max()) == 50.0


def test_to_device_on_cpu_builds_casts_and_passes_through():
    x = to_device([1, 2, 3], "cpu", torch.int32)
    assert x.dtype == torch.int32 and x.tolist() == [1, 2, 3]
    t = torch.arange(4)
    assert to_device(t, "cpu") is t  # already there: no copy
    assert to_device(t, "cpu", torch.float32).dtype == torch.float32


@pytest.mark.cuda
def test_to_device_on_cuda_copies_without_a_sync():
    x = torch.zeros(1 << 20, device="cuda")
    for _ in range(50):  # queued work the copy must not wait for on the host
        x += 1
    torch.cuda.set_sync_debug_mode("error")
    try:
        y = to_device(list(range(1000)), "cuda", torch.int64)
        z = to_device(torch.arange(7, dtype=torch.int32), torch.device("cuda"))
    finally:
        torch.cuda.set_sync_debug_mode(0)
    assert y.device.type == "cuda" and z.device.type == "cuda"
    assert y.cpu().tolist() == list(range(1000)) and z.cpu().tolist() == list(range(7))


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)])
def test_cat_to_device_joins_host_parts_and_device_parts(device):
    parts = [torch.arange(3), torch.arange(10, 14), torch.arange(20, 21)]
    want = torch.cat(parts).tolist()
    assert cat_to_device(parts, device).tolist() == want
    assert cat_to_device([p.to(device) for p in parts], device).tolist() == want
    mixed = [parts[0], parts[1].to(device), parts[2]]  # some on the host, some already there
    got = cat_to_device(mixed, device)
    assert got.device.type == device and got.tolist() == want


def _finite_cases(device):
    g = torch.Generator().manual_seed(0)
    base = torch.randn(3, 4, 50, generator=g) * 1e30  # large but finite: no overflow in the check
    yield base.to(device), True
    for v in (float("nan"), float("inf"), -float("inf")):
        for where in ((0, 0, 0), (2, 3, 49), (1, 2, 17)):
            x = base.clone()
            x[where] = v
            yield x.to(device), False
    yield torch.empty(0, 5, device=device), True


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)])
def test_all_finite_and_sanitized(device):
    for x, want in _finite_cases(device):
        flag = all_finite(x)
        assert flag.device.type == x.device.type and flag.dim() == 0
        assert bool(flag) == want == bool(torch.isfinite(x).all())
        y = sanitized(x, flag)
        assert bool(torch.isfinite(y).all())
        assert torch.equal(y, torch.nan_to_num(x, nan=0.0, posinf=0.0, neginf=0.0))
        if want and device == "cpu":
            assert y is x  # a finite CPU tensor is not copied


@pytest.mark.cuda
def test_all_finite_and_sanitized_do_not_sync_on_cuda():
    x = torch.randn(8, 7, 1000, device="cuda")
    torch.cuda.set_sync_debug_mode("error")
    try:
        y = sanitized(x, all_finite(x))
    finally:
        torch.cuda.set_sync_debug_mode(0)
    assert torch.equal(y, x)
