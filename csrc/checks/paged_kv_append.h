// SPDX-License-Identifier: Apache-2.0
// Argument checks of paged_kv_append shared by the CPU and CUDA launchers. Metadata checks never touch data
// (no host sync on CUDA); the slot range check reads slot_mapping and runs on CPU tensors only.
#pragma once
#include "torch_checks.h"

namespace dspark {

// k, v [T, Hkv, D]; k_cache, v_cache [num_pages, page_size, Hkv, D] (contiguous, written in place);
// slot_mapping [T] int64
inline void check_paged_kv_append_meta(const at::Tensor& k, const at::Tensor& v, const at::Tensor& k_cache,
                                       const at::Tensor& v_cache, const at::Tensor& slot_mapping) {
  constexpr const char* op = "paged_kv_append";
  check_dim(op, k, "k", 3);
  check_float_dtype(op, k, "k");
  TORCH_CHECK_VALUE(v.sizes() == k.sizes(), "dspark::paged_kv_append: v must have the shape of k ", k.sizes(),
                    ", got ", v.sizes());
  check_dtype(op, v, "v", k.scalar_type());
  check_dim(op, k_cache, "k_cache", 4);
  check_dtype(op, k_cache, "k_cache", k.scalar_type());
  TORCH_CHECK_VALUE(k_cache.size(2) == k.size(1) && k_cache.size(3) == k.size(2),
                    "dspark::paged_kv_append: k_cache must be [num_pages, page_size, Hkv, D] with Hkv, D = ",
                    k.size(1), ", ", k.size(2), " (from k), got ", k_cache.sizes());
  TORCH_CHECK_VALUE(v_cache.sizes() == k_cache.sizes(),
                    "dspark::paged_kv_append: v_cache must have the shape of "
                    "k_cache ",
                    k_cache.sizes(), ", got ", v_cache.sizes());
  check_dtype(op, v_cache, "v_cache", k.scalar_type());
  TORCH_CHECK_VALUE(k_cache.is_contiguous(),
                    "dspark::paged_kv_append: k_cache must be contiguous (it is written in "
                    "place)");
  TORCH_CHECK_VALUE(v_cache.is_contiguous(),
                    "dspark::paged_kv_append: v_cache must be contiguous (it is written in "
                    "place)");
  check_dim(op, slot_mapping, "slot_mapping", 1);
  check_dtype(op, slot_mapping, "slot_mapping", at::kLong);
  TORCH_CHECK_VALUE(slot_mapping.size(0) == k.size(0),
                    "dspark::paged_kv_append: slot_mapping must have one slot per "
                    "token (",
                    k.size(0), "), got ", slot_mapping.size(0));
  check_same_device(op, k, "k", v, "v");
  check_same_device(op, k, "k", k_cache, "k_cache");
  check_same_device(op, k, "k", v_cache, "v_cache");
  check_same_device(op, k, "k", slot_mapping, "slot_mapping");
}

// Every slot is -1 (skip) or a valid slot page * page_size + offset < num_pages * page_size.
inline void check_slot_values(const int64_t* slots, int64_t n, int64_t num_slots) {
  for (int64_t i = 0; i < n; ++i) {
    TORCH_CHECK_VALUE(slots[i] >= -1 && slots[i] < num_slots, "dspark::paged_kv_append: slot_mapping[", i,
                      "] = ", slots[i], " is outside [-1, ", num_slots, ") (num_pages * page_size)");
  }
}

}  // namespace dspark
