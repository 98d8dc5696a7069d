// SPDX-License-Identifier: Apache-2.0
// CUDA paged_verify_attention on tensor cores: bf16 / fp16 inputs, head_dim 64 and 128, compute capability
// 8.0 and later (mma.sync.m16n8k16, include/dspark/kernels/mma.cuh).
//
// The same grid, split plan and outputs as the CUDA-core PvaSplitKernel (paged_verify_attention.cuh), so
// both share the plan kernel, the workspace and the merge: CTA (part, KV head, request) takes one key range
// of a split request, or row tiles part, part + kPvaMaxSplits, ... of an unsplit one. A row tile is 64 rows
// of the request's GQA group (n_q tokens x G heads); each of the 4 warps owns 16 rows and keeps their Q
// fragments in registers. Per 64-key tile the CTA copies K and V from the pages into shared memory with
// asynchronous 16-byte copies, double-buffered (tile t + 1 is in flight while tile t is computed on; rows
// padded by 8 elements, so a warp's fragment reads of K hit 32 distinct banks and its 16-bit gathers of V's
// columns share a word between at most 2 lanes); each warp computes S = Q K^T on tensor
// cores (fp32 accumulators), masks, scales and folds S into its rows' online-softmax state (max and sum
// reduced over the 4 lanes that share a row, in a fixed butterfly order), rounds P to the input type and
// accumulates O += P V on tensor cores.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "dspark/kernels/async_copy.cuh"
#include "dspark/kernels/mma.cuh"
#include "dspark/kernels/paged_verify_attention_plan.cuh"
#include "dspark/kernels/warp_reduce.cuh"
#include "dspark/online_softmax.h"

