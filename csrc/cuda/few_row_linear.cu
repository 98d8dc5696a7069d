// SPDX-License-Identifier: Apache-2.0
// CUDA few_row_linear: y = x · wᵀ (+ b) for a few fp32 rows (kernel:
// include/dspark/kernels/few_row_linear.cuh).
#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include "checks/few_row_linear.h"
#include "dspark/kernels/few_row_linear.cuh"

namespace dspark {

// x [M, K] f32, weight [N, K] f32, bias [N] f32 or none (cuda) -> y [M, N] f32
at::Tensor few_row_linear_cuda(const at::Tensor& x, const at::Tensor& weight,
                               const std::optional<at::Tensor>& bias) {
  check_few_row_linear_args(x, weight, bias);
  const c10::cuda::CUDAGuard guard(x.device());
  const int64_t M = x.size(0), K = x.size(1), N = weight.size(0);
  const auto xc = x.contiguous();
  const auto wc = weight.contiguous();
  const at::Tensor bc = bias.has_value() ? bias->contiguous() : at::Tensor();
  auto y = at::empty({M, N}, x.options());
  const cudaError_t status = kernels::FewRowLinear(
      xc.data_ptr<float>(), wc.data_ptr<float>(), bc.defined() ? bc.data_ptr<float>() : nullptr,
      y.data_ptr<float>(), M, N, K, c10::cuda::getCurrentCUDAStream());
  TORCH_CHECK(status == cudaSuccess,
              "dspark::few_row_linear: CUDA kernel launch failed: ", cudaGetErrorString(status));
  return y;
}

}  // namespace dspark

TORCH_LIBRARY_IMPL(dspark, CUDA, m) { m.impl("few_row_linear", &dspark::few_row_linear_cuda); }
