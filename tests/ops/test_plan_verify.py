# SPDX-License-Identifier: Apache-2.0
"""plan_verify: bit-equal to the plain reference, opcheck, compile, properties, bad input."""

import itertools

import pytest
import torch
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import dspark
from dspark.reference import plan_verify_ref, sps_ceil_ref
from tests.ops.samples import confidence_inputs, sps_table, survival_batch

MODES = ["full", "threshold", "early_stop", "lagged_topk"]


@pytest.mark.parametrize("R", [1, 3, 64])
@pytest.mark.parametrize("gamma", [1, 4, 7, 15])
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("sps_kind", ["decaying", "jagged", "flat", "steep"])
def test_matches_reference(R, gamma, mode, sps_kind):
    seed = R * 1000 + gamma * 10 + MODES.index(mode)
    surv = survival_batch(R, gamma, seed=seed)
    lagged = survival_batch(R, gamma, seed=seed + 1)
    tokens, rate = sps_table(sps_kind, seed=seed)
    out = dspark.ops.plan_verify(surv, tokens, rate, mode, lagged, 0.7)
    ref = plan_verify_ref(surv, tokens, rate, mode, lagged, 0.7)
    assert out[0].dtype == torch.int32 and out[1].dtype == torch.int64
    assert torch.equal(out[0], ref[0]), (out[0], ref[0])
    assert torch.equal(out[1], ref[1])
    assert bool(((out[0] >= 1) & (out[0] <= gamma + 1)).all())


def test_ties_follow_the_value_independent_order():
    # every survival equal: admission goes by position first, then by request index
    surv = torch.full((4, 3), 0.5)
    tokens, rate = torch.tensor([1, 100]), torch.tensor([10.0, 10.0], dtype=torch.float64)
    lagged = torch.zeros(4, 3)
    lagged[0, :2] = 1.0  # budget K: two candidates improve Theta under a flat table
    vl, k = dspark.ops.plan_verify(surv, tokens, rate, "lagged_topk", lagged)
    assert int(k) == 2
    assert vl.tolist() == [2, 2, 1, 1]  # (r0, j0), (r1, j0): position ascending, then request ascending


def test_sps_ceiling_pricing():
    tokens, rate = [4, 8], [10.0, 5.0]
    assert sps_ceil_ref(tokens, rate, 1) == 10.0
    assert sps_ceil_ref(tokens, rate, 5) == 5.0  # between probes: the next probe up, never the floor
    assert sps_ceil_ref(tokens, rate, 16) == 2.5  # past the last probe: constant tokens/s
    # the op uses the same rule: with R = 1 and a cliff right after B = 4, a 4th draft is not worth it
    surv = torch.tensor([[0.99, 0.98, 0.97, 0.96, 0.95]])
    vl, _ = dspark.ops.plan_verify(surv, torch.tensor(tokens), torch.tensor(rate, dtype=torch.float64))
    assert vl.tolist() == [4]


@pytest.mark.parametrize("mode", ["early_stop", "lagged_topk"])
def test_tau_is_summed_in_units_of_two_to_the_minus_32(mode):
    # Under a flat table any a > 0 raises Theta in fp64, but tau is summed in fixed point (exact, order-free
    # on every device): a survival below 2^-32 adds nothing, so Theta does not strictly improve.
    tokens, rate = torch.tensor([1, 100]), torch.tensor([10.0, 10.0], dtype=torch.float64)
    tiny = torch.tensor([[2.0**-33, 2.0**-34], [0.5, 2.0**-40]])
    vl, k = dspark.ops.plan_verify(tiny, tokens, rate, mode, tiny)
    assert vl.tolist() == [1, 2] and int(k) == 1
    just = torch.tensor([[2.0**-32, 0.0]])  # exactly one unit: admitted
    assert dspark.ops.plan_verify(just, tokens, rate, mode, just)[0].tolist() == [2]


def test_opcheck():
    surv = survival_batch(5, 4, seed=1)
    tokens, rate = sps_table("decaying")
    for mode in MODES:
        torch.library.opcheck(
            torch.ops.dspark.plan_verify.default, (surv, surv.clone(), tokens, rate, mode, 0.5)
        )
    torch.library.opcheck(torch.ops.dspark.plan_verify.default, (surv, None, tokens, rate, "early_stop", 0.0))


def _confidence_then_plan(hidden, prev_emb, weight, bias, sts, tokens, rate):
    _, _, surv = dspark.ops.confidence(hidden, prev_emb, weight, bias, sts)
    return dspark.ops.plan_verify(surv, tokens, rate, "early_stop")


