// SPDX-License-Identifier: Apache-2.0
// CUDA plan_verify: per-request verify lengths from survival and an SPS table, the same plan as the CPU op.
//
// full / threshold: PlanFinalizeKernel alone (one block, one thread per request).
// early_stop / lagged_topk with R * G <= kPlanOneBlockSlots: PlanOneBlockKernel, one CTA in shared memory:
//   1. every slot (r, j) becomes a 64-bit key whose ascending order is the planner's order (plan_key); a
//      bitonic network sorts them (invalid slots, a <= 0, sort last);
//   2. an integer block scan gives each candidate i its tau after admitting 0..i (fixed point, planner.h:
//      exact in any order, so the same bits as the CPU's sequential walk);
//   3. early_stop: admitted = the least i whose Theta does not improve on i - 1's (admission_stops, an
//      integer min); lagged_topk: K = the least index of the greatest Theta over the sorted lagged survival
//      (integer max of an ordered key of Theta, then integer min of the index), take = min(K, candidates);
//   4. each admitted candidate adds 1 to its request's length (integer atomics: order-free).
// Larger batches: two kernels on the stream.
//   1. PlanRankKernel (many blocks): each valid candidate (a > 0) counts the valid candidates that precede it
//      under candidate_precedes (all pairs, tiled through shared memory). The order is a strict total order,
//      so the counts are a permutation of [0, n_valid): exactly the positions std::sort gives on the CPU.
//      Each candidate scatters its survival to sorted[rank]; for the current survival it also keeps its rank.
//   2. PlanFinalizeKernel (one block): thread 0 runs early_stop_admit / argmax_budget (planner.h, the CPU's
//      walk) on the sorted values, then each thread counts its request's drafts whose rank is below the
//      admitted count.
// DType is the survival element type: float, the dtype the op takes (threshold_verify_len reads float rows).
// Survival values are not validated on CUDA (that needs the data on the host); for survival outside [0, 1] or
// increasing along a row the plan is unspecified but memory-safe.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "dspark/kernels/warp_reduce.cuh"
#include "dspark/planner.h"

