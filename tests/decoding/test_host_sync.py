# SPDX-License-Identifier: Apache-2.0
"""HostReader: one counted read point returns every tensor's values on the CPU."""

import pytest
import torch

from dspark.decoding.host_sync import HostReader


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
