// SPDX-License-Identifier: Apache-2.0
// CUDA paged_verify_attention (kernels: include/dspark/kernels/paged_verify_attention.cuh).
#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <cstdint>
#include <type_traits>

#include "checks/paged_verify_attention.h"
#include "cuda/tensor_cores.h"
#include "dspark/kernels/paged_verify_attention.cuh"

namespace dspark {
namespace {

bool aligned16(const at::Tensor& t) { return reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0; }

// The tensor-core kernel for bf16 / fp16 at head_dim 64 / 128 with 16-byte aligned q and caches where
// tensor_cores_allowed; otherwise the CUDA-core kernel.
bool use_tensor_cores(const at::Tensor& q, const at::Tensor& kc, const at::Tensor& vc, int64_t D) {
  if (q.scalar_type() != at::kBFloat16 && q.scalar_type() != at::kHalf) return false;
  if (!kernels::PvaHasSplitKernel(D) || !aligned16(q) || !aligned16(kc) || !aligned16(vc)) return false;
  return tensor_cores_allowed(q.get_device());
}

// The kernels for scalar_t: tensor cores for bf16 / fp16 when `tensor_cores`, else CUDA cores. A function
// template, so the tensor-core branch is only instantiated for the 16-bit types.
template <typename scalar_t>
cudaError_t launch(bool tensor_cores, const scalar_t* q, const scalar_t* kc, const scalar_t* vc,
                   scalar_t* out, float* ws_o, float* ws_m, float* ws_l, int32_t* base, bool planned,
                   const kernels::PvaIndex& ix, int T, int R, int D, cudaStream_t stream) {
  using kernels::PvaMath;
  if constexpr (std::is_same_v<scalar_t, at::BFloat16> || std::is_same_v<scalar_t, at::Half>) {
    constexpr PvaMath kTc =
        std::is_same_v<scalar_t, at::BFloat16> ? PvaMath::kTensorCoresBf16 : PvaMath::kTensorCoresFp16;
    if (tensor_cores)
      return kernels::PagedVerifyAttention<scalar_t, kTc>(q, kc, vc, out, ws_o, ws_m, ws_l, base, planned, ix,
                                                          T, R, D, stream);
  }
  return kernels::PagedVerifyAttention<scalar_t, PvaMath::kCudaCores>(q, kc, vc, out, ws_o, ws_m, ws_l, base,
                                                                      planned, ix, T, R, D, stream);
}

}  // namespace

// q [T, Hq, D]; k_cache, v_cache [num_pages, page_size, Hkv, D]; qo_indptr, kv_indptr [R + 1] i32;
// kv_indices [nnz] i32; kv_last_page_len [R] i32; split_base [R] i32 or none -> o [T, Hq, D] (cuda). The
// index value checks read the index tensors and would sync, so they are CPU-only; on CUDA invalid indices (or
// a split_base other than the plan of qo_indptr) are undefined behaviour.
at::Tensor paged_verify_attention_cuda(const at::Tensor& q, const at::Tensor& k_cache,
                                       const at::Tensor& v_cache, const at::Tensor& qo_indptr,
                                       const at::Tensor& kv_indptr, const at::Tensor& kv_indices,
                                       const at::Tensor& kv_last_page_len, double scale, bool causal,
                                       const c10::optional<at::Tensor>& split_base) {
  check_paged_verify_attention_meta(q, k_cache, v_cache, qo_indptr, kv_indptr, kv_indices, kv_last_page_len,
                                    split_base);
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
  // (given once per forward by the caller as split_base, else planned here by PvaPlanKernel)
  at::Tensor ws_o, ws_ml, base;
  const bool planned = split_base.has_value();
  if (kernels::PvaHasSplitKernel(D)) {
    const int64_t W = kernels::PvaWorkspaceRows(T, R);
    ws_o = at::empty({kernels::kPvaMaxSplits, W, Hq, D}, q.options().dtype(at::kFloat));
    ws_ml = at::empty({2, kernels::kPvaMaxSplits, W, Hq}, q.options().dtype(at::kFloat));
    base = planned ? split_base->contiguous() : at::empty({R}, q.options().dtype(at::kInt));
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
  const bool tensor_cores = use_tensor_cores(qc, kc, vc, D);
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kHalf, at::kBFloat16, q.scalar_type(), "dspark_paged_verify_attention_cuda", [&] {
        const bool split = ws_o.defined();
        float* wo = split ? ws_o.data_ptr<float>() : nullptr;
        float* wm = split ? ws_ml.data_ptr<float>() : nullptr;
        const cudaError_t status = launch<scalar_t>(
            tensor_cores, qc.data_ptr<scalar_t>(), kc.data_ptr<scalar_t>(), vc.data_ptr<scalar_t>(),
            out.data_ptr<scalar_t>(), wo, wm, split ? wm + ws_ml.numel() / 2 : nullptr,
            split ? base.data_ptr<int32_t>() : nullptr, planned, ix, static_cast<int>(T), static_cast<int>(R),
            static_cast<int>(D), c10::cuda::getCurrentCUDAStream());
        TORCH_CHECK(status == cudaSuccess, "dspark::paged_verify_attention: CUDA kernel launch failed: ",
                    cudaGetErrorString(status));
      });
  return out;
}

}  // namespace dspark

TORCH_LIBRARY_IMPL(dspark, CUDA, m) {
  m.impl("paged_verify_attention", &dspark::paged_verify_attention_cuda);
}
