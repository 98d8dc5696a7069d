# SPDX-License-Identifier: Apache-2.0
"""Contract C4 for top-p rows whose threshold the CUDA split kernels find from masses summed in 2^-40 fixed
point (rejection_sample_split.cuh) where the CPU op sums floats in lane order per bisection step. Both rules
are emulated here exactly; where they keep the same ids (with weight) in every row of a request, everything
else is the same arithmetic and the request's tokens must be the CPU's. :func:`top_p_disagreements` names the
requests where they do not (a boundary within the sums' rounding of ``top_p x total``)."""

from __future__ import annotations

import torch
from torch import Tensor

from dspark.reference import sampling_math as sm
from dspark.reference.rejection_sample import scaled_weights_ref

FIXED_ONE = 2**40  # the kernels' unit of mass


def fixed_point_keeps(y: Tensor, w: Tensor, top_p: float) -> Tensor:
    """``(V,)`` bool: the ids with weight that the split kernels' top-p keeps — the value classes (-0 and +0
    one class) from the largest ``y`` down to the first whose cumulative ``floor(w * 2^40)`` reaches
    ``max(1, floor(top_p * total))`` (MassReplay in include/dspark/kernels/radix_select.cuh)."""
    units = (w.double() * FIXED_ONE).floor().to(torch.int64)  # w * 2^40 is exact in float32: truncation only
    total = int(units.sum())
    need = max(1, int(float(sm.f32(top_p)) * float(total)))
    values, inverse = torch.unique(y, return_inverse=True)  # ascending
    mass = torch.zeros(values.numel(), dtype=torch.int64).index_add_(0, inverse, units)
    cum = 0
    for c in range(values.numel() - 1, -1, -1):
        cum += int(mass[c])
        if mass[c] != 0 and cum >= need:
            return (y >= values[c]) & (w > 0)
    return w > 0


def cpu_keeps(y: Tensor, w: Tensor, top_p: float) -> Tensor:
    """``(V,)`` bool: the ids with weight the CPU op's top-p keeps (its lane-sum bisection)."""
    lo, hi = sm.ordered_key(float("-inf")), sm.ordered_key(float(y.max()))
    target = sm.f32(top_p) * sm.lane_sum(w)
    thr = sm.key_to_float(
        sm.search_key(lo, hi, lambda v: bool(sm.lane_sum(torch.where(y > v, w, 0.0)) < target))
    )
    return (y >= thr) & (w > 0)


def top_p_disagreements(args: tuple, procs: dict) -> set[int]:
    """Requests of a ``rejection_sample`` call (``args`` = target_logits, qo_indptr, draft_logits,
    draft_tokens, verify_len, temperature; ``procs`` its keyword processors) with a sampled top-p verify row
    whose two kept sets differ."""
    tl, qo, _, drafts, vl, temp = (a.cpu() if isinstance(a, Tensor) else a for a in args)
    top_p = procs.get("top_p")
    if top_p is None:
        return set()
    top_k, pen = procs.get("top_k"), procs.get("repetition_penalty")
    ptok, pptr = procs.get("penalty_tokens"), procs.get("penalty_indptr")
    out = set()
    for r in range(drafts.shape[0]):
        tp, t = float(top_p[r]), float(temp[r])
        if tp >= 1.0 or t == 0.0:
            continue
        seen = [] if ptok is None else ptok[int(pptr[r]) : int(pptr[r + 1])].tolist()
        for i in range(int(vl[r])):
            _, y, w = scaled_weights_ref(
                tl[int(qo[r]) + i].cpu(),
                t,
                0 if top_k is None else int(top_k[r]),
                1.0 if pen is None else float(pen[r]),
                seen + drafts[r, :i].tolist(),
            )
            if not torch.equal(fixed_point_keeps(y, w, tp), cpu_keeps(y, w, tp)):
                out.add(r)
                break
    return out


def assert_equal_outside(cpu: tuple, other: tuple, skip: set[int]) -> None:
    """``(accepted, out_tokens)`` of two ``rejection_sample`` calls equal for every request not in ``skip``."""
    keep = [r for r in range(cpu[0].shape[0]) if r not in skip]
    a, b = cpu[0][keep], other[0].cpu()[keep]
    assert torch.equal(a, b), f"accepted counts differ: {a.tolist()} vs {b.tolist()} (requests {keep})"
    assert torch.equal(cpu[1][keep], other[1].cpu()[keep]), "tokens differ where both top-p rules agree"