namespace dspark::kernels {

constexpr int kPlanRankThreads = 128;
constexpr int kPlanFinalizeThreads = 512;
constexpr int64_t kPlanMaxSharedProbes = 1024;  // the SPS table is staged in shared memory up to this length
constexpr int32_t kPlanInvalidRank = 0x7FFFFFFF;
constexpr int kPlanOneBlockThreads = 1024;
constexpr int kPlanSlotsPerThread = 4;
constexpr int64_t kPlanOneBlockSlots = kPlanOneBlockThreads * kPlanSlotsPerThread;  // R * G up to this
constexpr int64_t kPlanOneBlockProbes = 512;  // staged next to the 32 KiB of keys, within 48 KiB
constexpr uint64_t kPlanNoCandidate = ~0ull;

// Sort key of slot (r, j) of an R-request batch with survival a > 0: ascending keys are the planner's order
// (a descending — the bits of a float >= 0 are monotone in it, 0x3F800000 is 1.0f —, then j, then r). Keys
// are distinct (j * R + r is), and every key is below kPlanNoCandidate.
DSPARK_HD uint64_t plan_key(float a, int32_t j, int32_t r, int64_t R) {
  return (static_cast<uint64_t>(0x3F800000u - float_as_bits(a)) << 32) |
         static_cast<uint64_t>(static_cast<int64_t>(j) * R + r);
}
DSPARK_HD float plan_key_survival(uint64_t key) {
  return bits_as_float(0x3F800000u - static_cast<uint32_t>(key >> 32));
}
DSPARK_HD int64_t plan_key_request(uint64_t key, int64_t R) {
  return static_cast<int64_t>(key & 0xFFFFFFFFu) % R;
}

// One compare-exchange of the ascending bitonic sorting network over a power-of-two array: stage (k, j),
// element i; only the lower element of each pair (i < i ^ j) acts, so the n / 2 pairs of a step are disjoint.
DSPARK_HD void bitonic_exchange(uint64_t* keys, int64_t i, int64_t k, int64_t j) {
  const int64_t p = i ^ j;
  if (p <= i) return;
  const uint64_t lo = keys[i], hi = keys[p];
  if ((lo > hi) == ((i & k) == 0)) {
    keys[i] = hi;
    keys[p] = lo;
  }
}

// Monotone map of a non-NaN double to uint64 (a total order; -0 just below +0).
DSPARK_HD uint64_t plan_theta_key(double theta) {
  const uint64_t b = double_as_bits(theta);
  return (b >> 63) ? ~b : (b | (1ull << 63));
}

// grid: (ceil(n / kPlanRankThreads), 1 or 2); blockIdx.y = 0 ranks `survival`, 1 ranks `lagged`.
// survival, lagged: [R, G] f32 (n = R * G) -> rank [R * G] i32 (current only; kPlanInvalidRank where a <= 0),
//   sorted, sorted_lagged: [n_valid] f32 survival values in planner order
template <typename DType>
__global__ void PlanRankKernel(const DType* __restrict__ survival, const DType* __restrict__ lagged,
                               int64_t n, int32_t G, int32_t* __restrict__ rank, float* __restrict__ sorted,
                               float* __restrict__ sorted_lagged) {
  __shared__ float s_a[kPlanRankThreads];
  __shared__ int32_t s_j[kPlanRankThreads];
  __shared__ int32_t s_r[kPlanRankThreads];
  const bool is_lagged = blockIdx.y == 1;
  const DType* __restrict__ s = is_lagged ? lagged : survival;
  const int64_t c = static_cast<int64_t>(blockIdx.x) * kPlanRankThreads + threadIdx.x;
  const bool in_range = c < n;
  const float a = in_range ? static_cast<float>(s[c]) : 0.f;
  const int32_t j = static_cast<int32_t>(in_range ? c % G : 0),
                r = static_cast<int32_t>(in_range ? c / G : 0);
  const bool valid = a > 0.f;
  int32_t count = 0;
  for (int64_t tile = 0; tile < n; tile += kPlanRankThreads) {
    const int64_t d = tile + threadIdx.x;
    __syncthreads();  // the previous tile has been read by every thread
    if (d < n) {
      s_a[threadIdx.x] = static_cast<float>(s[d]);
      s_j[threadIdx.x] = static_cast<int32_t>(d % G);
      s_r[threadIdx.x] = static_cast<int32_t>(d / G);
    } else {
      s_a[threadIdx.x] = 0.f;  // invalid: never counted
      s_j[threadIdx.x] = 0;
      s_r[threadIdx.x] = 0;
    }
    __syncthreads();
    if (valid) {
#pragma unroll 8
      for (int k = 0; k < kPlanRankThreads; ++k) {
        const float ad = s_a[k];
        count += (ad > 0.f && candidate_precedes(ad, s_j[k], s_r[k], a, j, r)) ? 1 : 0;
      }
    }
  }
  if (!in_range) return;
  if (is_lagged) {
    if (valid) sorted_lagged[count] = a;
  } else {
    rank[c] = valid ? count : kPlanInvalidRank;
    if (valid) sorted[count] = a;
  }
}

// Sum over the block of per-thread int64 values (integer: the result does not depend on the order).
__device__ __forceinline__ int64_t PlanBlockSum(int64_t v, unsigned long long* s_acc) {
  __syncthreads();
  if (threadIdx.x == 0) *s_acc = 0ull;
  __syncthreads();
  atomicAdd(s_acc, static_cast<unsigned long long>(v));
  __syncthreads();
  return static_cast<int64_t>(*s_acc);
}

// The SPS table for a kernel's reads: copied into shared memory at `dst` (n_probes rates, then n_probes
// tokens; 8-byte aligned) when `stage`, else read from global memory. The copy is published by the caller's
// next barrier.
struct PlanProbes {
  const int64_t* tokens;
  const double* rate;
};
__device__ __forceinline__ PlanProbes PlanStageProbes(const int64_t* tokens, const double* rate,
                                                      int64_t n_probes, bool stage, unsigned char* dst) {
  if (!stage) return {tokens, rate};
  double* s_rate = reinterpret_cast<double*>(dst);
  int64_t* s_tok = reinterpret_cast<int64_t*>(dst + n_probes * sizeof(double));
  for (int64_t i = threadIdx.x; i < n_probes; i += blockDim.x) {
    s_rate[i] = rate[i];
    s_tok[i] = tokens[i];
  }
  return {s_tok, s_rate};
}

// grid: 1 block of kPlanFinalizeThreads; dynamic shared memory: n_probes * (8 + 8) bytes when staged.
// survival, lagged: [R, G] f32; rank [R * G] i32, sorted, sorted_lagged [<= R * G] f32 (from PlanRankKernel;
// unused for full / threshold); tokens [n_probes] i64, rate [n_probes] f64
//   -> verify_len [R] i32, budget [] i64
template <typename DType>
__global__ void PlanFinalizeKernel(const DType* __restrict__ survival, const DType* __restrict__ lagged,
                                   int64_t R, int32_t G, const int64_t* __restrict__ tokens,
                                   const double* __restrict__ rate, int64_t n_probes, bool stage_probes,
                                   int32_t mode, double threshold, const int32_t* __restrict__ rank,
                                   const float* __restrict__ sorted, const float* __restrict__ sorted_lagged,
                                   int32_t* __restrict__ verify_len, int64_t* __restrict__ budget) {
  extern __shared__ __align__(16) unsigned char s_raw[];
  __shared__ unsigned long long s_acc;
  __shared__ int64_t s_take;
  const int64_t n = R * G;
  if (mode == kPlanFull) {
    for (int64_t r = threadIdx.x; r < R; r += blockDim.x) verify_len[r] = G + 1;
    if (threadIdx.x == 0) *budget = n;
    return;
  }
  if (mode == kPlanThreshold) {
    int64_t local = 0;
    for (int64_t r = threadIdx.x; r < R; r += blockDim.x) {
      const int32_t len = threshold_verify_len(survival + r * G, G, threshold);
      verify_len[r] = len;
      local += len - 1;
    }
    const int64_t total = PlanBlockSum(local, &s_acc);
    if (threadIdx.x == 0) *budget = total;
    return;
  }

  // early_stop / lagged_topk. Stage the SPS table (read ~log2(n_probes) times per admitted candidate).
  const PlanProbes probes = PlanStageProbes(tokens, rate, n_probes, stage_probes, s_raw);
  const int64_t* tok = probes.tokens;
  const double* rt = probes.rate;
  int64_t local_cur = 0, local_lag = 0;
  for (int64_t c = threadIdx.x; c < n; c += blockDim.x) {
    local_cur += static_cast<float>(survival[c]) > 0.f ? 1 : 0;
    if (mode == kPlanLaggedTopK) local_lag += static_cast<float>(lagged[c]) > 0.f ? 1 : 0;
  }
  const int64_t n_cur = PlanBlockSum(local_cur, &s_acc);  // its __syncthreads also publishes the staged table
  const int64_t n_lag = mode == kPlanLaggedTopK ? PlanBlockSum(local_lag, &s_acc) : 0;
  if (threadIdx.x == 0) {
    int64_t take = 0;
    if (mode == kPlanEarlyStop) {
      take = early_stop_admit(sorted, n_cur, R, tok, rt, n_probes);
      *budget = take;
    } else {
      const int64_t k = argmax_budget(sorted_lagged, n_lag, R, tok, rt, n_probes);
      *budget = k;
      take = k < n_cur ? k : n_cur;
    }
    s_take = take;
  }
  __syncthreads();
  const int64_t take = s_take;
  for (int64_t r = threadIdx.x; r < R; r += blockDim.x) {
    int32_t len = 1;
    for (int32_t j = 0; j < G; ++j) len += static_cast<int64_t>(rank[r * G + j]) < take ? 1 : 0;
    verify_len[r] = len;
  }
}

// Exclusive prefix sum over the block of one int64 per thread (integer: the same in any order). s_warp holds
// one int64 per warp; every thread must call it.
__device__ __forceinline__ int64_t PlanBlockExclusiveScan(int64_t v, int64_t* s_warp) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  int64_t x = v;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const int64_t y = __shfl_up_sync(0xFFFFFFFFu, x, o);
    if (lane >= o) x += y;
  }
  __syncthreads();  // s_warp's earlier contents have been read
  if (lane == 31) s_warp[warp] = x;
  __syncthreads();
  if (warp == 0) {
    int64_t w = lane < static_cast<int>(blockDim.x >> 5) ? s_warp[lane] : 0;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const int64_t y = __shfl_up_sync(0xFFFFFFFFu, w, o);
      if (lane >= o) w += y;
    }
    s_warp[lane] = w;  // inclusive warp totals
  }
  __syncthreads();
  return x - v + (warp > 0 ? s_warp[warp - 1] : 0);
}

