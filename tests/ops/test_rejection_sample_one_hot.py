# SPDX-License-Identifier: Apache-2.0
"""rejection_sample with deterministic ("one-hot") proposals: ``draft_one_hot`` and ``draft_logits=None``.

Bit-equal to the reference, equal to an exactly one-hot q, SIMD == scalar, the emitted law of tiny rounds
against exact enumeration from p (with negative controls that must fail), opcheck, bad input.
"""

import pytest
import torch
from torch import Tensor

import dspark
from dspark.reference import draft_probs_ref, rejection_sample_ref, target_probs_ref
from tests.ops.test_rejection_sample import PROCS, _bad, _wide_inputs, rs_inputs


def onehot_inputs(R=6, G=4, V=300, seed=1, dtype=torch.float32, hit=0.7):
    """rs_inputs whose drafts are often strongly favoured by the target (a margin of 0..3 over the row's
    maximum), so one-hot rows (accepted with probability p(x)) accept often, as greedy rows do."""
    g = torch.Generator().manual_seed(seed + 1000)
    tl, qo, z, drafts, vl, temp = rs_inputs(R=R, G=G, V=V, seed=seed)
    tl = tl.float()
    for r in range(R):
        for i in range(int(vl[r]) - 1):
            if torch.rand((), generator=g) < hit:
                row = int(qo[r]) + i
                tl[row, drafts[r, i]] = tl[row].max() + 3 * torch.rand((), generator=g)
    return tl.to(dtype), qo, z, drafts, vl, temp


ONE_HOT_MASKS = {
    "mixed": torch.tensor([True, False, True, True, False, True]),
    "all": torch.ones(6, dtype=torch.bool),
    "none": torch.zeros(6, dtype=torch.bool),
}


def masked_draft_logits(z: Tensor, mask: str) -> tuple[Tensor | None, dict]:
    """``(draft_logits, kwargs)`` for a mask of ONE_HOT_MASKS (NaN in the one-hot requests' rows, never read),
    or no draft logits at all for ``"no_draft_logits"``."""
    if mask == "no_draft_logits":
        return None, {}
    oh = ONE_HOT_MASKS[mask]
    zz = z.clone()
    zz[oh] = float("nan")
    return zz, {"draft_one_hot": oh}


