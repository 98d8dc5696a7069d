# SPDX-License-Identifier: Apache-2.0
"""Reference of ``dspark::paged_kv_append``."""

from __future__ import annotations

from torch import Tensor


def paged_kv_append_ref(k: Tensor, v: Tensor, k_cache: Tensor, v_cache: Tensor, slot_mapping: Tensor) -> None:
    """k, v ``(T, Hkv, D)`` -> written into caches ``(num_pages, page_size, Hkv, D)`` at ``slot_mapping (T,)``."""
    keep = slot_mapping >= 0
    slots = slot_mapping[keep]
    k_cache.view(-1, *k_cache.shape[2:])[slots] = k[keep]
    v_cache.view(-1, *v_cache.shape[2:])[slots] = v[keep]
