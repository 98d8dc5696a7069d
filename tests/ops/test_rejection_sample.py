# SPDX-License-Identifier: Apache-2.0
"""rejection_sample: bit-equal to the reference, processors = HF plain decoding, greedy rules, opcheck, errors."""

import pytest
import torch

import dspark
from dspark.reference import rejection_sample_ref, target_probs_ref


def rs_inputs(R=6, G=4, V=300, seed=1, dtype=torch.float32, match=0.0):
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(R, G, V, generator=g)
    vl = torch.randint(1, G + 2, (R,), generator=g).to(torch.int32)
    vl[0] = G + 1
    qo = torch.zeros(R + 1, dtype=torch.int32)
    qo[1:] = torch.cumsum(vl, 0)
    tl = (torch.randn(int(qo[-1]) + 2, V, generator=g) * 0.7).to(dtype)
    drafts = torch.randint(0, V, (R, G), generator=g)
    if match:  # make drafts the target argmax often, so greedy rows accept
        for r in range(R):
            for i in range(int(vl[r]) - 1):
                if torch.rand((), generator=g) < match:
                    drafts[r, i] = int(tl[int(qo[r]) + i].float().argmax())
    temp = torch.tensor([0.0, 1.0, 0.7, 1.3, 1.0, 0.5] * R)[:R]
    return tl, qo, z, drafts, vl, temp


PROCS = [
    {},
    {"top_k": torch.tensor([0, 5, 50, 1, 400, 10])},
    {"top_p": torch.tensor([1.0, 0.9, 0.5, 0.2, 0.99, 0.7])},
    {
        "top_k": torch.tensor([3, 5, 50, 1, 400, 10]),
        "top_p": torch.tensor([1.0, 0.9, 0.5, 0.2, 0.99, 0.7]),
        "repetition_penalty": torch.tensor([1.3, 1.2, 0.8, 1.1, 2.0, 1.0]),
        "penalty_tokens": torch.arange(20) * 13 % 300,
        "penalty_indptr": torch.tensor([0, 3, 5, 9, 12, 20, 20]),
    },
]