// Sorts the slots of one [R, G] survival matrix into s_keys[0, n_pow2): candidates (a > 0) in the planner's
// order, then kPlanNoCandidate. Returns the number of candidates. Every thread must call it.
template <typename DType>
__device__ int64_t PlanSortCandidates(const DType* __restrict__ s, int64_t R, int32_t G, int64_t n_pow2,
                                      uint64_t* s_keys) {
  const int64_t n = R * G;
  int64_t count = 0;
  __syncthreads();  // s_keys's earlier contents have been read
  for (int64_t base = 0; base < n_pow2; base += blockDim.x) {
    const int64_t c = base + threadIdx.x;
    const float a = c < n ? static_cast<float>(s[c]) : 0.f;
    const bool valid = a > 0.f;
    if (c < n_pow2) {
      s_keys[c] =
          valid ? plan_key(a, static_cast<int32_t>(c % G), static_cast<int32_t>(c / G), R) : kPlanNoCandidate;
    }
    count += __syncthreads_count(valid);
  }
  for (int64_t k = 2; k <= n_pow2; k <<= 1) {
    for (int64_t j = k >> 1; j > 0; j >>= 1) {
      for (int64_t i = threadIdx.x; i < n_pow2; i += blockDim.x) bitonic_exchange(s_keys, i, k, j);
      __syncthreads();
    }
  }
  return count;
}

