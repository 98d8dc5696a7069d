# SPDX-License-Identifier: Apache-2.0
"""``dspark::paged_kv_append``: write new tokens' K and V rows into a paged KV cache."""

from __future__ import annotations

import torch
from torch import Tensor


def paged_kv_append(k: Tensor, v: Tensor, k_cache: Tensor, v_cache: Tensor, slot_mapping: Tensor) -> None:
    """Scatter ``k[t]`` and ``v[t]`` into slot ``slot_mapping[t]`` of ``k_cache`` and ``v_cache`` (in place).

    Slot ``s`` is row ``s % page_size`` of page ``s // page_size``; ``-1`` skips the token (padding).

    Parameters
    ----------
    k, v : Tensor
        Shape ``(T, Hkv, D)``, float32/bfloat16/float16: the new tokens' keys (RoPE applied) and values.
    k_cache, v_cache : Tensor
        Shape ``(num_pages, page_size, Hkv, D)``, contiguous, dtype of ``k``; modified in place.
    slot_mapping : Tensor
        Shape ``(T,)`` int64 in ``[-1, num_pages * page_size)`` (range checked on CPU).

    Examples
    --------
    >>> import torch, dspark
    >>> kc, vc = torch.zeros(4, 16, 2, 8), torch.zeros(4, 16, 2, 8)
    >>> k, v = torch.randn(3, 2, 8), torch.randn(3, 2, 8)
    >>> dspark.ops.paged_kv_append(k, v, kc, vc, torch.tensor([16, 17, -1]))
    >>> bool((kc[1, 1] == k[1]).all()), bool((kc[1, 2] == 0).all())
    (True, True)
    """
    torch.ops.dspark.paged_kv_append.default(k, v, k_cache, v_cache, slot_mapping)


@torch.library.register_fake("dspark::paged_kv_append")
def _paged_kv_append_fake(k, v, k_cache, v_cache, slot_mapping):
    return None
