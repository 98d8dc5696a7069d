// SPDX-License-Identifier: Apache-2.0
// CUDA paged_verify_attention: ragged attention of each request's query rows over its own paged KV.
//
// Split-KV kernel (head_dim 64 and 128): one CTA per (KV split, KV head, request) takes every query row of
// the request's GQA group (n_q tokens x G heads, up to kRowsPerTile at a time: a verify round of <= 16 tokens
// with G <= 4 is one tile), so each K/V tile of kKeyTile keys is gathered from the pages into shared memory
// (fp32) once and used by all rows. In the score phase lane j of a warp owns key j of the tile (the K tile
// row stride is D + 1 floats, so lanes hit distinct banks, and the query row is a broadcast read); then each
// lane accumulates D / 32 output columns. Splits cut the request's keys into num_splits ranges so that short
// query blocks still fill the GPU; the partial (o, m, l) of each split go to a workspace and a merge kernel
// combines them in split order with the online-softmax rule (include/dspark/online_softmax.h). A request's
// split count is read from its own query and key counts only (PvaRequestSplit), never from R, T or the GPU's
// load, so its rows are bit for bit the same alone and in any batch (contract C2); a request with one split
// writes the output directly, its row tiles spread over the kPvaMaxSplits CTAs of its (KV head, request)
// (prefill rows in the grid, not in one CTA's loop).
// Generic kernel (any head_dim <= 256): one warp per (query token, query head), keys one at a time. Correct,
// not fast: it exists for head dims the tuned kernel is not instantiated for.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "dspark/kernels/paged_verify_attention_mma.cuh"
#include "dspark/kernels/paged_verify_attention_plan.cuh"
#include "dspark/kernels/warp_reduce.cuh"
#include "dspark/online_softmax.h"

