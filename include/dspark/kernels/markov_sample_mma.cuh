// SPDX-License-Identifier: Apache-2.0
// CUDA markov_sample on tensor cores: bf16 / fp16 Markov tables (W1, W2) with rank a multiple of 16, compute
// capability 8.0 and later. One launch per draft step k, then MarkovReduceKernel (markov_sample.cuh).
//
// MarkovMmaStepKernel, grid (ceil(R / 64), ceil(V / 128)), 4 warps: a CTA takes 64 requests and 128
// vocabulary ids (32 per warp, four 8-id blocks). It stages e = W1[x_{k-1}] of its requests in shared memory
// (16-bit, rows padded by 8: conflict-free fragment reads), and each warp computes the bias W2 e of its ids
// for all 64 requests with mma.sync.m16n8k16 (fp32 accumulators): per 16-wide rank step it reads its W2
// fragments from global memory once (each id's row in 32-byte pieces) and applies them to the 4 request
// tiles. The bias tile goes through shared memory (reusing the e rows), then one warp per request does the
// CUDA-core kernel's epilogue: z = U + bias (stored: z is what q is, contract C1), the Gumbel-max key
// draft_key(z, T) with keyed Philox noise, and the best (key, id) of the tile by best_of over the warp —
// order-free, so deterministic (C2). The bias's sum order is the tensor core's, not the CPU's 8-lane tree: z
// agrees with the CPU op to the fp32 dot-product error bound and tokens agree except where the CPU's decision
// margin is inside it (C4).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "dspark/kernels/markov_sample.cuh"
#include "dspark/kernels/mma.cuh"

namespace dspark::kernels {

constexpr int kMarkovMmaRequests = 64;                  // requests per CTA: 4 tiles of 16
constexpr int kMarkovMmaVocab = 128;                    // vocabulary ids per CTA: 4 warps x 32
constexpr int kMarkovMmaPad = 8;                        // elements of padding per staged e row
constexpr int kMarkovMmaZStride = kMarkovMmaVocab + 8;  // floats per staged z row (padded)

template <bool kBf16>
__device__ __forceinline__ float HalfBitsToFloat(uint16_t bits) {
  if constexpr (kBf16) {
    return __uint_as_float(static_cast<uint32_t>(bits) << 16);
  } else {
    return __half2float(__ushort_as_half(bits));
  }
}

// The accumulators of a warp's 4 row tiles x 4 id blocks (m16n8 C fragments) into rows g and g + 8 of each
// row tile, columns 2t and 2t + 1 of each id block of the warp's 32 columns of s_z
// [kMarkovMmaRequests][kMarkovMmaZStride].
__device__ __forceinline__ void StoreAccumulators(const float (&acc)[4][4][4], float* s_z, int m_tiles,
                                                  int warp, int g, int t) {
#pragma unroll
  for (int mt = 0; mt < 4; ++mt) {
    if (mt >= m_tiles) break;  // warp-uniform
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int c = mt * 16 + g + 8 * h;
#pragma unroll
      for (int nb = 0; nb < 4; ++nb) {
        s_z[c * kMarkovMmaZStride + warp * 32 + nb * 8 + 2 * t] = acc[mt][nb][2 * h];
        s_z[c * kMarkovMmaZStride + warp * 32 + nb * 8 + 2 * t + 1] = acc[mt][nb][2 * h + 1];
      }
    }
  }
}

// One warp's draw over tile `tile` of a row: z_j = value(j, id) for the tile's ids j (id = tile * 128 + j <
// V), stored to z_row[id] (z is what q is: contract C1), the Gumbel-max key draft_key(z, T) and the best
// (key, id) by best_of over the warp (order-free); lane 0 writes it to *part_key / *part_idx. The loop is the
// kernel's one call site of draft_key: unrolled copies of it made ptxas give the kernel a stack frame.
template <typename Value>
__device__ __forceinline__ void DrawTileRow(Value value, float* z_row, int64_t tile, int64_t V, float T,
                                            uint64_t seed, uint64_t offset, uint32_t req, uint32_t k,
                                            float* part_key, int64_t* part_idx, int lane) {
  KeyIdx best{-INFINITY, -1};
#pragma unroll 1
  for (int j = lane; j < kMarkovMmaVocab; j += 32) {
    const int64_t id = tile * kMarkovMmaVocab + j;
    if (id >= V) break;
    const float zi = value(j, id);
    z_row[id] = zi;
    const float key = draft_key(zi, T, seed, offset, req, k, id);
    if (key > -INFINITY) best = best_of(best, KeyIdx{key, id});  // -inf logits are never drawn
  }
  best = WarpBest(best);  // lane 0 holds the warp's best
  if (lane == 0) {
    *part_key = best.key;
    *part_idx = best.idx;
  }
}

