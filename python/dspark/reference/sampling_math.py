# SPDX-License-Identifier: Apache-2.0
"""float32 emulation of include/dspark/sampling.h (exp_exact, log_exact, fixed-order lane sums, markov_dot).

Every helper performs the same float32 operations in the same order as the C++/CUDA code, so the references
built on them agree with the ops bit for bit. fma is emulated in float64 (the product of two floats is exact
there; the single float64 rounding before the float32 one can only matter on an exact float32 midpoint).
"""

from __future__ import annotations

import torch
from torch import Tensor

SUM_LANES = 256
GUMBEL_PURPOSE_DRAFT, ACCEPT_PURPOSE, RESIDUAL_PURPOSE = 1, 2, 3


def f32(x: float) -> Tensor:
    return torch.tensor(x, dtype=torch.float32)


def fma(a: Tensor, b, c) -> Tensor:
    a, b, c = (torch.as_tensor(t, dtype=torch.float32).double() for t in (a, b, c))
    return (a * b + c).float()


def _pow2(n: Tensor) -> Tensor:
    """2^n as float32 for integer n in [-126, 127] (int32 tensor)."""
    return ((n + 127).to(torch.int32) << 23).view(torch.float32)


def exp_exact(x: Tensor) -> Tensor:
    """include/dspark/sampling.h exp_exact on a float32 tensor."""
    x = x.float()
    n = torch.round(x * f32(1.44269502))
    r = (x - n * f32(0.693145752)) - n * f32(1.42860677e-06)
    p = torch.full_like(x, 1.98412698e-04)
    for c in (1.38888889e-03, 8.33333377e-03, 4.16666679e-02, 1.66666672e-01, 0.5, 1.0, 1.0):
        p = p * r + f32(c)
    ni = torch.nan_to_num(n, nan=0.0, posinf=0.0, neginf=0.0).clamp(-300, 300).to(torch.int32)
    mid = p * _pow2(ni.clamp(-126, 127))
    high = (p * _pow2((ni - 1).clamp(-126, 127))) * f32(2.0)
    low = (p * _pow2((ni + 64).clamp(-126, 127))) * f32(5.42101086e-20)
    out = torch.where(ni > 127, high, torch.where(ni >= -126, mid, low))
    out = torch.where(x > 88.8, torch.full_like(x, float("inf")), out)
    return torch.where(x > -104.0, out, torch.zeros_like(x))


def log_exact(x: Tensor) -> Tensor:
    """include/dspark/philox.h log_exact (positive normal floats)."""
    x = x.float()
    bits = x.view(torch.int32)
    e = ((bits >> 23) & 0xFF) - 127
    m = ((bits & 0x007FFFFF) | 0x3F800000).view(torch.float32)
    big = m > f32(1.41421356)
    m = torch.where(big, m * f32(0.5), m)
    e = torch.where(big, e + 1, e)
    f = m - f32(1.0)
    s = f / (f32(2.0) + f)
    s2 = s * s
    p = fma(s2, 0.11111111, 0.14285715)
    p = fma(s2, p, 0.2)
    p = fma(s2, p, 0.33333334)
    p = fma(s2, p, 1.0)
    log_m = (f32(2.0) * s) * p
    ef = e.float()
    return fma(ef, 1.42860682e-06, log_m) + ef * f32(0.693145752)


def log_positive(x: Tensor) -> Tensor:
    """log for x > 0 including subnormals (sampling.h log_positive)."""
    x = x.float()
    tiny = x < f32(1.17549435e-38)
    scaled = log_exact(torch.where(tiny, x * f32(1.84467441e19), f32(1.0))) + f32(-44.3614196)
    return torch.where(tiny, scaled, log_exact(torch.where(tiny, f32(1.0), x)))


def lane_sum(v: Tensor) -> Tensor:
    """Fixed-order sum over the last dim: 256 strided lanes in increasing index, then the fixed tree."""
    v = v.float()
    n = v.shape[-1]
    pad = (-n) % SUM_LANES
    if pad:
        v = torch.cat([v, v.new_zeros(*v.shape[:-1], pad)], dim=-1)
    chunks = v.reshape(*v.shape[:-1], -1, SUM_LANES)
    lanes = v.new_zeros(*v.shape[:-1], SUM_LANES)
    for c in range(chunks.shape[-2]):
        lanes = lanes + chunks[..., c, :]
    s = SUM_LANES // 2
    while s > 0:
        lanes = torch.cat([lanes[..., :s] + lanes[..., s : 2 * s], lanes[..., s:]], dim=-1)
        s //= 2
    return lanes[..., 0]


def markov_dot(w2: Tensor, e: Tensor, vocab_chunk: int = 8192) -> Tensor:
    """W2 [V, r] . e [R, r] -> [R, V]: 8 strided partial sums of float32 products, then the fixed tree."""
    w2 = w2.float()
    e = e.float()
    R, r = e.shape
    out = []
    for v0 in range(0, w2.shape[0], vocab_chunk):
        prod = w2[None, v0 : v0 + vocab_chunk, :] * e[:, None, :]  # [R, v, r], each product rounded
        acc = prod.new_zeros(R, prod.shape[1], 8)
        for c in range(0, r, 8):
            w = min(8, r - c)
            acc[..., :w] = acc[..., :w] + prod[..., c : c + w]
        a = acc.unbind(-1)
        out.append(((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7])))
    return torch.cat(out, dim=1) if out else w2.new_zeros(R, 0)


def ordered_key(x: float) -> int:
    b = int(torch.tensor(x, dtype=torch.float32).view(torch.int32).item()) & 0xFFFFFFFF
    return (~b & 0xFFFFFFFF) if b & 0x80000000 else (b | 0x80000000)


def key_to_float(k: int) -> Tensor:
    b = (k & 0x7FFFFFFF) if k & 0x80000000 else (~k & 0xFFFFFFFF)
    return torch.tensor(b if b < 2**31 else b - 2**32, dtype=torch.int32).view(torch.float32)


def search_key(lo: int, hi: int, pred) -> int:
    """Smallest key K in [lo, hi] with pred(key_to_float(K)) (pred monotone, true at hi)."""
    while lo < hi:
        mid = lo + (hi - lo) // 2
        if pred(key_to_float(mid)):
            hi = mid
        else:
            lo = mid + 1
    return lo
