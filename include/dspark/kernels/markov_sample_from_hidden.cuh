// SPDX-License-Identifier: Apache-2.0
// CUDA markov_sample_from_hidden on tensor cores: the drafter's base logits U = h · lm_headᵀ and the first
// Markov step in one GEMM over the LM head, then the later steps in place (bf16 / fp16, H % 8 == 0, rank % 16
// == 0, 16-byte aligned rows; compute capability 8.0 and later).
//
// MarkovHiddenMmaKernel, grid (ceil(R G / 64), ceil(V / 128)), 4 warps: a CTA takes 64 draft rows m = r G + k
// and 128 vocabulary ids (32 per warp). Per 64-column chunk of H it stages the rows' h in shared memory and
// each warp multiplies them by its ids' lm_head rows with mma.sync.m16n8k16 (fp32 accumulators; lm_head read
// from global memory once per CTA by 16-byte loads). Then the same for the rank: rows of step 0 carry
// e = W1[anchor] against W2 (the first step's bias, in the same accumulators), other rows zeros. The epilogue
// stores every row (U for k > 0: the buffer the later steps add their bias to; z_0 = U_0 + W2 e for k = 0,
// what q is: contract C1) and, for k = 0, the best Gumbel-max (key, id) of the tile as MarkovMmaStepKernel
// does. MarkovReduceKernel picks x_0; steps k = 1 .. G - 1 are MarkovMmaStepKernel with u = z.
//
// The lm_head is read once for all G steps; U is never rounded to 16 bits, never stored apart from z, and
// the first step needs no pass of its own. Sums are the tensor core's: z agrees with the fp64 value to the
// fp32 dot-product bound over H + rank terms, tokens with the CPU op's except inside that margin (C4).
//
// k-order inside a 32-column slice: lane (g, t) loads columns 8t .. 8t + 7 of its A rows and B ids as one
// 16-byte piece and feeds them to two MMAs, (8t, 8t+1 | 8t+2, 8t+3) then (8t+4, 8t+5 | 8t+6, 8t+7), in the
// registers where the PTX layout expects columns (2t, 2t+1 | 2t+8, 2t+9). A and B are permuted alike, so each
// MMA still sums products of matching columns: 16 distinct columns per MMA, all 32 over the pair.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "dspark/kernels/markov_sample_mma.cuh"

