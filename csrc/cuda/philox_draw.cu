// SPDX-License-Identifier: Apache-2.0
// CUDA philox_draw: the keyed Philox uniforms and Gumbels of include/dspark/philox.h, one per element; the
// same function the CPU op runs, so both devices return the same bits.
#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include "checks/philox_draw.h"
#include "dspark/kernels/philox_draw.cuh"

namespace dspark {

// request, position, index: [N] int64 (cuda) -> uniform [N] f32, gumbel [N] f32
// Only metadata is checked here: the CPU op's range checks (request < 2^32, position < 2^16, index < 2^34)
// need the values on the host, so on CUDA out-of-range values are not rejected (they are truncated to the
// counter's bit widths) — the op never syncs with the host.
std::tuple<at::Tensor, at::Tensor> philox_draw_cuda(int64_t seed, int64_t offset, const at::Tensor& request,
                                                    const at::Tensor& position, int64_t purpose,
                                                    const at::Tensor& index) {
  check_philox_draw_args(request, position, purpose, index);
  const c10::cuda::CUDAGuard guard(request.device());
  const auto req = request.contiguous(), pos = position.contiguous(), idx = index.contiguous();
  const int64_t n = req.numel();
  auto uniform = at::empty({n}, req.options().dtype(at::kFloat));
  auto gumbel = at::empty({n}, req.options().dtype(at::kFloat));
  const cudaError_t status = kernels::PhiloxDraw<int64_t>(
      static_cast<uint64_t>(seed), static_cast<uint64_t>(offset), req.data_ptr<int64_t>(),
      pos.data_ptr<int64_t>(), static_cast<uint32_t>(purpose), idx.data_ptr<int64_t>(),
      uniform.data_ptr<float>(), gumbel.data_ptr<float>(), n, c10::cuda::getCurrentCUDAStream());
  TORCH_CHECK(status == cudaSuccess,
              "dspark::philox_draw: CUDA kernel launch failed: ", cudaGetErrorString(status));
  return {uniform, gumbel};
}

}  // namespace dspark

TORCH_LIBRARY_IMPL(dspark, CUDA, m) { m.impl("philox_draw", &dspark::philox_draw_cuda); }
