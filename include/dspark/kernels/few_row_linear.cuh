// SPDX-License-Identifier: Apache-2.0
// CUDA few_row_linear: y = x · wᵀ (+ b) for a few fp32 rows of x, reading each weight row once.
//
// One warp per weight row (grid-stride over N). The warp streams its row of w in 16-byte loads (scalar loads
// when K % 4 != 0 or a pointer is not 16-byte aligned) and multiplies each piece by up to kFewRowTile rows of
// x, whose reads hit L1/L2 (x is small and every warp reads it); more rows of x take further passes over the
// same weight row, which is then in L1. Lane partial sums are fused multiply-adds in a fixed order and the
// warp reduction is a fixed butterfly, so the result is the same on every run (contract C2); it equals
// F.linear to float rounding (C4: a different summation order).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "dspark/kernels/warp_reduce.cuh"

namespace dspark::kernels {

constexpr int kFewRowTile = 8;   // rows of x per pass over a weight row (accumulators per lane)
constexpr int kFewRowWarps = 8;  // warps per block
constexpr int64_t kFewRowMaxBlocks = int64_t{1} << 16;

// grid: min(ceil(N / kFewRowWarps), kFewRowMaxBlocks) blocks of 32 * kFewRowWarps threads.
// x [M, K] f32, w [N, K] f32, b [N] f32 or null -> y [M, N] f32 (all contiguous; 16-byte aligned when kVec4)
template <bool kVec4>
__global__ void FewRowLinearKernel(const float* __restrict__ x, const float* __restrict__ w,
                                   const float* __restrict__ b, float* __restrict__ y, int64_t M, int64_t N,
                                   int64_t K) {
  const int lane = static_cast<int>(threadIdx.x % 32);
  const int64_t warps_per_block = blockDim.x / 32;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * warps_per_block + threadIdx.x / 32;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * warps_per_block;
  for (int64_t n = first; n < N; n += stride) {
    const float* wn = w + n * K;
    for (int64_t m0 = 0; m0 < M; m0 += kFewRowTile) {
      const int64_t rows = M - m0 < kFewRowTile ? M - m0 : kFewRowTile;  // warp-uniform
      const float* xt = x + m0 * K;
      float acc[kFewRowTile];
#pragma unroll
      for (int r = 0; r < kFewRowTile; ++r) acc[r] = 0.f;
      if constexpr (kVec4) {
        const int64_t k4 = K / 4;
        for (int64_t k = lane; k < k4; k += 32) {
          const float4 wv = reinterpret_cast<const float4*>(wn)[k];
#pragma unroll
          for (int r = 0; r < kFewRowTile; ++r) {
            if (r < rows) {
              const float4 xv = reinterpret_cast<const float4*>(xt + r * K)[k];
              acc[r] = fmaf(xv.x, wv.x, acc[r]);
              acc[r] = fmaf(xv.y, wv.y, acc[r]);
              acc[r] = fmaf(xv.z, wv.z, acc[r]);
              acc[r] = fmaf(xv.w, wv.w, acc[r]);
            }
          }
        }
      } else {
        for (int64_t k = lane; k < K; k += 32) {
          const float wv = wn[k];
#pragma unroll
          for (int r = 0; r < kFewRowTile; ++r) {
            if (r < rows) acc[r] = fmaf(xt[r * K + k], wv, acc[r]);
          }
        }
      }
#pragma unroll
      for (int r = 0; r < kFewRowTile; ++r) {
        const float s = WarpSum(acc[r]);  // every lane holds the sum
        if (lane == r && r < rows) y[(m0 + r) * N + n] = b == nullptr ? s : s + b[n];
      }
    }
  }
}

inline cudaError_t FewRowLinear(const float* x, const float* w, const float* b, float* y, int64_t M,
                                int64_t N, int64_t K, cudaStream_t stream) {
  if (M <= 0 || N <= 0) return cudaSuccess;
  const auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  const bool vec4 = K % 4 == 0 && aligned(x) && aligned(w);
  const int64_t wanted = (N + kFewRowWarps - 1) / kFewRowWarps;
  const auto grid = static_cast<unsigned>(wanted < kFewRowMaxBlocks ? wanted : kFewRowMaxBlocks);
  if (vec4) {
    FewRowLinearKernel<true><<<grid, 32 * kFewRowWarps, 0, stream>>>(x, w, b, y, M, N, K);
  } else {
    FewRowLinearKernel<false><<<grid, 32 * kFewRowWarps, 0, stream>>>(x, w, b, y, M, N, K);
  }
  return cudaGetLastError();
}

}  // namespace dspark::kernels
