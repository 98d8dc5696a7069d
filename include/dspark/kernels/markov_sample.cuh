// SPDX-License-Identifier: Apache-2.0
// CUDA markov_sample: two launches per draft step k.
//   MarkovStepKernel  grid (request chunks, vocabulary tiles): a block owns kSumLanes vocabulary rows and
//     kMarkovChunk requests. It stages e = W1[x_{k-1}] of its requests in shared memory, reads each W2 row
//     once for all of them (chunks of the same tile run back to back, so the tile is re-read from L2, not
//     HBM), writes z = U + W2 e, and reduces the Gumbel-max key z / T + G (z when T = 0) to one (key, index)
//     per (request, tile).
//   MarkovReduceKernel grid R: best over the tiles -> x_k.
// When rank % 8 == 0 and W2 is 16-byte aligned (kVec), each thread reads its W2 row 8 entries per load
// instruction (16 bytes for bf16 / fp16, two for fp32) and e from shared memory as float4: the same products
// and sums in the same order as the scalar path, with an eighth of the load instructions.
// The arithmetic (markov_dot's 8 strided lanes and tree, draft_key, ties to the lowest id) is that of
// include/dspark/sampling.h, so tokens and z are bit-identical to the CPU op.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "dspark/kernels/sampling_block.cuh"

namespace dspark::kernels {

constexpr int kMarkovChunk = 8;  // requests per block: each W2 row read serves this many

// 8 consecutive entries from a 16-byte aligned address, as floats (exact conversions).
__device__ __forceinline__ void Load8(const float* p, float (&v)[8]) {
  const float4 a = __ldg(reinterpret_cast<const float4*>(p)),
               b = __ldg(reinterpret_cast<const float4*>(p) + 1);
  v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
}

__device__ __forceinline__ float2 PairToFloat2(__nv_bfloat162 h) { return __bfloat1622float2(h); }
__device__ __forceinline__ float2 PairToFloat2(__half2 h) { return __half22float2(h); }

template <typename T>  // __nv_bfloat16 or __half: one 16-byte load of four pairs
__device__ __forceinline__ void Load8(const T* p, float (&v)[8]) {
  using Pair = std::conditional_t<std::is_same_v<T, __half>, __half2, __nv_bfloat162>;
  const uint4 raw = __ldg(reinterpret_cast<const uint4*>(p));
  const Pair* h = reinterpret_cast<const Pair*>(&raw);
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const float2 f = PairToFloat2(h[k]);
    v[2 * k] = f.x, v[2 * k + 1] = f.y;
  }
}

// 8 consecutive floats of shared memory (16-byte aligned).
__device__ __forceinline__ void LoadShared8(const float* p, float (&v)[8]) {
  const float4 a = reinterpret_cast<const float4*>(p)[0], b = reinterpret_cast<const float4*>(p)[1];
  v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
}

template <typename TU, typename TW, bool kVec>
__global__ void __launch_bounds__(kSumLanes)
    MarkovStepKernel(const TU* __restrict__ u, const int64_t* __restrict__ anchor, const TW* __restrict__ w1,
                     const TW* __restrict__ w2, const float* __restrict__ temperature,
                     const int64_t* __restrict__ request_ids, int64_t* __restrict__ tokens,
                     float* __restrict__ z, float* __restrict__ prev_emb, float* __restrict__ part_key,
                     int64_t* __restrict__ part_idx, int64_t R, int64_t G, int64_t V, int64_t rank, int64_t k,
                     uint64_t seed, PhiloxOffset philox_offset) {
  const uint64_t offset = philox_offset.value();  // read on the device: graphs replay fixed arguments
  extern __shared__ float4 s_e4[];                // float4: 16-byte aligned for the kVec loads
  float* s_e = reinterpret_cast<float*>(s_e4);    // [kMarkovChunk][rank]
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
  if (i < V && kVec) {
    const TW* wrow = w2 + i * rank;
    for (int64_t j = 0; j < rank; j += 8) {
      float wv[8];
      Load8(wrow + j, wv);
#pragma unroll
      for (int c = 0; c < kMarkovChunk; ++c) {
        if (c >= nr) break;
        float ev[8];
        LoadShared8(s_e + c * rank + j, ev);
#pragma unroll
        for (int l = 0; l < 8; ++l) acc[c][l] = add_rn(acc[c][l], mul_rn(wv[l], ev[l]));
      }
    }
  } else if (i < V) {
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
#pragma unroll
  for (int c = 0; c < kMarkovChunk; ++c) {  // unrolled: acc stays in registers (a runtime index spills it)
    if (c >= nr) break;
    const int64_t r = r0 + c;
    KeyIdx mine{-INFINITY, -1};
    if (i < V) {
      const int64_t rk = r * G + k;
      const float zi = add_rn(static_cast<float>(u[rk * V + i]), markov_tree(acc[c]));
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

// static: markov_sample.cu and markov_sample_from_hidden.cu both launch it (one copy per translation unit)
static __global__ void __launch_bounds__(kSumLanes)
    MarkovReduceKernel(const float* __restrict__ part_key, const int64_t* __restrict__ part_idx,
                       int64_t* __restrict__ tokens, int64_t n_tiles, int64_t G, int64_t k) {
  __shared__ BlockScratch scratch;
  const int64_t r = blockIdx.x;
  KeyIdx mine{-INFINITY, -1};
  for (int64_t t = threadIdx.x; t < n_tiles; t += blockDim.x) {
    mine = best_of(mine, KeyIdx{part_key[r * n_tiles + t], part_idx[r * n_tiles + t]});
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
                         int64_t rank, uint64_t seed, PhiloxOffset offset, cudaStream_t stream) {
  if (R <= 0 || G <= 0 || V <= 0) return cudaSuccess;
  const int64_t n_tiles = (V + kSumLanes - 1) / kSumLanes;
  const dim3 grid(static_cast<unsigned>((R + kMarkovChunk - 1) / kMarkovChunk),
                  static_cast<unsigned>(n_tiles));
  const size_t smem = static_cast<size_t>(kMarkovChunk) * static_cast<size_t>(rank) * sizeof(float);
  const bool vec = rank % 8 == 0 && reinterpret_cast<uintptr_t>(w2) % 16 == 0;
  auto* step = vec ? MarkovStepKernel<TU, TW, true> : MarkovStepKernel<TU, TW, false>;
  // The 48 KiB default bounds static + dynamic shared memory together: the kernel's static BlockScratch
  // counts too (without the opt-in, 1440 <= rank <= 1536 would fail to launch).
  if (smem + sizeof(BlockScratch) > 48 * 1024) {
    const cudaError_t e =
        cudaFuncSetAttribute(step, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
    if (e != cudaSuccess) return e;
  }
  for (int64_t k = 0; k < G; ++k) {
    step<<<grid, kSumLanes, smem, stream>>>(u, anchor, w1, w2, temperature, request_ids, tokens, z, prev_emb,
                                            part_key, part_idx, R, G, V, rank, k, seed, offset);
    MarkovReduceKernel<<<static_cast<unsigned>(R), kSumLanes, 0, stream>>>(part_key, part_idx, tokens,
                                                                           n_tiles, G, k);
  }
  return cudaGetLastError();
}

}  // namespace dspark::kernels
