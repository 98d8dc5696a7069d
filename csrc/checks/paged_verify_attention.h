// SPDX-License-Identifier: Apache-2.0
// Argument checks of paged_verify_attention shared by the CPU and CUDA launchers. Metadata checks never touch
// data (no host sync on CUDA); the index value checks read the index tensors and run on CPU tensors only.
#pragma once
#include "dspark/attention_plan.h"
#include "torch_checks.h"

namespace dspark {

// q [T, Hq, D]; k_cache, v_cache [num_pages, page_size, Hkv, D]; qo_indptr, kv_indptr [R + 1] i32;
// kv_indices [nnz_pages] i32; kv_last_page_len [R] i32
inline void check_paged_verify_attention_meta(const at::Tensor& q, const at::Tensor& k_cache,
                                              const at::Tensor& v_cache, const at::Tensor& qo_indptr,
                                              const at::Tensor& kv_indptr, const at::Tensor& kv_indices,
                                              const at::Tensor& kv_last_page_len,
                                              const c10::optional<at::Tensor>& split_base) {
  constexpr const char* op = "paged_verify_attention";
  check_dim(op, q, "q", 3);
  check_float_dtype(op, q, "q");
  check_dim(op, k_cache, "k_cache", 4);
  check_dtype(op, k_cache, "k_cache", q.scalar_type());
  TORCH_CHECK_VALUE(v_cache.sizes() == k_cache.sizes(),
                    "dspark::paged_verify_attention: v_cache must have the "
                    "shape of k_cache ",
                    k_cache.sizes(), ", got ", v_cache.sizes());
  check_dtype(op, v_cache, "v_cache", q.scalar_type());
  TORCH_CHECK_VALUE(k_cache.size(3) == q.size(2), "dspark::paged_verify_attention: k_cache head_dim ",
                    k_cache.size(3), " must equal q's head_dim ", q.size(2));
  TORCH_CHECK_VALUE(k_cache.size(2) >= 1 && q.size(1) % k_cache.size(2) == 0,
                    "dspark::paged_verify_attention: "
                    "k_cache's KV head count ",
                    k_cache.size(2), " must divide q's head count ", q.size(1), " (GQA)");
  TORCH_CHECK_VALUE(k_cache.size(1) >= 1, "dspark::paged_verify_attention: k_cache page_size must be >= 1");
  check_dim(op, qo_indptr, "qo_indptr", 1);
  check_dim(op, kv_indptr, "kv_indptr", 1);
  check_dim(op, kv_indices, "kv_indices", 1);
  check_dim(op, kv_last_page_len, "kv_last_page_len", 1);
  check_dtype(op, qo_indptr, "qo_indptr", at::kInt);
  check_dtype(op, kv_indptr, "kv_indptr", at::kInt);
  check_dtype(op, kv_indices, "kv_indices", at::kInt);
  check_dtype(op, kv_last_page_len, "kv_last_page_len", at::kInt);
  TORCH_CHECK_VALUE(qo_indptr.size(0) >= 1,
                    "dspark::paged_verify_attention: qo_indptr must have R + 1 >= 1 "
                    "entries, got 0");
  const int64_t R = qo_indptr.size(0) - 1;
  TORCH_CHECK_VALUE(kv_indptr.size(0) == R + 1,
                    "dspark::paged_verify_attention: kv_indptr must have R + 1 = ", R + 1,
                    " entries (from qo_indptr), got ", kv_indptr.size(0));
  TORCH_CHECK_VALUE(kv_last_page_len.size(0) == R,
                    "dspark::paged_verify_attention: kv_last_page_len must have R = ", R, " entries, got ",
                    kv_last_page_len.size(0));
  check_same_device(op, q, "q", k_cache, "k_cache");
  check_same_device(op, q, "q", v_cache, "v_cache");
  check_same_device(op, q, "q", qo_indptr, "qo_indptr");
  check_same_device(op, q, "q", kv_indptr, "kv_indptr");
  check_same_device(op, q, "q", kv_indices, "kv_indices");
  check_same_device(op, q, "q", kv_last_page_len, "kv_last_page_len");
  if (split_base.has_value()) {
    check_dim(op, *split_base, "split_base", 1);
    check_dtype(op, *split_base, "split_base", at::kInt);
    TORCH_CHECK_VALUE(split_base->size(0) == R,
                      "dspark::paged_verify_attention: split_base must have R = ", R, " entries, got ",
                      split_base->size(0));
    check_same_device(op, q, "q", *split_base, "split_base");
  }
}

// A split_base given by the caller is the plan of qo_indptr (dspark/attention_plan.h): each entry the rows
// that the requests before it take in the split workspace (CPU only: reads both).
inline void check_split_base_values(const int32_t* qo, const int32_t* base, int64_t R) {
  int64_t rows = 0;
  for (int64_t r = 0; r < R; ++r) {
    TORCH_CHECK_VALUE(base[r] == rows, "dspark::paged_verify_attention: split_base[", r, "] = ", base[r],
                      " is not the plan of qo_indptr (expected ", rows,
                      ": dspark.ops.paged_verify_attention_split_base)");
    rows += PvaSplitRows(qo[r + 1] - qo[r]);
  }
}

// indptr arrays start at 0 and never decrease; qo_indptr ends at T; page ids are valid; each request with
// pages has a last-page length in [1, page_size].
inline void check_paged_index_values(const int32_t* qo, const int32_t* kvp, const int32_t* idx,
                                     const int32_t* last, int64_t R, int64_t T, int64_t nnz,
                                     int64_t num_pages, int64_t page_size) {
  TORCH_CHECK_VALUE(qo[0] == 0, "dspark::paged_verify_attention: qo_indptr[0] must be 0, got ", qo[0]);
  TORCH_CHECK_VALUE(kvp[0] == 0, "dspark::paged_verify_attention: kv_indptr[0] must be 0, got ", kvp[0]);
  for (int64_t r = 0; r < R; ++r) {
    TORCH_CHECK_VALUE(qo[r + 1] >= qo[r], "dspark::paged_verify_attention: qo_indptr decreases at ", r + 1);
    TORCH_CHECK_VALUE(kvp[r + 1] >= kvp[r], "dspark::paged_verify_attention: kv_indptr decreases at ", r + 1);
    const int32_t n_pages = kvp[r + 1] - kvp[r];
    TORCH_CHECK_VALUE(n_pages == 0 || (last[r] >= 1 && last[r] <= page_size),
                      "dspark::paged_verify_attention: "
                      "kv_last_page_len[",
                      r, "] = ", last[r], " must lie in [1, page_size = ", page_size, "]");
  }
  TORCH_CHECK_VALUE(qo[R] == T, "dspark::paged_verify_attention: qo_indptr[R] = ", qo[R],
                    " must equal the number of query rows T = ", T);
  TORCH_CHECK_VALUE(kvp[R] <= nnz, "dspark::paged_verify_attention: kv_indptr[R] = ", kvp[R],
                    " exceeds kv_indices' length ", nnz);
  for (int64_t i = 0; i < kvp[R]; ++i) {
    TORCH_CHECK_VALUE(idx[i] >= 0 && idx[i] < num_pages, "dspark::paged_verify_attention: kv_indices[", i,
                      "] = ", idx[i], " is not a page in [0, ", num_pages, ")");
  }
}

}  // namespace dspark
