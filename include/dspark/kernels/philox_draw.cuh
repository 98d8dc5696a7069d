// SPDX-License-Identifier: Apache-2.0
// CUDA philox_draw: one keyed Philox uniform and its Gumbel per element (include/dspark/philox.h), the same
// function the CPU op runs, so both devices return the same bits.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "dspark/philox.h"

namespace dspark::kernels {

// request, position, index: [n] IdType -> uniform [n] f32, gumbel [n] f32 (grid-stride loop).
template <typename IdType>
__global__ void PhiloxDrawKernel(uint64_t seed, uint64_t offset, const IdType* __restrict__ request,
                                 const IdType* __restrict__ position, uint32_t purpose,
                                 const IdType* __restrict__ index, float* __restrict__ uniform,
                                 float* __restrict__ gumbel, int64_t n) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const float u =
        philox_uniform(seed, offset, static_cast<uint32_t>(request[i]), static_cast<uint32_t>(position[i]),
                       purpose, static_cast<uint64_t>(index[i]));
    uniform[i] = u;
    gumbel[i] = uniform_to_gumbel(u);
  }
}

template <typename IdType>
cudaError_t PhiloxDraw(uint64_t seed, uint64_t offset, const IdType* request, const IdType* position,
                       uint32_t purpose, const IdType* index, float* uniform, float* gumbel, int64_t n,
                       cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  constexpr int kThreads = 256;
  constexpr int64_t kMaxBlocks = 1 << 16;  // grid-stride past this
  const int64_t blocks = (n + kThreads - 1) / kThreads;
  const unsigned grid = static_cast<unsigned>(blocks < kMaxBlocks ? blocks : kMaxBlocks);
  PhiloxDrawKernel<IdType>
      <<<grid, kThreads, 0, stream>>>(seed, offset, request, position, purpose, index, uniform, gumbel, n);
  return cudaGetLastError();
}

}  // namespace dspark::kernels
