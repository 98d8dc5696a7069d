// SPDX-License-Identifier: Apache-2.0
// CUDA paged_verify_attention: the request index both tile kernels read (PvaIndex, key counts, causal limits)
// and the split plan — how many key ranges a request is cut into (a function of its own query and key counts
// only: contract C2) and where its rows sit in the split workspace.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "dspark/attention_plan.h"

namespace dspark::kernels {

// keys per K/V tile of the CUDA-core kernel; split ranges start on multiples of it
constexpr int kPvaKeyTile = 32;
// a request with at most kPvaSplitMaxQueries query tokens (a verify block; dspark/attention_plan.h) is split
// over its keys into at most kPvaMaxSplits ranges of at least kPvaSplitKeys keys each, on kPvaKeyTile
// boundaries; longer (prefill-like) requests are not split
constexpr int kPvaMaxSplits = 16;
constexpr int kPvaSplitKeys = 256;

struct PvaIndex {
  const int32_t* qo_indptr;         // [R + 1]
  const int32_t* kv_indptr;         // [R + 1]
  const int32_t* kv_indices;        // [nnz]
  const int32_t* kv_last_page_len;  // [R]
  int Hq, Hkv, page_size;
  float scale;
  bool causal;
};

__device__ __forceinline__ int PvaKvLen(const PvaIndex& ix, int r) {
  const int n_pages = ix.kv_indptr[r + 1] - ix.kv_indptr[r];
  return n_pages == 0 ? 0 : (n_pages - 1) * ix.page_size + ix.kv_last_page_len[r];
}

// Number of keys query token i (relative to its request) may see.
__device__ __forceinline__ int PvaLimit(const PvaIndex& ix, int n_q, int n_kv, int i) {
  if (!ix.causal) return n_kv;
  const int lim = n_kv - n_q + i + 1;
  return lim < 0 ? 0 : (lim > n_kv ? n_kv : lim);
}

// How one request's keys are split: `count` ranges of `chunk` keys (the last one shorter). A function of the
// request's own n_q and n_kv only (C2).
struct PvaSplit {
  int count, chunk;
};

__host__ __device__ __forceinline__ PvaSplit PvaRequestSplit(int n_q, int n_kv) {
  const int tiles = (n_kv + kPvaKeyTile - 1) / kPvaKeyTile;
  int want = n_q <= kPvaSplitMaxQueries ? n_kv / kPvaSplitKeys : 1;
  want = want < 1 ? 1 : (want > kPvaMaxSplits ? kPvaMaxSplits : want);
  if (tiles <= 1 || want == 1) return {1, tiles * kPvaKeyTile};
  const int chunk_tiles = (tiles + want - 1) / want;
  return {(tiles + chunk_tiles - 1) / chunk_tiles, chunk_tiles * kPvaKeyTile};  // no empty range
}

// What CTA `part` of request r's kPvaMaxSplits CTAs (per KV head) does. A split request's CTA `part` takes
// key range `part` for all its rows; an unsplit one's takes every key for row tiles part, part +
// kPvaMaxSplits, ... (prefill rows spread over the CTAs: a row's sums do not depend on which CTA or tile
// computes it). Shared by the CUDA-core and tensor-core kernels; `active` false: a CTA past a split request's
// ranges.
struct PvaCtaWork {
  bool active;
  int q_begin, n_q, n_kv;     // the request's first query row, its query tokens and keys
  int total_rows;             // its query rows: n_q tokens x G heads of the GQA group
  const int32_t* pages;       // its pages
  int num_splits, split;      // its split count; this CTA's range (0 when unsplit)
  int tile_first, tile_step;  // this CTA's row tiles: tile_first, tile_first + tile_step, ...
  int k_begin, k_end;         // this CTA's keys
};

__device__ __forceinline__ PvaCtaWork PvaWork(const PvaIndex& ix, int r, int part) {
  PvaCtaWork w;
  w.q_begin = ix.qo_indptr[r];
  w.n_q = ix.qo_indptr[r + 1] - w.q_begin;
  w.n_kv = PvaKvLen(ix, r);
  w.total_rows = w.n_q * (ix.Hq / ix.Hkv);
  w.pages = ix.kv_indices + ix.kv_indptr[r];
  const PvaSplit plan = PvaRequestSplit(w.n_q, w.n_kv);
  const bool split = plan.count > 1;
  w.active = !split || part < plan.count;
  w.num_splits = plan.count;
  w.split = split ? part : 0;
  w.tile_first = split ? 0 : part;
  w.tile_step = split ? 1 : kPvaMaxSplits;
  w.k_begin = w.split * plan.chunk;
  w.k_end = min(w.n_kv, w.k_begin + plan.chunk);
  return w;
}

// grid 1 block of 32 threads: base[r] = the first workspace row of request r = the query tokens of the
// requests before it that may be split (PvaSplitRows), an exclusive warp scan in fixed order. Launched per
// call only when the caller gave no split_base (computed once per forward on the host). base [R] i32; the
// workspace holds min(T, kPvaSplitMaxQueries * R) rows.
__global__ void PvaPlanKernel(const int32_t* __restrict__ qo_indptr, int32_t* __restrict__ base, int R) {
  const int lane = threadIdx.x;
  int carry = 0;
  for (int r0 = 0; r0 < R; r0 += 32) {
    const int r = r0 + lane;
    int n = 0;
    if (r < R) n = PvaSplitRows(qo_indptr[r + 1] - qo_indptr[r]);
    int incl = n;
#pragma unroll
    for (int d = 1; d < 32; d <<= 1) {
      const int up = __shfl_up_sync(0xFFFFFFFFu, incl, d);
      if (lane >= d) incl += up;
    }
    if (r < R) base[r] = carry + incl - n;
    carry += __shfl_sync(0xFFFFFFFFu, incl, 31);
  }
}

// Rows of the split workspace: the query tokens of requests with at most kPvaSplitMaxQueries of them.
inline int64_t PvaWorkspaceRows(int64_t T, int64_t R) {
  return T < kPvaSplitMaxQueries * R ? T : kPvaSplitMaxQueries * R;
}

}  // namespace dspark::kernels
