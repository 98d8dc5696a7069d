// SPDX-License-Identifier: Apache-2.0
// CPU philox_draw: the keyed Philox uniforms and Gumbels of include/dspark/philox.h, one per element.
#include "checks/philox_draw.h"

#include <ATen/Parallel.h>
#include <torch/library.h>

#include "dspark/philox.h"

namespace dspark {

// request, position, index: [N] int64 -> uniform [N] f32, gumbel [N] f32
std::tuple<at::Tensor, at::Tensor> philox_draw_cpu(int64_t seed, int64_t offset, const at::Tensor& request,
                                                   const at::Tensor& position, int64_t purpose,
                                                   const at::Tensor& index) {
  check_philox_draw_args(request, position, purpose, index);
  const auto req = request.contiguous(), pos = position.contiguous(), idx = index.contiguous();
  const int64_t n = req.numel();
  const int64_t* r = req.data_ptr<int64_t>();
  const int64_t* p = pos.data_ptr<int64_t>();
  const int64_t* ix = idx.data_ptr<int64_t>();
  for (int64_t i = 0; i < n; ++i) {
    TORCH_CHECK_VALUE(r[i] >= 0 && r[i] <= 0xFFFFFFFFll, "dspark::philox_draw: request[", i, "] = ", r[i],
                      " is outside [0, 2^32)");
    TORCH_CHECK_VALUE(p[i] >= 0 && p[i] <= 0xFFFFll, "dspark::philox_draw: position[", i, "] = ", p[i],
                      " is outside [0, 2^16)");
    TORCH_CHECK_VALUE(ix[i] >= 0 && ix[i] < (1ll << 34), "dspark::philox_draw: index[", i, "] = ", ix[i],
                      " is outside [0, 2^34)");
  }
  auto uniform = at::empty({n}, req.options().dtype(at::kFloat));
  auto gumbel = at::empty({n}, req.options().dtype(at::kFloat));
  float* u = uniform.data_ptr<float>();
  float* g = gumbel.data_ptr<float>();
  at::parallel_for(0, n, 4096, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      u[i] = philox_uniform(static_cast<uint64_t>(seed), static_cast<uint64_t>(offset),
                            static_cast<uint32_t>(r[i]), static_cast<uint32_t>(p[i]),
                            static_cast<uint32_t>(purpose), static_cast<uint64_t>(ix[i]));
      g[i] = uniform_to_gumbel(u[i]);
    }
  });
  return {uniform, gumbel};
}

}  // namespace dspark

TORCH_LIBRARY_IMPL(dspark, CPU, m) { m.impl("philox_draw", &dspark::philox_draw_cpu); }
