// SPDX-License-Identifier: Apache-2.0
// CUDA rejection_sample. Per verify row (RejectionRow) a block builds the processed target row y (penalty,
// / T) and p (top-k by radix select, top-p by threshold search, fixed-order normalisation) in a global
// workspace, forms q = softmax(z / T) on the fly (requests with deterministic proposals: q one-hot at the
// draft, never formed; their draft rows are not read), and takes the accept / residual / bonus decision. The
// rows of a request run in order in one block, stopping at the first rejection. Greedy requests may go to
// vocabulary-split kernels instead (rejection_sample_greedy.cuh), and so may the sampled requests
// (rejection_sample_split.cuh; the launcher then runs none of the kernels below). Every sum, exp, log and tie
// rule here is the CPU op's (include/dspark/sampling.h + sampling_block.cuh): same tokens.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "dspark/kernels/radix_select.cuh"
#include "dspark/kernels/sampling_block.cuh"
#include "dspark/kernels/warp_reduce.cuh"

namespace dspark::kernels {

struct RejectionParams {
  const int32_t* qo_indptr;
  const float* draft_logits;  // [R, G, V]; nullptr: every request's drafts are deterministic proposals
  const bool* draft_one_hot;  // [R], nullable: request r's drafts are deterministic proposals
  const int64_t* draft_tokens;
  const int32_t* verify_len;
  const float* temperature;
  const int64_t* request_ids;     // nullable
  const int64_t* top_k;           // nullable
  const float* top_p;             // nullable
  const float* penalty;           // nullable
  const int64_t* penalty_tokens;  // nullable
  const int64_t* penalty_indptr;  // nullable
  float* ws_y;                    // [R, V]
  float* ws_w;                    // [R, V]
  int32_t* accepted;              // [R]
  int64_t* out_tokens;            // [R, G + 1], pre-filled with -1
  int64_t G, V;
  uint64_t seed, offset;
  bool greedy_elsewhere = false;  // greedy requests go to rejection_sample_greedy.cuh's kernels
};

// Whether request r is left to the vocabulary-split greedy kernels rather than the kernel below.
__device__ __forceinline__ bool ElsewhereRequest(const RejectionParams& a, int64_t r) {
  return a.temperature[r] == 0.0f && a.greedy_elsewhere;
}

// The vocabulary-split kernels (greedy and sampled) give each CTA one chunk of a row's ids; the split
// depends on V alone.
constexpr int64_t kVocabChunk = 4096;
inline int64_t VocabChunks(int64_t V) { return (V + kVocabChunk - 1) / kVocabChunk; }

// A (key, id) candidate packed so that an integer max is best_of's winner: the key's order, then the lowest
// id. -0 is folded into +0 (they tie under best_of's float comparison; their ordered keys differ). Every
// packed candidate is >= 1, so 0 stands for none.
__device__ __forceinline__ uint64_t PackKeyIdx(float v, int64_t id) {
  if (v == 0.0f) v = 0.0f;
  return (static_cast<uint64_t>(ordered_key(v)) << 32) | (0xFFFFFFFFu - static_cast<uint32_t>(id));
}
__device__ __forceinline__ int64_t PackedIdx(uint64_t packed) {
  return static_cast<int64_t>(0xFFFFFFFFu - static_cast<uint32_t>(packed & 0xFFFFFFFFu));
}

// The integer max of one value per thread over the block (warp_best: one slot per warp), valid in thread 0.
// Order-free. Every thread must call it; one barrier.
__device__ __forceinline__ uint64_t BlockMaxPacked(uint64_t v, uint64_t* warp_best) {
  v = WarpMax(v);
  if (threadIdx.x % 32 == 0) warp_best[threadIdx.x / 32] = v;
  __syncthreads();
  if (threadIdx.x < 32) {
    v = threadIdx.x < blockDim.x / 32 ? warp_best[threadIdx.x] : 0;
    v = WarpMax(v);
  }
  return v;
}

// The ids of [lo, lo + 32 * words) that the CPU op repetition-penalises in verify row i of request r — the
// history's, then the row's earlier drafts — as a shared-memory bitmap of `words` words. Block-wide, with
// barriers; only when the request's penalty is not 1.
__device__ __forceinline__ void ChunkPenalised(const RejectionParams& a, int64_t r, int64_t i, int64_t lo,
                                               int64_t hi, uint32_t* bits, int words) {
  for (int w = threadIdx.x; w < words; w += blockDim.x) bits[w] = 0u;
  __syncthreads();
  const int64_t* drafts = a.draft_tokens + r * a.G;
  const int64_t p0 = a.penalty_tokens ? a.penalty_indptr[r] : 0;
  const int64_t n_pen = a.penalty_tokens ? a.penalty_indptr[r + 1] - p0 : 0;
  for (int64_t k = threadIdx.x; k < n_pen + i; k += blockDim.x) {
    const int64_t id = k < n_pen ? a.penalty_tokens[p0 + k] : drafts[k - n_pen];
    if (id >= lo && id < hi) atomicOr(&bits[(id - lo) / 32], 1u << ((id - lo) % 32));  // a set
  }
  __syncthreads();
}
__device__ __forceinline__ bool IsPenalised(const uint32_t* bits, int64_t offset) {
  return (bits[offset / 32] >> (offset % 32)) & 1u;
}

// Gumbel-max draw over the block from weights wt(j) >= 0 (only wt > 0 can win); -1 when every weight is 0.
template <typename W>
__device__ int64_t BlockGumbelDraw(int64_t V, W wt, uint64_t seed, uint64_t offset, uint32_t request,
                                   uint32_t position, BlockScratch& s) {
  KeyIdx mine{-INFINITY, -1};
  for (int64_t j = threadIdx.x; j < V; j += kSumLanes) {
    const float x = wt(j);
    if (!(x > 0.0f)) continue;
    mine = best_of(mine, KeyIdx{residual_key(x, seed, offset, request, position, j), j});
  }
  return BlockBest(mine, s).idx;
}

// What one verify row decides: the token it emits, and whether that token is the row's draft accepted (the
// request's walk then goes on to its next row).
struct RowOutcome {
  int64_t token;
  bool accepted;
};

// Verify row i of request r, block-wide (kSumLanes threads): the processed target row y (penalty, / T), p
// (top-k by radix select, top-p by threshold search, fixed-order normalisation) in w, and the accept /
// residual / bonus decision. y and w are this row's V-float scratch. A function of (r, i) and the inputs only
// — the Philox keys name the row — so rows may be decided in order in one block or each in its own block,
// with the same result.
template <typename TL>
__device__ RowOutcome RejectionRow(const TL* __restrict__ target, const RejectionParams& a, int64_t r,
                                   int64_t i, float* y, float* w, BlockScratch& s, RadixScratch& rs) {
  const int64_t V = a.V, G = a.G;
  const int tid = threadIdx.x;
  const float T = a.temperature[r];
  const bool one_hot = a.draft_logits == nullptr || (a.draft_one_hot != nullptr && a.draft_one_hot[r]);
  const int64_t top_k = a.top_k ? a.top_k[r] : 0;
  const float top_p = a.top_p ? a.top_p[r] : 1.0f;
  const float pen = a.penalty ? a.penalty[r] : 1.0f;
  const int64_t* ptok = a.penalty_tokens ? a.penalty_tokens + a.penalty_indptr[r] : nullptr;
  const int64_t n_pen = a.penalty_tokens ? a.penalty_indptr[r + 1] - a.penalty_indptr[r] : 0;
  const uint32_t req = static_cast<uint32_t>(a.request_ids ? a.request_ids[r] : r);
  const int64_t n = a.verify_len[r];
  const int64_t* drafts = a.draft_tokens + r * G;
  const TL* row = target + (static_cast<int64_t>(a.qo_indptr[r]) + i) * V;
  const uint32_t pos = static_cast<uint32_t>(i);
  for (int64_t j = tid; j < V; j += kSumLanes) y[j] = static_cast<float>(row[j]);
  __syncthreads();
  if (pen != 1.0f) {  // duplicates write the same value
    for (int64_t j = tid; j < n_pen; j += kSumLanes)
      y[ptok[j]] = repetition_penalize(static_cast<float>(row[ptok[j]]), pen);
    for (int64_t j = tid; j < i; j += kSumLanes)
      y[drafts[j]] = repetition_penalize(static_cast<float>(row[drafts[j]]), pen);
  }
  __syncthreads();
  KeyIdx mine{-INFINITY, -1};
  for (int64_t j = tid; j < V; j += kSumLanes) {
    const float v = temperature_scaled(y[j], T);
    y[j] = v;
    mine = best_of(mine, KeyIdx{v, j});
  }
  const KeyIdx top = BlockBest(mine, s);                                // also a barrier after the y writes
  if (T == 0.0f) return {top.idx, i != n - 1 && top.idx == drafts[i]};  // greedy: the argmax
  const float m = top.key;
  const uint32_t key_lo = ordered_key(-INFINITY), key_hi = ordered_key(m);
  float thr = -INFINITY;
  // top-k: the k-th largest key, which keeps the ids the CPU's search keeps (radix_select.cuh)
  if (top_k > 0 && top_k < V) {
    thr = key_to_float(BlockRadixKthLargest(V, top_k, [&](int64_t j) { return ordered_key(y[j]); }, rs));
  }
  float lane = 0.f;
  for (int64_t j = tid; j < V; j += kSumLanes) {
    const float e = y[j] >= thr ? exp_exact(add_rn(y[j], -m)) : 0.0f;
    w[j] = e;
    lane = add_rn(lane, e);
  }
  float total = BlockLaneSum(lane, s);
  if (top_p < 1.0f) {
    const float target_mass = mul_rn(top_p, total);
    const float thr_p = key_to_float(search_key(key_lo, key_hi, [&](float v) {
      float l = 0.f;
      for (int64_t j = tid; j < V; j += kSumLanes) l = add_rn(l, y[j] > v ? w[j] : 0.0f);
      return BlockLaneSum(l, s) < target_mass;
    }));
    lane = 0.f;
    for (int64_t j = tid; j < V; j += kSumLanes) {
      const float e = y[j] >= thr_p ? w[j] : 0.0f;
      w[j] = e;
      lane = add_rn(lane, e);
    }
    total = BlockLaneSum(lane, s);
  }
  for (int64_t j = tid; j < V; j += kSumLanes) w[j] = div_rn(w[j], total);
  __syncthreads();
  if (i == n - 1) {  // bonus from p
    return {BlockGumbelDraw(V, [&](int64_t j) { return w[j]; }, a.seed, a.offset, req, pos, s), false};
  }
  const int64_t x = drafts[i];
  const float u = philox_uniform(a.seed, a.offset, req, pos, kPurposeAccept, 0);
  if (one_hot) {  // q one-hot at x: accept iff u < p(x), else a draw from p without x
    if (accept_proposal(u, w[x])) return {x, true};
    int64_t c = BlockGumbelDraw(
        V, [&](int64_t j) { return proposal_residual_weight(w[j], j, x); }, a.seed, a.offset, req, pos, s);
    if (c < 0) c = BlockGumbelDraw(V, [&](int64_t j) { return w[j]; }, a.seed, a.offset, req, pos, s);
    return {c, false};
  }
  const float* z = a.draft_logits + (r * G + i) * V;
  KeyIdx zm{-INFINITY, -1};
  for (int64_t j = tid; j < V; j += kSumLanes) zm = best_of(zm, KeyIdx{div_rn(z[j], T), j});
  const float mq = BlockBest(zm, s).key;
  lane = 0.f;
  for (int64_t j = tid; j < V; j += kSumLanes) lane = add_rn(lane, draft_weight(z[j], T, mq));
  const float sq = BlockLaneSum(lane, s);
  auto q_at = [&](int64_t j) { return div_rn(draft_weight(z[j], T, mq), sq); };
  if (accept_draft(u, q_at(x), w[x])) return {x, true};
  int64_t c =
      BlockGumbelDraw(V, [&](int64_t j) { return add_rn(w[j], -q_at(j)); }, a.seed, a.offset, req, pos, s);
  if (c < 0) c = BlockGumbelDraw(V, [&](int64_t j) { return w[j]; }, a.seed, a.offset, req, pos, s);
  return {c, false};
}

// grid R: each request's rows in order in one block, stopping at the first rejection (later rows never read).
// ws_y / ws_w [R, V].
template <typename TL>
__global__ void __launch_bounds__(kSumLanes)
    RejectionSampleKernel(const TL* __restrict__ target, RejectionParams a) {
  __shared__ BlockScratch s;
  __shared__ RadixScratch rs;
  const int64_t r = blockIdx.x;
  if (ElsewhereRequest(a, r)) return;  // block-uniform, before any barrier
  int64_t* emit = a.out_tokens + r * (a.G + 1);
  float* y = a.ws_y + r * a.V;
  float* w = a.ws_w + r * a.V;
  const int64_t n = a.verify_len[r];
  int32_t n_acc = 0;
  for (int64_t i = 0; i < n; ++i) {
    const RowOutcome o = RejectionRow(target, a, r, i, y, w, s, rs);
    if (threadIdx.x == 0) emit[i] = o.token;
    if (!o.accepted) break;
    ++n_acc;
  }
  if (threadIdx.x == 0) a.accepted[r] = n_acc;
}

// One block per request (RejectionSampleKernel, ws [R, V]).
template <typename TL>
cudaError_t RejectionSample(const TL* target, const RejectionParams& params, int64_t R, cudaStream_t stream) {
  if (R <= 0) return cudaSuccess;
  RejectionSampleKernel<TL><<<static_cast<unsigned>(R), kSumLanes, 0, stream>>>(target, params);
  return cudaGetLastError();
}

}  // namespace dspark::kernels
