// SPDX-License-Identifier: Apache-2.0
// CUDA rejection_sample, the sampled requests split over the vocabulary. Without top-p, with the CPU op's
// tokens bit for bit: every part of such a row is elementwise (y, exp, the proposal weights, the Gumbel
// keys), an order-free maximum, an integer histogram (the top-k threshold), or one of two fixed-order lane
// sums (p's and q's normalisers); only the lane sums are sequential, and they are cheap once their terms are
// in memory. With top-p, the threshold comes from a radix select over the masses (1c), summed in 2^-40 fixed
// point by integer atomics (order-free, C2) where the CPU sums floats in lane order per bisection step: the
// kept set is the CPU's except where the mass above the boundary lies within that rounding of top_p x total,
// and given the kept set everything else is still the CPU's arithmetic (contract C4). So:
//   1. SampledMaxKernel, grid (chunks, G + 1, R): y = the penalised target logit / T of the chunk's ids into
//      ws_e; the chunk's maxima of y and of z / T as ordered keys (-0 folded into +0: the sign of a zero
//      maximum m changes no exp(v - m)).
//   1b. with top_k, SampledTopKPassKernel x 4, same grid: the radix select of the k-th largest y, one 8-bit
//      digit per pass, each CTA adding its chunk's digit histogram to the row's (radix_select.cuh);
//   1c. with top_p, SampledTopPPassKernel x 4, same grid: the radix select of the top-p threshold, one 8-bit
//      digit of y's ordered key per pass, each CTA adding its chunk's per-digit masses of e = exp(y - m)
//      (0 below the top-k threshold) to the row's (MassReplay decides the digits from them);
//   2. SampledExpKernel, same grid: m = the row's maximum; e = exp(y - m) in place (0 below the top-k
//      and top-p thresholds), and the proposal weights
//      draft_weight(z, T, m_q) into ws_q (rows with a sampled draft only).
//   3. SampledLaneSumKernel, grid (2, G + 1, R), kSumLanes threads: p's normaliser (blockIdx.x = 0) or q's
//      (1) as the CPU sums them: lane t adds ids t, t + 256, ... in order, then the fixed tree.
//   4. SampledWalkKernel, one thread per request: rows in order, the accept test with p(x) = e(x) / sum and
//      q(x) = w_q(x) / sum_q; emits the accepted drafts and records the stopping row (the first rejection,
//      or the bonus row).
//   5. SampledDrawKernel, grid (chunks, R): the stopping row's Gumbel-max over the chunk, as packed integer
//      maxima (PackKeyIdx: order-free, ties to the lowest id) of the residual — (p - q)+, or p without the
//      proposal for a deterministic one — and of p (the bonus, and the residual's fallback when no residual
//      weight is positive).
//   6. SampledEmitKernel, one thread per request: the stopping row's token.
// Each step is the CPU op's expression for the same element (include/dspark/sampling.h), so the tokens are
// the CPU op's. Workspace: ws_e, ws_q [R, G + 1, V] f32 (RejectionParams::ws_y, ws_w).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "dspark/kernels/radix_select.cuh"
#include "dspark/kernels/rejection_sample_greedy.cuh"

