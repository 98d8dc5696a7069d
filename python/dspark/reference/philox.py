# SPDX-License-Identifier: Apache-2.0
"""Pure-Python Philox4x32-10 and the keyed draws of include/dspark/philox.h."""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import Tensor

_M0, _M1 = 0xD2511F53, 0xCD9E8D57
_W0, _W1 = 0x9E3779B9, 0xBB67AE85
_MASK = 0xFFFFFFFF


def philox4x32_10_ref(counter: list[int], key: list[int]) -> list[int]:
    """Philox4x32-10 block: ``counter`` 4 words, ``key`` 2 words -> 4 words (Salmon et al., SC'11)."""
    c0, c1, c2, c3 = (int(x) & _MASK for x in counter)
    k0, k1 = (int(x) & _MASK for x in key)
    for rnd in range(10):
        if rnd > 0:
            k0, k1 = (k0 + _W0) & _MASK, (k1 + _W1) & _MASK
        p0, p1 = _M0 * c0, _M1 * c2
        c0, c1, c2, c3 = (p1 >> 32) ^ c1 ^ k0, p1 & _MASK, (p0 >> 32) ^ c3 ^ k1, p0 & _MASK
    return [c0, c1, c2, c3]


def _word(seed: int, offset: int, request: int, position: int, purpose: int, index: int) -> int:
    seed &= (1 << 64) - 1
    offset &= (1 << 64) - 1
    ctr = [index >> 2, (position & 0xFFFF) | (purpose << 16), request, offset & _MASK]
    key = [seed & _MASK, (seed >> 32) ^ (offset >> 32)]
    return philox4x32_10_ref(ctr, key)[index & 3]


def philox_draw_ref(
    seed: int, offset: int, request: Tensor, position: Tensor, purpose: int, index: Tensor
) -> tuple[Tensor, Tensor]:
    """Reference of ``dspark::philox_draw``: shapes ``(N,)`` int64 -> uniform, gumbel ``(N,)`` float32.

    The uniform is exact (odd multiples of 2^-24); the Gumbel is computed in float64 from it, so it matches
    the op's fp32 value to about one ulp, not bit for bit.
    """
    words = [
        _word(seed, offset, int(r), int(p), purpose, int(i))
        for r, p, i in zip(request.tolist(), position.tolist(), index.tolist(), strict=True)
    ]
    u = np.array([((w >> 8) | 1) * 2.0**-24 for w in words], dtype=np.float64)
    g = np.array([-math.log(-math.log(x)) for x in u], dtype=np.float64)
    return torch.from_numpy(u.astype(np.float32)), torch.from_numpy(g.astype(np.float32))