// Fixed-point survival of this thread's sorted candidates, slots [t * kPlanSlotsPerThread, ...), and tau
// before the first of them (anchors plus every earlier candidate).
struct PlanThreadSlots {
  int64_t first;
  int64_t value[kPlanSlotsPerThread];
  int64_t tau_before;
};

__device__ __forceinline__ PlanThreadSlots PlanScanSlots(const uint64_t* s_keys, int64_t n_valid, int64_t R,
                                                         int64_t* s_warp) {
  PlanThreadSlots t;
  t.first = static_cast<int64_t>(threadIdx.x) * kPlanSlotsPerThread;
  int64_t local = 0;
#pragma unroll
  for (int e = 0; e < kPlanSlotsPerThread; ++e) {
    const int64_t i = t.first + e;
    t.value[e] = i < n_valid ? survival_fixed(plan_key_survival(s_keys[i])) : 0;
    local += t.value[e];
  }
  t.tau_before = tau_fixed_of_anchors(R) + PlanBlockExclusiveScan(local, s_warp);
  return t;
}

// early_stop's admitted count over n_valid sorted candidates: the least i with admission_stops, else n_valid.
__device__ int64_t PlanEarlyStop(const uint64_t* s_keys, int64_t n_valid, int64_t R, const int64_t* tok,
                                 const double* rt, int64_t n_probes, int64_t* s_warp,
                                 unsigned long long* s_min) {
  const PlanThreadSlots t = PlanScanSlots(s_keys, n_valid, R, s_warp);
  if (threadIdx.x == 0) *s_min = static_cast<unsigned long long>(n_valid);
  __syncthreads();
  int64_t tau = t.tau_before;
#pragma unroll
  for (int e = 0; e < kPlanSlotsPerThread; ++e) {
    const int64_t i = t.first + e;
    tau += t.value[e];
    if (i < n_valid && admission_stops(tau, t.value[e], i, R, tok, rt, n_probes)) {
      atomicMin(s_min, static_cast<unsigned long long>(i));
    }
  }
  __syncthreads();
  return static_cast<int64_t>(*s_min);
}

