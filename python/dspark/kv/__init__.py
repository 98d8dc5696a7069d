# SPDX-License-Identifier: Apache-2.0
"""Paged KV cache bookkeeping: the page pool, block tables and slot mapping."""

from dspark.kv.pool import KVPoolExhausted, PagedBatchIndex, PagePool

__all__ = ["KVPoolExhausted", "PagePool", "PagedBatchIndex"]
