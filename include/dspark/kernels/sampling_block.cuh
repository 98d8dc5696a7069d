// SPDX-License-Identifier: Apache-2.0
// Block-level reductions of the sampling kernels, for blocks of exactly kSumLanes threads, two barriers each.
// BlockLaneSum reproduces the CPU lane sum of include/dspark/sampling.h: thread t is lane t (it accumulated
// i = t, t + kSumLanes, ... in increasing i) and the tree combines lane l with lane l + s for
// s = kSumLanes/2, ..., 1 — the same additions in the same order as lane_tree. BlockBest reduces KeyIdx
// candidates with best_of (sampling.h).
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "dspark/sampling.h"

namespace dspark::kernels {

struct BlockScratch {
  float f[kSumLanes];
  int64_t i[kSumLanes];
  float total_f;    // a reduction's result, in its own slot: the next call's writes to f / i cannot race a
  int64_t total_i;  // slow thread still reading it (each call's first barrier orders them)
};

static_assert(kSumLanes == 256, "the reductions below are written for blocks of 8 warps");
constexpr unsigned kFullMask = 0xFFFFFFFFu;

// The lane tree lane[l] += lane[l + h], h = 128, 64, ..., 1, with two barriers: thread l < 32 forms the
// h = 128, 64, 32 levels of its own subtree from shared memory, and warp 0 does h = 16, ..., 1 by shuffles
// (lane l reads lane l + h, exactly the tree's pairs; lanes >= h hold values no later level reads).
__device__ __forceinline__ float BlockLaneSum(float lane, BlockScratch& s) {
  s.f[threadIdx.x] = lane;
  __syncthreads();
  if (threadIdx.x < 32) {
    const float* f = s.f + threadIdx.x;
    const float b0 = add_rn(add_rn(f[0], f[128]), add_rn(f[64], f[192]));
    const float b1 = add_rn(add_rn(f[32], f[160]), add_rn(f[96], f[224]));
    float v = add_rn(b0, b1);
#pragma unroll
    for (int h = 16; h > 0; h >>= 1) v = add_rn(v, __shfl_down_sync(kFullMask, v, h));
    if (threadIdx.x == 0) s.total_f = v;
  }
  __syncthreads();
  return s.total_f;
}

__device__ __forceinline__ KeyIdx WarpBest(KeyIdx v) {
#pragma unroll
  for (int h = 16; h > 0; h >>= 1) {
    v = best_of(v, KeyIdx{__shfl_down_sync(kFullMask, v.key, h), __shfl_down_sync(kFullMask, v.idx, h)});
  }
  return v;
}

// Best (key, index) of the block, ties to the lowest index; order-independent, so any tree is exact.
__device__ __forceinline__ KeyIdx BlockBest(KeyIdx v, BlockScratch& s) {
  v = WarpBest(v);
  if ((threadIdx.x & 31) == 0) {
    s.f[threadIdx.x >> 5] = v.key;
    s.i[threadIdx.x >> 5] = v.idx;
  }
  __syncthreads();
  if (threadIdx.x < 32) {
    KeyIdx w{-INFINITY, -1};
    if (threadIdx.x < kSumLanes / 32) w = KeyIdx{s.f[threadIdx.x], s.i[threadIdx.x]};
    w = WarpBest(w);
    if (threadIdx.x == 0) {
      s.total_f = w.key;
      s.total_i = w.idx;
    }
  }
  __syncthreads();
  return KeyIdx{s.total_f, s.total_i};
}

}  // namespace dspark::kernels
