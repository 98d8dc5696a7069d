# SPDX-License-Identifier: Apache-2.0
"""markov_sample: bit-equal to the reference, sampling law, opcheck, compile, errors."""

import numpy as np
import pytest
import torch

import dspark
from dspark.reference import markov_sample_ref
from dspark.reference import sampling_math as sm

DT = [torch.float32, torch.bfloat16, torch.float16]


def markov_inputs(R, G, V, r, dtype=torch.float32, wdtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    U = (torch.randn(R, G, V, generator=g) * 2).to(dtype)
    w1 = torch.randn(V, r, generator=g).to(wdtype)
    w2 = (torch.randn(V, r, generator=g) / r**0.5).to(wdtype)
    anchor = torch.randint(0, V, (R,), generator=g)
    temp = torch.tensor([0.0, 1.0, 0.7, 1.6] * R)[:R]
    return U, anchor, w1, w2, temp


@pytest.mark.parametrize("R,G,V,r", [(1, 1, 7, 1), (3, 4, 300, 12), (5, 7, 513, 16), (2, 3, 1000, 64)])
@pytest.mark.parametrize("dtype", DT)
@pytest.mark.parametrize("wdtype", [torch.float32, torch.bfloat16])
def test_bit_equal_to_reference(R, G, V, r, dtype, wdtype):
    args = markov_inputs(R, G, V, r, dtype, wdtype, seed=R + V)
    ids = torch.randint(0, 2**32, (R,))
    for kw in ({}, {"request_ids": ids}):
        out = dspark.ops.markov_sample(*args, 123, 45, **kw)
        ref = markov_sample_ref(*args, 123, 45, **kw)
        for name, o, e in zip(("tokens", "draft_logits", "prev_emb"), out, ref, strict=True):
            assert torch.equal(o, e), name


def _spread_logits(U, dtype):
    # -inf entries, a far tail (ids the Gumbel span rules out) and one row at a large scale
    U = U.float().clone()
    U[..., 3::11] = float("-inf")
    U[..., 1::7] -= 40.0
    U[-1] *= 25.0
    return U.to(dtype)


@pytest.mark.parametrize("R,G,V,r", [(1, 2, 5, 3), (9, 3, 777, 17), (4, 2, 256, 8), (8, 3, 2113, 40)])
@pytest.mark.parametrize(
    "dtype,wdtype",
    [
        (torch.float32, torch.float32),
        (torch.bfloat16, torch.bfloat16),
        (torch.float16, torch.float16),
        (torch.float32, torch.float16),
    ],
)
def test_simd_and_scalar_paths_agree(R, G, V, r, dtype, wdtype, monkeypatch):
    # The vectorised CPU path (when the CPU has AVX-512) and the scalar one (DSPARK_CPU_SIMD=0) draw the same
    # tokens and logits: vocabulary sizes off the vector width and the tile, odd R, greedy and sampled rows.
    U, anchor, w1, w2, temp = markov_inputs(R, G, V, r, dtype, wdtype, seed=V + r)
    args = (_spread_logits(U, dtype), anchor, w1, w2, temp, 11, 3, torch.randint(0, 2**32, (R,)))
    monkeypatch.delenv("DSPARK_CPU_SIMD", raising=False)
    fast = dspark.ops.markov_sample(*args)
    monkeypatch.setenv("DSPARK_CPU_SIMD", "0")
    scalar = dspark.ops.markov_sample(*args)
    for name, o, e in zip(("tokens", "draft_logits", "prev_emb"), fast, scalar, strict=True):
        assert torch.equal(o, e), name


def test_simd_and_scalar_paths_agree_on_non_finite_bias(monkeypatch):
    # inf / NaN in W2 make z inf or NaN (base_logits are checked, the weights are not): same winner either way
    U, anchor, w1, w2, temp = markov_inputs(4, 3, 600, 16, seed=5)
    w2[7], w2[300, 3], w2[301] = float("inf"), float("nan"), -float("inf")
    args = (U, anchor, w1, w2, temp, 1, 2)
    fast = dspark.ops.markov_sample(*args)
    monkeypatch.setenv("DSPARK_CPU_SIMD", "0")
    scalar = dspark.ops.markov_sample(*args)
    for o, e in zip(fast, scalar, strict=True):
        assert (
            torch.equal(o.view(torch.int32), e.view(torch.int32))
            if o.is_floating_point()
            else torch.equal(o, e)
        )


@pytest.mark.parametrize("V,r", [(1100, 8), (300, 0)])
def test_bit_equal_to_reference_multi_tile(V, r):
    # several vocabulary tiles with a partial last one, 9 requests (a lone last pair), far tails, r = 0
    U, anchor, w1, w2, temp = markov_inputs(9, 2, V, r, seed=V)
    args = (_spread_logits(U, torch.float32), anchor, w1, w2, temp, 5, 8)
    for name, o, e in zip(
        ("tokens", "draft_logits", "prev_emb"),
        dspark.ops.markov_sample(*args),
        markov_sample_ref(*args),
        strict=True,
    ):
        assert torch.equal(o, e), name


def test_semantics_independent_of_reference():
    # z = U + W2 W1[x_{k-1}] (float64 check), prev_emb = W1[x_{k-1}], greedy = argmax z
    U, anchor, w1, w2, _ = markov_inputs(4, 6, 200, 8, seed=7)
    temp = torch.zeros(4)
    x, z, e = dspark.ops.markov_sample(U, anchor, w1, w2, temp, 0, 0)
    prev = torch.cat([anchor[:, None], x[:, :-1]], dim=1)
    torch.testing.assert_close(e, w1[prev])
    want = U.double() + torch.einsum("vr,bkr->bkv", w2.double(), w1[prev].double())
    torch.testing.assert_close(z.double(), want, atol=1e-5, rtol=1e-6)
    assert torch.equal(x, z.argmax(-1))
    x2, _, _ = dspark.ops.markov_sample(U, anchor, w1, w2, temp, 99, 5)
    assert torch.equal(x, x2), "temperature 0 must not depend on the seed"


def test_sampling_frequencies_match_softmax():
    # 250k requests x 4 positions = 1M draws; position 0 has a fixed law, later ones are checked per prev token
    R, G, V, r = 250_000, 4, 6, 3
    g = torch.Generator().manual_seed(0)
    U1 = torch.randn(G, V, generator=g)
    U1[1, 2] = float("-inf")  # a zero-probability token
    U = U1.expand(R, G, V).contiguous()
    w1, w2 = torch.randn(V, r, generator=g), torch.randn(V, r, generator=g) * 0.5
    t = 0.8
    x, z, _ = dspark.ops.markov_sample(U, torch.full((R,), 3), w1, w2, torch.full((R,), t), 5, 1)
    assert not bool((x[:, 1] == 2).any()), "a -inf logit was drawn"
    for k in range(G):
        prev = torch.full((R,), 3) if k == 0 else x[:, k - 1]
        for pv in range(V):
            sel = prev == pv
            n = int(sel.sum())
            if n < 2000:
                continue
            zk = z[sel.nonzero()[0, 0], k].double()
            p = torch.softmax(zk / t, -1).numpy()
            counts = np.bincount(x[sel, k].numpy(), minlength=V)
            exp = p * n
            m = exp > 0
            stat = float((((counts - exp) ** 2)[m] / exp[m]).sum())
            assert stat < 30.0, (k, pv, counts, exp)  # chi2 with <= 5 dof: P(stat > 30) < 2e-5


def test_seed_offset_and_request_ids_change_draws():
    args = markov_inputs(64, 4, 500, 8, seed=1)
    args = (*args[:4], torch.ones(64))
    a = dspark.ops.markov_sample(*args, 1, 0)[0]
    assert not torch.equal(a, dspark.ops.markov_sample(*args, 2, 0)[0])
    assert not torch.equal(a, dspark.ops.markov_sample(*args, 1, 1)[0])
    ids = torch.arange(64) + 1000
    assert not torch.equal(a, dspark.ops.markov_sample(*args, 1, 0, ids)[0])
    assert torch.equal(a, dspark.ops.markov_sample(*args, 1, 0, torch.arange(64))[0])


@pytest.mark.parametrize("offset,added", [(3, 4), (0, 7), (2**63 - 1, 2), (5, -2)])
def test_round_offset_is_added_to_offset(offset, added):
    """A device counter ``round_offset`` draws as ``offset + round_offset[0]`` (mod 2^64) passed as ``offset``
    (what a CUDA graph replay relies on); the sum, not either part, keys the noise."""
    args = markov_inputs(16, 4, 300, 8, seed=3)
    args = (*args[:4], torch.ones(16))
    total = (offset + added + 2**63) % 2**64 - 2**63  # the uint64 sum as the int64 the op takes
    want = dspark.ops.markov_sample(*args, 9, total)
    got = dspark.ops.markov_sample(*args, 9, offset, None, torch.tensor([added]))
    for g, w in zip(got, want, strict=True):
        assert torch.equal(g, w)
    # negative control: the counter is read, not ignored
    assert not torch.equal(dspark.ops.markov_sample(*args, 9, offset)[0], want[0])


def test_opcheck_and_compile():
    args = markov_inputs(2, 3, 40, 4, seed=2)
    torch.library.opcheck(torch.ops.dspark.markov_sample.default, (*args, 1, 2, None))
    torch.library.opcheck(torch.ops.dspark.markov_sample.default, (*args, 1, 2, torch.tensor([5, 9])))
    torch.library.opcheck(
        torch.ops.dspark.markov_sample.default, (*args, 1, 2, torch.tensor([5, 9]), torch.tensor([3]))
    )
    fn = torch.compile(lambda *a: dspark.ops.markov_sample(*a, 1, 2), fullgraph=True)
    for o, e in zip(fn(*args), dspark.ops.markov_sample(*args, 1, 2), strict=True):
        assert torch.equal(o, e)


def test_fake_shapes():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        U, w = torch.empty(3, 5, 100), torch.empty(100, 7)
        x, z, e = dspark.ops.markov_sample(U, torch.zeros(3, dtype=torch.int64), w, w, torch.ones(3), 0, 0)
        assert x.shape == (3, 5) and x.dtype == torch.int64
        assert z.shape == (3, 5, 100) and z.dtype == torch.float32 and e.shape == (3, 5, 7)


def _bad(**changes):
    U, a, w1, w2, t = markov_inputs(2, 3, 20, 4)
    d = dict(base_logits=U, anchor=a, w1=w1, w2=w2, temperature=t, seed=0, offset=0)
    d.update(changes)
    return d


@pytest.mark.parametrize(
    "changes,match",
    [
        (dict(base_logits=torch.randn(2, 20)), "base_logits must be 3-D"),
        (dict(base_logits=torch.randn(2, 3, 20, dtype=torch.float64)), "base_logits must be float32"),
        (dict(anchor=torch.zeros(3, dtype=torch.int64)), "anchor must have one token per request"),
        (dict(anchor=torch.zeros(2, dtype=torch.int32)), "anchor must be torch.int64"),
        (dict(anchor=torch.tensor([0, 20])), "anchor\\[1\\] = 20 is outside"),
        (dict(w1=torch.randn(19, 4)), "w1 must be \\[V, r\\]"),
        (dict(w2=torch.randn(20, 5)), "w2 must be \\[V, r\\]"),
        (dict(w2=torch.randn(20, 4, dtype=torch.bfloat16)), "w2 must have w1's dtype"),
        (dict(temperature=torch.ones(3)), "temperature must have one entry per request"),
        (dict(temperature=torch.tensor([1.0, -0.5])), "temperature\\[1\\] must be finite and >= 0"),
        (dict(temperature=torch.tensor([float("nan"), 1.0])), "temperature\\[0\\]"),
        (dict(base_logits=torch.full((2, 3, 20), float("nan"))), "base_logits contains NaN"),
        (dict(base_logits=torch.full((2, 3, 20), float("inf"))), "base_logits contains \\+inf"),
        (dict(base_logits=torch.full((2, 3, 20), float("-inf"))), "needs a finite entry"),
        (dict(request_ids=torch.tensor([0, 2**32])), "request_ids\\[1\\]"),
        (dict(round_offset=torch.tensor([1, 2])), "round_offset must hold one counter"),
        (dict(round_offset=torch.tensor([1], dtype=torch.int32)), "round_offset must be torch.int64"),
        (dict(round_offset=torch.tensor(1)), "round_offset must be 1-D"),
    ],
)
def test_bad_input_names_the_argument(changes, match):
    with pytest.raises(ValueError, match=match):
        dspark.ops.markov_sample(**_bad(**changes))


def test_exp_exact_accuracy():
    x = -torch.rand(200_000) * 87
    rel = (sm.exp_exact(x).double() - x.double().exp()).abs() / x.double().exp()
    assert float(rel.max()) < 2.5 * 2**-24


def test_the_c4_check_passes_equal_outputs_and_catches_wrong_ones():
    # the rule the CUDA tensor-core kernel is held to (tests/ops/markov_c4.py), checked able to fail: a z off
    # by 20x its tolerance, and a token swapped where the CPU's decision was far from a tie
    from tests.ops.markov_c4 import assert_c4, z_tolerance

    args = markov_inputs(4, 3, 500, 16, torch.bfloat16, torch.bfloat16, seed=2)
    ids = torch.arange(4) + 10
    cpu = dspark.ops.markov_sample(*args, 7, 3, ids)
    assert assert_c4(args, cpu, cpu, 7, 3, ids) == 0
    z = cpu[1].clone()
    tol = z_tolerance(args[3].double().abs(), cpu[2][1, 2], z[1, 2])
    z[1, 2, 17] += 20 * float(tol[17])
    with pytest.raises(AssertionError, match="z off by"):
        assert_c4(args, cpu, (cpu[0], z, cpu[2]), 7, 3, ids)
    tokens = cpu[0].clone()
    tokens[0, 2] = (tokens[0, 2] + 1) % 500
    with pytest.raises(AssertionError, match="outside the tolerance"):
        assert_c4(args, cpu, (tokens, cpu[1], cpu[2]), 7, 3, ids)
