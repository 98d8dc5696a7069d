// SPDX-License-Identifier: Apache-2.0
// Block-level reductions of the sampling kernels, for blocks of exactly kSumLanes threads. BlockLaneSum
// reproduces the CPU lane sum of include/dspark/sampling.h: thread t is lane t (it accumulated i = t,
// t + kSumLanes, ... in increasing i) and the shared-memory tree combines lane l with lane l + s for
// s = kSumLanes/2, ..., 1 — the same additions in the same order as lane_tree.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "dspark/sampling.h"

namespace dspark::kernels {

struct KeyIdx {
  float key;
  int64_t idx;  // -1: none
};

__device__ __forceinline__ KeyIdx BestOf(KeyIdx a, KeyIdx b) {
  if (b.idx < 0) return a;
  if (a.idx < 0) return b;
  return better(b.key, b.idx, a.key, a.idx) ? b : a;
}

struct BlockScratch {
  float f[kSumLanes];
  int64_t i[kSumLanes];
};

__device__ __forceinline__ float BlockLaneSum(float lane, BlockScratch& s) {
  s.f[threadIdx.x] = lane;
  __syncthreads();
  for (int h = kSumLanes / 2; h > 0; h >>= 1) {
    if (threadIdx.x < h) s.f[threadIdx.x] = add_rn(s.f[threadIdx.x], s.f[threadIdx.x + h]);
    __syncthreads();
  }
  const float total = s.f[0];
  __syncthreads();
  return total;
}

__device__ __forceinline__ int64_t BlockCount(int64_t c, BlockScratch& s) {
  s.i[threadIdx.x] = c;
  __syncthreads();
  for (int h = kSumLanes / 2; h > 0; h >>= 1) {
    if (threadIdx.x < h) s.i[threadIdx.x] += s.i[threadIdx.x + h];
    __syncthreads();
  }
  const int64_t total = s.i[0];
  __syncthreads();
  return total;
}

// Best (key, index) of the block, ties to the lowest index; order-independent, so any tree is exact.
__device__ __forceinline__ KeyIdx BlockBest(KeyIdx v, BlockScratch& s) {
  s.f[threadIdx.x] = v.key;
  s.i[threadIdx.x] = v.idx;
  __syncthreads();
  for (int h = kSumLanes / 2; h > 0; h >>= 1) {
    if (threadIdx.x < h) {
      const KeyIdx b = BestOf(KeyIdx{s.f[threadIdx.x], s.i[threadIdx.x]},
                              KeyIdx{s.f[threadIdx.x + h], s.i[threadIdx.x + h]});
      s.f[threadIdx.x] = b.key;
      s.i[threadIdx.x] = b.idx;
    }
    __syncthreads();
  }
  const KeyIdx out{s.f[0], s.i[0]};
  __syncthreads();
  return out;
}

}  // namespace dspark::kernels