@pytest.mark.parametrize("procs", PROCS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("mask", ["mixed", "all", "none", "no_draft_logits"])
def test_one_hot_bit_equal_to_reference(procs, dtype, mask):
    # ragged verify lengths, greedy and sampled rows, processors; the draft rows of one-hot requests hold NaN
    # (never read, not checked)
    tl, qo, z, drafts, vl, temp = onehot_inputs(seed=21, dtype=dtype)
    ids = torch.tensor([7, 2**32 - 1, 0, 12, 99, 5])
    zz, kw = masked_draft_logits(z, mask)
    for seed in range(3):
        for ids_kw in ({}, {"request_ids": ids}):
            o = dspark.ops.rejection_sample(tl, qo, zz, drafts, vl, temp, seed, 3, **ids_kw, **kw, **procs)
            r = rejection_sample_ref(tl, qo, zz, drafts, vl, temp, seed, 3, **ids_kw, **kw, **procs)
            assert torch.equal(o[0], r[0]) and torch.equal(o[1], r[1]), (seed, o, r)


def test_one_hot_accepts_and_rejects():
    # the inputs exercise both branches of the one-hot rule on sampled rows, and the output layout holds
    R = 60
    tl, qo, z, drafts, vl, temp = onehot_inputs(R=R, seed=5)
    acc, out = dspark.ops.rejection_sample(tl, qo, None, drafts, vl, temp, 4, 0)
    sampled = (temp > 0) & (vl > 1)
    assert bool((acc[sampled] > 0).any()) and bool((acc[sampled] < vl[sampled] - 1).any())
    for r in range(R):
        a = int(acc[r])
        assert 0 <= a <= int(vl[r]) - 1 and torch.equal(out[r, :a], drafts[r, :a])
        assert 0 <= int(out[r, a]) < 300 and bool((out[r, a + 1 :] == -1).all())
        if a < int(vl[r]) - 1 and float(temp[r]) > 0:  # a rejected one-hot proposal is never re-emitted
            assert int(out[r, a]) != int(drafts[r, a])


def test_one_hot_greedy_rows_unchanged():
    # T = 0: accept iff the argmax equals the draft, whether the request is one-hot or not
    tl, qo, z, drafts, vl, _ = onehot_inputs(seed=6)
    temp = torch.zeros(6)
    want = dspark.ops.rejection_sample(tl, qo, z, drafts, vl, temp, 0, 0)
    for zz, kw in ((None, {}), (z, {"draft_one_hot": ONE_HOT_MASKS["mixed"]})):
        got = dspark.ops.rejection_sample(tl, qo, zz, drafts, vl, temp, 0, 0, **kw)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


def test_one_hot_degenerate_target():
    # top_k = 1: p is one-hot at the argmax a. A proposal a is always accepted; any other is always rejected
    # and the residual (p without x) is p itself, so a is emitted
    tl, qo, _, drafts, vl, _ = onehot_inputs(R=40, seed=8, hit=0.5)
    temp, top_k = torch.ones(40), torch.ones(40, dtype=torch.int64)
    acc, out = dspark.ops.rejection_sample(tl, qo, None, drafts, vl, temp, 1, 1, top_k=top_k)
    for r in range(40):
        am = tl[int(qo[r]) : int(qo[r + 1])].argmax(-1)
        n = 0
        while n < int(vl[r]) - 1 and int(drafts[r, n]) == int(am[n]):
            n += 1
        assert int(acc[r]) == n and int(out[r, n]) == int(am[n])


@pytest.mark.parametrize("procs", [0, 3])
@pytest.mark.parametrize("z_off", [-1e30, float("-inf")])
def test_one_hot_equals_exactly_one_hot_q(procs, z_off):
    # draft logits 0 at x and -1e30 (or -inf) elsewhere give q = 1.0 at x and 0.0 elsewhere exactly, at every
    # temperature used; a normal request with them decides exactly as a one-hot request (same keys, same test)
    R = 24
    tl, qo, _, drafts, vl, _ = onehot_inputs(R=R, seed=9)
    temp = torch.tensor([0.0, 1.0, 0.7, 1.3, 0.05, 2.5])[torch.arange(R) % 6]
    z = torch.full((R, drafts.shape[1], 300), z_off)
    z.scatter_(2, drafts[:, :, None], 0.0)
    for r in range(R):
        if float(temp[r]) > 0:
            for i in range(drafts.shape[1]):
                q = draft_probs_ref(z[r, i], float(temp[r]))
                assert float(q[drafts[r, i]]) == 1.0 and int((q != 0).sum()) == 1
    kw = {}
    if procs:
        pr = PROCS[procs]
        kw = {k: pr[k].repeat(4) for k in ("top_k", "top_p", "repetition_penalty")}
        kw["penalty_tokens"] = pr["penalty_tokens"]
        kw["penalty_indptr"] = torch.cat([pr["penalty_indptr"], torch.full((R - 6,), 20)])
    for seed in range(4):
        want = dspark.ops.rejection_sample(tl, qo, z, drafts, vl, temp, seed, 2, **kw)
        garbage = torch.full_like(z, float("nan"))
        for zz, extra in ((None, {}), (garbage, {"draft_one_hot": torch.ones(R, dtype=torch.bool)})):
            got = dspark.ops.rejection_sample(tl, qo, zz, drafts, vl, temp, seed, 2, **kw, **extra)
            assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1]), (seed, got, want)


