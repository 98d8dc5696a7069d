# SPDX-License-Identifier: Apache-2.0
"""Reference of ``dspark::paged_verify_attention``."""

from __future__ import annotations

import torch
from torch import Tensor


def gather_request_kv(
    k_cache: Tensor, v_cache: Tensor, kv_indptr: Tensor, kv_indices: Tensor, kv_last_page_len: Tensor, r: int
) -> tuple[Tensor, Tensor]:
    """Request ``r``'s keys and values in sequence order: ``(n_kv, Hkv, D)`` each."""
    page_size = k_cache.shape[1]
    pages = kv_indices[int(kv_indptr[r]) : int(kv_indptr[r + 1])].long()
    n_kv = 0 if pages.numel() == 0 else (pages.numel() - 1) * page_size + int(kv_last_page_len[r])
    k = k_cache[pages].reshape(-1, *k_cache.shape[2:])[:n_kv]
    v = v_cache[pages].reshape(-1, *v_cache.shape[2:])[:n_kv]
    return k, v


def paged_verify_attention_ref(
    q: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    qo_indptr: Tensor,
    kv_indptr: Tensor,
    kv_indices: Tensor,
    kv_last_page_len: Tensor,
    scale: float,
    causal: bool = True,
    compute_dtype: torch.dtype | None = None,
) -> Tensor:
    """Gather each request's KV, then plain softmax attention with an explicit boolean mask.

    q ``(T, Hq, D)``, caches ``(num_pages, page_size, Hkv, D)`` -> ``(T, Hq, D)`` in q's dtype. The math runs in
    ``compute_dtype`` (default: q's dtype, as PyTorch itself would); rows with no visible key give zeros.
    """
    cd = compute_dtype or q.dtype
    out = torch.zeros_like(q)
    Hq, Hkv = q.shape[1], k_cache.shape[2]
    for r in range(qo_indptr.numel() - 1):
        q0, q1 = int(qo_indptr[r]), int(qo_indptr[r + 1])
        n_q = q1 - q0
        if n_q == 0:
            continue
        k, v = gather_request_kv(k_cache, v_cache, kv_indptr, kv_indices, kv_last_page_len, r)
        n_kv = k.shape[0]
        if n_kv == 0:
            continue
        k = k.to(cd).repeat_interleave(Hq // Hkv, dim=1).transpose(0, 1)  # (Hq, n_kv, D)
        v = v.to(cd).repeat_interleave(Hq // Hkv, dim=1).transpose(0, 1)
        qr = q[q0:q1].to(cd).transpose(0, 1)  # (Hq, n_q, D)
        scores = (qr @ k.transpose(1, 2)) * scale  # (Hq, n_q, n_kv)
        if causal:
            i = torch.arange(n_q).unsqueeze(1)
            j = torch.arange(n_kv).unsqueeze(0)
            visible = (j <= n_kv - n_q + i).to(q.device)
        else:
            visible = torch.ones(n_q, n_kv, dtype=torch.bool, device=q.device)
        scores = scores.masked_fill(~visible, float("-inf"))
        p = torch.softmax(scores, dim=-1)
        p = torch.nan_to_num(p, nan=0.0)  # rows without a visible key
        out[q0:q1] = (p @ v).transpose(0, 1).to(q.dtype)
    return out