namespace dspark::kernels {

// A sampled request (temperature > 0; greedy ones go to rejection_sample_greedy.cuh).
__device__ __forceinline__ bool SampledRequest(const RejectionParams& a, int64_t r) {
  return a.temperature[r] > 0.0f;
}

// Whether request r keeps only its top_k ids (0 < top_k < V), as the CPU op's top-k branch.
__device__ __forceinline__ bool RowHasTopK(const RejectionParams& a, int64_t r) {
  return a.top_k != nullptr && a.top_k[r] > 0 && a.top_k[r] < a.V;
}

// Whether request r keeps only its top_p mass (top_p < 1), as the CPU op's top-p branch.
__device__ __forceinline__ bool RowHasTopP(const RejectionParams& a, int64_t r) {
  return a.top_p != nullptr && a.top_p[r] < 1.0f;
}

constexpr int kSampledThreads = 256;

// e = exp(y - m) in 2^-40 fixed point (e <= 1: a row's sum stays below 2^58 for any V < 2^18; truncation,
// the same on every device).
__device__ __forceinline__ unsigned long long MassFixed(float e) {
  return static_cast<unsigned long long>(e * 1099511627776.0f);  // 2^40: exact scaling
}

// The ordered key a top-p pass files y under: -0 folded into +0 (y >= -0 and y >= +0 keep the same ids).
__device__ __forceinline__ uint32_t TopPKey(float y) { return ordered_key(y == 0.0f ? 0.0f : y); }

// Small per-call workspace of the sampled split kernels.
struct SampledWork {
  uint32_t* chunk_max;  // [R, G + 1, chunks, 2]: ordered keys of max y and max z / T over each chunk
  uint32_t* hist;       // [R, G + 1, 4, 256]: the top-k radix passes' digit histograms (null without top_k)
  unsigned long long* mass_hist;  // [R, G + 1, 4, 256]: the top-p passes' fixed-point masses (null without)
  float* sums;                    // [R, G + 1, 2]: p's and q's normalisers
  int32_t* stop;                  // [R, 2]: the stopping row, and 1 when it draws a residual (0: the bonus)
  uint64_t* best;                 // [R, 2]: packed maxima of the residual draw and of the draw from p
  int64_t chunks;
};

// The ordered key of a row maximum candidate, -0 folded into +0.
__device__ __forceinline__ uint32_t MaxKey(float v) { return ordered_key(v == 0.0f ? 0.0f : v); }

// Whether row i of request r has a sampled draft whose q the op forms (not the bonus row, not a
// deterministic proposal).
__device__ __forceinline__ bool RowHasQ(const RejectionParams& a, int64_t r, int64_t i) {
  const bool one_hot = a.draft_logits == nullptr || (a.draft_one_hot != nullptr && a.draft_one_hot[r]);
  return !one_hot && i < a.verify_len[r] - 1;
}

// grid (chunks, G + 1, R), block kSampledThreads.
template <typename TL>
__global__ void __launch_bounds__(kSampledThreads)
    SampledMaxKernel(const TL* __restrict__ target, RejectionParams a, SampledWork w) {
  __shared__ uint32_t penalised[kVocabChunk / 32];
  __shared__ uint64_t warp_best[kSampledThreads / 32];
  const int64_t chunk = blockIdx.x, i = blockIdx.y, r = blockIdx.z, row = r * (a.G + 1) + i;
  if (i >= a.verify_len[r] || !SampledRequest(a, r)) return;  // CTA-uniform, before any barrier
  const int64_t lo = chunk * kVocabChunk, hi = min(a.V, lo + kVocabChunk);
  const TL* logits = target + (static_cast<int64_t>(a.qo_indptr[r]) + i) * a.V;
  const float T = a.temperature[r], pen = a.penalty ? a.penalty[r] : 1.0f;
  if (pen != 1.0f) ChunkPenalised(a, r, i, lo, hi, penalised, kVocabChunk / 32);
  const bool has_q = RowHasQ(a, r, i);
  const float* z = has_q ? a.draft_logits + (r * a.G + i) * a.V : nullptr;
  float* y = a.ws_y + row * a.V;
  if (chunk == 0 && RowHasTopK(a, r)) {  // the radix passes (later launches) add into these
    for (int b = threadIdx.x; b < 4 * kRadixBins; b += kSampledThreads) w.hist[row * 4 * kRadixBins + b] = 0u;
  }
  if (chunk == 0 && RowHasTopP(a, r)) {
    for (int b = threadIdx.x; b < 4 * kRadixBins; b += kSampledThreads)
      w.mass_hist[row * 4 * kRadixBins + b] = 0ull;
  }
  uint32_t my = 0, mz = 0;  // 0: below every ordered key of a non-NaN float
  for (int64_t j = lo + threadIdx.x; j < hi; j += kSampledThreads) {
    float v = static_cast<float>(logits[j]);
    if (pen != 1.0f && IsPenalised(penalised, j - lo)) v = repetition_penalize(v, pen);
    v = temperature_scaled(v, T);
    y[j] = v;
    my = max(my, MaxKey(v));
    if (has_q) mz = max(mz, MaxKey(div_rn(z[j], T)));
  }
  const uint64_t ymax = BlockMaxPacked(my, warp_best);
  __syncthreads();                                                  // warp_best is reused
  const uint64_t zmax = has_q ? BlockMaxPacked(mz, warp_best) : 0;  // has_q is CTA-uniform
  if (threadIdx.x == 0) {
    w.chunk_max[(row * w.chunks + chunk) * 2] = static_cast<uint32_t>(ymax);
    w.chunk_max[(row * w.chunks + chunk) * 2 + 1] = static_cast<uint32_t>(zmax);
  }
}

// grid (chunks, G + 1, R), block kSampledThreads: pass `pass` (0 .. 3) of the top-k radix select of a row —
// the histogram of digit `pass` of the chunk's keys that match the digits the earlier passes decided, added
// to the row's histogram by integer atomics (order-free). Rows without top-k are skipped.
__global__ void __launch_bounds__(kSampledThreads)
    SampledTopKPassKernel(RejectionParams a, SampledWork w, int pass) {
  __shared__ uint32_t hist[kRadixBins];
  __shared__ uint32_t s_prefix;
  const int64_t chunk = blockIdx.x, i = blockIdx.y, r = blockIdx.z, row = r * (a.G + 1) + i;
  if (i >= a.verify_len[r] || !SampledRequest(a, r) || !RowHasTopK(a, r)) return;  // CTA-uniform
  uint32_t* row_hist = w.hist + row * 4 * kRadixBins;
  if (threadIdx.x == 0) {
    int64_t k = a.top_k[r];
    s_prefix = RadixReplay(row_hist, pass, k);
  }
  for (int b = threadIdx.x; b < kRadixBins; b += kSampledThreads) hist[b] = 0u;
  __syncthreads();
  const uint32_t prefix = s_prefix, mask = RadixMask(pass);
  const int shift = 24 - 8 * pass;
  const float* y = a.ws_y + row * a.V;
  const int64_t lo = chunk * kVocabChunk, hi = min(a.V, lo + kVocabChunk);
  for (int64_t j = lo + threadIdx.x; j < hi; j += kSampledThreads) {
    const uint32_t key = ordered_key(y[j]);
    if ((key & mask) == prefix) atomicAdd(&hist[(key >> shift) & 0xFFu], 1u);
  }
  __syncthreads();
  for (int b = threadIdx.x; b < kRadixBins; b += kSampledThreads) {
    if (hist[b] != 0u) atomicAdd(&row_hist[pass * kRadixBins + b], hist[b]);
  }
}

// The top-k threshold of a row (-inf without top-k): the k-th largest y (the CPU's search keeps the same ids,
// radix_select.cuh). Thread 0 only.
__device__ __forceinline__ float RowTopKThreshold(const RejectionParams& a, const SampledWork& w, int64_t r,
                                                  int64_t row) {
  if (!RowHasTopK(a, r)) return -INFINITY;
  int64_t k = a.top_k[r];
  return key_to_float(RadixReplay(w.hist + row * 4 * kRadixBins, 4, k));
}

// The row's maxima of y and z / T as ordered keys: integer maxima over its chunks, order-free.
__device__ __forceinline__ uint2 RowMaxKeys(const SampledWork& w, int64_t row) {
  uint32_t ky = 0, kz = 0;
  for (int64_t c = 0; c < w.chunks; ++c) {
    ky = max(ky, w.chunk_max[(row * w.chunks + c) * 2]);
    kz = max(kz, w.chunk_max[(row * w.chunks + c) * 2 + 1]);
  }
  return make_uint2(ky, kz);
}

// grid (chunks, G + 1, R), block kSampledThreads: pass `pass` (0 .. 3) of a row's top-p radix select — the
// fixed-point masses e = exp(y - m) (0 below the top-k threshold) of the chunk's ids whose keys match the
// digits the earlier passes decided, per digit `pass`, added to the row's by integer atomics (order-free).
// Rows without top-p are skipped.
__global__ void __launch_bounds__(kSampledThreads)
    SampledTopPPassKernel(RejectionParams a, SampledWork w, int pass) {
  __shared__ unsigned long long hist[kRadixBins];
  __shared__ uint32_t s_prefix;
  __shared__ float s_thr;
  const int64_t chunk = blockIdx.x, i = blockIdx.y, r = blockIdx.z, row = r * (a.G + 1) + i;
  if (i >= a.verify_len[r] || !SampledRequest(a, r) || !RowHasTopP(a, r)) return;  // CTA-uniform
  unsigned long long* row_hist = w.mass_hist + row * 4 * kRadixBins;
  if (threadIdx.x == 0) {
    s_thr = RowTopKThreshold(a, w, r, row);
    s_prefix = MassReplay(row_hist, pass, a.top_p[r]);
  }
  for (int b = threadIdx.x; b < kRadixBins; b += kSampledThreads) hist[b] = 0ull;
  __syncthreads();
  const uint32_t prefix = s_prefix, mask = RadixMask(pass);
  const int shift = 24 - 8 * pass;
  const float thr = s_thr, m = key_to_float(RowMaxKeys(w, row).x);
  const float* y = a.ws_y + row * a.V;
  const int64_t lo = chunk * kVocabChunk, hi = min(a.V, lo + kVocabChunk);
  for (int64_t j = lo + threadIdx.x; j < hi; j += kSampledThreads) {
    const float v = y[j];
    const uint32_t key = TopPKey(v);
    if ((key & mask) != prefix || !(v >= thr)) continue;
    const unsigned long long mass = MassFixed(exp_exact(add_rn(v, -m)));
    if (mass != 0ull) atomicAdd(&hist[(key >> shift) & 0xFFu], mass);
  }
  __syncthreads();
  for (int b = threadIdx.x; b < kRadixBins; b += kSampledThreads) {
    if (hist[b] != 0ull) atomicAdd(&row_hist[pass * kRadixBins + b], hist[b]);
  }
}

// grid (chunks, G + 1, R), block kSampledThreads.
__global__ void __launch_bounds__(kSampledThreads) SampledExpKernel(RejectionParams a, SampledWork w) {
  __shared__ float s_thr, s_thr_p;
  const int64_t chunk = blockIdx.x, i = blockIdx.y, r = blockIdx.z, row = r * (a.G + 1) + i;
  if (i >= a.verify_len[r] || !SampledRequest(a, r)) return;  // CTA-uniform
  const int64_t lo = chunk * kVocabChunk, hi = min(a.V, lo + kVocabChunk);
  const bool has_q = RowHasQ(a, r, i);
  if (threadIdx.x == 0) {
    s_thr = RowTopKThreshold(a, w, r, row);
    s_thr_p = RowHasTopP(a, r) ? key_to_float(MassReplay(w.mass_hist + row * 4 * kRadixBins, 4, a.top_p[r]))
                               : -INFINITY;
  }
  __syncthreads();
  const float thr = max(s_thr, s_thr_p);  // kept: y >= both thresholds
  const uint2 keys = RowMaxKeys(w, row);
  const uint32_t kz = keys.y;
  const float m = key_to_float(keys.x), T = a.temperature[r];
  float* e = a.ws_y + row * a.V;
  for (int64_t j = lo + threadIdx.x; j < hi; j += kSampledThreads) {
    e[j] = e[j] >= thr ? exp_exact(add_rn(e[j], -m)) : 0.0f;
  }
  if (!has_q) return;
  const float mq = key_to_float(kz);
  const float* z = a.draft_logits + (r * a.G + i) * a.V;
  float* wq = a.ws_w + row * a.V;
  for (int64_t j = lo + threadIdx.x; j < hi; j += kSampledThreads) wq[j] = draft_weight(z[j], T, mq);
}

// grid (2, G + 1, R), block kSumLanes: blockIdx.x 0 sums e (p's normaliser), 1 sums w_q (q's).
__global__ void __launch_bounds__(kSumLanes) SampledLaneSumKernel(RejectionParams a, SampledWork w) {
  __shared__ BlockScratch s;
  const int64_t which = blockIdx.x, i = blockIdx.y, r = blockIdx.z, row = r * (a.G + 1) + i;
  if (i >= a.verify_len[r] || !SampledRequest(a, r)) return;  // block-uniform
  if (which == 1 && !RowHasQ(a, r, i)) return;
  const float* src = (which == 0 ? a.ws_y : a.ws_w) + row * a.V;
  // The lane's additions are a dependent chain in id order; its loads are not, so they are issued
  // kLaneBatch at a time (the terms were just written by SampledExpKernel and are mostly in L2).
  constexpr int kLaneBatch = 32;
  float lane = 0.f;
  int64_t j = threadIdx.x;
  for (; j + (kLaneBatch - 1) * kSumLanes < a.V; j += kLaneBatch * kSumLanes) {
    float v[kLaneBatch];
#pragma unroll
    for (int b = 0; b < kLaneBatch; ++b) v[b] = src[j + b * kSumLanes];
#pragma unroll
    for (int b = 0; b < kLaneBatch; ++b) lane = add_rn(lane, v[b]);
  }
  for (; j < a.V; j += kSumLanes) lane = add_rn(lane, src[j]);
  const float total = BlockLaneSum(lane, s);
  if (threadIdx.x == 0) w.sums[row * 2 + which] = total;
}

// One thread per request: the accept walk over the decided normalisers.
__global__ void SampledWalkKernel(RejectionParams a, SampledWork w, int64_t R) {
  const int64_t r = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (r >= R || !SampledRequest(a, r)) return;
  const int64_t n = a.verify_len[r];
  const uint32_t req = static_cast<uint32_t>(a.request_ids ? a.request_ids[r] : r);
  const int64_t* drafts = a.draft_tokens + r * a.G;
  int32_t n_acc = 0;
  int64_t stop = n - 1;
  int32_t residual = 0;
  for (int64_t i = 0; i < n - 1; ++i) {
    const int64_t row = r * (a.G + 1) + i, x = drafts[i];
    const float p_x = div_rn(a.ws_y[row * a.V + x], w.sums[row * 2]);
    const float u = philox_uniform(a.seed, a.offset, req, static_cast<uint32_t>(i), kPurposeAccept, 0);
    const bool ok = RowHasQ(a, r, i)
                        ? accept_draft(u, div_rn(a.ws_w[row * a.V + x], w.sums[row * 2 + 1]), p_x)
                        : accept_proposal(u, p_x);
    if (!ok) {
      stop = i;
      residual = 1;
      break;
    }
    a.out_tokens[r * (a.G + 1) + i] = x;
    ++n_acc;
  }
  a.accepted[r] = n_acc;
  w.stop[r * 2] = static_cast<int32_t>(stop);
  w.stop[r * 2 + 1] = residual;
  w.best[r * 2] = 0ull;
  w.best[r * 2 + 1] = 0ull;
}

// grid (chunks, R), block kSampledThreads: the stopping row's draw over one chunk.
__global__ void __launch_bounds__(kSampledThreads) SampledDrawKernel(RejectionParams a, SampledWork w) {
  __shared__ uint64_t warp_best[kSampledThreads / 32];
  const int64_t chunk = blockIdx.x, r = blockIdx.y;
  if (!SampledRequest(a, r)) return;  // CTA-uniform
  const int64_t i = w.stop[r * 2], row = r * (a.G + 1) + i;
  const bool residual = w.stop[r * 2 + 1] != 0, has_q = residual && RowHasQ(a, r, i);
  const int64_t x = residual ? a.draft_tokens[r * a.G + i] : -1;
  const uint32_t req = static_cast<uint32_t>(a.request_ids ? a.request_ids[r] : r);
  const uint32_t pos = static_cast<uint32_t>(i);
  const float sum = w.sums[row * 2], sum_q = has_q ? w.sums[row * 2 + 1] : 1.0f;
  const float* e = a.ws_y + row * a.V;
  const float* wq = a.ws_w + row * a.V;
  const int64_t lo = chunk * kVocabChunk, hi = min(a.V, lo + kVocabChunk);
  uint64_t best_res = 0, best_p = 0;
  for (int64_t j = lo + threadIdx.x; j < hi; j += kSampledThreads) {
    const float p = div_rn(e[j], sum);
    if (p > 0.0f) {
      best_p = max(best_p, PackKeyIdx(residual_key(p, a.seed, a.offset, req, pos, j), j));
    }
    if (!residual) continue;
    const float rw = has_q ? add_rn(p, -div_rn(wq[j], sum_q)) : proposal_residual_weight(p, j, x);
    if (rw > 0.0f) best_res = max(best_res, PackKeyIdx(residual_key(rw, a.seed, a.offset, req, pos, j), j));
  }
  best_p = BlockMaxPacked(best_p, warp_best);
  if (threadIdx.x == 0 && best_p != 0)
    atomicMax(reinterpret_cast<unsigned long long*>(w.best + r * 2 + 1),
              static_cast<unsigned long long>(best_p));
  if (!residual) return;  // CTA-uniform
  __syncthreads();        // warp_best is reused
  best_res = BlockMaxPacked(best_res, warp_best);
  if (threadIdx.x == 0 && best_res != 0)
    atomicMax(reinterpret_cast<unsigned long long*>(w.best + r * 2),
              static_cast<unsigned long long>(best_res));
}

// One thread per request: the stopping row's token — the residual draw's, else (no positive residual
// weight, or the bonus row) the draw from p.
__global__ void SampledEmitKernel(RejectionParams a, SampledWork w, int64_t R) {
  const int64_t r = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (r >= R || !SampledRequest(a, r)) return;
  const uint64_t res = w.best[r * 2], from_p = w.best[r * 2 + 1];
  const uint64_t pick = w.stop[r * 2 + 1] != 0 && res != 0 ? res : from_p;
  a.out_tokens[r * (a.G + 1) + w.stop[r * 2]] = pick != 0 ? PackedIdx(pick) : -1;
}

// target [T, V]; params with ws_y / ws_w [R, G + 1, V] f32; work sized for R, G and VocabChunks(V).
// Greedy requests are left untouched; work.mass_hist is needed with params.top_p.
template <typename TL>
cudaError_t RejectionSampleSampledSplit(const TL* target, const RejectionParams& params, int64_t R,
                                        const SampledWork& work, cudaStream_t stream) {
  if (R <= 0) return cudaSuccess;
  const unsigned rows = static_cast<unsigned>(params.G + 1), reqs = static_cast<unsigned>(R);
  const dim3 chunk_grid(static_cast<unsigned>(work.chunks), rows, reqs);
  const unsigned walk_blocks = static_cast<unsigned>((R + 127) / 128);
  SampledMaxKernel<TL><<<chunk_grid, kSampledThreads, 0, stream>>>(target, params, work);
  if (params.top_k != nullptr) {
    for (int pass = 0; pass < 4; ++pass) {
      SampledTopKPassKernel<<<chunk_grid, kSampledThreads, 0, stream>>>(params, work, pass);
    }
  }
  if (params.top_p != nullptr) {
    for (int pass = 0; pass < 4; ++pass) {
      SampledTopPPassKernel<<<chunk_grid, kSampledThreads, 0, stream>>>(params, work, pass);
    }
  }
  SampledExpKernel<<<chunk_grid, kSampledThreads, 0, stream>>>(params, work);
  SampledLaneSumKernel<<<dim3(2, rows, reqs), kSumLanes, 0, stream>>>(params, work);
  SampledWalkKernel<<<walk_blocks, 128, 0, stream>>>(params, work, R);
  SampledDrawKernel<<<dim3(static_cast<unsigned>(work.chunks), reqs), kSampledThreads, 0, stream>>>(params,
                                                                                                    work);
  SampledEmitKernel<<<walk_blocks, 128, 0, stream>>>(params, work, R);
  return cudaGetLastError();
}

}  // namespace dspark::kernels
