// SPDX-License-Identifier: Apache-2.0
// CUDA confidence: c = sigmoid((w . [h; e] + b) / T_k + o_k) per draft position and the survival cumprod
// (kernel: include/dspark/kernels/confidence.cuh).
#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include "checks/confidence.h"
#include "dspark/kernels/confidence.cuh"

namespace dspark {

// hidden [R, g, H], prev_emb [R, g, r], weight [H + r] f32, bias [] or [1] f32, sts_temperature [g] f32,
// sts_bias [g] f32 or none (cuda) -> logit, conf, survival: [R, g] f32
// bias, sts_temperature and sts_bias are read on the device. The CPU op's value checks (temperatures finite
// and > 0, offsets finite) need the data on the host, so they are CPU-only: the CUDA op never syncs.
std::tuple<at::Tensor, at::Tensor, at::Tensor> confidence_cuda(
    const at::Tensor& hidden, const at::Tensor& prev_emb, const at::Tensor& weight, const at::Tensor& bias,
    const at::Tensor& sts_temperature, const std::optional<at::Tensor>& sts_bias) {
  check_confidence_args(hidden, prev_emb, weight, bias, sts_temperature, sts_bias);
  const c10::cuda::CUDAGuard guard(hidden.device());
  const int64_t R = hidden.size(0), G = hidden.size(1), H = hidden.size(2), r = prev_emb.size(2);
  TORCH_CHECK_VALUE(R <= 0x7FFFFFFF, "dspark::confidence: at most 2^31 - 1 requests on CUDA, got ", R);
  const auto h = hidden.contiguous();
  const auto e = prev_emb.to(hidden.scalar_type()).contiguous();
  const auto w = weight.contiguous();
  const auto b = bias.contiguous();
  const auto t = sts_temperature.contiguous();
  const at::Tensor o = sts_bias.has_value() ? sts_bias->contiguous() : at::Tensor();
  const float* o_ptr = o.defined() ? o.data_ptr<float>() : nullptr;  // null: no offsets
  auto opts = h.options().dtype(at::kFloat);
  auto logit = at::empty({R, G}, opts), conf = at::empty({R, G}, opts), surv = at::empty({R, G}, opts);
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, h.scalar_type(), "dspark_confidence_cuda", [&] {
    const cudaError_t status = kernels::Confidence<scalar_t>(
        h.data_ptr<scalar_t>(), e.data_ptr<scalar_t>(), w.data_ptr<float>(), b.data_ptr<float>(),
        t.data_ptr<float>(), o_ptr, logit.data_ptr<float>(), conf.data_ptr<float>(), surv.data_ptr<float>(),
        R, G, H, r, stream);
    TORCH_CHECK(status == cudaSuccess,
                "dspark::confidence: CUDA kernel launch failed: ", cudaGetErrorString(status));
  });
  return {logit, conf, surv};
}

}  // namespace dspark

TORCH_LIBRARY_IMPL(dspark, CUDA, m) { m.impl("confidence", &dspark::confidence_cuda); }
