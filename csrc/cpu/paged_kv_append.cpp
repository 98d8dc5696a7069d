// SPDX-License-Identifier: Apache-2.0
// CPU paged_kv_append: scatter each new token's K and V rows into its KV-cache slot (slot -1 = skip).
#include "checks/paged_kv_append.h"

#include <ATen/Parallel.h>
#include <torch/library.h>

#include <cstring>

namespace dspark {

// k, v [T, Hkv, D]; k_cache, v_cache [num_pages, page_size, Hkv, D] (written in place); slot_mapping [T] i64
void paged_kv_append_cpu(const at::Tensor& k, const at::Tensor& v, const at::Tensor& k_cache,
                         const at::Tensor& v_cache, const at::Tensor& slot_mapping) {
  check_paged_kv_append_meta(k, v, k_cache, v_cache, slot_mapping);
  const auto slots = slot_mapping.contiguous();
  const int64_t T = k.size(0);
  const int64_t num_slots = k_cache.size(0) * k_cache.size(1);
  const int64_t* sp = slots.data_ptr<int64_t>();
  check_slot_values(sp, T, num_slots);
  const auto kc = k.contiguous(), vc = v.contiguous();
  const int64_t row = k.size(1) * k.size(2);  // elements per token
  const size_t row_bytes = static_cast<size_t>(row) * k.element_size();
  const char* ks = static_cast<const char*>(kc.const_data_ptr());
  const char* vs = static_cast<const char*>(vc.const_data_ptr());
  char* kd = static_cast<char*>(k_cache.data_ptr());
  char* vd = static_cast<char*>(v_cache.data_ptr());
  at::parallel_for(0, T, 64, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      if (sp[t] < 0) continue;
      std::memcpy(kd + sp[t] * row_bytes, ks + t * row_bytes, row_bytes);
      std::memcpy(vd + sp[t] * row_bytes, vs + t * row_bytes, row_bytes);
    }
  });
}

}  // namespace dspark

TORCH_LIBRARY_IMPL(dspark, CPU, m) { m.impl("paged_kv_append", &dspark::paged_kv_append_cpu); }
