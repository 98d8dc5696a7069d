# SPDX-License-Identifier: Apache-2.0
"""``dspark::paged_verify_attention``: ragged attention of query blocks over their requests' paged KV."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from dspark import _C


def paged_verify_attention(
    q: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    qo_indptr: Tensor,
    kv_indptr: Tensor,
    kv_indices: Tensor,
    kv_last_page_len: Tensor,
    scale: float,
    causal: bool = True,
    split_base: Tensor | None = None,
) -> Tensor:
    """Attention of each request's query rows over that request's keys and values in a paged cache.

    Request ``r`` owns query rows ``qo_indptr[r]:qo_indptr[r+1]`` (``n_q`` of them) and the pages
    ``kv_indices[kv_indptr[r]:kv_indptr[r+1]]``, whose last page holds ``kv_last_page_len[r]`` keys, so it has
    ``n_kv = (n_pages - 1) * page_size + kv_last_page_len[r]`` keys (0 without pages). With ``causal`` the
    mask is bottom-right aligned: query ``i`` sees keys ``[0, n_kv - n_q + i]`` (the query block is the last
    ``n_q`` positions of the sequence); without it every query sees all ``n_kv`` keys. A row that sees no key
    outputs zeros. GQA: query head ``h`` reads KV head ``h // (Hq // Hkv)``. Scores and softmax run in fp32.

    Parameters
    ----------
    q : Tensor
        Shape ``(T, Hq, D)``, float32/bfloat16/float16 (RoPE applied).
    k_cache, v_cache : Tensor
        Shape ``(num_pages, page_size, Hkv, D)``, dtype of ``q``; ``Hkv`` divides ``Hq``.
    qo_indptr, kv_indptr : Tensor
        Shape ``(R + 1,)`` int32, starting at 0, non-decreasing; ``qo_indptr[R] == T``.
    kv_indices : Tensor
        Shape ``(nnz_pages,)`` int32 page ids.
    kv_last_page_len : Tensor
        Shape ``(R,)`` int32 in ``[1, page_size]`` for requests with pages.
    scale : float
        Score scale, usually ``D ** -0.5``.
    causal : bool
        Bottom-right-aligned causal mask (default) or full attention to the request's KV.
    split_base : Tensor, optional
        Shape ``(R,)`` int32 on ``q``'s device: the CUDA kernels' split plan for ``qo_indptr``,
        :func:`paged_verify_attention_split_base` of it. A caller that runs every layer of a forward over one
        batch computes it once and passes it to each layer; without it the CUDA op plans on the device per call
        (one more launch). The CPU op checks it against ``qo_indptr`` and does not otherwise use it; on CUDA a
        wrong plan is undefined behaviour.

    Returns
    -------
    Tensor
        Shape ``(T, Hq, D)``, dtype of ``q``.

    Examples
    --------
    >>> import torch, dspark
    >>> kc, vc = torch.randn(4, 16, 2, 64), torch.randn(4, 16, 2, 64)
    >>> q = torch.randn(5, 6, 64)  # request 0: 2 rows over 20 keys, request 1: 3 rows over 7 keys
    >>> o = dspark.ops.paged_verify_attention(
    ...     q, kc, vc, torch.tensor([0, 2, 5], dtype=torch.int32), torch.tensor([0, 2, 3], dtype=torch.int32),
    ...     torch.tensor([0, 3, 1], dtype=torch.int32), torch.tensor([4, 7], dtype=torch.int32), 64**-0.5, True)
    >>> o.shape
    torch.Size([5, 6, 64])
    """
    return torch.ops.dspark.paged_verify_attention.default(
        q,
        k_cache,
        v_cache,
        qo_indptr,
        kv_indptr,
        kv_indices,
        kv_last_page_len,
        float(scale),
        bool(causal),
        split_base,
    )


SPLIT_MAX_QUERIES: int = _C.pva_split_max_queries
"""A request with at most this many query rows (a verify block) may be split over its keys on CUDA."""


def paged_verify_attention_split_base(qo_indptr: Sequence[int]) -> list[int]:
    """The CUDA kernels' split plan of a batch, on the host: request ``r``'s first row in the split workspace,
    the query rows of the requests before it that may be split (those with at most :data:`SPLIT_MAX_QUERIES`).

    ``qo_indptr`` ``(R + 1,)`` host offsets -> ``(R,)`` ints, the ``split_base`` of :func:`paged_verify_attention`.
    """
    base, rows = [], 0
    for a, b in zip(qo_indptr[:-1], qo_indptr[1:], strict=True):
        base.append(rows)
        rows += b - a if b - a <= SPLIT_MAX_QUERIES else 0
    return base


@torch.library.register_fake("dspark::paged_verify_attention")
def _paged_verify_attention_fake(
    q, k_cache, v_cache, qo_indptr, kv_indptr, kv_indices, kv_last_page_len, scale, causal, split_base=None
):
    return torch.empty_like(q, memory_format=torch.contiguous_format)
