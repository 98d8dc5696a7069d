# SPDX-License-Identifier: Apache-2.0
"""confidence: against the pure-PyTorch reference, opcheck, compile, bad input."""

import pytest
import torch

import dspark
from dspark.reference import confidence_ref
from tests.ops.samples import confidence_inputs

DTYPES = [(torch.float32, 2e-6), (torch.bfloat16, 2e-5), (torch.float16, 2e-5)]


@pytest.mark.parametrize("R", [1, 3, 64])
@pytest.mark.parametrize("gamma", [1, 4, 7, 15])
@pytest.mark.parametrize("dtype,atol", DTYPES)
def test_matches_reference(R, gamma, dtype, atol):
    args = confidence_inputs(R, gamma, H=40, r=6, dtype=dtype, seed=R * 100 + gamma)
    out = dspark.ops.confidence(*args)
    ref = confidence_ref(*args)
    for name, o, r in zip(("logit", "conf", "survival"), out, ref, strict=True):
        assert o.dtype == torch.float32 and o.shape == (R, gamma), name
        torch.testing.assert_close(o, r, atol=atol, rtol=1e-5, msg=name)
    surv = out[2]
    assert bool((surv[:, 1:] <= surv[:, :-1]).all()), "survival must be non-increasing"


def _offsets(gamma, seed):
    return torch.randn(gamma, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("gamma", [1, 7])
@pytest.mark.parametrize("dtype,atol", DTYPES)
def test_sts_bias_matches_reference(gamma, dtype, atol):
    args = (*confidence_inputs(5, gamma, H=40, r=6, dtype=dtype, seed=gamma), _offsets(gamma, 1))
    out = dspark.ops.confidence(*args)
    ref = confidence_ref(*args)
    for name, o, r in zip(("logit", "conf", "survival"), out, ref, strict=True):
        torch.testing.assert_close(o, r, atol=atol, rtol=1e-5, msg=name)


def test_sts_bias_shifts_conf_only_and_none_is_zero_bit_for_bit():
    args = confidence_inputs(6, 5, seed=4)
    plain = dspark.ops.confidence(*args)
    zero = dspark.ops.confidence(*args, torch.zeros(5))
    for a, b in zip(plain, zero, strict=True):
        assert torch.equal(a, b)  # SGLang's STS is the b = 0 case exactly
    o = _offsets(5, 2)
    logit, conf, surv = dspark.ops.confidence(*args, o)
    assert torch.equal(logit, plain[0])  # the raw logit never sees STS
    torch.testing.assert_close(conf, torch.sigmoid(plain[0] / args[4] + o))
    assert torch.equal(surv, torch.cumprod(conf, dim=1))


def test_survival_is_cumprod_of_conf_exactly():
    # the op's survival uses the same fp64-running-product rounding as torch.cumprod on CPU
    _, conf, surv = dspark.ops.confidence(*confidence_inputs(16, 7, seed=3))
    assert torch.equal(surv, torch.cumprod(conf, dim=1))


def test_markov_rank_zero_and_sts_scaling():
    h, _, w, b, _ = confidence_inputs(4, 5, H=32, r=0, seed=1)
    e = torch.empty(4, 5, 0)
    logit, conf, _ = dspark.ops.confidence(h, e, w, b, torch.ones(5))
    torch.testing.assert_close(conf, torch.sigmoid(logit))
    t = torch.tensor([0.5, 1.0, 2.0, 4.0, 8.0])
    logit2, conf2, _ = dspark.ops.confidence(h, e, w, b, t)
    torch.testing.assert_close(logit2, logit)  # STS never touches the raw logit
    torch.testing.assert_close(conf2, torch.sigmoid(logit / t))


def test_opcheck():
    torch.library.opcheck(torch.ops.dspark.confidence.default, confidence_inputs(3, 4, seed=2))
    torch.library.opcheck(
        torch.ops.dspark.confidence.default, (*confidence_inputs(3, 4, seed=6), _offsets(4, 3))
    )
    torch.library.opcheck(
        torch.ops.dspark.confidence.default, confidence_inputs(2, 3, dtype=torch.bfloat16, seed=5)
    )


def _bad(**changes):
    h, e, w, b, t = confidence_inputs(2, 3, H=8, r=2)
    d = dict(hidden=h, prev_emb=e, weight=w, bias=b, sts_temperature=t)
    d.update(changes)
    return d


@pytest.mark.parametrize(
    "changes,match",
    [
        (dict(hidden=torch.randn(2, 3)), "hidden must be 3-D"),
        (
            dict(hidden=torch.randn(2, 3, 8, dtype=torch.float64)),
            "hidden must be float32, bfloat16 or float16, got torch.float64",
        ),
        (dict(prev_emb=torch.randn(2, 4, 2)), "prev_emb must be"),
        (dict(weight=torch.randn(9)), "weight must have H \\+ r"),
        (dict(weight=torch.randn(10, dtype=torch.float64)), "weight must be torch.float32"),
        (dict(bias=torch.zeros(2)), "bias must hold one value"),
        (dict(sts_temperature=torch.ones(4)), "sts_temperature must have one entry per draft position"),
        (dict(sts_temperature=torch.tensor([1.0, 0.0, 1.0])), "sts_temperature\\[1\\]"),
        (dict(sts_temperature=torch.tensor([1.0, float("nan"), 1.0])), "sts_temperature\\[1\\]"),
        (dict(sts_bias=torch.zeros(4)), "sts_bias must have one entry per draft position"),
        (dict(sts_bias=torch.zeros(3, dtype=torch.float64)), "sts_bias must be torch.float32"),
        (dict(sts_bias=torch.zeros(1, 3)), "sts_bias must be 1-D"),
        (dict(sts_bias=torch.tensor([0.0, 0.0, float("inf")])), "sts_bias\\[2\\] must be finite"),
    ],
)
def test_bad_input_names_the_argument(changes, match):
    with pytest.raises(ValueError, match=match):
        dspark.ops.confidence(**_bad(**changes))