@pytest.mark.parametrize("V", [1, 15, 17, 63, 65, 257, 1000])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_one_hot_simd_and_scalar_paths_agree(V, dtype, monkeypatch):
    # the vector path excludes x inside its 16-id chunks and 64-id noise blocks; the scalar loops by index.
    # Drafts at chunk edges; processors on; mixed one-hot / normal requests and no draft_logits at all
    R, G = 12, 4
    tl, qo, z, drafts, vl, temp = _wide_inputs(R, G, V, seed=V + 1, dtype=dtype)
    edges = torch.tensor([0, 15, 16, 63, 64, V - 1, 31, 17]) % V
    drafts = edges[torch.randperm(R * G, generator=torch.Generator().manual_seed(V)) % len(edges)]
    drafts = drafts.reshape(R, G)
    pr = PROCS[3]
    kw = {k: pr[k].repeat(2) for k in ("top_k", "top_p", "repetition_penalty")}
    kw["penalty_tokens"] = pr["penalty_tokens"] % V
    kw["penalty_indptr"] = torch.cat([pr["penalty_indptr"], torch.full((R - 6,), 20)])
    kw["request_ids"] = torch.randint(0, 2**32, (R,), generator=torch.Generator().manual_seed(V))
    for zz, extra in ((z, {"draft_one_hot": torch.arange(R) % 3 != 1}), (None, {})):
        for seed in range(3):
            monkeypatch.delenv("DSPARK_CPU_SIMD", raising=False)
            fast = dspark.ops.rejection_sample(tl, qo, zz, drafts, vl, temp, seed, 5, **kw, **extra)
            monkeypatch.setenv("DSPARK_CPU_SIMD", "0")
            scalar = dspark.ops.rejection_sample(tl, qo, zz, drafts, vl, temp, seed, 5, **kw, **extra)
            assert torch.equal(fast[0], scalar[0]) and torch.equal(fast[1], scalar[1]), (seed, fast, scalar)
        if V >= 17:
            ref = rejection_sample_ref(tl, qo, zz, drafts, vl, temp, 2, 5, **kw, **extra)
            assert torch.equal(fast[0], ref[0]) and torch.equal(fast[1], ref[1])


# Exact law of a round of deterministic proposals on a tiny vocabulary. With drafts x_1, x_2 and target rows
# p_0 (after the anchor), p_1 (after x_1), p_2 (after x_1 x_2), speculative sampling must emit a sequence with
# the target's own law: y_1 ~ p_0; if y_1 = x_1 then y_2 ~ p_1; if also y_2 = x_2 then y_3 ~ p_2 (bonus).
TINY_V = 4
TINY_LOGITS = torch.tensor([[1.0, 0.2, 0.4, -1.0], [0.3, -0.5, 1.2, 0.0], [-0.2, 0.9, 0.1, 0.5]])


def _tiny_outcomes(drafts: list[int]) -> list[tuple]:
    x1, x2 = drafts
    return (
        [(a,) for a in range(TINY_V) if a != x1]
        + [(x1, b) for b in range(TINY_V) if b != x2]
        + [(x1, x2, c) for c in range(TINY_V)]
    )


def _tiny_law(drafts: list[int], temperature: float, top_k: int) -> dict:
    """Exact probability of every emitted sequence, by enumeration from p alone."""
    p = [target_probs_ref(TINY_LOGITS[i], temperature, top_k)[1].double() for i in range(3)]
    law = {}
    for seq in _tiny_outcomes(drafts):
        pr = 1.0
        for i, y in enumerate(seq):
            pr *= float(p[i][y])
        law[seq] = pr
    assert abs(sum(law.values()) - 1.0) < 1e-6
    return law


def _chi_square_p(counts: dict, law: dict) -> float:
    """Upper-tail p-value of Pearson's statistic over the outcomes of positive probability; an outcome of
    probability 0 that occurs gives 0."""
    n = sum(counts.values())
    if any(law.get(k, 0.0) == 0.0 for k in counts):
        return 0.0
    keep = [k for k, pr in law.items() if pr > 0]
    stat = sum((counts.get(k, 0) - n * law[k]) ** 2 / (n * law[k]) for k in keep)
    dof = torch.tensor((len(keep) - 1) / 2.0, dtype=torch.float64)
    return float(torch.special.gammaincc(dof, torch.tensor(stat / 2.0, dtype=torch.float64)))