// lagged_topk's budget over n_valid sorted candidates: the least k in [0, n_valid] whose Theta (k admitted)
// is the greatest (argmax_budget's first maximum).
__device__ int64_t PlanArgmaxBudget(const uint64_t* s_keys, int64_t n_valid, int64_t R, const int64_t* tok,
                                    const double* rt, int64_t n_probes, int64_t* s_warp,
                                    unsigned long long* s_max, unsigned long long* s_min) {
  const PlanThreadSlots t = PlanScanSlots(s_keys, n_valid, R, s_warp);
  const uint64_t none_key = plan_theta_key(plan_theta(tau_fixed_of_anchors(R), R, tok, rt, n_probes));
  if (threadIdx.x == 0) {
    *s_max = 0ull;
    *s_min = static_cast<unsigned long long>(n_valid);
  }
  __syncthreads();
  uint64_t key[kPlanSlotsPerThread];
  uint64_t best = threadIdx.x == 0 ? none_key : 0ull;
  int64_t tau = t.tau_before;
#pragma unroll
  for (int e = 0; e < kPlanSlotsPerThread; ++e) {
    const int64_t i = t.first + e;
    tau += t.value[e];
    key[e] = i < n_valid ? plan_theta_key(plan_theta(tau, R + i + 1, tok, rt, n_probes)) : 0ull;
    best = key[e] > best ? key[e] : best;
  }
  best = WarpMax(best);
  if ((threadIdx.x & 31) == 0) atomicMax(s_max, static_cast<unsigned long long>(best));
  __syncthreads();
  best = *s_max;
  if (threadIdx.x == 0 && none_key == best) atomicMin(s_min, 0ull);
#pragma unroll
  for (int e = 0; e < kPlanSlotsPerThread; ++e) {
    const int64_t i = t.first + e;
    if (i < n_valid && key[e] == best) atomicMin(s_min, static_cast<unsigned long long>(i + 1));
  }
  __syncthreads();
  return static_cast<int64_t>(*s_min);
}