// u [R, G, V], anchor [R], w1/w2 [V, rank] 16-bit (w2 4-byte aligned), temperature [R], request_ids [R] or
// null -> z [R, G, V] f32 and prev_emb [R, G, rank] f32 at step k; part_key / part_idx [R, ceil(V / 128)].
// u may be z itself (markov_sample_from_hidden's steps add the bias in place: each element is read, then
// written, by the same thread). Dynamic smem MarkovMmaSmem(rank) bytes.
template <typename TU, bool kBf16>
__global__ void __launch_bounds__(128)
    MarkovMmaStepKernel(const TU* u, const int64_t* __restrict__ anchor, const uint16_t* __restrict__ w1,
                        const uint16_t* __restrict__ w2, const float* __restrict__ temperature,
                        const int64_t* __restrict__ request_ids, const int64_t* __restrict__ tokens, float* z,
                        float* __restrict__ prev_emb, float* __restrict__ part_key,
                        int64_t* __restrict__ part_idx, int64_t R, int64_t G, int64_t V, int64_t rank,
                        int64_t k, uint64_t seed, PhiloxOffset philox_offset) {
  const uint64_t offset = philox_offset.value();  // read on the device: graphs replay fixed arguments
  extern __shared__ uint4 s_markov_mma[];         // uint4: 16-byte aligned
  uint16_t* s_e = reinterpret_cast<uint16_t*>(s_markov_mma);  // [kMarkovMmaRequests][rank + 8]
  const int64_t r0 = static_cast<int64_t>(blockIdx.x) * kMarkovMmaRequests;
  const int64_t tile = blockIdx.y, n_tiles = gridDim.y;
  const int nr = static_cast<int>(R - r0 < kMarkovMmaRequests ? R - r0 : kMarkovMmaRequests);
  const int64_t stride = rank + kMarkovMmaPad;
  for (int64_t e = threadIdx.x; e < kMarkovMmaRequests * rank; e += blockDim.x) {
    const int c = static_cast<int>(e / rank);
    const int64_t j = e % rank;
    uint16_t bits = 0;  // requests past R: zero rows (their results are never stored)
    if (c < nr) {
      const int64_t r = r0 + c;
      const int64_t prev = k == 0 ? anchor[r] : tokens[r * G + k - 1];
      bits = w1[prev * rank + j];
      if (tile == 0) prev_emb[(r * G + k) * rank + j] = HalfBitsToFloat<kBf16>(bits);
    }
    s_e[c * stride + j] = bits;
  }
  __syncthreads();

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int64_t v0 = tile * kMarkovMmaVocab + warp * 32;  // this warp's ids: v0 + 8 nb + n
  const int m_tiles = (nr + 15) / 16;
  float acc[4][4][4];  // [request tile][id block][fragment]
#pragma unroll
  for (int mt = 0; mt < 4; ++mt) {
#pragma unroll
    for (int nb = 0; nb < 4; ++nb) acc[mt][nb][0] = acc[mt][nb][1] = acc[mt][nb][2] = acc[mt][nb][3] = 0.f;
  }
  for (int64_t ks = 0; ks < rank; ks += 16) {
    uint32_t b[4][2];  // B[kk][n] = W2[v0 + 8 nb + n][ks + kk]: two consecutive rank entries per register
#pragma unroll
    for (int nb = 0; nb < 4; ++nb) {
      const int64_t id = v0 + nb * 8 + g;
      const uint16_t* row = w2 + id * rank + ks + 2 * t;
      b[nb][0] = id < V ? *reinterpret_cast<const uint32_t*>(row) : 0u;
      b[nb][1] = id < V ? *reinterpret_cast<const uint32_t*>(row + 8) : 0u;
    }
#pragma unroll
    for (int mt = 0; mt < 4; ++mt) {
      if (mt >= m_tiles) break;  // warp-uniform
      const uint16_t* e_lo = s_e + (mt * 16 + g) * stride + ks + 2 * t;
      const uint16_t* e_hi = e_lo + 8 * stride;
      const uint32_t a[4] = {
          *reinterpret_cast<const uint32_t*>(e_lo), *reinterpret_cast<const uint32_t*>(e_hi),
          *reinterpret_cast<const uint32_t*>(e_lo + 8), *reinterpret_cast<const uint32_t*>(e_hi + 8)};
#pragma unroll
      for (int nb = 0; nb < 4; ++nb) Mma16816<kBf16>(acc[mt][nb], a, b[nb][0], b[nb][1]);
    }
  }

  // epilogue 1: z = U + bias into shared memory (the staged e is no longer read), rows g and g + 8 of each
  // request tile, columns 2t and 2t + 1 of each id block
  __syncthreads();
  float* s_z = reinterpret_cast<float*>(s_markov_mma);  // [kMarkovMmaRequests][kMarkovMmaZStride]
  StoreAccumulators(acc, s_z, m_tiles, warp, g, t);
  __syncthreads();
  // epilogue 2, one warp per request: z = U + bias, drawn over the tile (DrawTileRow)
  for (int c = warp; c < nr; c += 4) {
    const int64_t r = r0 + c, rk = r * G + k;
    const float* bias = s_z + c * kMarkovMmaZStride;
    const auto value = [&](int j, int64_t id) { return add_rn(static_cast<float>(u[rk * V + id]), bias[j]); };
    DrawTileRow(value, z + rk * V, tile, V, temperature[r], seed, offset,
                static_cast<uint32_t>(request_ids ? request_ids[r] : r), static_cast<uint32_t>(k),
                part_key + r * n_tiles + tile, part_idx + r * n_tiles + tile, lane);
  }
}