namespace dspark::kernels {

constexpr int kHiddenChunk = 64;                  // columns of H (or of the rank) staged per pass
constexpr int kHiddenStride = kHiddenChunk + 32;  // 16-bit elements per staged row: 192 bytes, so the eight
                                                  // lanes of a 16-byte shared-load phase hit distinct banks

// 8 consecutive 16-bit entries of row `row` from column `col` (16-byte aligned), or zeros past the matrix.
__device__ __forceinline__ uint4 LoadRow8(const uint16_t* base, int64_t ld, int64_t row, int64_t rows,
                                          int64_t col, int64_t cols) {
  if (row >= rows || col >= cols) return make_uint4(0u, 0u, 0u, 0u);
  return __ldg(reinterpret_cast<const uint4*>(base + row * ld + col));
}

// acc[mt][nb] += A · Bᵀ over one staged chunk: A = s_a (64 rows x kHiddenChunk, zeros past the matrix), B =
// rows v0 + 8 nb + g of b (ld entries per row, `cols` valid columns from k0), only request tiles < m_tiles.
template <bool kBf16>
__device__ __forceinline__ void MmaChunk(float (&acc)[4][4][4], const uint16_t* s_a, const uint16_t* b,
                                         int64_t ld, int64_t V, int64_t v0, int64_t k0, int64_t cols,
                                         int m_tiles, int g, int t) {
#pragma unroll
  for (int kk = 0; kk < kHiddenChunk; kk += 32) {
    uint4 bq[4];
#pragma unroll
    for (int nb = 0; nb < 4; ++nb) bq[nb] = LoadRow8(b, ld, v0 + nb * 8 + g, V, k0 + kk + 8 * t, cols);
#pragma unroll
    for (int mt = 0; mt < 4; ++mt) {
      if (mt >= m_tiles) break;  // warp-uniform
      const uint4 lo = *reinterpret_cast<const uint4*>(s_a + (mt * 16 + g) * kHiddenStride + kk + 8 * t);
      const uint4 hi = *reinterpret_cast<const uint4*>(s_a + (mt * 16 + g + 8) * kHiddenStride + kk + 8 * t);
      const uint32_t a1[4] = {lo.x, hi.x, lo.y, hi.y}, a2[4] = {lo.z, hi.z, lo.w, hi.w};
#pragma unroll
      for (int nb = 0; nb < 4; ++nb) {
        Mma16816<kBf16>(acc[mt][nb], a1, bq[nb].x, bq[nb].y);
        Mma16816<kBf16>(acc[mt][nb], a2, bq[nb].z, bq[nb].w);
      }
    }
  }
}

// hidden [R G, H] and lm_head [V, H] 16-bit, anchor [R], w1 / w2 [V, rank] 16-bit, temperature [R],
// request_ids [R] or null -> z [R, G, V] f32 (z_0, and U for k > 0), prev_emb[:, 0] [R, rank] f32,
// part_key / part_idx [R, ceil(V / 128)] for step 0. Dynamic smem MarkovHiddenSmem() bytes.
template <bool kBf16>
__global__ void __launch_bounds__(128)
    MarkovHiddenMmaKernel(const uint16_t* __restrict__ hidden, const uint16_t* __restrict__ lm_head,
                          const int64_t* __restrict__ anchor, const uint16_t* __restrict__ w1,
                          const uint16_t* __restrict__ w2, const float* __restrict__ temperature,
                          const int64_t* __restrict__ request_ids, float* __restrict__ z,
                          float* __restrict__ prev_emb, float* __restrict__ part_key,
                          int64_t* __restrict__ part_idx, int64_t R, int64_t G, int64_t V, int64_t H,
                          int64_t rank, uint64_t seed, PhiloxOffset philox_offset) {
  const uint64_t offset = philox_offset.value();  // read on the device: graphs replay fixed arguments
  extern __shared__ uint4 s_hidden_mma[];         // uint4: 16-byte aligned
  uint16_t* s_a = reinterpret_cast<uint16_t*>(s_hidden_mma);  // [kMarkovMmaRequests][kHiddenStride]
  const int64_t M = R * G, m0 = static_cast<int64_t>(blockIdx.x) * kMarkovMmaRequests;
  const int64_t tile = blockIdx.y, n_tiles = gridDim.y;
  const int nm = static_cast<int>(M - m0 < kMarkovMmaRequests ? M - m0 : kMarkovMmaRequests);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int64_t v0 = tile * kMarkovMmaVocab + warp * 32;  // this warp's ids: v0 + 8 nb + n
  const int m_tiles = (nm + 15) / 16;
  constexpr int kPieces = kHiddenChunk / 8;  // 16-byte pieces per staged row
  float acc[4][4][4];                        // [row tile][id block][fragment]
#pragma unroll
  for (int mt = 0; mt < 4; ++mt) {
#pragma unroll
    for (int nb = 0; nb < 4; ++nb) acc[mt][nb][0] = acc[mt][nb][1] = acc[mt][nb][2] = acc[mt][nb][3] = 0.f;
  }
  // U: h rows against lm_head
  for (int64_t k0 = 0; k0 < H; k0 += kHiddenChunk) {
    for (int p = threadIdx.x; p < kMarkovMmaRequests * kPieces; p += blockDim.x) {
      const int c = p / kPieces, piece = p % kPieces;
      *reinterpret_cast<uint4*>(s_a + c * kHiddenStride + piece * 8) =
          LoadRow8(hidden, H, m0 + c, m0 + nm, k0 + piece * 8, H);
    }
    __syncthreads();
    MmaChunk<kBf16>(acc, s_a, lm_head, H, V, v0, k0, H, m_tiles, g, t);
    __syncthreads();
  }
  // the first step's bias: W1[anchor] rows for k = 0, zero rows otherwise
  for (int64_t k0 = 0; k0 < rank; k0 += kHiddenChunk) {
    for (int p = threadIdx.x; p < kMarkovMmaRequests * kPieces; p += blockDim.x) {
      const int c = p / kPieces, piece = p % kPieces;
      const int64_t m = m0 + c;
      uint4 v = make_uint4(0u, 0u, 0u, 0u);
      if (c < nm && m % G == 0) v = LoadRow8(w1, rank, anchor[m / G], V, k0 + piece * 8, rank);
      *reinterpret_cast<uint4*>(s_a + c * kHiddenStride + piece * 8) = v;
    }
    __syncthreads();
    MmaChunk<kBf16>(acc, s_a, w2, rank, V, v0, k0, rank, m_tiles, g, t);
    __syncthreads();
  }
  if (tile == 0) {  // prev_emb of step 0: W1[anchor], widened exactly
    for (int64_t e = threadIdx.x; e < static_cast<int64_t>(nm) * rank; e += blockDim.x) {
      const int64_t m = m0 + e / rank, j = e % rank;
      if (m % G == 0) prev_emb[m * rank + j] = HalfBitsToFloat<kBf16>(w1[anchor[m / G] * rank + j]);
    }
  }

  // epilogue 1: accumulators into shared memory (the staged rows are no longer read), rows g and g + 8 of
  // each row tile, columns 2t and 2t + 1 of each id block
  float* s_z = reinterpret_cast<float*>(s_hidden_mma);  // [kMarkovMmaRequests][kMarkovMmaZStride]
  StoreAccumulators(acc, s_z, m_tiles, warp, g, t);
  __syncthreads();
  // epilogue 2, one warp per row: every row stored; rows of step 0 also draw (DrawTileRow, as
  // MarkovMmaStepKernel)
  for (int c = warp; c < nm; c += 4) {
    const int64_t m = m0 + c, r = m / G;
    const float* row = s_z + c * kMarkovMmaZStride;
    if (m % G != 0) {  // U of a later step (warp-uniform branch)
      for (int j = lane; j < kMarkovMmaVocab; j += 32) {
        const int64_t id = tile * kMarkovMmaVocab + j;
        if (id >= V) break;
        z[m * V + id] = row[j];
      }
      continue;
    }
    const auto value = [&](int j, int64_t) { return row[j]; };
    DrawTileRow(value, z + m * V, tile, V, temperature[r], seed, offset,
                static_cast<uint32_t>(request_ids ? request_ids[r] : r), 0u, part_key + r * n_tiles + tile,
                part_idx + r * n_tiles + tile, lane);
  }
}

// Dynamic shared memory of MarkovHiddenMmaKernel: the staged chunk, then (reused) the accumulator rows.
inline size_t MarkovHiddenSmem() {
  const size_t a = static_cast<size_t>(kMarkovMmaRequests) * kHiddenStride * sizeof(uint16_t);
  const size_t z = static_cast<size_t>(kMarkovMmaRequests) * kMarkovMmaZStride * sizeof(float);
  return a > z ? a : z;
}

// The fused draft: MarkovHiddenMmaKernel + MarkovReduceKernel (step 0), then per step k >= 1
// MarkovMmaStepKernel on z in place + MarkovReduceKernel. hidden [R, G, H], lm_head [V, H], w1 / w2 [V, rank]
// as 16-bit patterns (16-byte aligned rows); tokens [R, G], z [R, G, V], prev_emb [R, G, rank];
// part_key / part_idx [R, MarkovMmaTiles(V)].
template <bool kBf16>
cudaError_t MarkovSampleFromHiddenMma(const uint16_t* hidden, const uint16_t* lm_head, const int64_t* anchor,
                                      const uint16_t* w1, const uint16_t* w2, const float* temperature,
                                      const int64_t* request_ids, int64_t* tokens, float* z, float* prev_emb,
                                      float* part_key, int64_t* part_idx, int64_t R, int64_t G, int64_t V,
                                      int64_t H, int64_t rank, uint64_t seed, PhiloxOffset offset,
                                      cudaStream_t stream) {
  if (R <= 0 || G <= 0 || V <= 0) return cudaSuccess;
  const int64_t n_tiles = MarkovMmaTiles(V);
  const dim3 first_grid(static_cast<unsigned>((R * G + kMarkovMmaRequests - 1) / kMarkovMmaRequests),
                        static_cast<unsigned>(n_tiles));
  MarkovHiddenMmaKernel<kBf16><<<first_grid, 128, MarkovHiddenSmem(), stream>>>(
      hidden, lm_head, anchor, w1, w2, temperature, request_ids, z, prev_emb, part_key, part_idx, R, G, V, H,
      rank, seed, offset);
  MarkovReduceKernel<<<static_cast<unsigned>(R), kSumLanes, 0, stream>>>(part_key, part_idx, tokens, n_tiles,
                                                                         G, 0);
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  return MarkovSampleMma<float, kBf16>(z, anchor, w1, w2, temperature, request_ids, tokens, z, prev_emb,
                                       part_key, part_idx, R, G, V, rank, seed, offset, 1, stream);
}

}  // namespace dspark::kernels