namespace dspark::kernels {

constexpr int kPvaWarps = 8;
constexpr int kPvaRowsPerWarp = 8;
constexpr int kPvaRowsPerTile = kPvaWarps * kPvaRowsPerWarp;
constexpr int kPvaGenericMaxD = 256;
// grid (kPvaMaxSplits, Hkv, R) (CTAs without a key range or a row tile return at once); block kPvaWarps * 32;
// dynamic smem (kPvaRowsPerTile * D + kPvaKeyTile * (2D + 1)) floats. q [T, Hq, D], caches [pages, page_size,
// Hkv, D] -> out [T, Hq, D] (a request with one split) or ws_o [kPvaMaxSplits, W, Hq, D] f32 + ws_m, ws_l
// [kPvaMaxSplits, W, Hq] f32 at rows base[r] + token (W = min(T, kPvaSplitMaxQueries * R))
template <typename DType, int D>
__global__ void __launch_bounds__(kPvaWarps * 32)
    PvaSplitKernel(const DType* __restrict__ q, const DType* __restrict__ kc, const DType* __restrict__ vc,
                   DType* __restrict__ out, float* __restrict__ ws_o, float* __restrict__ ws_m,
                   float* __restrict__ ws_l, const int32_t* __restrict__ base, PvaIndex ix, int W) {
  static_assert(D % 32 == 0, "head_dim must be a multiple of 32");
  constexpr int kCols = D / 32;
  extern __shared__ float smem[];
  float* Qs = smem;                        // [kPvaRowsPerTile][D]
  float* Ks = Qs + kPvaRowsPerTile * D;    // [kPvaKeyTile][D + 1]
  float* Vs = Ks + kPvaKeyTile * (D + 1);  // [kPvaKeyTile][D]
  const int part = blockIdx.x, kvh = blockIdx.y, r = blockIdx.z;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int G = ix.Hq / ix.Hkv;
  const PvaCtaWork work = PvaWork(ix, r, part);
  if (!work.active) return;  // CTA-uniform, before any barrier
  const int q_begin = work.q_begin, n_q = work.n_q, n_kv = work.n_kv, total_rows = work.total_rows;
  const int num_splits = work.num_splits, split = work.split, k_begin = work.k_begin, k_end = work.k_end;
  const int32_t* pages = work.pages;
  for (int row_base = work.tile_first * kPvaRowsPerTile; row_base < total_rows;
       row_base += work.tile_step * kPvaRowsPerTile) {
    const int tile_rows = min(kPvaRowsPerTile, total_rows - row_base);
    __syncthreads();  // the previous tile's readers of Qs are done
    for (int e = threadIdx.x; e < kPvaRowsPerTile * D; e += blockDim.x) {
      const int lr = e / D, d = e % D, row = row_base + lr;
      float val = 0.f;
      if (lr < tile_rows) {
        const int tok = row / G, g = row % G;
        val = static_cast<float>(q[(static_cast<int64_t>(q_begin + tok) * ix.Hq + kvh * G + g) * D + d]);
      }
      Qs[e] = val;
    }
    float m[kPvaRowsPerWarp], l[kPvaRowsPerWarp], acc[kPvaRowsPerWarp][kCols];
    int lim[kPvaRowsPerWarp];
#pragma unroll
    for (int rr = 0; rr < kPvaRowsPerWarp; ++rr) {
      m[rr] = softmax_neg_inf();
      l[rr] = 0.f;
      const int row = row_base + warp * kPvaRowsPerWarp + rr;
      lim[rr] = row < row_base + tile_rows ? PvaLimit(ix, n_q, n_kv, row / G) : 0;
#pragma unroll
      for (int c = 0; c < kCols; ++c) acc[rr][c] = 0.f;
    }
    const int loop_end = min(k_end, PvaLimit(ix, n_q, n_kv, (row_base + tile_rows - 1) / G));
    for (int kt = k_begin; kt < loop_end; kt += kPvaKeyTile) {
      __syncthreads();  // previous K/V tile consumed (and Qs written on the first pass)
      for (int e = threadIdx.x; e < kPvaKeyTile * D; e += blockDim.x) {
        const int j = e / D, d = e % D, key = kt + j;
        float kval = 0.f, vval = 0.f;
        if (key < loop_end) {
          const int64_t slot =
              static_cast<int64_t>(pages[key / ix.page_size]) * ix.page_size + key % ix.page_size;
          const int64_t off = (slot * ix.Hkv + kvh) * D + d;
          kval = static_cast<float>(kc[off]);
          vval = static_cast<float>(vc[off]);
        }
        Ks[j * (D + 1) + d] = kval;
        Vs[j * D + d] = vval;
      }
      __syncthreads();
#pragma unroll
      for (int rr = 0; rr < kPvaRowsPerWarp; ++rr) {
        const int lr = warp * kPvaRowsPerWarp + rr;
        if (lr >= tile_rows || kt >= lim[rr]) continue;  // warp-uniform
        const int key = kt + lane;
        float s = softmax_neg_inf();
        if (key < loop_end && key < lim[rr]) {
          const float* qr = Qs + lr * D;
          const float* kr = Ks + lane * (D + 1);
          float dot = 0.f;
#pragma unroll 16
          for (int d = 0; d < D; ++d) dot = fmaf(qr[d], kr[d], dot);
          s = dot * ix.scale;
        }
        const float m_new = fmaxf(m[rr], WarpMax(s));
        const float alpha = softmax_rescale(m[rr], m_new);
        const float p = softmax_weight(s, m_new);
        l[rr] = l[rr] * alpha + WarpSum(p);
        m[rr] = m_new;
#pragma unroll
        for (int c = 0; c < kCols; ++c) acc[rr][c] *= alpha;
#pragma unroll 4
        for (int j = 0; j < kPvaKeyTile; ++j) {
          const float pj = __shfl_sync(0xFFFFFFFFu, p, j);
#pragma unroll
          for (int c = 0; c < kCols; ++c) acc[rr][c] = fmaf(pj, Vs[j * D + lane + 32 * c], acc[rr][c]);
        }
      }
    }
#pragma unroll
    for (int rr = 0; rr < kPvaRowsPerWarp; ++rr) {
      const int lr = warp * kPvaRowsPerWarp + rr;
      if (lr >= tile_rows) continue;
      const int row = row_base + lr, tok = row / G, head = kvh * G + row % G;
      const int64_t tq = q_begin + tok;
      const float inv = softmax_inv_sum(l[rr]);
      if (num_splits == 1) {
#pragma unroll
        for (int c = 0; c < kCols; ++c)
          out[(tq * ix.Hq + head) * D + lane + 32 * c] = static_cast<DType>(acc[rr][c] * inv);
      } else {
        const int64_t wrow = (static_cast<int64_t>(split) * W + base[r] + tok) * ix.Hq + head;
#pragma unroll
        for (int c = 0; c < kCols; ++c) ws_o[wrow * D + lane + 32 * c] = acc[rr][c] * inv;
        if (lane == 0) {
          ws_m[wrow] = m[rr];
          ws_l[wrow] = l[rr];
        }
      }
    }
  }
}

// grid (R, Hq) blocks of min(D, 128) threads: for each query token t of a split request r and head h,
// out[t, h] = sum_s w_s o_s / sum_s w_s with w_s = exp(m_s - m) l_s, summed in split order.
template <typename DType>
__global__ void PvaMergeKernel(const float* __restrict__ ws_o, const float* __restrict__ ws_m,
                               const float* __restrict__ ws_l, const int32_t* __restrict__ base,
                               DType* __restrict__ out, PvaIndex ix, int W, int D) {
  const int r = blockIdx.x, head = blockIdx.y;
  const int q_begin = ix.qo_indptr[r], n_q = ix.qo_indptr[r + 1] - q_begin;
  const int num_splits = PvaRequestSplit(n_q, PvaKvLen(ix, r)).count;
  if (num_splits == 1) return;                             // written by the split kernel
  const int64_t stride = static_cast<int64_t>(W) * ix.Hq;  // one split's rows
  for (int tok = 0; tok < n_q; ++tok) {
    const int64_t row = static_cast<int64_t>(base[r] + tok) * ix.Hq + head;
    float mx = softmax_neg_inf();
    for (int s = 0; s < num_splits; ++s) mx = fmaxf(mx, ws_m[s * stride + row]);
    float total = 0.f;
    for (int s = 0; s < num_splits; ++s)
      total += softmax_merge_weight(ws_m[s * stride + row], mx) * ws_l[s * stride + row];
    const float inv = softmax_inv_sum(total);
    DType* dst = out + (static_cast<int64_t>(q_begin + tok) * ix.Hq + head) * D;
    for (int d = threadIdx.x; d < D; d += blockDim.x) {
      float o = 0.f;
      for (int s = 0; s < num_splits; ++s) {
        const float w = softmax_merge_weight(ws_m[s * stride + row], mx) * ws_l[s * stride + row];
        if (w > 0.f) o = fmaf(w, ws_o[(s * stride + row) * D + d], o);
      }
      dst[d] = static_cast<DType>(o * inv);
    }
  }
}

// grid ceil(T * Hq / 4) blocks of 128 threads (one warp per (token, query head)); D <= kPvaGenericMaxD.
template <typename DType>
__global__ void PvaGenericKernel(const DType* __restrict__ q, const DType* __restrict__ kc,
                                 const DType* __restrict__ vc, DType* __restrict__ out, PvaIndex ix, int T,
                                 int R, int D) {
  constexpr int kCols = kPvaGenericMaxD / 32;
  const int64_t wid = static_cast<int64_t>(blockIdx.x) * 4 + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (wid >= static_cast<int64_t>(T) * ix.Hq) return;
  const int t = static_cast<int>(wid / ix.Hq), h = static_cast<int>(wid % ix.Hq);
  int lo = 0, hi = R - 1;  // request r with qo[r] <= t < qo[r + 1]
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (ix.qo_indptr[mid] <= t)
      lo = mid;
    else
      hi = mid - 1;
  }
  const int r = lo, kvh = h / (ix.Hq / ix.Hkv);
  const int n_q = ix.qo_indptr[r + 1] - ix.qo_indptr[r], n_kv = PvaKvLen(ix, r);
  const int lim = PvaLimit(ix, n_q, n_kv, t - ix.qo_indptr[r]);
  const int32_t* pages = ix.kv_indices + ix.kv_indptr[r];
  float qv[kCols], acc[kCols];
#pragma unroll
  for (int c = 0; c < kCols; ++c) {
    const int d = lane + 32 * c;
    qv[c] = d < D ? static_cast<float>(q[(static_cast<int64_t>(t) * ix.Hq + h) * D + d]) : 0.f;
    acc[c] = 0.f;
  }
  float m = softmax_neg_inf(), l = 0.f;
  for (int key = 0; key < lim; ++key) {
    const int64_t slot = static_cast<int64_t>(pages[key / ix.page_size]) * ix.page_size + key % ix.page_size;
    const int64_t base = (slot * ix.Hkv + kvh) * D;
    float part = 0.f;
#pragma unroll
    for (int c = 0; c < kCols; ++c) {
      const int d = lane + 32 * c;
      if (d < D) part = fmaf(qv[c], static_cast<float>(kc[base + d]), part);
    }
    const float s = WarpSum(part) * ix.scale;
    const float m_new = fmaxf(m, s);
    const float alpha = softmax_rescale(m, m_new), p = softmax_weight(s, m_new);
    l = l * alpha + p;
    m = m_new;
#pragma unroll
    for (int c = 0; c < kCols; ++c) {
      const int d = lane + 32 * c;
      if (d < D) acc[c] = fmaf(p, static_cast<float>(vc[base + d]), acc[c] * alpha);
    }
  }
  const float inv = softmax_inv_sum(l);
#pragma unroll
  for (int c = 0; c < kCols; ++c) {
    const int d = lane + 32 * c;
    if (d < D) out[(static_cast<int64_t>(t) * ix.Hq + h) * D + d] = static_cast<DType>(acc[c] * inv);
  }
}