// Dynamic shared memory: the staged e rows, then (reused) the staged bias rows.
inline size_t MarkovMmaSmem(int64_t rank) {
  const size_t e = static_cast<size_t>(kMarkovMmaRequests) * static_cast<size_t>(rank + kMarkovMmaPad) * 2;
  const size_t z = static_cast<size_t>(kMarkovMmaRequests) * kMarkovMmaZStride * sizeof(float);
  return e > z ? e : z;
}

inline int64_t MarkovMmaTiles(int64_t V) { return (V + kMarkovMmaVocab - 1) / kMarkovMmaVocab; }

// The tensor-core draft: per step k = first_step .. G - 1, MarkovMmaStepKernel then MarkovReduceKernel. Same
// arguments as MarkovSample, with w1 / w2 as 16-bit patterns; part_key / part_idx [R, MarkovMmaTiles(V)].
// first_step > 0: the earlier steps' tokens are already drawn (markov_sample_from_hidden's first step).
template <typename TU, bool kBf16>
cudaError_t MarkovSampleMma(const TU* u, const int64_t* anchor, const uint16_t* w1, const uint16_t* w2,
                            const float* temperature, const int64_t* request_ids, int64_t* tokens, float* z,
                            float* prev_emb, float* part_key, int64_t* part_idx, int64_t R, int64_t G,
                            int64_t V, int64_t rank, uint64_t seed, PhiloxOffset offset, int64_t first_step,
                            cudaStream_t stream) {
  if (R <= 0 || G <= first_step || V <= 0) return cudaSuccess;
  const int64_t n_tiles = MarkovMmaTiles(V);
  const dim3 grid(static_cast<unsigned>((R + kMarkovMmaRequests - 1) / kMarkovMmaRequests),
                  static_cast<unsigned>(n_tiles));
  const size_t smem = MarkovMmaSmem(rank);
  auto* step = MarkovMmaStepKernel<TU, kBf16>;
  if (smem > 48 * 1024) {
    const cudaError_t e =
        cudaFuncSetAttribute(step, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
    if (e != cudaSuccess) return e;
  }
  for (int64_t k = first_step; k < G; ++k) {
    step<<<grid, 128, smem, stream>>>(u, anchor, w1, w2, temperature, request_ids, tokens, z, prev_emb,
                                      part_key, part_idx, R, G, V, rank, k, seed, offset);
    MarkovReduceKernel<<<static_cast<unsigned>(R), kSumLanes, 0, stream>>>(part_key, part_idx, tokens,
                                                                           n_tiles, G, k);
  }
  return cudaGetLastError();
}

}  // namespace dspark::kernels
