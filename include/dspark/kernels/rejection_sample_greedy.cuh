// SPDX-License-Identifier: Apache-2.0
// CUDA rejection_sample, greedy requests (temperature 0) split over the vocabulary: a greedy row's only
// decision is its argmax, so every (request, verify row, vocabulary chunk) gets its own CTA.
//   1. GreedyChunkKernel, grid (chunks, G + 1, R): the best (value, id) of the chunk's ids of one verify row
//   —
//      the target logit, repetition-penalised for the ids of the request's history and its earlier drafts
//      (a shared-memory bitmap of the chunk's penalised ids) — packed as (ordered value << 32 | ~id) so that
//      an integer max is the argmax with ties to the lowest id: order-free (contract C2), and the same token
//      as the CPU op (best_of, include/dspark/sampling.h).
//   2. GreedyWalkKernel, grid R, one warp: per row in order, the max over the chunks; accept while it equals
//      the draft, emit it, stop at the first mismatch or the bonus row.
// The single-block kernel (rejection_sample.cuh) leaves greedy requests to these two (greedy_elsewhere).
// Rows with NaN logits are unspecified here (the decoder sanitises them first).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "dspark/kernels/rejection_sample.cuh"
#include "dspark/kernels/warp_reduce.cuh"

namespace dspark::kernels {

constexpr int kGreedyThreads = 256;
constexpr int64_t kGreedyChunk = 4096;  // vocabulary ids per CTA

inline int64_t GreedyChunks(int64_t V) { return (V + kGreedyChunk - 1) / kGreedyChunk; }

__device__ __forceinline__ uint64_t GreedyPack(float v, int64_t id) {
  if (v == 0.0f) v = 0.0f;  // -0 and +0 tie under best_of's float comparison; their ordered keys differ
  return (static_cast<uint64_t>(ordered_key(v)) << 32) | (0xFFFFFFFFu - static_cast<uint32_t>(id));
}
__device__ __forceinline__ int64_t GreedyId(uint64_t packed) {
  return static_cast<int64_t>(0xFFFFFFFFu - static_cast<uint32_t>(packed & 0xFFFFFFFFu));
}
// grid (GreedyChunks(V), G + 1, R), block kGreedyThreads -> best [R, G + 1, chunks] u64 (rows < verify_len of
// greedy requests only)
template <typename TL>
__global__ void __launch_bounds__(kGreedyThreads)
    GreedyChunkKernel(const TL* __restrict__ target, RejectionParams a, uint64_t* __restrict__ best) {
  __shared__ uint32_t penalised[kGreedyChunk / 32];
  __shared__ uint64_t warp_best[kGreedyThreads / 32];
  const int64_t chunk = blockIdx.x, i = blockIdx.y, r = blockIdx.z, chunks = gridDim.x;
  if (a.temperature[r] != 0.0f || i >= a.verify_len[r]) return;  // CTA-uniform, before any barrier
  const int64_t lo = chunk * kGreedyChunk, hi = min(a.V, lo + kGreedyChunk);
  const TL* row = target + (static_cast<int64_t>(a.qo_indptr[r]) + i) * a.V;
  const float pen = a.penalty ? a.penalty[r] : 1.0f;
  if (pen != 1.0f) {  // the ids the CPU op penalises in this row: the history's, then drafts[0 .. i - 1]
    for (int w = threadIdx.x; w < kGreedyChunk / 32; w += kGreedyThreads) penalised[w] = 0u;
    __syncthreads();
    const int64_t* drafts = a.draft_tokens + r * a.G;
    const int64_t p0 = a.penalty_tokens ? a.penalty_indptr[r] : 0;
    const int64_t n_pen = a.penalty_tokens ? a.penalty_indptr[r + 1] - p0 : 0;
    for (int64_t k = threadIdx.x; k < n_pen + i; k += kGreedyThreads) {
      const int64_t id = k < n_pen ? a.penalty_tokens[p0 + k] : drafts[k - n_pen];
      if (id >= lo && id < hi) atomicOr(&penalised[(id - lo) / 32], 1u << ((id - lo) % 32));  // a set
    }
    __syncthreads();
  }
  uint64_t mine = 0;  // below every packed candidate (ordered keys of floats are >= 1)
  for (int64_t j = lo + threadIdx.x; j < hi; j += kGreedyThreads) {
    float v = static_cast<float>(row[j]);
    if (pen != 1.0f && (penalised[(j - lo) / 32] >> ((j - lo) % 32) & 1u)) v = repetition_penalize(v, pen);
    const uint64_t c = GreedyPack(v, j);
    mine = c > mine ? c : mine;
  }
  mine = WarpMax(mine);
  if (threadIdx.x % 32 == 0) warp_best[threadIdx.x / 32] = mine;
  __syncthreads();
  if (threadIdx.x < 32) {
    uint64_t v = threadIdx.x < kGreedyThreads / 32 ? warp_best[threadIdx.x] : 0;
    v = WarpMax(v);
    if (threadIdx.x == 0) best[(r * (a.G + 1) + i) * chunks + chunk] = v;
  }
}

// grid R, block 32: the greedy walk of each greedy request over its rows' chunk maxima.
__global__ void GreedyWalkKernel(RejectionParams a, const uint64_t* __restrict__ best, int64_t chunks) {
  const int64_t r = blockIdx.x;
  if (a.temperature[r] != 0.0f) return;
  const int64_t n = a.verify_len[r];
  const int64_t* drafts = a.draft_tokens + r * a.G;
  int64_t* emit = a.out_tokens + r * (a.G + 1);
  int32_t n_acc = 0;
  for (int64_t i = 0; i < n; ++i) {
    uint64_t v = 0;
    for (int64_t c = threadIdx.x; c < chunks; c += 32) {
      const uint64_t o = best[(r * (a.G + 1) + i) * chunks + c];
      v = o > v ? o : v;
    }
    const int64_t arg = GreedyId(WarpMax(v));
    if (threadIdx.x == 0) emit[i] = arg;
    if (i == n - 1 || arg != drafts[i]) break;  // warp-uniform
    ++n_acc;
  }
  if (threadIdx.x == 0) a.accepted[r] = n_acc;
}

template <typename TL>
cudaError_t RejectionSampleGreedy(const TL* target, const RejectionParams& params, int64_t R, uint64_t* best,
                                  cudaStream_t stream) {
  if (R <= 0) return cudaSuccess;
  const int64_t chunks = GreedyChunks(params.V);
  const dim3 grid(static_cast<unsigned>(chunks), static_cast<unsigned>(params.G + 1),
                  static_cast<unsigned>(R));
  GreedyChunkKernel<TL><<<grid, kGreedyThreads, 0, stream>>>(target, params, best);
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  GreedyWalkKernel<<<static_cast<unsigned>(R), 32, 0, stream>>>(params, best, chunks);
  return cudaGetLastError();
}

}  // namespace dspark::kernels
