# SPDX-License-Identifier: Apache-2.0
"""paged_verify_attention: against gather + explicit-mask attention (flash-attention's 2x error rule vs fp64),
opcheck, compile, edge cases, bad input."""

from __future__ import annotations

import pytest
import torch

import dspark
from dspark.reference import paged_verify_attention_ref


def make_paged(
    n_q: list[int],
    n_kv: list[int],
    Hq: int = 4,
    Hkv: int = 2,
    D: int = 64,
    page_size: int = 16,
    dtype: torch.dtype = torch.float32,
    seed: int = 0,
    spare_pages: int = 3,
    device: str = "cpu",
) -> tuple:
    """Random q and a paged cache where request r has n_q[r] query rows and n_kv[r] keys on shuffled pages.

    Returns the op's positional arguments without scale/causal: (q, k_cache, v_cache, qo_indptr, kv_indptr,
    kv_indices, kv_last_page_len).
    """
    g = torch.Generator().manual_seed(seed)
    pages_per = [-(-n // page_size) for n in n_kv]
    num_pages = sum(pages_per) + spare_pages
    perm = torch.randperm(num_pages, generator=g).to(torch.int32)
    k_cache = torch.randn(num_pages, page_size, Hkv, D, generator=g).to(dtype)
    v_cache = torch.randn(num_pages, page_size, Hkv, D, generator=g).to(dtype)
    q = torch.randn(sum(n_q), Hq, D, generator=g).to(dtype)
    qo = torch.tensor([0, *torch.tensor(n_q).cumsum(0).tolist()], dtype=torch.int32)
    kvp = torch.tensor([0, *torch.tensor(pages_per).cumsum(0).tolist()], dtype=torch.int32)
    indices = perm[: sum(pages_per)].clone()
    last = torch.tensor(
        [n - (p - 1) * page_size if p else 0 for n, p in zip(n_kv, pages_per, strict=True)], dtype=torch.int32
    )
    return tuple(t.to(device) for t in (q, k_cache, v_cache, qo, kvp, indices, last))


def assert_fa_rule(out, args, scale, causal, floor):
    """|op - ref64| <= 2 * |torch_same_precision - ref64| + floor (flash-attention's test rule)."""
    ref64 = paged_verify_attention_ref(*args, scale, causal, compute_dtype=torch.float64)
    pt = paged_verify_attention_ref(*args, scale, causal)
    err_op = (out.double() - ref64.double()).abs().max().item()
    err_pt = (pt.double() - ref64.double()).abs().max().item()
    assert err_op <= 2 * err_pt + floor, f"op error {err_op:.3g} > 2 x torch error {err_pt:.3g} + {floor}"


FLOOR = {torch.float32: 2e-6, torch.bfloat16: 1e-5, torch.float16: 1e-5}
CASES = [
    # name, n_q, n_kv, Hq, Hkv, D, page_size
    ("verify", [1, 4, 8, 16], [37, 5, 200, 16], 6, 2, 64, 16),
    ("verify_d128_mha", [3, 1, 7], [64, 17, 130], 4, 4, 128, 16),
    ("prefill", [40, 1, 70], [40, 9, 70], 4, 1, 64, 16),
    ("mixed_page1", [5, 12], [5, 30], 8, 2, 32, 1),
    ("generic_d40_page5", [2, 9, 1], [11, 9, 50], 3, 1, 40, 5),
    # verify chunks over >= 1024 keys are split over their keys and merged (2, 4 and 8 splits)
    ("verify_split_keys", [1, 16, 5], [1100, 2070, 4500], 6, 2, 64, 16),
]


@pytest.mark.parametrize("name,n_q,n_kv,Hq,Hkv,D,ps", CASES, ids=[c[0] for c in CASES])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("simd", ["on", "avx2", "off"])
def test_matches_reference(name, n_q, n_kv, Hq, Hkv, D, ps, dtype, causal, simd, monkeypatch):
    # "on": the widest vector loops the CPU has (AVX-512 for D % 16 == 0, else AVX2 + FMA for D % 8 == 0);
    # "avx2": the AVX2 loops even on an AVX-512 CPU (DSPARK_CPU_SIMD=avx2); "off": the scalar loops
    # (DSPARK_CPU_SIMD=0). Each must meet the rule on its own: they round differently.
    if simd == "on":
        monkeypatch.delenv("DSPARK_CPU_SIMD", raising=False)
    else:
        monkeypatch.setenv("DSPARK_CPU_SIMD", "0" if simd == "off" else "avx2")
    args = make_paged(n_q, n_kv, Hq, Hkv, D, ps, dtype, seed=hash(name) % 1000)
    scale = D**-0.5
    out = dspark.ops.paged_verify_attention(*args, scale, causal)
    assert out.shape == args[0].shape and out.dtype == dtype
    assert_fa_rule(out, args, scale, causal, FLOOR[dtype])


@pytest.mark.parametrize("simd", ["on", "avx2", "off"])
def test_the_rule_sees_one_wrong_output(simd, monkeypatch):
    # negative control: the rule above is tight enough to catch one output element off by 1e-4
    if simd != "on":
        monkeypatch.setenv("DSPARK_CPU_SIMD", "0" if simd == "off" else "avx2")
    args = make_paged([3, 1], [40, 9], 4, 2, 64, 16, torch.float32, seed=3)
    out = dspark.ops.paged_verify_attention(*args, 0.125, True)
    assert_fa_rule(out, args, 0.125, True, FLOOR[torch.float32])
    out[2, 1, 7] += 1e-4
    with pytest.raises(AssertionError, match="op error"):
        assert_fa_rule(out, args, 0.125, True, FLOOR[torch.float32])


def assert_alone_as_in_batch(n_q, n_kv, Hq, Hkv, D=64, dtype=torch.float32, device="cpu"):
    """Each request's rows computed alone equal, bit for bit, its rows in the whole batch (contract C2)."""
    q, kc, vc, qo, kvp, idx, last = make_paged(n_q, n_kv, Hq, Hkv, D, dtype=dtype, seed=8, device=device)
    batched = dspark.ops.paged_verify_attention(q, kc, vc, qo, kvp, idx, last, D**-0.5, True)
    qo_h, kvp_h = qo.tolist(), kvp.tolist()
    for r in range(len(n_q)):
        rows = slice(qo_h[r], qo_h[r + 1])
        pages = idx[kvp_h[r] : kvp_h[r + 1]]
        alone = dspark.ops.paged_verify_attention(
            q[rows],
            kc,
            vc,
            torch.tensor([0, n_q[r]], dtype=torch.int32, device=device),
            torch.tensor([0, len(pages)], dtype=torch.int32, device=device),
            pages,
            last[r : r + 1],
            D**-0.5,
            True,
        )
        assert torch.equal(alone, batched[rows]), f"request {r} ({n_q[r]} rows, {n_kv[r]} keys) differs"


@pytest.mark.parametrize("simd", ["on", "off"])
def test_a_request_attends_alike_alone_and_in_a_batch(simd, monkeypatch):
    # the CPU op splits a verify chunk's keys by the chunk's own key count, never by R or the thread count: a
    # request's rows are bit for bit the same alone as next to others (the long one is split, the short not)
    if simd == "off":
        monkeypatch.setenv("DSPARK_CPU_SIMD", "0")
    assert_alone_as_in_batch([3, 4, 1], [70, 1500, 2600], Hq=6, Hkv=2)


def test_bottom_right_causal_alignment_explicitly():
    # one request, 3 queries over 5 keys: query i sees keys [0, 2 + i]; changing key 4 must only move row 2
    args = make_paged([3], [5], Hq=2, Hkv=1, D=64, page_size=4, seed=1)
    q, kc, vc, *idx = args
    base = dspark.ops.paged_verify_attention(q, kc, vc, *idx, 0.125, True)
    page1 = int(idx[2][1])
    kc2, vc2 = kc.clone(), vc.clone()
    kc2[page1, 0] += 1.0  # key 4 lives in page 1, offset 0
    vc2[page1, 0] += 1.0
    moved = dspark.ops.paged_verify_attention(q, kc2, vc2, *idx, 0.125, True)
    assert torch.equal(moved[:2], base[:2])
    assert not torch.equal(moved[2], base[2])
    full = dspark.ops.paged_verify_attention(q, kc2, vc2, *idx, 0.125, False)
    assert not torch.equal(full[0], dspark.ops.paged_verify_attention(q, kc, vc, *idx, 0.125, False)[0])


def test_empty_requests_and_rows_without_keys():
    # request 0: no query rows; request 1: no KV (zeros); request 2: 4 queries over 2 keys (first two see none)
    args = make_paged([0, 2, 4], [7, 0, 2], Hq=2, Hkv=1, D=64, page_size=4, seed=2)
    out = dspark.ops.paged_verify_attention(*args, 0.125, True)
    assert torch.equal(out[:2], torch.zeros_like(out[:2]))
    assert torch.equal(out[2:4], torch.zeros_like(out[2:4]))
    assert_fa_rule(out, args, 0.125, True, 2e-6)
    empty = make_paged([0], [0], seed=3)
    assert dspark.ops.paged_verify_attention(*empty, 0.125, True).shape == (0, 4, 64)


def test_ignores_pages_of_other_requests_and_spare_pages():
    args = make_paged([4, 4], [20, 33], seed=4, spare_pages=5)
    q, kc, vc, qo, kvp, idx, last = args
    out = dspark.ops.paged_verify_attention(*args, 0.125, True)
    used = set(idx.tolist())
    kc2, vc2 = kc.clone(), vc.clone()
    for p in range(kc.shape[0]):
        if p not in used:
            kc2[p].normal_()
            vc2[p].normal_()
    # the unused tail of each request's last page is not read either
    for r in range(2):
        lp = int(idx[int(kvp[r + 1]) - 1])
        kc2[lp, int(last[r]) :] = 1e4
    assert torch.equal(dspark.ops.paged_verify_attention(q, kc2, vc2, qo, kvp, idx, last, 0.125, True), out)


def split_plan_from_the_definition(n_q: list[int]) -> list[int]:
    """The split plan written from its definition (not from the helper): request r's first workspace row is the
    number of query rows of the requests before it that have at most 16 of them."""
    small = torch.tensor([n if n <= 16 else 0 for n in n_q], dtype=torch.int64)
    return (torch.cumsum(small, 0) - small).tolist()


def test_split_base_is_the_plan_the_op_checks():
    """The host plan (what a forward computes once for every layer) agrees with the definition and with the
    C++ rule the CPU op checks it against, over batches with requests of 0, 1, 16, 17 and 300 rows; the output
    is the same with or without it. Negative controls: a plan off by one row, and one that counts a 17-row
    request, are refused naming split_base."""
    g = torch.Generator().manual_seed(11)
    for trial in range(30):
        R = int(torch.randint(1, 9, (1,), generator=g))
        choices = torch.tensor([0, 1, 3, 15, 16, 17, 40])
        n_q = choices[torch.randint(0, len(choices), (R,), generator=g)].tolist()
        n_kv = [n + int(torch.randint(0, 50, (1,), generator=g)) for n in n_q]
        qo = [0, *torch.tensor(n_q).cumsum(0).tolist()]
        plan = dspark.ops.paged_verify_attention_split_base(qo)
        assert plan == split_plan_from_the_definition(n_q)
        args = make_paged(n_q, n_kv, seed=trial)
        want = dspark.ops.paged_verify_attention(*args, 0.125, True)
        got = dspark.ops.paged_verify_attention(*args, 0.125, True, torch.tensor(plan, dtype=torch.int32))
        assert torch.equal(got, want)
    args = make_paged([3, 17, 2], [9, 40, 5])
    for wrong in ([0, 3, 21], [0, 4, 4], [1, 3, 3]):
        with pytest.raises(
            ValueError, match="split_base\\[[12]\\] = .* is not the plan|split_base\\[0\\] = 1"
        ):
            dspark.ops.paged_verify_attention(*args, 0.125, True, torch.tensor(wrong, dtype=torch.int32))
    assert dspark.ops.paged_verify_attention_split_base([0, 3, 20, 22]) == [0, 3, 3]


def test_opcheck():
    torch.library.opcheck(
        torch.ops.dspark.paged_verify_attention.default, (*make_paged([2, 3], [9, 20]), 0.125, True)
    )
    torch.library.opcheck(
        torch.ops.dspark.paged_verify_attention.default,
        (*make_paged([2, 30], [9, 40]), 0.125, True, torch.tensor([0, 2], dtype=torch.int32)),
    )
    torch.library.opcheck(
        torch.ops.dspark.paged_verify_attention.default,
        (*make_paged([1, 5], [30, 5], dtype=torch.bfloat16, seed=5), 0.125, False),
    )


def test_torch_compile_fullgraph():
    args = make_paged([3, 2], [19, 40], seed=6)

    @torch.compile(fullgraph=True, backend="aot_eager")
    def f(q, kc, vc, qo, kvp, idx, last):
        return dspark.ops.paged_verify_attention(q * 1.0, kc, vc, qo, kvp, idx, last, 0.125, True) + 0.0

    torch.testing.assert_close(f(*args), dspark.ops.paged_verify_attention(*args, 0.125, True))


def _bad(**changes):
    q, kc, vc, qo, kvp, idx, last = make_paged([2, 3], [9, 20], seed=7)
    d = dict(q=q, k_cache=kc, v_cache=vc, qo_indptr=qo, kv_indptr=kvp, kv_indices=idx, kv_last_page_len=last)
    d.update(changes)
    return d


i32 = lambda *x: torch.tensor(x, dtype=torch.int32)  # noqa: E731


@pytest.mark.parametrize(
    "changes,match",
    [
        (dict(q=torch.randn(5, 4)), "q must be 3-D"),
        (dict(q=torch.randn(5, 4, 64, dtype=torch.float64)), "q must be float32, bfloat16 or float16"),
        (dict(k_cache=torch.randn(4, 16, 2, 64, dtype=torch.bfloat16)), "k_cache must be torch.float32"),
        (dict(v_cache=torch.randn(4, 16, 2, 32)), "v_cache must have the shape of k_cache"),
        (dict(q=torch.randn(5, 3, 64)), "must divide q's head count"),
        (dict(qo_indptr=torch.tensor([0, 2, 5])), "qo_indptr must be torch.int32"),
        (dict(qo_indptr=i32(0, 2, 4)), "qo_indptr\\[R\\] = 4 must equal"),
        (dict(qo_indptr=i32(0, 3, 2)), "qo_indptr decreases"),
        (dict(kv_indptr=i32(0, 1)), "kv_indptr must have R \\+ 1 = 3"),
        (dict(kv_indptr=i32(0, 1, 9)), "exceeds kv_indices' length"),
        (dict(kv_indices=i32(0, 1, 99)), "kv_indices\\[2\\] = 99"),
        (dict(kv_last_page_len=i32(0, 4)), "kv_last_page_len\\[0\\] = 0"),
        (dict(kv_last_page_len=i32(9, 17)), "kv_last_page_len\\[1\\] = 17"),
        (dict(split_base=torch.tensor([0, 2])), "split_base must be torch.int32"),
        (dict(split_base=i32(0)), "split_base must have R = 2 entries"),
        (dict(split_base=i32(0, 3)), "split_base\\[1\\] = 3 is not the plan of qo_indptr \\(expected 2"),
    ],
)
def test_bad_input_names_the_argument(changes, match):
    d = _bad(**changes)
    with pytest.raises(ValueError, match=match):
        dspark.ops.paged_verify_attention(**d, scale=0.125, causal=True)