@pytest.mark.parametrize("procs", PROCS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("seed", [0, 1])
def test_bit_equal_to_reference(procs, dtype, seed):
    args = rs_inputs(seed=seed + 10, dtype=dtype, match=0.6)
    ids = torch.tensor([7, 2**32 - 1, 0, 12, 99, 5])
    for kw in ({}, {"request_ids": ids}):
        o = dspark.ops.rejection_sample(*args, seed, 3, **kw, **procs)
        r = rejection_sample_ref(*args, seed, 3, **kw, **procs)
        assert torch.equal(o[0], r[0]) and torch.equal(o[1], r[1]), (o, r)


def test_output_layout():
    tl, qo, z, drafts, vl, temp = rs_inputs(R=6, seed=4, match=0.8)
    acc, out = dspark.ops.rejection_sample(tl, qo, z, drafts, vl, temp, 0, 0)
    assert acc.dtype == torch.int32 and out.shape == (6, 5)
    for r in range(6):
        a = int(acc[r])
        assert 0 <= a <= int(vl[r]) - 1
        assert torch.equal(out[r, :a], drafts[r, :a])
        assert 0 <= int(out[r, a]) < 300
        assert bool((out[r, a + 1 :] == -1).all())


def test_greedy_rule_independent():
    tl, qo, z, drafts, vl, _ = rs_inputs(R=6, seed=5, match=0.7)
    acc, out = dspark.ops.rejection_sample(tl, qo, z, drafts, vl, torch.zeros(6), 0, 0)
    for r in range(6):
        am = tl[int(qo[r]) : int(qo[r + 1])].argmax(-1)
        n = 0
        while n < int(vl[r]) - 1 and int(drafts[r, n]) == int(am[n]):
            n += 1
        assert int(acc[r]) == n and int(out[r, n]) == int(am[n])


def test_processors_match_transformers():
    from transformers.generation.logits_process import (
        RepetitionPenaltyLogitsProcessor,
        TemperatureLogitsWarper,
        TopKLogitsWarper,
        TopPLogitsWarper,
    )

    g = torch.Generator().manual_seed(0)
    for _ in range(10):
        logits = torch.randn(1, 200, generator=g) * 3
        seen = torch.randint(0, 200, (1, 12), generator=g)
        t, k, p, pen = 0.8, 40, 0.85, 1.3
        s = RepetitionPenaltyLogitsProcessor(pen)(seen, logits.clone())
        s = TemperatureLogitsWarper(t)(seen, s)
        s = TopKLogitsWarper(k)(seen, s)
        s = TopPLogitsWarper(p)(seen, s)
        want = torch.softmax(s.double(), -1)[0]
        _, got = target_probs_ref(logits[0], t, k, p, pen, seen[0].tolist())
        torch.testing.assert_close(got.double(), want, atol=2e-6, rtol=1e-4)


def _wide_inputs(R, G, V, seed, dtype):
    """Verify inputs with logits spread wide enough to reach exp's underflow branches and subnormal weights."""
    g = torch.Generator().manual_seed(seed)
    tl, qo, z, drafts, vl, _ = rs_inputs(R=R, G=G, V=V, seed=seed, match=0.5)
    scale = torch.tensor([1.0, 8.0, 40.0, 0.3])[torch.arange(R) % 4]
    z = z * scale[:, None, None]
    tl = tl.float() * torch.rand(tl.shape[0], 1, generator=g) * 40  # row scales from 0 to 40
    if V > 3:  # masked tokens
        z[0, 0, :3] = -float("inf")
        tl[0, V // 2] = -float("inf")
    temp = torch.tensor([0.0, 1.0, 0.7, 1.3, 0.05, 2.5])[torch.arange(R) % 6]
    return tl.to(dtype), qo, z, drafts, vl, temp


@pytest.mark.parametrize("V", [1, 15, 17, 63, 65, 255, 257, 1000])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("procs", [0, 1, 3])
def test_simd_and_scalar_paths_agree(V, dtype, procs, monkeypatch):
    # The vectorised CPU passes (when the CPU has AVX-512) and the scalar loops (DSPARK_CPU_SIMD=0) accept and
    # emit the same tokens: vocabularies off the vector width, the 64-id noise blocks and the 256 sum lanes;
    # logits spread enough that exp underflows and residual weights go subnormal; -inf entries; processors.
    R, G = 12, 4
    args = _wide_inputs(R, G, V, seed=V, dtype=dtype)
    kw = {"request_ids": torch.randint(0, 2**32, (R,), generator=torch.Generator().manual_seed(V))}
    if procs:
        pr = PROCS[procs]
        for name in ("top_k", "top_p", "repetition_penalty"):
            if name in pr:
                kw[name] = pr[name].repeat(2)
        if "penalty_tokens" in pr:
            kw["penalty_tokens"] = pr["penalty_tokens"] % V
            kw["penalty_indptr"] = torch.cat([pr["penalty_indptr"], torch.full((R - 6,), 20)])
    for seed in range(3):
        monkeypatch.delenv("DSPARK_CPU_SIMD", raising=False)
        fast = dspark.ops.rejection_sample(*args, seed, 5, **kw)
        monkeypatch.setenv("DSPARK_CPU_SIMD", "0")
        scalar = dspark.ops.rejection_sample(*args, seed, 5, **kw)
        assert torch.equal(fast[0], scalar[0]) and torch.equal(fast[1], scalar[1]), (seed, fast, scalar)
    if V >= 17:  # and both equal the reference
        ref = rejection_sample_ref(*args, 2, 5, **kw)
        assert torch.equal(fast[0], ref[0]) and torch.equal(fast[1], ref[1])


@pytest.mark.parametrize("simd", ["1", "0"])
@pytest.mark.parametrize("where", [0, 16, 32])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_non_finite_found_in_every_lane(simd, where, dtype, monkeypatch):
    # the logits scan (vector or scalar) sees a NaN / +inf / all -inf row wherever it sits, tail lanes included
    monkeypatch.setenv("DSPARK_CPU_SIMD", simd)
    tl, qo, z, drafts, vl, temp = rs_inputs(R=6, V=33, seed=3, dtype=dtype)
    for value, match in (
        (float("nan"), "target_logits contains NaN"),
        (float("inf"), "contains NaN or \\+inf"),
    ):
        bad = tl.clone()
        bad[int(qo[-1]) - 1, where] = value
        with pytest.raises(ValueError, match=match):
            dspark.ops.rejection_sample(bad, qo, z, drafts, vl, temp, 0, 0)
    bad = tl.clone()
    bad[int(qo[-1]) - 1] = -float("inf")
    with pytest.raises(ValueError, match="needs a finite entry"):
        dspark.ops.rejection_sample(bad, qo, z, drafts, vl, temp, 0, 0)
    badz = z.clone()
    badz[5, 3, where] = float("nan")
    with pytest.raises(ValueError, match="draft_logits contains NaN"):
        dspark.ops.rejection_sample(tl, qo, badz, drafts, vl, temp, 0, 0)
    tl2 = tl.clone()
    tl2[-1, where] = float("nan")  # a row after the verify rows is never read, so it is not checked
    dspark.ops.rejection_sample(tl2, qo, z, drafts, vl, temp, 0, 0)


def test_opcheck_and_compile():
    args = rs_inputs(R=6, V=50, seed=2)
    torch.library.opcheck(torch.ops.dspark.rejection_sample.default, (*args, 1, 2) + (None,) * 6)
    torch.library.opcheck(
        torch.ops.dspark.rejection_sample.default,
        (
            *args,
            1,
            2,
            None,
            PROCS[3]["top_k"],
            PROCS[3]["top_p"],
            PROCS[3]["repetition_penalty"],
            PROCS[3]["penalty_tokens"] % 50,
            PROCS[3]["penalty_indptr"],
        ),
    )
    fn = torch.compile(lambda *a: dspark.ops.rejection_sample(*a, 1, 2), fullgraph=True)
    for o, e in zip(fn(*args), dspark.ops.rejection_sample(*args, 1, 2), strict=True):
        assert torch.equal(o, e)


def _bad(**changes):
    tl, qo, z, drafts, vl, temp = rs_inputs(R=6, V=30, seed=3)
    d = dict(
        target_logits=tl,
        qo_indptr=qo,
        draft_logits=z,
        draft_tokens=drafts,
        verify_len=vl,
        temperature=temp,
        seed=0,
        offset=0,
    )
    d.update(changes)
    return d


def _with(name, fn):
    d = _bad()
    return {name: fn(d[name])}


@pytest.mark.parametrize(
    "changes,match",
    [
        (_with("target_logits", lambda t: t[:, :29]), "target_logits must be \\[T, V\\]"),
        (_with("draft_logits", lambda t: t.double()), "draft_logits must be torch.float32"),
        (_with("draft_tokens", lambda t: t[:, :2]), "draft_tokens must be \\[R, gamma\\]"),
        (_with("qo_indptr", lambda t: t.long()), "qo_indptr must be torch.int32"),
        (_with("verify_len", lambda t: torch.full_like(t, 6)), "verify_len\\[0\\] = 6 is outside"),
        (_with("verify_len", lambda t: torch.zeros_like(t)), "verify_len\\[0\\] = 0 is outside"),
        (_with("qo_indptr", lambda t: t * 2), "qo_indptr must give request"),
        (_with("temperature", lambda t: -t - 1), "temperature\\[0\\] must be finite and >= 0"),
        (_with("target_logits", lambda t: t.fill_(float("nan"))), "target_logits contains NaN"),
        (_with("draft_logits", lambda t: t.fill_(float("inf"))), "draft_logits contains NaN or \\+inf"),
        ({"top_p": torch.zeros(6)}, "top_p\\[0\\] must be in \\(0, 1\\]"),
        ({"top_k": torch.zeros(5, dtype=torch.int64)}, "top_k must have one entry per request"),
        ({"repetition_penalty": torch.zeros(6)}, "repetition_penalty\\[0\\]"),
        ({"penalty_tokens": torch.zeros(2, dtype=torch.int64)}, "must be given together"),
    ],
)
def test_bad_input_names_the_argument(changes, match):
    with pytest.raises(ValueError, match=match):
        dspark.ops.rejection_sample(**_bad(**changes))
