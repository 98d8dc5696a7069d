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

namespace dspark::kernels {

constexpr int kGreedyThreads = 256;
// grid (VocabChunks(V), G + 1, R), block kGreedyThreads -> best [R, G + 1, chunks] u64 (rows < verify_len of
// greedy requests only)
template <typename TL>
__global__ void __launch_bounds__(kGreedyThreads)
    GreedyChunkKernel(const TL* __restrict__ target, RejectionParams a, uint64_t* __restrict__ best) {
  __shared__ uint32_t penalised[kVocabChunk / 32];
  __shared__ uint64_t warp_best[kGreedyThreads / 32];
  const int64_t chunk = blockIdx.x, i = blockIdx.y, r = blockIdx.z, chunks = gridDim.x;
  if (a.temperature[r] != 0.0f || i >= a.verify_len[r]) return;  // CTA-uniform, before any barrier
  const int64_t lo = chunk * kVocabChunk, hi = min(a.V, lo + kVocabChunk);
  const TL* row = target + (static_cast<int64_t>(a.qo_indptr[r]) + i) * a.V;
  const float pen = a.penalty ? a.penalty[r] : 1.0f;
  if (pen != 1.0f) ChunkPenalised(a, r, i, lo, hi, penalised, kVocabChunk / 32);
  uint64_t mine = 0;  // below every packed candidate (ordered keys of floats are >= 1)
  for (int64_t j = lo + threadIdx.x; j < hi; j += kGreedyThreads) {
    float v = static_cast<float>(row[j]);
    if (pen != 1.0f && IsPenalised(penalised, j - lo)) v = repetition_penalize(v, pen);
    const uint64_t c = PackKeyIdx(v, j);
    mine = c > mine ? c : mine;
  }
  mine = BlockMaxPacked(mine, warp_best);
  if (threadIdx.x == 0) best[(r * (a.G + 1) + i) * chunks + chunk] = mine;
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
    const int64_t arg = PackedIdx(WarpMax(v));
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
  const int64_t chunks = VocabChunks(params.V);
  const dim3 grid(static_cast<unsigned>(chunks), static_cast<unsigned>(params.G + 1),
                  static_cast<unsigned>(R));
  GreedyChunkKernel<TL><<<grid, kGreedyThreads, 0, stream>>>(target, params, best);
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  GreedyWalkKernel<<<static_cast<unsigned>(R), 32, 0, stream>>>(params, best, chunks);
  return cudaGetLastError();
}

}  // namespace dspark::kernels
