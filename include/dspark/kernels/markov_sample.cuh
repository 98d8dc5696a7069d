// SPDX-License-Identifier: Apache-2.0
// CUDA markov_sample: two launches per draft step k.
//   MarkovStepKernel  grid (request chunks, vocabulary tiles): a block owns kSumLanes vocabulary rows and
//     kMarkovChunk requests. It stages e = W1[x_{k-1}] of its requests in shared memory, reads each W2 row
//     once for all of them (chunks of the same tile run back to back, so the tile is re-read from L2, not
//     HBM), writes z = U + W2 e, and reduces the Gumbel-max key z / T + G (z when T = 0) to one (key, index)
//     per (request, tile).
//   MarkovReduceKernel grid R: best over the tiles -> x_k.
// The arithmetic (markov_dot's 8 strided lanes and tree, draft_key, ties to the lowest id) is that of
// include/dspark/sampling.h, so tokens and z are bit-identical to the CPU op.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "dspark/kernels/sampling_block.cuh"

namespace dspark::kernels {

constexpr int kMarkovChunk = 4;  // requests per block

template <typename TU, typename TW>
__global__ void __launch_bounds__(kSumLanes)
    MarkovStepKernel(const TU* __restrict__ u, const int64_t* __restrict__ anchor, const TW* __restrict__ w1,
                     const TW* __restrict__ w2, const float* __restrict__ temperature,
                     const int64_t* __restrict__ request_ids, int64_t* __restrict__ tokens,
                     float* __restrict__ z, float* __restrict__ prev_emb, float* __restrict__ part_key,
                     int64_t* __restrict__ part_idx, int64_t R, int64_t G, int64_t V, int64_t rank, int64_t k,
                     uint64_t seed, uint64_t offset) {
  extern __shared__ float s_e[];  // [kMarkovChunk][rank]
  __shared__ BlockScratch scratch;
  const int64_t r0 = static_cast<int64_t>(blockIdx.x) * kMarkovChunk;
  const int64_t tile = blockIdx.y, n_tiles = gridDim.y;
  const int nr = static_cast<int>(R - r0 < kMarkovChunk ? R - r0 : kMarkovChunk);
  for (int c = 0; c < nr; ++c) {
    const int64_t r = r0 + c;
    const int64_t prev = k == 0 ? anchor[r] : tokens[r * G + k - 1];
    for (int64_t j = threadIdx.x; j < rank; j += blockDim.x) {
      const float v = static_cast<float>(w1[prev * rank + j]);
      s_e[c * rank + j] = v;
      if (tile == 0) prev_emb[(r * G + k) * rank + j] = v;
    }
  }
  __syncthreads();
  const int64_t i = tile * kSumLanes + threadIdx.x;
  float acc[kMarkovChunk][8];
#pragma unroll
  for (int c = 0; c < kMarkovChunk; ++c) {
#pragma unroll
    for (int l = 0; l < 8; ++l) acc[c][l] = 0.f;
  }
  if (i < V) {
    const TW* wrow = w2 + i * rank;
    for (int64_t j = 0; j < rank; j += 8) {
      const int width = static_cast<int>(rank - j < 8 ? rank - j : 8);
      float wv[8];
#pragma unroll
      for (int l = 0; l < 8; ++l) wv[l] = l < width ? static_cast<float>(wrow[j + l]) : 0.f;
#pragma unroll
      for (int c = 0; c < kMarkovChunk; ++c) {
        if (c >= nr) break;
#pragma unroll
        for (int l = 0; l < 8; ++l) {
          if (l < width) acc[c][l] = add_rn(acc[c][l], mul_rn(wv[l], s_e[c * rank + j + l]));
        }
      }
    }
  }
  for (int c = 0; c < nr; ++c) {
    const int64_t r = r0 + c;
    KeyIdx mine{-INFINITY, -1};
    if (i < V) {
      const float* a = acc[c];
      const float bias = add_rn(add_rn(add_rn(a[0], a[1]), add_rn(a[2], a[3])),
                                add_rn(add_rn(a[4], a[5]), add_rn(a[6], a[7])));
      const int64_t rk = r * G + k;
      const float zi = add_rn(static_cast<float>(u[rk * V + i]), bias);
      z[rk * V + i] = zi;
      const uint32_t req = static_cast<uint32_t>(request_ids ? request_ids[r] : r);
      const float key = draft_key(zi, temperature[r], seed, offset, req, static_cast<uint32_t>(k), i);
      if (key > -INFINITY) mine = KeyIdx{key, i};  // -inf logits are never drawn
    }
    const KeyIdx best = BlockBest(mine, scratch);
    if (threadIdx.x == 0) {
      part_key[r * n_tiles + tile] = best.key;
      part_idx[r * n_tiles + tile] = best.idx;
    }
  }
}

__global__ void __launch_bounds__(kSumLanes)
    MarkovReduceKernel(const float* __restrict__ part_key, const int64_t* __restrict__ part_idx,
                       int64_t* __restrict__ tokens, int64_t n_tiles, int64_t G, int64_t k) {
  __shared__ BlockScratch scratch;
  const int64_t r = blockIdx.x;
  KeyIdx mine{-INFINITY, -1};
  for (int64_t t = threadIdx.x; t < n_tiles; t += blockDim.x) {
    mine = BestOf(mine, KeyIdx{part_key[r * n_tiles + t], part_idx[r * n_tiles + t]});
  }
  const KeyIdx best = BlockBest(mine, scratch);
  if (threadIdx.x == 0) tokens[r * G + k] = best.idx;
}

// u [R, G, V], anchor [R], w1/w2 [V, rank], temperature [R], request_ids [R] or null
//   -> tokens [R, G], z [R, G, V] f32, prev_emb [R, G, rank] f32; part_key/part_idx: [R, ceil(V / 256)]
template <typename TU, typename TW>
cudaError_t MarkovSample(const TU* u, const int64_t* anchor, const TW* w1, const TW* w2,
                         const float* temperature, const int64_t* request_ids, int64_t* tokens, float* z,
                         float* prev_emb, float* part_key, int64_t* part_idx, int64_t R, int64_t G, int64_t V,
                         int64_t rank, uint64_t seed, uint64_t offset, cudaStream_t stream) {
  if (R <= 0 || G <= 0 || V <= 0) return cudaSuccess;
  const int64_t n_tiles = (V + kSumLanes - 1) / kSumLanes;
  const dim3 grid(static_cast<unsigned>((R + kMarkovChunk - 1) / kMarkovChunk),
                  static_cast<unsigned>(n_tiles));
  const size_t smem = static_cast<size_t>(kMarkovChunk) * static_cast<size_t>(rank) * sizeof(float);
  if (smem > 48 * 1024) {
    const cudaError_t e = cudaFuncSetAttribute(
        MarkovStepKernel<TU, TW>, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
    if (e != cudaSuccess) return e;
  }
  for (int64_t k = 0; k < G; ++k) {
    MarkovStepKernel<TU, TW><<<grid, kSumLanes, smem, stream>>>(u, anchor, w1, w2, temperature, request_ids,
                                                                tokens, z, prev_emb, part_key, part_idx, R, G,
                                                                V, rank, k, seed, offset);
    MarkovReduceKernel<<<static_cast<unsigned>(R), kSumLanes, 0, stream>>>(part_key, part_idx, tokens,
                                                                           n_tiles, G, k);
  }
  return cudaGetLastError();
}

}  // namespace dspark::kernels
