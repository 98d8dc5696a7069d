# SPDX-License-Identifier: Apache-2.0
"""markov_sample_from_hidden (CPU): bit-equal to the reference where U is exact in fp32, within the fp32
bound of it otherwise (contract C4, tests/ops/markov_c4.py, able to fail on a wrong LM head), opcheck,
compile, fake shapes, errors that name the argument."""

import pytest
import torch

import dspark
from dspark.reference import base_logits_ref, markov_sample_from_hidden_ref
from tests.ops.markov_c4 import assert_c4, u_tolerance

DT = [torch.float32, torch.bfloat16, torch.float16]


def hidden_inputs(R, G, V, H, r, dtype=torch.float32, seed=0, integer=False):
    """(hidden, lm_head, anchor, w1, w2, temperature). ``integer``: small integers in hidden / lm_head, so
    every sum of U is exact in fp32 whatever its order (|U| <= 16 H < 2^24)."""
    g = torch.Generator().manual_seed(seed)
    if integer:
        hidden = torch.randint(-4, 5, (R, G, H), generator=g).to(dtype)
        lm_head = torch.randint(-4, 5, (V, H), generator=g).to(dtype) / 8  # powers of two: still exact
    else:
        hidden = torch.randn(R, G, H, generator=g).to(dtype)
        lm_head = (torch.randn(V, H, generator=g) / H**0.5).to(dtype)
    w1 = torch.randn(V, r, generator=g).to(dtype)
    w2 = (torch.randn(V, r, generator=g) / r**0.5).to(dtype)
    anchor = torch.randint(0, V, (R,), generator=g)
    temp = torch.tensor([0.0, 1.0, 0.7, 1.6] * R)[:R]
    return hidden, lm_head, anchor, w1, w2, temp


@pytest.mark.parametrize("R,G,V,H,r", [(1, 1, 7, 8, 16), (3, 4, 300, 24, 16), (5, 7, 513, 72, 32)])
@pytest.mark.parametrize("dtype", DT)
def test_bit_equal_to_reference_when_u_is_exact(R, G, V, H, r, dtype):
    args = hidden_inputs(R, G, V, H, r, dtype, seed=R + V, integer=True)
    ids = torch.randint(0, 2**32, (R,))
    out = dspark.ops.markov_sample_from_hidden(*args, 123, 45, ids)
    ref = markov_sample_from_hidden_ref(*args, 123, 45, ids)
    for name, o, e in zip(("tokens", "draft_logits", "prev_emb"), out, ref, strict=True):
        assert torch.equal(o, e), name


@pytest.mark.parametrize("R,G,V,H,r", [(2, 3, 1000, 64, 16), (9, 7, 2113, 96, 48), (4, 2, 256, 576, 64)])
@pytest.mark.parametrize("dtype", DT)
def test_within_the_fp32_bound_of_the_reference(R, G, V, H, r, dtype):
    args = hidden_inputs(R, G, V, H, r, dtype, seed=V + H)
    ids = torch.randint(0, 2**32, (R,))
    out = dspark.ops.markov_sample_from_hidden(*args, 7, 3, ids)
    ref = markov_sample_from_hidden_ref(*args, 7, 3, ids)
    hidden, lm_head, anchor, w1, w2, temp = args
    u_args = (base_logits_ref(hidden, lm_head), anchor, w1, w2, temp)
    diverged = assert_c4(u_args, ref, out, 7, 3, ids, u_tol=u_tolerance(hidden, lm_head))
    assert diverged <= 1  # near-ties are rare


def test_the_u_bound_catches_a_wrong_lm_head():
    # negative control: an LM head with one row off by 1 % (far outside the fp32 bound) must fail the check
    hidden, lm_head, anchor, w1, w2, temp = hidden_inputs(3, 4, 500, 64, 16, seed=5)
    ids = torch.arange(3)
    ref = markov_sample_from_hidden_ref(hidden, lm_head, anchor, w1, w2, temp, 7, 3, ids)
    wrong = lm_head.clone()
    wrong[17] *= 1.01
    out = dspark.ops.markov_sample_from_hidden(hidden, wrong, anchor, w1, w2, temp, 7, 3, ids)
    u_args = (base_logits_ref(hidden, lm_head), anchor, w1, w2, temp)
    with pytest.raises(AssertionError, match="z off by"):
        assert_c4(u_args, ref, out, 7, 3, ids, u_tol=u_tolerance(hidden, lm_head))