def _tiny_round(R: int, drafts: list[int], temperature: float, top_k: int, seed: int, **op_kw):
    tl = TINY_LOGITS.repeat(R, 1)
    qo = torch.arange(R + 1, dtype=torch.int32) * 3
    d = torch.tensor(drafts).repeat(R, 1)
    vl = torch.full((R,), 3, dtype=torch.int32)
    kw = {"request_ids": torch.arange(R) + 1000, "top_k": torch.full((R,), top_k), **op_kw}
    return tl, qo, d, vl, torch.full((R,), temperature), seed, kw


def _emitted(acc: Tensor, out: Tensor) -> dict:
    counts: dict = {}
    for a, row in zip(acc.tolist(), out.tolist(), strict=True):
        seq = tuple(row[: a + 1])
        counts[seq] = counts.get(seq, 0) + 1
    return counts


def _no_removal_round(tl, qo, d, vl, temp, seed, kw):
    """Negative control: accept with probability p(x) (right), but on rejection draw from p itself, x kept."""
    R = d.shape[0]
    gen = torch.Generator().manual_seed(seed)
    p = [target_probs_ref(TINY_LOGITS[i], float(temp[0]), int(kw["top_k"][0]))[1] for i in range(3)]
    out = torch.full((R, 3), -1, dtype=torch.int64)
    acc = torch.zeros(R, dtype=torch.int32)
    for r in range(R):
        for i in range(3):
            if i == 2 or not bool(torch.rand((), generator=gen) < p[i][d[r, i]]):
                out[r, i] = int(torch.multinomial(p[i], 1, generator=gen))
                break
            out[r, i] = d[r, i]
            acc[r] += 1
    return acc, out


@pytest.mark.parametrize(
    "drafts,temperature,top_k",
    [([0, 2], 1.0, 0), ([2, 1], 0.7, 0), ([3, 2], 1.0, 3), ([1, 0], 1.5, 0)],
)
def test_one_hot_round_has_the_target_law(drafts, temperature, top_k):
    # R = 6000 independent requests (distinct request ids) in one call; ([3, 2], top-k 3): p_0(x_1) = 0, never
    # accepted. Negative controls on the same statistic: q taken as uniform (a normal request with zero draft
    # logits) and a residual that keeps x
    R = 6000
    law = _tiny_law(drafts, temperature, top_k)
    tl, qo, d, vl, temp, seed, kw = _tiny_round(R, drafts, temperature, top_k, seed=sum(drafts) + 1)
    acc, out = dspark.ops.rejection_sample(tl, qo, None, d, vl, temp, seed, 4, **kw)
    counts = _emitted(acc, out)
    p_ok = _chi_square_p(counts, law)
    assert p_ok > 1e-4, (p_ok, counts, law)
    # the same rounds through draft_one_hot (draft rows unread) emit the same tokens
    garbage = torch.full((R, 2, TINY_V), float("nan"))
    acc2, out2 = dspark.ops.rejection_sample(
        tl, qo, garbage, d, vl, temp, seed, 4, draft_one_hot=torch.ones(R, dtype=torch.bool), **kw
    )
    assert torch.equal(acc, acc2) and torch.equal(out, out2)
    uniform = torch.zeros(R, 2, TINY_V)  # q uniform: accept with min(1, 4 p(x)), the wrong law
    bad = _emitted(*dspark.ops.rejection_sample(tl, qo, uniform, d, vl, temp, seed, 4, **kw))
    assert _chi_square_p(bad, law) < 1e-6
    if law[(drafts[0], drafts[1], 0)] > 0:  # (keeping x changes nothing where p_0(x_1) = 0)
        keep_x = _emitted(*_no_removal_round(tl, qo, d, vl, temp, seed, kw))
        assert _chi_square_p(keep_x, law) < 1e-6


