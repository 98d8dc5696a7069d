// SPDX-License-Identifier: Apache-2.0
// Warp-wide reductions shared by the CUDA kernels: a fixed butterfly of shuffles, so every lane ends with the
// same value and the order of the additions never depends on timing (contract C2).
#pragma once
#include <cuda_runtime.h>

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

}  // namespace dspark::kernels
