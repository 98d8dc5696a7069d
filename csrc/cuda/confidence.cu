// SPDX-License-Identifier: Apache-2.0
// CUDA confidence: c = sigmoid((w . [h; e] + b) / T_k) per draft position and the survival cumprod
// (kernel: include/dspark/kernels/confidence.cuh).
#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include "checks/confidence.h"
#include "dspark/kernels/confidence.cuh"

namespace dspark {

// hidden [R, g, H], prev_emb [R, g, r], weight [H + r] f32, bias [] or [1] f32, sts_temperature [g] f32
// (cuda)
//   -> logit, conf, survival: [R, g] f32
// bias and sts_temperature are read on the device. The CPU op's value check (every temperature finite and
// > 0) needs the data on the host, so it is CPU-only: the CUDA op never syncs with the host.
std::tuple<at::Tensor, at::Tensor, at::Tensor> confidence_cuda(const at::Tensor& hidden,
                                                               const at::Tensor& prev_emb,
                                                               const at::Tensor& weight,
                                                               const at::Tensor& bias,
                                                               const at::Tensor& sts_temperature) {
  check_confidence_args(hidden, prev_emb, weight, bias, sts_temperature);
  const c10::cuda::CUDAGuard guard(hidden.device());
  const int64_t R = hidden.size(0), G = hidden.size(1), H = hidden.size(2), r = prev_emb.size(2);
  TORCH_CHECK_VALUE(R <= 0x7FFFFFFF, "dspark::confidence: at most 2^31 - 1 requests on CUDA, got ", R);
  const auto h = hidden.contiguous();
  const auto e = prev_emb.to(hidden.scalar_type()).contiguous();
  const auto w = weight.contiguous();
  const auto b = bias.contiguous();
  const auto t = sts_temperature.contiguous();
  auto opts = h.options().dtype(at::kFloat);
  auto logit = at::empty({R, G}, opts), conf = at::empty({R, G}, opts), surv = at::empty({R, G}, opts);
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, h.scalar_type(), "dspark_confidence_cuda", [&] {
    const cudaError_t status =
        kernels::Confidence<scalar_t>(h.data_ptr<scalar_t>(), e.data_ptr<scalar_t>(), w.data_ptr<float>(),
                                      b.data_ptr<float>(), t.data_ptr<float>(), logit.data_ptr<float>(),
                                      conf.data_ptr<float>(), surv.data_ptr<float>(), R, G, H, r, stream);
    TORCH_CHECK(status == cudaSuccess,
                "dspark::confidence: CUDA kernel launch failed: ", cudaGetErrorString(status));
  });
  return {logit, conf, surv};
}

}  // namespace dspark

TORCH_LIBRARY_IMPL(dspark, CUDA, m) { m.impl("confidence", &dspark::confidence_cuda); }