// grid: 1 block of kPlanOneBlockThreads; dynamic shared memory: n_pow2 * 8 bytes of keys, then n_probes * 16
// when staged. early_stop / lagged_topk only, R * G <= n_pow2 <= kPlanOneBlockSlots (n_pow2 a power of two).
// survival, lagged: [R, G] f32; tokens [n_probes] i64, rate [n_probes] f64 -> verify_len [R] i32, budget []
// i64
template <typename DType>
__global__ void __launch_bounds__(kPlanOneBlockThreads)
    PlanOneBlockKernel(const DType* __restrict__ survival, const DType* __restrict__ lagged, int64_t R,
                       int32_t G, int64_t n_pow2, const int64_t* __restrict__ tokens,
                       const double* __restrict__ rate, int64_t n_probes, bool stage_probes, int32_t mode,
                       int32_t* __restrict__ verify_len, int64_t* __restrict__ budget) {
  extern __shared__ __align__(16) unsigned char s_raw[];
  __shared__ int64_t s_warp[kPlanOneBlockThreads / 32];
  __shared__ unsigned long long s_max, s_min;
  uint64_t* s_keys = reinterpret_cast<uint64_t*>(s_raw);
  // after the keys; published by the barrier PlanSortCandidates starts with
  const PlanProbes probes =
      PlanStageProbes(tokens, rate, n_probes, stage_probes, s_raw + n_pow2 * sizeof(uint64_t));
  const int64_t* tok = probes.tokens;
  const double* rt = probes.rate;
  for (int64_t r = threadIdx.x; r < R; r += blockDim.x) verify_len[r] = 1;  // anchors; drafts added below
  int64_t take = 0;
  if (mode == kPlanLaggedTopK) {
    const int64_t n_lag = PlanSortCandidates(lagged, R, G, n_pow2, s_keys);
    const int64_t k = PlanArgmaxBudget(s_keys, n_lag, R, tok, rt, n_probes, s_warp, &s_max, &s_min);
    const int64_t n_cur = PlanSortCandidates(survival, R, G, n_pow2, s_keys);
    take = k < n_cur ? k : n_cur;
    if (threadIdx.x == 0) *budget = k;
  } else {
    const int64_t n_cur = PlanSortCandidates(survival, R, G, n_pow2, s_keys);
    take = PlanEarlyStop(s_keys, n_cur, R, tok, rt, n_probes, s_warp, &s_min);
    if (threadIdx.x == 0) *budget = take;
  }
  // The anchors' 1s were written before the sort's barriers, so they are visible here.
  for (int64_t i = threadIdx.x; i < take; i += blockDim.x) {
    atomicAdd(&verify_len[plan_key_request(s_keys[i], R)], 1);
  }
}

// survival, lagged (nullable unless mode == lagged_topk): [R, G] f32; tokens [n_probes] i64, rate [n_probes]
// f64; workspace (early_stop / lagged_topk with R * G > kPlanOneBlockSlots only, else nullable): rank
// [R * G] i32, sorted [R * G] f32, sorted_lagged [R * G] f32 (lagged_topk only) -> verify_len [R] i32,
// budget [] i64
template <typename DType>
cudaError_t PlanVerify(const DType* survival, const DType* lagged, int64_t R, int32_t G,
                       const int64_t* tokens, const double* rate, int64_t n_probes, int32_t mode,
                       double threshold, int32_t* rank, float* sorted, float* sorted_lagged,
                       int32_t* verify_len, int64_t* budget, cudaStream_t stream) {
  const int64_t n = R * G;
  const bool ranked = mode == kPlanEarlyStop || mode == kPlanLaggedTopK;
  if (ranked && n <= kPlanOneBlockSlots) {
    int64_t n_pow2 = 1;
    while (n_pow2 < n) n_pow2 <<= 1;
    const bool stage = n_probes <= kPlanOneBlockProbes;
    const size_t smem = static_cast<size_t>(n_pow2) * sizeof(uint64_t) +
                        (stage ? static_cast<size_t>(n_probes) * (sizeof(double) + sizeof(int64_t)) : 0);
    PlanOneBlockKernel<DType><<<1, kPlanOneBlockThreads, smem, stream>>>(
        survival, lagged, R, G, n_pow2, tokens, rate, n_probes, stage, mode, verify_len, budget);
    return cudaGetLastError();
  }
  if (ranked && n > 0) {
    const dim3 grid(static_cast<unsigned>((n + kPlanRankThreads - 1) / kPlanRankThreads),
                    mode == kPlanLaggedTopK ? 2u : 1u);
    PlanRankKernel<DType>
        <<<grid, kPlanRankThreads, 0, stream>>>(survival, lagged, n, G, rank, sorted, sorted_lagged);
    const cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) return err;
  }
  const bool stage_probes = ranked && n_probes <= kPlanMaxSharedProbes;
  const size_t smem = stage_probes ? static_cast<size_t>(n_probes) * (sizeof(double) + sizeof(int64_t)) : 0;
  PlanFinalizeKernel<DType><<<1, kPlanFinalizeThreads, smem, stream>>>(
      survival, lagged, R, G, tokens, rate, n_probes, stage_probes, mode, threshold, rank, sorted,
      sorted_lagged, verify_len, budget);
  return cudaGetLastError();
}

}  // namespace dspark::kernels
