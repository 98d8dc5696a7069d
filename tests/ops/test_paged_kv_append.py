# SPDX-License-Identifier: Apache-2.0
"""paged_kv_append: against the reference scatter, skip slots, opcheck, bad input."""

from __future__ import annotations

import pytest
import torch

import dspark
from dspark.reference import paged_kv_append_ref


def _inputs(T=7, pages=5, ps=4, Hkv=2, D=8, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    k = torch.randn(T, Hkv, D, generator=g).to(dtype)
    v = torch.randn(T, Hkv, D, generator=g).to(dtype)
    kc = torch.randn(pages, ps, Hkv, D, generator=g).to(dtype)
    vc = torch.randn(pages, ps, Hkv, D, generator=g).to(dtype)
    slots = torch.randperm(pages * ps, generator=g)[:T]
    slots[1] = -1
    return k, v, kc, vc, slots


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("D", [8, 64, 3])
def test_matches_reference_bitwise(dtype, D):
    k, v, kc, vc, slots = _inputs(D=D, dtype=dtype, seed=D)
    kc_ref, vc_ref = kc.clone(), vc.clone()
    dspark.ops.paged_kv_append(k, v, kc, vc, slots)
    paged_kv_append_ref(k, v, kc_ref, vc_ref, slots)
    assert torch.equal(kc, kc_ref) and torch.equal(vc, vc_ref)


def test_skip_slot_leaves_cache_and_non_contiguous_input():
    k, v, kc, vc, slots = _inputs()
    before = kc.clone()
    kt = k.transpose(0, 1).contiguous().transpose(0, 1)  # same values, non-contiguous
    dspark.ops.paged_kv_append(kt, v, kc, vc, torch.full_like(slots, -1))
    assert torch.equal(kc, before)
    dspark.ops.paged_kv_append(kt, v, kc, vc, slots)
    flat = kc.view(-1, *kc.shape[2:])
    for t, s in enumerate(slots.tolist()):
        if s >= 0:
            assert torch.equal(flat[s], k[t])


def test_opcheck():
    torch.library.opcheck(torch.ops.dspark.paged_kv_append.default, _inputs(seed=3))


@pytest.mark.parametrize(
    "i,val,match",
    [
        (0, torch.randn(7, 2), "k must be 3-D"),
        (1, torch.randn(7, 2, 9), "v must have the shape of k"),
        (2, torch.randn(5, 4, 3, 8), "k_cache must be \\[num_pages, page_size, Hkv, D\\]"),
        (3, torch.randn(5, 4, 2, 8, dtype=torch.float16), "v_cache must be torch.float32"),
        (2, torch.randn(5, 8, 2, 4).transpose(1, 3), "k_cache must be contiguous"),
        (4, torch.zeros(6, dtype=torch.long), "slot_mapping must have one slot per token"),
        (4, torch.zeros(7, dtype=torch.int32), "slot_mapping must be torch.int64"),
        (4, torch.tensor([0, 1, 2, 3, 4, 5, 20]), "slot_mapping\\[6\\] = 20 is outside"),
        (4, torch.tensor([0, 1, 2, 3, 4, 5, -2]), "slot_mapping\\[6\\] = -2"),
    ],
)
def test_bad_input_names_the_argument(i, val, match):
    args = list(_inputs())
    if i == 2 and val.dim() == 4 and not val.is_contiguous():
        args[3] = torch.randn(val.shape)
    args[i] = val
    with pytest.raises(ValueError, match=match):
        dspark.ops.paged_kv_append(*args)