namespace dspark::kernels {

constexpr int kPvaMmaWarps = 4;
constexpr int kPvaMmaRowsPerTile = kPvaMmaWarps * 16;
constexpr int kPvaMmaKeys = 64;  // keys per K/V tile
constexpr int kPvaMmaPad = 8;    // elements of padding per shared-memory row

// Dynamic shared memory of PvaMmaKernel<D>: 2 buffers x (K, V) x 64 keys x (D + 8) 16-bit elements
// (36 KiB at D = 64, 68 KiB at D = 128: past the 48 KiB default, so the launcher raises the limit).
constexpr size_t PvaMmaSmemBytes(int D) {
  return 2u * 2u * kPvaMmaKeys * static_cast<size_t>(D + kPvaMmaPad) * sizeof(uint16_t);
}

// Max and sum over the 4 lanes that hold one fragment row (lanes 4g .. 4g + 3).
__device__ __forceinline__ float QuadMax(float v) {
  v = fmaxf(v, __shfl_xor_sync(0xFFFFFFFFu, v, 1));
  return fmaxf(v, __shfl_xor_sync(0xFFFFFFFFu, v, 2));
}
__device__ __forceinline__ float QuadSum(float v) {
  v += __shfl_xor_sync(0xFFFFFFFFu, v, 1);
  return v + __shfl_xor_sync(0xFFFFFFFFu, v, 2);
}

// grid (kPvaMaxSplits, Hkv, R); block kPvaMmaWarps * 32; dynamic smem PvaMmaSmemBytes(D). q [T,
// Hq, D], caches [pages, page_size, Hkv, D] (16-byte aligned) -> out [T, Hq, D] (a request with one split) or
// ws_o [kPvaMaxSplits, W, Hq, D] f32 + ws_m, ws_l [kPvaMaxSplits, W, Hq] f32 at rows base[r] + token, exactly
// as PvaSplitKernel. (Launch bounds of 2 CTAs per SM: without a minimum, ptxas capped head_dim 64 at 128
// registers and spilled.)
template <typename DType, int D, bool kBf16>
__global__ void __launch_bounds__(kPvaMmaWarps * 32, 2)
    PvaMmaKernel(const DType* __restrict__ q_, const DType* __restrict__ kc_, const DType* __restrict__ vc_,
                 DType* __restrict__ out, float* __restrict__ ws_o, float* __restrict__ ws_m,
                 float* __restrict__ ws_l, const int32_t* __restrict__ base, PvaIndex ix, int W) {
  static_assert(sizeof(DType) == 2 && D % 16 == 0, "16-bit inputs, head_dim a multiple of 16");
  constexpr int kKs = D / 16;     // k-steps of Q K^T
  constexpr int kNd = D / 8;      // 8-column blocks of O
  constexpr int kChunks = D / 8;  // 16-byte chunks per key row
  constexpr int kStride = D + kPvaMmaPad;
  constexpr int kTile = kPvaMmaKeys * kStride;      // one [key][d] tile
  extern __shared__ __align__(16) uint16_t s_kv[];  // [buffer][K, V][key][d]
  const uint16_t* q = reinterpret_cast<const uint16_t*>(q_);
  const uint16_t* kc = reinterpret_cast<const uint16_t*>(kc_);
  const uint16_t* vc = reinterpret_cast<const uint16_t*>(vc_);

  const int part = blockIdx.x, kvh = blockIdx.y, r = blockIdx.z;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int G = ix.Hq / ix.Hkv;
  const PvaCtaWork work = PvaWork(ix, r, part);
  if (!work.active) return;  // CTA-uniform, before any barrier
  const int q_begin = work.q_begin, n_q = work.n_q, n_kv = work.n_kv, total_rows = work.total_rows;
  const int num_splits = work.num_splits, split = work.split, k_begin = work.k_begin, k_end = work.k_end;
  const int32_t* pages = work.pages;
  for (int row_base = work.tile_first * kPvaMmaRowsPerTile; row_base < total_rows;
       row_base += work.tile_step * kPvaMmaRowsPerTile) {
    const int tile_rows = min(kPvaMmaRowsPerTile, total_rows - row_base);
    // this lane's two fragment rows: warp rows g and g + 8
    int row_of[2], lim[2];
    int64_t qrow[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int lr = warp * 16 + g + 8 * h;
      row_of[h] = lr;
      const bool ok = lr < tile_rows;
      const int row = row_base + lr, tok = row / G;
      qrow[h] = ok ? (static_cast<int64_t>(q_begin + tok) * ix.Hq + kvh * G + row % G) * D : -1;
      lim[h] = ok ? PvaLimit(ix, n_q, n_kv, tok) : 0;
    }
    uint32_t qa[kKs][4];
#pragma unroll
    for (int ks = 0; ks < kKs; ++ks) {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int h = i & 1, col = ks * 16 + 2 * t + 8 * (i >> 1);
        qa[ks][i] = qrow[h] < 0 ? 0u : *reinterpret_cast<const uint32_t*>(q + qrow[h] + col);
      }
    }
    float m[2] = {softmax_neg_inf(), softmax_neg_inf()}, l[2] = {0.f, 0.f};
    float o[kNd][4];
#pragma unroll
    for (int nd = 0; nd < kNd; ++nd) o[nd][0] = o[nd][1] = o[nd][2] = o[nd][3] = 0.f;
    // keys this warp's rows see at most (an integer max: order-free)
    const int warp_lim = WarpMax(max(lim[0], lim[1]));
    const int loop_end = min(k_end, PvaLimit(ix, n_q, n_kv, (row_base + tile_rows - 1) / G));

    // Issues the copies of the K / V tile at key kt into buffer b (zeros past the range: a masked key's V
    // must not be NaN, 0 x NaN in P V) and closes their group.
    auto load_tile = [&](int kt, int b) {
      for (int e = threadIdx.x; e < kPvaMmaKeys * kChunks; e += blockDim.x) {
        const int j = e / kChunks, c = e % kChunks, key = kt + j;
        const bool in_range = key < loop_end;
        int64_t off = 0;
        if (in_range) {
          const int64_t slot =
              static_cast<int64_t>(pages[key / ix.page_size]) * ix.page_size + key % ix.page_size;
          off = (slot * ix.Hkv + kvh) * D + c * 8;
        }
        CpAsync16(s_kv + (2 * b) * kTile + j * kStride + c * 8, kc + off, in_range);
        CpAsync16(s_kv + (2 * b + 1) * kTile + j * kStride + c * 8, vc + off, in_range);
      }
      CpAsyncCommit();
    };
    __syncthreads();  // the previous row tile's last K/V tile has been read
    if (k_begin < loop_end) load_tile(k_begin, 0);

    int buf = 0;
    for (int kt = k_begin; kt < loop_end; kt += kPvaMmaKeys, buf ^= 1) {
      __syncthreads();  // buffer buf ^ 1 (read in the previous step) is free
      if (kt + kPvaMmaKeys < loop_end) {
        load_tile(kt + kPvaMmaKeys, buf ^ 1);
      } else {
        CpAsyncCommit();  // an empty group, so "all but the newest group" is always this tile's
      }
      CpAsyncWait<1>();
      __syncthreads();               // every thread's copies of this tile have landed
      if (kt >= warp_lim) continue;  // warp-uniform: every row of this warp has seen all its keys
      const uint16_t* Ks = s_kv + (2 * buf) * kTile;
      const uint16_t* Vs = s_kv + (2 * buf + 1) * kTile;

      // S = Q K^T: 8 blocks of 8 keys, fp32
      float s[kPvaMmaKeys / 8][4];
#pragma unroll
      for (int nb = 0; nb < kPvaMmaKeys / 8; ++nb) {
        s[nb][0] = s[nb][1] = s[nb][2] = s[nb][3] = 0.f;
        const uint16_t* krow = Ks + (nb * 8 + g) * kStride + 2 * t;
#pragma unroll
        for (int ks = 0; ks < kKs; ++ks) {
          const uint32_t b0 = *reinterpret_cast<const uint32_t*>(krow + ks * 16);
          const uint32_t b1 = *reinterpret_cast<const uint32_t*>(krow + ks * 16 + 8);
          Mma16816<kBf16>(s[nb], qa[ks], b0, b1);
        }
      }
      // mask and scale, then the online-softmax update of rows g (h = 0) and g + 8 (h = 1)
      float mx[2] = {softmax_neg_inf(), softmax_neg_inf()};
#pragma unroll
      for (int nb = 0; nb < kPvaMmaKeys / 8; ++nb) {
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const int h = i >> 1, key = kt + nb * 8 + 2 * t + (i & 1);
          s[nb][i] = key < k_end && key < lim[h] ? s[nb][i] * ix.scale : softmax_neg_inf();
          mx[h] = fmaxf(mx[h], s[nb][i]);
        }
      }
      float alpha[2], sum[2] = {0.f, 0.f};
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const float m_new = fmaxf(m[h], QuadMax(mx[h]));
        alpha[h] = softmax_rescale(m[h], m_new);
        m[h] = m_new;
      }
#pragma unroll
      for (int nb = 0; nb < kPvaMmaKeys / 8; ++nb) {
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          s[nb][i] = softmax_weight(s[nb][i], m[i >> 1]);
          sum[i >> 1] += s[nb][i];
        }
      }
