# SPDX-License-Identifier: Apache-2.0
"""Few-row inputs of large fp32 weights padded to 16 rows (``cpu_linear.padded_linear``)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from dspark.models import cpu_linear
from dspark.models.cpu_linear import PAD_ROWS, padded_linear, pads, weight_stationary_linears


@pytest.fixture
def small_weights_pad(monkeypatch):
    """Every weight counts as large and pads from 2 rows (the rule without its timing)."""
    monkeypatch.setattr(cpu_linear, "PAD_MIN_NUMEL", 1)
    monkeypatch.setattr(cpu_linear, "pad_from", lambda weight: 2)


@pytest.mark.parametrize("rows", [2, 5, 8, 15])
@pytest.mark.parametrize("with_bias", [False, True])
def test_padded_rows_match_f_linear(small_weights_pad, rows, with_bias):
    g = torch.Generator().manual_seed(rows)
    w = torch.randn(40, 24, generator=g)
    b = torch.randn(40, generator=g) if with_bias else None
    x = torch.randn(1, rows, 24, generator=g)  # a leading batch dim, as a model's hidden states have
    assert pads(x, w, b)
    got = padded_linear(x, w, b)
    assert got.shape == (1, rows, 40)
    torch.testing.assert_close(got, F.linear(x, w, b), atol=1e-5, rtol=1e-5)


def test_what_pads_and_what_does_not(monkeypatch):
    w = torch.randn(40, 24)
    monkeypatch.setattr(cpu_linear, "pad_from", lambda weight: 6)
    assert not pads(torch.randn(8, 24), w)  # below PAD_MIN_NUMEL
    monkeypatch.setattr(cpu_linear, "PAD_MIN_NUMEL", 1)
    assert pads(torch.randn(6, 24), w) and pads(torch.randn(PAD_ROWS - 1, 24), w)
    assert not pads(torch.randn(5, 24), w)  # below pad_from
    assert not pads(torch.randn(PAD_ROWS, 24), w)  # already a full tile
    assert not pads(torch.randn(8, 24).bfloat16(), w.bfloat16())  # fp32 only
    with torch.enable_grad():
        assert not pads(torch.randn(8, 24, requires_grad=True), w)  # autograd keeps the standard path


def test_large_weights_are_routed_through_it_where_the_stationary_path_is_off(monkeypatch):
    monkeypatch.setattr(cpu_linear, "default_max_rows", lambda: 0)
    monkeypatch.setattr(cpu_linear.platform, "machine", lambda: "x86_64")
    monkeypatch.setattr(cpu_linear, "PAD_MIN_NUMEL", 40 * 24)
    big, small = nn.Linear(24, 40), nn.Linear(24, 8)
    with weight_stationary_linears([big, small]) as limit:
        assert limit == 0 and "forward" in big.__dict__ and "forward" not in small.__dict__
    assert "forward" not in big.__dict__
    with weight_stationary_linears([big, small], 0):  # an explicit 0: nothing changes
        assert "forward" not in big.__dict__
    monkeypatch.setattr(cpu_linear.platform, "machine", lambda: "aarch64")
    with weight_stationary_linears([big, small]):  # measured on x86 only
        assert "forward" not in big.__dict__


def test_the_probe_times_each_shape_once():
    w = torch.randn(64, 32)
    first = cpu_linear.pad_from(w)
    assert first in (*cpu_linear._PAD_PROBE_ROWS, PAD_ROWS)
    key = (64, 32, torch.get_num_threads())
    assert cpu_linear._PAD_FROM[key] == first
    cpu_linear._PAD_FROM[key] = 7  # a cached answer is returned without timing again
    try:
        assert cpu_linear.pad_from(torch.randn(64, 32)) == 7
    finally:
        cpu_linear._PAD_FROM.pop(key)
