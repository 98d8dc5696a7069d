// SPDX-License-Identifier: Apache-2.0
// Warp-wide reductions shared by the CUDA kernels: a fixed butterfly of shuffles, so every lane ends with the
// same value and the order of the additions never depends on timing (contract C2).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

namespace dspark::kernels {

__device__ __forceinline__ float WarpSum(float v) {
#pragma unroll
  for (int m = 16; m > 0; m >>= 1) v += __shfl_xor_sync(0xFFFFFFFFu, v, m);
  return v;
}

__device__ __forceinline__ float WarpMax(float v) {
#pragma unroll
  for (int m = 16; m > 0; m >>= 1) v = fmaxf(v, __shfl_xor_sync(0xFFFFFFFFu, v, m));
  return v;
}

// Integer maxima (order-free by nature), every lane ending with the warp's maximum.
__device__ __forceinline__ int WarpMax(int v) {
#pragma unroll
  for (int m = 16; m > 0; m >>= 1) v = max(v, __shfl_xor_sync(0xFFFFFFFFu, v, m));
  return v;
}

__device__ __forceinline__ uint64_t WarpMax(uint64_t v) {
#pragma unroll
  for (int m = 16; m > 0; m >>= 1) {
    const uint64_t o = __shfl_xor_sync(0xFFFFFFFFu, v, m);
    v = o > v ? o : v;
  }
  return v;
}

}  // namespace dspark::kernels