def test_one_hot_opcheck_and_compile():
    tl, qo, z, drafts, vl, temp = onehot_inputs(R=6, V=50, seed=2)
    oh = ONE_HOT_MASKS["mixed"]
    op = torch.ops.dspark.rejection_sample.default
    torch.library.opcheck(op, (tl, qo, z, drafts, vl, temp, 1, 2) + (None,) * 6 + (oh,))
    torch.library.opcheck(op, (tl, qo, None, drafts, vl, temp, 1, 2) + (None,) * 6)
    torch.library.opcheck(
        op,
        (
            tl,
            qo,
            None,
            drafts,
            vl,
            temp,
            1,
            2,
            torch.arange(6) + 3,
            PROCS[3]["top_k"],
            PROCS[3]["top_p"],
            PROCS[3]["repetition_penalty"],
            PROCS[3]["penalty_tokens"] % 50,
            PROCS[3]["penalty_indptr"],
            torch.ones(6, dtype=torch.bool),
        ),
    )
    fn = torch.compile(
        lambda t, q, zz, d, v, tt, o: dspark.ops.rejection_sample(t, q, zz, d, v, tt, 1, 2, draft_one_hot=o),
        fullgraph=True,
    )
    for zz, o in ((z, oh), (None, None)):
        want = dspark.ops.rejection_sample(tl, qo, zz, drafts, vl, temp, 1, 2, draft_one_hot=o)
        for got, exp in zip(fn(tl, qo, zz, drafts, vl, temp, o), want, strict=True):
            assert torch.equal(got, exp)


def _nan_in_request(r):
    z = _bad()["draft_logits"].clone()
    z[r, -1, -1] = float("nan")
    return z


@pytest.mark.parametrize(
    "changes,match",
    [
        (
            {"draft_one_hot": torch.ones(6, dtype=torch.int64)},
            "draft_one_hot must be torch.bool, got torch.int64",
        ),
        ({"draft_one_hot": torch.ones(5, dtype=torch.bool)}, "draft_one_hot must have one entry per request"),
        ({"draft_one_hot": torch.ones(6, 1, dtype=torch.bool)}, "draft_one_hot must be 1-D"),
        (
            {"draft_logits": None, "draft_one_hot": torch.tensor([True] * 5 + [False])},
            "draft_one_hot\\[5\\] is False but draft_logits is None",
        ),
        ({"draft_logits": None, "draft_one_hot": torch.ones(4, dtype=torch.bool)}, "draft_one_hot must have"),
        ({"draft_logits": None, "verify_len": torch.ones(5, dtype=torch.int32)}, "verify_len must have one"),
        (
            {"draft_logits": None, "draft_tokens": torch.full((6, 4), 30)},
            "draft_tokens\\[0, 0\\] = 30 is outside the vocabulary \\[0, 30\\)",
        ),
        (  # a NaN in a request that is not one-hot is still an error
            {"draft_one_hot": torch.tensor([True] * 5 + [False]), "draft_logits": _nan_in_request(5)},
            "draft_logits contains NaN or \\+inf",
        ),
    ],
)
def test_one_hot_bad_input_names_the_argument(changes, match):
    with pytest.raises(ValueError, match=match):
        dspark.ops.rejection_sample(**_bad(**changes))


def test_one_hot_rows_may_hold_anything():
    # NaN / +inf in the draft rows of one-hot requests is not an error (those rows are never read)
    d = _bad()
    z = d["draft_logits"].clone()
    z[0, 0, 0], z[2, 1, 3] = float("nan"), float("inf")
    oh = torch.tensor([True, False, True, False, False, False])
    want = dspark.ops.rejection_sample(**{**d, "draft_one_hot": oh})
    got = dspark.ops.rejection_sample(**{**d, "draft_logits": z, "draft_one_hot": oh})
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