def test_round_offset_is_added_to_offset():
    """``round_offset`` draws as ``offset + round_offset[0]`` passed as ``offset``; ignoring it would fail."""
    args = hidden_inputs(8, 3, 200, 16, 8, seed=4)
    args = (*args[:5], torch.ones(8))
    want = dspark.ops.markov_sample_from_hidden(*args, 9, 12)
    got = dspark.ops.markov_sample_from_hidden(*args, 9, 5, None, torch.tensor([7]))
    for g, w in zip(got, want, strict=True):
        assert torch.equal(g, w)
    assert not torch.equal(dspark.ops.markov_sample_from_hidden(*args, 9, 5)[0], want[0])


def test_opcheck_and_compile():
    args = hidden_inputs(2, 3, 40, 8, 16, seed=2)
    torch.library.opcheck(torch.ops.dspark.markov_sample_from_hidden.default, (*args, 1, 2, None))
    torch.library.opcheck(
        torch.ops.dspark.markov_sample_from_hidden.default, (*args, 1, 2, torch.tensor([5, 9]))
    )
    torch.library.opcheck(
        torch.ops.dspark.markov_sample_from_hidden.default,
        (*args, 1, 2, torch.tensor([5, 9]), torch.tensor([4])),
    )
    fn = torch.compile(lambda *a: dspark.ops.markov_sample_from_hidden(*a, 1, 2), fullgraph=True)
    for o, e in zip(fn(*args), dspark.ops.markov_sample_from_hidden(*args, 1, 2), strict=True):
        assert torch.equal(o, e)


def test_fake_shapes():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        h, lm, w = torch.empty(3, 5, 32), torch.empty(100, 32), torch.empty(100, 16)
        x, z, e = dspark.ops.markov_sample_from_hidden(
            h, lm, torch.zeros(3, dtype=torch.int64), w, w, torch.ones(3), 0, 0
        )
        assert x.shape == (3, 5) and x.dtype == torch.int64
        assert z.shape == (3, 5, 100) and z.dtype == torch.float32 and e.shape == (3, 5, 16)


def _bad(**changes):
    h, lm, a, w1, w2, t = hidden_inputs(2, 3, 20, 8, 4)
    d = dict(hidden=h, lm_head=lm, anchor=a, w1=w1, w2=w2, temperature=t, seed=0, offset=0)
    d.update(changes)
    return d


@pytest.mark.parametrize(
    "changes,match",
    [
        (dict(hidden=torch.randn(2, 8)), "hidden must be 3-D"),
        (dict(hidden=torch.randn(2, 3, 8, dtype=torch.float64)), "hidden must be float32"),
        (dict(lm_head=torch.randn(20, 9)), "lm_head must be \\[V, H\\] with H = 8"),
        (dict(lm_head=torch.randn(20)), "lm_head must be 2-D"),
        (dict(lm_head=torch.randn(20, 8, dtype=torch.bfloat16)), "lm_head must have hidden's dtype"),
        (dict(anchor=torch.zeros(3, dtype=torch.int64)), "anchor must have one token per request"),
        (dict(anchor=torch.tensor([0, 20])), "anchor\\[1\\] = 20 is outside"),
        (dict(w1=torch.randn(19, 4)), "w1 must be \\[V, r\\] with V = 20"),
        (dict(w2=torch.randn(20, 5)), "w2 must be \\[V, r\\]"),
        (dict(temperature=torch.tensor([1.0, -0.5])), "temperature\\[1\\] must be finite and >= 0"),
        (dict(hidden=torch.full((2, 3, 8), float("nan"))), "hidden · lm_headᵀ contains NaN"),
        (dict(request_ids=torch.tensor([0, 2**32])), "request_ids\\[1\\]"),
        (dict(round_offset=torch.tensor([1, 2])), "round_offset must hold one counter"),
        (dict(round_offset=torch.tensor([1.0])), "round_offset must be torch.int64"),
    ],
)
def test_bad_input_names_the_argument(changes, match):
    with pytest.raises(ValueError, match="dspark::markov_sample_from_hidden: " + match):
        dspark.ops.markov_sample_from_hidden(**_bad(**changes))
