// SPDX-License-Identifier: Apache-2.0
// CUDA paged_verify_attention (kernels: include/dspark/kernels/paged_verify_attention.cuh).
#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include "checks/paged_verify_attention.h"
#include "dspark/kernels/paged_verify_attention.cuh"

namespace dspark {
// q [T, Hq, D]; k_cache, v_cache [num_pages, page_size, Hkv, D]; qo_indptr, kv_indptr [R + 1] i32;
// kv_indices [nnz] i32; kv_last_page_len [R] i32 -> o [T, Hq, D] (cuda). The index value checks read the
// index tensors and would sync, so they are CPU-only; on CUDA invalid indices are undefined behaviour.
at::Tensor paged_verify_attention_cuda(const at::Tensor& q, const at::Tensor& k_cache,
                                       const at::Tensor& v_cache, const at::Tensor& qo_indptr,
                                       const at::Tensor& kv_indptr, const at::Tensor& kv_indices,
                                       const at::Tensor& kv_last_page_len, double scale, bool causal) {
  check_paged_verify_attention_meta(q, k_cache, v_cache, qo_indptr, kv_indptr, kv_indices, kv_last_page_len);
  const c10::cuda::CUDAGuard guard(q.device());
  const int64_t T = q.size(0), Hq = q.size(1), D = q.size(2), Hkv = k_cache.size(2);
  const int64_t R = qo_indptr.size(0) - 1;
  TORCH_CHECK_VALUE(kernels::PvaHasSplitKernel(D) || D <= kernels::kPvaGenericMaxD,
                    "dspark::paged_verify_attention: q head_dim ", D, " is not supported on CUDA (at most ",
                    kernels::kPvaGenericMaxD, ")");
  TORCH_CHECK_VALUE(T <= 0x7FFFFFFF && R <= 65535 && Hq <= 65535,
                    "dspark::paged_verify_attention: CUDA limits are T < 2^31, R <= 65535 and Hq <= 65535");
  TORCH_CHECK_VALUE(k_cache.numel() <= (int64_t{1} << 62),
                    "dspark::paged_verify_attention: k_cache too large");
  const auto qc = q.contiguous(), kc = k_cache.contiguous(), vc = v_cache.contiguous();
  const auto qo = qo_indptr.contiguous(), kvp = kv_indptr.contiguous(), idx = kv_indices.contiguous(),
             last = kv_last_page_len.contiguous();
  auto out = at::empty_like(qc);
  if (T == 0) return out;
  // the split kernel's workspace: its size follows T and R, a request's split count never does (C2)
  at::Tensor ws_o, ws_ml, base;
  if (kernels::PvaHasSplitKernel(D)) {
    const int64_t W = kernels::PvaWorkspaceRows(T, R);
    ws_o = at::empty({kernels::kPvaMaxSplits, W, Hq, D}, q.options().dtype(at::kFloat));
    ws_ml = at::empty({2, kernels::kPvaMaxSplits, W, Hq}, q.options().dtype(at::kFloat));
    base = at::empty({R}, q.options().dtype(at::kInt));
  }
  kernels::PvaIndex ix{qo.data_ptr<int32_t>(),
                       kvp.data_ptr<int32_t>(),
                       idx.data_ptr<int32_t>(),
                       last.data_ptr<int32_t>(),
                       static_cast<int>(Hq),
                       static_cast<int>(Hkv),
                       static_cast<int>(k_cache.size(1)),
                       static_cast<float>(scale),
                       causal};
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kHalf, at::kBFloat16, q.scalar_type(), "dspark_paged_verify_attention_cuda", [&] {
        const bool split = ws_o.defined();
        float* wo = split ? ws_o.data_ptr<float>() : nullptr;
        float* wm = split ? ws_ml.data_ptr<float>() : nullptr;
        float* wl = split ? wm + ws_ml.numel() / 2 : nullptr;
        const cudaError_t status = kernels::PagedVerifyAttention<scalar_t>(
            qc.data_ptr<scalar_t>(), kc.data_ptr<scalar_t>(), vc.data_ptr<scalar_t>(),
            out.data_ptr<scalar_t>(), wo, wm, wl, split ? base.data_ptr<int32_t>() : nullptr, ix,
            static_cast<int>(T), static_cast<int>(R), static_cast<int>(D), stream);
        TORCH_CHECK(status == cudaSuccess, "dspark::paged_verify_attention: CUDA kernel launch failed: ",
                    cudaGetErrorString(status));
      });
  return out;
}

}  // namespace dspark

TORCH_LIBRARY_IMPL(dspark, CUDA, m) {
  m.impl("paged_verify_attention", &dspark::paged_verify_attention_cuda);
}