// Which tile kernel runs: CUDA cores (any dtype), or tensor cores (bf16 / fp16, compute capability >= 8.0).
enum class PvaMath { kCudaCores, kTensorCoresBf16, kTensorCoresFp16 };

template <typename DType, int D, PvaMath kMath>
cudaError_t PvaLaunchSplit(const DType* q, const DType* kc, const DType* vc, DType* out, float* ws_o,
                           float* ws_m, float* ws_l, int32_t* base, bool planned, const PvaIndex& ix, int T,
                           int R, cudaStream_t stream) {
  const int W = static_cast<int>(PvaWorkspaceRows(T, R));
  if (!planned) PvaPlanKernel<<<1, 32, 0, stream>>>(ix.qo_indptr, base, R);
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  const dim3 grid(kPvaMaxSplits, static_cast<unsigned>(ix.Hkv), static_cast<unsigned>(R));
  if constexpr (kMath == PvaMath::kCudaCores) {
    const size_t smem = sizeof(float) * (kPvaRowsPerTile * D + kPvaKeyTile * (2 * D + 1));
    err = cudaFuncSetAttribute(PvaSplitKernel<DType, D>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                               static_cast<int>(smem));
    if (err != cudaSuccess) return err;
    PvaSplitKernel<DType, D>
        <<<grid, kPvaWarps * 32, smem, stream>>>(q, kc, vc, out, ws_o, ws_m, ws_l, base, ix, W);
  } else {
    constexpr size_t smem = PvaMmaSmemBytes(D);
    auto* kernel = PvaMmaKernel<DType, D, kMath == PvaMath::kTensorCoresBf16>;
    err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
    if (err != cudaSuccess) return err;
    kernel<<<grid, kPvaMmaWarps * 32, smem, stream>>>(q, kc, vc, out, ws_o, ws_m, ws_l, base, ix, W);
  }
  err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  const dim3 merge_grid(static_cast<unsigned>(R), static_cast<unsigned>(ix.Hq));
  const int merge_threads = D < 128 ? D : 128;
  PvaMergeKernel<DType><<<merge_grid, merge_threads, 0, stream>>>(ws_o, ws_m, ws_l, base, out, ix, W, D);
  return cudaGetLastError();
}