def test_compile_fullgraph_chain():
    torch._dynamo.reset()
    args = (*confidence_inputs(8, 7, seed=4), *sps_table("decaying"))
    compiled = torch.compile(_confidence_then_plan, fullgraph=True)
    eager = _confidence_then_plan(*args)
    got = compiled(*args)
    assert torch.equal(got[0], eager[0]) and torch.equal(got[1], eager[1])


# ---------------------------------------------------------------- properties
def _theta(surv, lengths, tokens, rate):
    R = len(lengths)
    tau = R + sum(float(surv[r, :n].double().sum()) for r, n in enumerate(lengths))
    return tau * sps_ceil_ref(tokens, rate, R + sum(lengths))


survival_rows = st.integers(1, 3).flatmap(
    lambda gamma: st.lists(
        st.lists(st.floats(0.05, 1.0), min_size=gamma, max_size=gamma), min_size=1, max_size=3
    )
)
sps_rates = st.lists(st.floats(1.0, 100.0), min_size=1, max_size=12)


def _as_survival(rows):
    return torch.cumprod(torch.tensor(rows, dtype=torch.float32), dim=1)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.filter_too_much])
@given(rows=survival_rows, rates=sps_rates, mode=st.sampled_from(MODES), thr=st.floats(0.0, 1.0))
def test_lengths_are_prefixes_in_range(rows, rates, mode, thr):
    surv = _as_survival(rows)
    R, gamma = surv.shape
    tokens = torch.arange(1, len(rates) + 1)
    rate = torch.tensor(rates, dtype=torch.float64)
    lagged = _as_survival(rows[::-1])
    vl, budget = dspark.ops.plan_verify(surv, tokens, rate, mode, lagged, thr)
    assert bool(((vl >= 1) & (vl <= gamma + 1)).all())
    if mode in ("early_stop", "lagged_topk"):
        # admitted drafts are exactly the first (vl - 1) of each row: the global order admits (r, j) only
        # after (r, j - 1), so the count per request determines a prefix
        n_pos = (surv > 0).sum(dim=1)
        assert bool((vl - 1 <= n_pos).all())
    if mode == "lagged_topk":
        assert int((vl - 1).sum()) <= int(budget)


@settings(max_examples=100, deadline=None)
@given(rows=survival_rows, rate=st.floats(0.5, 500.0))
def test_flat_sps_verifies_everything(rows, rate):
    surv = _as_survival(rows)
    gamma = surv.shape[1]
    tokens, rates = torch.tensor([1, 4096]), torch.tensor([rate, rate], dtype=torch.float64)
    for mode in ("early_stop", "lagged_topk"):
        vl, _ = dspark.ops.plan_verify(surv, tokens, rates, mode, torch.ones_like(surv))
        assert vl.tolist() == [gamma + 1] * surv.shape[0]


@settings(max_examples=100, deadline=None)
@given(rows=survival_rows)
def test_steep_sps_verifies_only_anchors(rows):
    surv = _as_survival(rows)
    R = surv.shape[0]
    # any extra token costs more than the best possible gain (tau at most doubles per token here)
    tokens = torch.arange(1, 64)
    rate = torch.tensor([1e6 * 0.01 ** max(0, int(t) - R) for t in tokens], dtype=torch.float64)
    for mode in ("early_stop", "lagged_topk"):
        vl, _ = dspark.ops.plan_verify(surv, tokens, rate, mode, torch.ones_like(surv))
        assert vl.tolist() == [1] * R


def _greedy_path_thetas(surv, tokens, rate):
    R = surv.shape[0]
    cands = sorted(
        ((float(surv[r, j]), j, r) for r in range(R) for j in range(surv.shape[1]) if surv[r, j] > 0),
        key=lambda c: (-c[0], c[1], c[2]),
    )
    thetas, tau = [R * sps_ceil_ref(tokens, rate, R)], float(R)
    for k, (a, _, _) in enumerate(cands, start=1):
        tau += a
        thetas.append(tau * sps_ceil_ref(tokens, rate, R + k))
    return thetas


def _unimodal(xs):
    peak = max(range(len(xs)), key=lambda i: xs[i])
    up = all(xs[i] < xs[i + 1] for i in range(peak))
    down = all(xs[i] > xs[i + 1] for i in range(peak, len(xs) - 1))
    return up and down


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.filter_too_much])
@given(rows=survival_rows, decay=st.lists(st.floats(0.3, 1.0), min_size=12, max_size=12))
def test_early_stop_reaches_brute_force_optimum_when_unimodal(rows, decay):
    surv = _as_survival(rows)
    R, gamma = surv.shape
    tokens = list(range(1, 13))
    rate, r = [], 100.0
    for d in decay:  # non-increasing steps/s
        r *= d
        rate.append(r)
    thetas = _greedy_path_thetas(surv, tokens, rate)
    assume(_unimodal(thetas))
    vl, _ = dspark.ops.plan_verify(
        surv, torch.tensor(tokens), torch.tensor(rate, dtype=torch.float64), "early_stop"
    )
    got = _theta(surv, [int(v) - 1 for v in vl], tokens, rate)
    best = max(_theta(surv, list(ls), tokens, rate) for ls in itertools.product(range(gamma + 1), repeat=R))
    assert got == pytest.approx(best, rel=1e-9)


