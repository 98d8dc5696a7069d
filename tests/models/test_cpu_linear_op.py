# SPDX-License-Identifier: Apache-2.0
"""Routing few-row fp32 linears through ``dspark::few_row_linear`` (``cpu_linear.op_applies``)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from dspark.models import cpu_linear
from dspark.models.cpu_linear import OP_MAX_ROWS, OP_MIN_ROWS, few_row_linears, op_applies
from dspark.models.target import TargetAdapter, TargetInput
from tests.models.tiny import tiny_model


@pytest.fixture
def op_machine(monkeypatch):
    """An x86 CPU with AVX2 / AVX-512 where the weight-stationary path does not pay; every weight large."""
    monkeypatch.setattr(cpu_linear, "default_max_rows", lambda: 0)
    monkeypatch.setattr(cpu_linear, "_simd_x86", lambda: True)
    monkeypatch.setattr(cpu_linear, "OP_MIN_NUMEL", 1)


@pytest.fixture
def op_calls(monkeypatch) -> list[tuple[int, ...]]:
    """The input shapes of every call of the op from ``cpu_linear``."""
    calls = []
    real = cpu_linear._few_row_op

    def spy(x, w, b=None):
        calls.append(tuple(x.shape))
        return real(x, w, b)

    monkeypatch.setattr(cpu_linear, "_few_row_op", spy)
    return calls


def test_what_takes_the_op(monkeypatch):
    monkeypatch.setattr(cpu_linear, "_simd_x86", lambda: True)
    w = torch.randn(40, 24)
    assert not op_applies(torch.randn(4, 24), w)  # below OP_MIN_NUMEL
    monkeypatch.setattr(cpu_linear, "OP_MIN_NUMEL", 1)
    assert op_applies(torch.randn(OP_MIN_ROWS, 24), w) and op_applies(torch.randn(1, OP_MAX_ROWS, 24), w)
    assert not op_applies(torch.randn(OP_MAX_ROWS + 1, 24), w)
    assert not op_applies(torch.randn(0, 24), w)
    assert not op_applies(torch.randn(4, 24).bfloat16(), w.bfloat16())  # fp32 only
    assert not op_applies(torch.randn(4, 24), w, torch.randn(40).half())
    with torch.enable_grad():
        assert not op_applies(torch.randn(4, 24, requires_grad=True), w)  # autograd keeps F.linear
    monkeypatch.setattr(cpu_linear, "_simd_x86", lambda: False)  # no AVX2: the op's scalar loop would lose
    assert not op_applies(torch.randn(4, 24), w)


@pytest.mark.parametrize("rows", [1, 3, 8, OP_MAX_ROWS])
def test_routed_modules_compute_the_same(op_machine, op_calls, rows):
    lin = nn.Linear(48, 200)
    x = torch.randn(1, rows, 48)  # a leading batch dim, as a model's hidden states have
    with torch.no_grad():
        want = F.linear(x, lin.weight, lin.bias)
        with few_row_linears([lin]) as limit:
            assert limit == 0 and "forward" in lin.__dict__
            got = lin(x)
    assert op_calls == [(rows, 48)] and got.shape == want.shape
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    assert "forward" not in lin.__dict__


def test_outside_the_window_and_with_autograd_it_is_f_linear_itself(op_machine, op_calls):
    lin = nn.Linear(16, 8)
    many = torch.randn(OP_MAX_ROWS + 1, 16)
    with few_row_linears([lin]):
        with torch.no_grad():
            assert torch.equal(lin(many), F.linear(many, lin.weight, lin.bias))
        x = torch.randn(3, 16)
        lin(x).sum().backward()  # the weight requires grad: F.linear, and gradients flow
    assert op_calls == [] and lin.weight.grad is not None
    torch.testing.assert_close(lin.weight.grad, x.sum(0).expand(8, 16))


def test_which_modules_are_routed(monkeypatch):
    monkeypatch.setattr(cpu_linear, "default_max_rows", lambda: 0)
    monkeypatch.setattr(cpu_linear, "_simd_x86", lambda: True)
    monkeypatch.setattr(cpu_linear, "OP_MIN_NUMEL", 40 * 24)
    big, small, half = nn.Linear(24, 40), nn.Linear(24, 8), nn.Linear(24, 40).bfloat16()
    with few_row_linears([big, small, half]):
        assert (
            "forward" in big.__dict__ and "forward" not in small.__dict__ and "forward" not in half.__dict__
        )
    assert "forward" not in big.__dict__
    with few_row_linears([big], 0):  # an explicit 0: nothing changes
        assert "forward" not in big.__dict__
    monkeypatch.setattr(cpu_linear, "_simd_x86", lambda: False)
    with few_row_linears([big]):  # not x86 with AVX2 / AVX-512
        assert "forward" not in big.__dict__


def test_drafter_style_direct_calls_take_it(op_machine, op_calls):
    w = nn.Parameter(torch.randn(64, 32), requires_grad=False)
    x = torch.randn(6, 32)
    torch.testing.assert_close(cpu_linear.linear(x, w), F.linear(x, w), atol=1e-5, rtol=1e-5)
    assert op_calls == [(6, 32)]
    assert torch.equal(cpu_linear.linear(x, w, max_rows=0), F.linear(x, w)) and len(op_calls) == 1


def test_adapter_forward_through_the_op_agrees_with_f_linear(op_machine, op_calls):
    g = torch.Generator().manual_seed(3)
    prompt = torch.randint(0, 97, (12,), generator=g).tolist()
    block = torch.randint(0, 97, (4,), generator=g).tolist()
    outs = {}
    for limit in (0, None):
        model = tiny_model("llama", seed=2)
        adapter = TargetAdapter(model, page_size=4, linear_max_rows=limit)
        adapter.add_request(0)
        adapter.forward([TargetInput(0, prompt, logits="last")])
        op_calls.clear()
        outs[limit] = adapter.forward([TargetInput(0, block)], layers=[0, 2])
        # None: every linear of the 4-row verify (7 per layer, 3 layers, and the LM head) through the op
        assert [rows for rows, _ in op_calls] == ([] if limit == 0 else [4] * (3 * 7 + 1))
        assert not any("forward" in m.__dict__ for m in model.modules())
        adapter.close()
    torch.testing.assert_close(outs[None].logits, outs[0].logits, atol=1e-5, rtol=1e-5)
    for layer in (0, 2):
        torch.testing.assert_close(outs[None].hidden[layer], outs[0].hidden[layer], atol=1e-5, rtol=1e-5)