// Whether the split-KV kernels are instantiated for this head_dim (otherwise the generic kernel runs).
inline bool PvaHasSplitKernel(int64_t D) { return D == 64 || D == 128; }

// With the split kernels (PvaHasSplitKernel(D)): ws_o [kPvaMaxSplits, W, Hq, D], ws_m / ws_l [kPvaMaxSplits,
// W, Hq] f32 and base [R] i32, W = PvaWorkspaceRows(T, R); unused otherwise. `planned`: base already holds
// the split plan (the caller's split_base), else PvaPlanKernel writes it. A tensor-core kMath needs a 16-bit
// DType of that kind, 16-byte aligned q / caches and compute capability >= 8.0 (the launcher checks).
template <typename DType, PvaMath kMath = PvaMath::kCudaCores>
cudaError_t PagedVerifyAttention(const DType* q, const DType* kc, const DType* vc, DType* out, float* ws_o,
                                 float* ws_m, float* ws_l, int32_t* base, bool planned, const PvaIndex& ix,
                                 int T, int R, int D, cudaStream_t stream) {
  if (T <= 0 || R <= 0) return cudaSuccess;
  if (D == 64)
    return PvaLaunchSplit<DType, 64, kMath>(q, kc, vc, out, ws_o, ws_m, ws_l, base, planned, ix, T, R,
                                            stream);
  if (D == 128)
    return PvaLaunchSplit<DType, 128, kMath>(q, kc, vc, out, ws_o, ws_m, ws_l, base, planned, ix, T, R,
                                             stream);
  const int64_t warps = static_cast<int64_t>(T) * ix.Hq;
  PvaGenericKernel<DType>
      <<<static_cast<unsigned>((warps + 3) / 4), 128, 0, stream>>>(q, kc, vc, out, ix, T, R, D);
  return cudaGetLastError();
}

}  // namespace dspark::kernels
