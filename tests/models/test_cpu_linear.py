# SPDX-License-Identifier: Apache-2.0
"""The weight-stationary few-row linear ((W · xᵀ)ᵀ on CPU fp32) and its use by the target adapter and drafter."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from dspark.models import cpu_linear
from dspark.models.cpu_linear import applies, few_row_linears, linear
from dspark.models.target import TargetAdapter, TargetInput
from tests.models.tiny import tiny_model


@pytest.mark.parametrize("rows", [1, 2, 3, 5, 8])
@pytest.mark.parametrize("with_bias", [False, True])
def test_matches_f_linear_for_few_rows(rows, with_bias):
    g = torch.Generator().manual_seed(rows)
    x = torch.randn(1, rows, 48, generator=g)
    w = torch.randn(200, 48, generator=g)
    b = torch.randn(200, generator=g) if with_bias else None
    assert applies(x, w, 8)
    y = linear(x, w, b, max_rows=8)
    want = F.linear(x, w, b)
    assert y.shape == want.shape == (1, rows, 200) and y.is_contiguous()
    torch.testing.assert_close(y, want, atol=1e-5, rtol=1e-5)


def test_falls_back_to_f_linear_bit_for_bit():
    g = torch.Generator().manual_seed(0)
    w = torch.randn(64, 32, generator=g)
    many = torch.randn(9, 32, generator=g)
    assert not applies(many, w, 8)
    assert torch.equal(linear(many, w, max_rows=8), F.linear(many, w))  # more rows than the limit
    few = many[:3]
    assert torch.equal(linear(few, w, max_rows=0), F.linear(few, w))  # turned off
    bf = few.bfloat16()
    assert not applies(bf, w.bfloat16(), 8)
    assert torch.equal(linear(bf, w.bfloat16(), max_rows=8), F.linear(bf, w.bfloat16()))
    empty = torch.zeros(0, 32)
    assert not applies(empty, w, 8) and linear(empty, w, max_rows=8).shape == (0, 64)


def test_autograd_inputs_take_the_standard_path():
    w = torch.randn(16, 8, requires_grad=True)
    x = torch.randn(2, 8)
    assert not applies(x, w, 8)
    linear(x, w, max_rows=8).sum().backward()
    torch.testing.assert_close(w.grad, x.sum(0).expand(16, 8))
    b = torch.zeros(16, requires_grad=True)
    assert not applies(x, w.detach(), 8, b) and applies(x, w.detach(), 8)
    linear(x, w.detach(), b, max_rows=8).sum().backward()
    torch.testing.assert_close(b.grad, torch.full((16,), 2.0))


def test_default_limit_follows_threads_and_platform(monkeypatch):
    monkeypatch.setattr(cpu_linear.platform, "machine", lambda: "x86_64")
    monkeypatch.setattr(cpu_linear.torch.backends.mkl, "is_available", lambda: True)
    monkeypatch.setattr(cpu_linear, "pays_here", lambda threads: True)
    monkeypatch.setattr(cpu_linear.torch, "get_num_threads", lambda: 1)
    assert cpu_linear.default_max_rows() == 4
    monkeypatch.setattr(cpu_linear.torch, "get_num_threads", lambda: 2)
    assert cpu_linear.default_max_rows() == 64
    monkeypatch.setattr(cpu_linear, "pays_here", lambda threads: False)  # measured slower on this CPU
    assert cpu_linear.default_max_rows() == 0
    monkeypatch.setattr(cpu_linear, "pays_here", lambda threads: True)
    monkeypatch.setattr(cpu_linear.platform, "machine", lambda: "aarch64")
    assert cpu_linear.default_max_rows() == 0


def test_the_probe_is_measured_once_per_thread_count():
    """pays_here is a measurement: it returns a bool and is cached per thread count (one probe a process)."""
    threads = torch.get_num_threads()
    first = cpu_linear.pays_here(threads)
    assert isinstance(first, bool) and cpu_linear.pays_here(threads) is first
    assert cpu_linear.pays_here.cache_info().hits >= 1


class _QuantLinear(nn.Linear):
    pass


def test_patches_plain_linears_only_and_restores_them():
    hooked = nn.Linear(4, 4)
    hooked.forward = lambda x: x  # another library's replacement forward: left alone
    model = nn.Sequential(nn.Linear(4, 6), _QuantLinear(6, 6), hooked, nn.Linear(6, 2))
    with few_row_linears(model.modules(), 8) as limit:
        assert limit == 8
        assert "forward" in model[0].__dict__ and "forward" in model[3].__dict__
        assert "forward" not in model[1].__dict__
        assert model[2].__dict__["forward"] is not None and model[2](torch.ones(4)).sum() == 4
    assert "forward" not in model[0].__dict__ and "forward" not in model[3].__dict__
    assert "forward" in hooked.__dict__
    with pytest.raises(RuntimeError, match="boom"), few_row_linears(model.modules(), 8):
        raise RuntimeError("boom")
    assert "forward" not in model[0].__dict__
    with few_row_linears(model.modules(), 0) as limit:
        assert limit == 0 and "forward" not in model[0].__dict__
    half = nn.Linear(4, 4).bfloat16()  # the path never applies to it: not changed
    with few_row_linears([half, model[0]], 8):
        assert "forward" not in half.__dict__ and "forward" in model[0].__dict__


def _spy_on_linear(monkeypatch) -> list[bool]:
    """Record, for every call of ``cpu_linear.linear``, whether it took the weight-stationary path."""
    calls = []
    real = cpu_linear.linear

    def spy(x, w, b=None, max_rows=None):
        calls.append(applies(x, w, max_rows))
        return real(x, w, b, max_rows)

    monkeypatch.setattr(cpu_linear, "linear", spy)
    return calls


def test_patched_module_computes_the_same(monkeypatch):
    calls = _spy_on_linear(monkeypatch)
    lin = nn.Linear(32, 40)
    x = torch.randn(3, 32)
    with torch.no_grad():
        want = lin(x)
        with few_row_linears([lin], 8):
            got = lin(x)
    assert calls == [True]
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_adapter_forward_uses_it_and_agrees_with_the_standard_path(monkeypatch):
    calls = _spy_on_linear(monkeypatch)
    g = torch.Generator().manual_seed(3)
    prompt = torch.randint(0, 97, (12,), generator=g).tolist()
    block = torch.randint(0, 97, (4,), generator=g).tolist()
    outs = {}
    for limit in (0, 8):
        model = tiny_model("llama", seed=2)
        with pytest.raises(ValueError, match="linear_max_rows"):
            TargetAdapter(model, linear_max_rows=-1)
        adapter = TargetAdapter(model, page_size=4, linear_max_rows=limit)
        adapter.add_request(0)
        adapter.forward([TargetInput(0, prompt, logits="last")])
        calls.clear()
        outs[limit] = adapter.forward([TargetInput(0, block)], layers=[0, 2])
        # limit 0 never calls it; limit 8 sends every linear of the 4-row verify through the fast path
        assert calls == ([] if limit == 0 else [True] * len(calls)) and (
            limit == 0 or len(calls) == 3 * 7 + 1
        )
        assert not any("forward" in m.__dict__ for m in model.modules())  # the model is unchanged outside
        adapter.close()
    torch.testing.assert_close(outs[8].logits, outs[0].logits, atol=1e-5, rtol=1e-5)
    for layer in (0, 2):
        torch.testing.assert_close(outs[8].hidden[layer], outs[0].hidden[layer], atol=1e-5, rtol=1e-5)
