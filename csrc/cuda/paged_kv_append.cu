// SPDX-License-Identifier: Apache-2.0
// CUDA paged_kv_append (kernel: include/dspark/kernels/paged_kv_append.cuh).
#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include "checks/paged_kv_append.h"
#include "dspark/kernels/paged_kv_append.cuh"

namespace dspark {

// k, v [T, Hkv, D]; k_cache, v_cache [num_pages, page_size, Hkv, D] (written in place); slot_mapping [T] i64
// (cuda). The slot range check reads slot_mapping and would sync, so it is CPU-only; on CUDA an
// out-of-range slot is undefined behaviour, -1 is skipped.
void paged_kv_append_cuda(const at::Tensor& k, const at::Tensor& v, const at::Tensor& k_cache,
                          const at::Tensor& v_cache, const at::Tensor& slot_mapping) {
  check_paged_kv_append_meta(k, v, k_cache, v_cache, slot_mapping);
  const c10::cuda::CUDAGuard guard(k.device());
  const auto kc = k.contiguous(), vc = v.contiguous(), slots = slot_mapping.contiguous();
  const int64_t T = k.size(0), row = k.size(1) * k.size(2);
  TORCH_CHECK_VALUE(T <= 0x7FFFFFFF, "dspark::paged_kv_append: at most 2^31 - 1 tokens on CUDA, got ", T);
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kHalf, at::kBFloat16, k.scalar_type(), "dspark_paged_kv_append_cuda", [&] {
        const cudaError_t status = kernels::PagedKvAppend<scalar_t>(
            kc.data_ptr<scalar_t>(), vc.data_ptr<scalar_t>(), k_cache.data_ptr<scalar_t>(),
            v_cache.data_ptr<scalar_t>(), slots.data_ptr<int64_t>(), T, row, stream);
        TORCH_CHECK(status == cudaSuccess,
                    "dspark::paged_kv_append: CUDA kernel launch failed: ", cudaGetErrorString(status));
      });
}

}  // namespace dspark

TORCH_LIBRARY_IMPL(dspark, CUDA, m) { m.impl("paged_kv_append", &dspark::paged_kv_append_cuda); }
