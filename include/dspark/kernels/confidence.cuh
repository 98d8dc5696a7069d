// SPDX-License-Identifier: Apache-2.0
// CUDA confidence: c = sigmoid((w . [h; e] + b) / T_k + o_k) per draft position and the survival cumprod.
//
// One block per request, its warps over the gamma positions. A warp computes one dot product in fp32 (lane
// partial sums, vectorised 16-byte loads when aligned, butterfly shuffle reduction); lane 0 applies the bias
// and STS (sts_sigmoid of include/dspark/survival.h) and stages c in shared memory. Then one thread runs
// survival_row on the block's c values: the same sequential fp64 product the CPU op computes, so survival is
// non-increasing exactly. The dot products differ from the CPU's in summation order only (~1 ulp-level).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "dspark/kernels/warp_reduce.cuh"
#include "dspark/survival.h"

namespace dspark::kernels {

constexpr int kConfidenceMaxWarps = 8;
// Survival is staged in shared memory up to this gamma; past it the kernel reads c back from global memory
// (visible to the block after __syncthreads), so any gamma works.
constexpr int64_t kConfidenceMaxSharedGamma = 8192;

// Partial dot product of lane `lane` over x[0, n) . w[0, n) in fp32 (before the warp reduction).
template <typename DType>
__device__ __forceinline__ float LaneDot(const DType* __restrict__ x, const float* __restrict__ w, int64_t n,
                                         int lane) {
  constexpr int kVec = static_cast<int>(16 / sizeof(DType));  // elements per 16-byte load of x
  float acc = 0.f;
  int64_t i0 = 0;
  if constexpr (kVec >= 4 && kVec % 4 == 0) {  // float, half, bfloat16 (w is read as float4s)
    struct alignas(16) XVec {
      DType v[kVec];
    };
    if (reinterpret_cast<uintptr_t>(x) % 16 != 0 || reinterpret_cast<uintptr_t>(w) % 16 != 0) {
      for (int64_t i = lane; i < n; i += 32) acc += static_cast<float>(x[i]) * w[i];
      return acc;
    }
    const int64_t n_vec = n / kVec;
    for (int64_t v = lane; v < n_vec; v += 32) {
      const XVec xv = reinterpret_cast<const XVec*>(x)[v];
      const float4* wv = reinterpret_cast<const float4*>(w + v * kVec);
#pragma unroll
      for (int q = 0; q < kVec / 4; ++q) {
        const float4 ww = wv[q];
        acc += static_cast<float>(xv.v[4 * q + 0]) * ww.x;
        acc += static_cast<float>(xv.v[4 * q + 1]) * ww.y;
        acc += static_cast<float>(xv.v[4 * q + 2]) * ww.z;
        acc += static_cast<float>(xv.v[4 * q + 3]) * ww.w;
      }
    }
    i0 = n_vec * kVec;
  }
  for (int64_t i = i0 + lane; i < n; i += 32) acc += static_cast<float>(x[i]) * w[i];
  return acc;
}

// grid: R blocks; block: 32 * warps threads; dynamic shared memory: gamma floats when use_smem.
// hidden [R, G, H], prev_emb [R, G, r], weight [H + r] f32, bias [1] f32, temperature [G] f32,
// offset [G] f32 or null (zeros) -> logit, conf, survival: [R, G] f32
template <typename DType>
__global__ void ConfidenceKernel(const DType* __restrict__ hidden, const DType* __restrict__ prev_emb,
                                 const float* __restrict__ weight, const float* __restrict__ bias,
                                 const float* __restrict__ temperature, const float* __restrict__ offset,
                                 float* __restrict__ logit,
                                 float* conf,  // not restrict: thread 0 reads it back when !use_smem
                                 float* __restrict__ survival, int64_t G, int64_t H, int64_t rank,
                                 bool use_smem) {
  extern __shared__ float s_conf[];
  const int64_t row = blockIdx.x;
  const int warp = static_cast<int>(threadIdx.x / 32), lane = static_cast<int>(threadIdx.x % 32);
  const int n_warps = static_cast<int>(blockDim.x / 32);
  const float b = *bias;
  for (int64_t k = warp; k < G; k += n_warps) {
    const int64_t rk = row * G + k;
    const float dh = WarpSum(LaneDot(hidden + rk * H, weight, H, lane));
    const float de = WarpSum(LaneDot(prev_emb + rk * rank, weight + H, rank, lane));
    if (lane == 0) {
      const float z = add_rn(add_rn(dh, de), b);
      const float c = sts_sigmoid(z, temperature[k], offset == nullptr ? 0.f : offset[k]);
      logit[rk] = z;
      conf[rk] = c;
      if (use_smem) s_conf[k] = c;
    }
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    survival_row(use_smem ? s_conf : conf + row * G, survival + row * G, static_cast<int>(G));
  }
}

template <typename DType>
cudaError_t Confidence(const DType* hidden, const DType* prev_emb, const float* weight, const float* bias,
                       const float* temperature, const float* offset, float* logit, float* conf,
                       float* survival, int64_t R, int64_t G, int64_t H, int64_t rank, cudaStream_t stream) {
  if (R <= 0 || G <= 0) return cudaSuccess;
  const int warps = static_cast<int>(G < kConfidenceMaxWarps ? G : kConfidenceMaxWarps);
  const bool use_smem = G <= kConfidenceMaxSharedGamma;
  const size_t smem = use_smem ? static_cast<size_t>(G) * sizeof(float) : 0;
  ConfidenceKernel<DType><<<static_cast<unsigned>(R), 32 * warps, smem, stream>>>(
      hidden, prev_emb, weight, bias, temperature, offset, logit, conf, survival, G, H, rank, use_smem);
  return cudaGetLastError();
}

}  // namespace dspark::kernels