#pragma unroll
      for (int h = 0; h < 2; ++h) l[h] = l[h] * alpha[h] + QuadSum(sum[h]);
#pragma unroll
      for (int nd = 0; nd < kNd; ++nd) {
        o[nd][0] *= alpha[0];
        o[nd][1] *= alpha[0];
        o[nd][2] *= alpha[1];
        o[nd][3] *= alpha[1];
      }
      // O += P V: P's C fragments of key blocks 2kk and 2kk + 1 are the A fragment of k-step kk
#pragma unroll
      for (int kk = 0; kk < kPvaMmaKeys / 16; ++kk) {
        const uint32_t pa[4] = {PackPair<kBf16>(s[2 * kk][0], s[2 * kk][1]),
                                PackPair<kBf16>(s[2 * kk][2], s[2 * kk][3]),
                                PackPair<kBf16>(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                                PackPair<kBf16>(s[2 * kk + 1][2], s[2 * kk + 1][3])};
#pragma unroll
        for (int nd = 0; nd < kNd; ++nd) {
          // B[k][n] = V[16 kk + k][8 nd + n]: two keys per register, gathered from V's rows
          const uint16_t* v = Vs + (kk * 16 + 2 * t) * kStride + nd * 8 + g;
          const uint32_t b0 = v[0] | (static_cast<uint32_t>(v[kStride]) << 16);
          const uint32_t b1 = v[8 * kStride] | (static_cast<uint32_t>(v[9 * kStride]) << 16);
          Mma16816<kBf16>(o[nd], pa, b0, b1);
        }
      }
    }
    // rows g and g + 8: normalised output, or the split's partial state
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      if (row_of[h] >= tile_rows) continue;
      const int row = row_base + row_of[h], tok = row / G, head = kvh * G + row % G;
      const float inv = softmax_inv_sum(l[h]);
      if (num_splits == 1) {
        DType* dst = out + qrow[h] + 2 * t;
#pragma unroll
        for (int nd = 0; nd < kNd; ++nd) {
          dst[nd * 8] = static_cast<DType>(o[nd][2 * h] * inv);
          dst[nd * 8 + 1] = static_cast<DType>(o[nd][2 * h + 1] * inv);
        }
      } else {
        const int64_t wrow = (static_cast<int64_t>(split) * W + base[r] + tok) * ix.Hq + head;
#pragma unroll
        for (int nd = 0; nd < kNd; ++nd) {
          ws_o[wrow * D + nd * 8 + 2 * t] = o[nd][2 * h] * inv;
          ws_o[wrow * D + nd * 8 + 2 * t + 1] = o[nd][2 * h + 1] * inv;
        }
        if (t == 0) {
          ws_m[wrow] = m[h];
          ws_l[wrow] = l[h];
        }
      }
    }
  }
}

}  // namespace dspark::kernels