@settings(max_examples=200, deadline=None)
@given(rows=survival_rows, lag_rows=survival_rows, rates=sps_rates)
def test_lagged_topk_never_exceeds_budget(rows, lag_rows, rates):
    surv = _as_survival(rows)
    lag = _as_survival(lag_rows)
    # lagged survival must have the same shape: tile / crop it
    lag = lag.repeat(surv.shape[0], surv.shape[1])[: surv.shape[0], : surv.shape[1]]
    lag = torch.cumprod(
        torch.where(lag > 0, lag / torch.cat([torch.ones_like(lag[:, :1]), lag[:, :-1]], 1), 0), 1
    )
    lag = lag.clamp(0, 1)
    lag = torch.minimum(lag, torch.cummin(lag, dim=1).values)
    vl, k = dspark.ops.plan_verify(
        surv, torch.arange(1, len(rates) + 1), torch.tensor(rates, dtype=torch.float64), "lagged_topk", lag
    )
    assert int((vl - 1).sum()) <= int(k)
    assert int(k) <= int((lag > 0).sum())


# ---------------------------------------------------------------- bad input
def _args(**changes):
    surv = survival_batch(3, 4, seed=9)
    tokens, rate = sps_table("decaying")
    d = dict(survival=surv, sps_tokens=tokens, sps_rate=rate, mode="early_stop", lagged_survival=None)
    d.update(changes)
    return d


@pytest.mark.parametrize(
    "changes,match",
    [
        (dict(survival=torch.tensor([[0.5, 1.2]])), "survival\\[0, 1\\] = 1.2 is not a probability"),
        (dict(survival=torch.tensor([[-0.1, 0.0]])), "not a probability"),
        (dict(survival=torch.tensor([[0.5, 0.6]])), "survival\\[0\\] increases at position 1"),
        (dict(survival=torch.tensor([[0.5, float("nan")]])), "not a probability"),
        (dict(survival=torch.rand(3, 4, dtype=torch.float64)), "survival must be torch.float32"),
        (dict(survival=torch.rand(3)), "survival must be 2-D"),
        (dict(survival=torch.zeros(2, 0)), "gamma >= 1"),
        # tau's int64 fixed point bounds the batch (a stride-0 view: no 8 GiB tensor is allocated)
        (dict(survival=torch.zeros(1, 1).expand(2**20, 2**11)), "survival must have R \\* \\(gamma \\+ 1\\)"),
        (dict(mode="greedy"), "mode must be one of"),
        (dict(mode="lagged_topk"), "needs lagged_survival"),
        (dict(mode="lagged_topk", lagged_survival=torch.ones(3, 5)), "lagged_survival must have the shape"),
        (dict(mode="lagged_topk", lagged_survival=torch.full((3, 4), 2.0)), "lagged_survival\\[0, 0\\]"),
        (dict(sps_tokens=torch.tensor([1, 4, 4]), sps_rate=torch.ones(3, dtype=torch.float64)), "strictly"),
        (dict(sps_tokens=torch.tensor([0, 4]), sps_rate=torch.ones(2, dtype=torch.float64)), "strictly"),
        (
            dict(sps_tokens=torch.tensor([1, 4]), sps_rate=torch.tensor([1.0, 0.0], dtype=torch.float64)),
            "> 0",
        ),
        (dict(sps_tokens=torch.tensor([1, 4]), sps_rate=torch.tensor([1.0, float("inf")])), "float64"),
        (
            dict(
                sps_tokens=torch.tensor([1, 4]),
                sps_rate=torch.tensor([1.0, float("inf")], dtype=torch.float64),
            ),
            "sps_rate\\[1\\]",
        ),
        (dict(sps_tokens=torch.tensor([1, 4]), sps_rate=torch.ones(3, dtype=torch.float64)), "equal length"),
        (dict(sps_tokens=torch.tensor([1.0, 4.0])), "sps_tokens must be torch.int64"),
    ],
)
def test_bad_input_names_the_argument(changes, match):
    with pytest.raises(ValueError, match=match):
        dspark.ops.plan_verify(**_args(**changes))


def test_empty_batch():
    tokens, rate = sps_table("decaying")
    for mode in MODES:
        vl, k = dspark.ops.plan_verify(torch.zeros(0, 4), tokens, rate, mode, torch.zeros(0, 4))
        assert vl.shape == (0,) and int(k) == 0
