// SPDX-License-Identifier: Apache-2.0
// CUDA plan_verify: per-request verify lengths from survival and an SPS table, the same plan as the CPU op.
//
// full / threshold: one single-block kernel, one thread per request.
// early_stop / lagged_topk: two kernels on the stream.
//   1. PlanRankKernel (many blocks): each valid candidate (a > 0) counts the valid candidates that precede it
//      under candidate_precedes (all pairs, tiled through shared memory). The order is a strict total order,
//      so the counts are a permutation of [0, n_valid): exactly the positions std::sort gives on the CPU.
//      Each candidate scatters its survival to sorted[rank]; for the current survival it also keeps its rank.
//   2. PlanFinalizeKernel (one block): thread 0 runs early_stop_admit / argmax_budget on the sorted values,
//      sequentially in the CPU's order so every fp64 rounding matches, then each thread counts its request's
//      drafts whose rank is below the admitted count.
// DType is the survival element type: float, the dtype the op takes (threshold_verify_len reads float rows).
// Survival values are not validated on CUDA (that needs the data on the host); for survival outside [0, 1] or
// increasing along a row the plan is unspecified but memory-safe.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "dspark/planner.h"

namespace dspark::kernels {

constexpr int kPlanRankThreads = 128;
constexpr int kPlanFinalizeThreads = 512;
constexpr int64_t kPlanMaxSharedProbes = 1024;  // the SPS table is staged in shared memory up to this length
constexpr int32_t kPlanInvalidRank = 0x7FFFFFFF;

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
  const int64_t* tok = tokens;
  const double* rt = rate;
  if (stage_probes) {
    double* s_rate = reinterpret_cast<double*>(s_raw);
    int64_t* s_tok = reinterpret_cast<int64_t*>(s_raw + n_probes * sizeof(double));
    for (int64_t i = threadIdx.x; i < n_probes; i += blockDim.x) {
      s_rate[i] = rate[i];
      s_tok[i] = tokens[i];
    }
    tok = s_tok;
    rt = s_rate;
  }
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

// survival, lagged (nullable unless mode == lagged_topk): [R, G] f32; tokens [n_probes] i64, rate [n_probes]
// f64; workspace (early_stop / lagged_topk only, else nullable): rank [R * G] i32, sorted [R * G] f32,
// sorted_lagged [R * G] f32 (lagged_topk only) -> verify_len [R] i32, budget [] i64
template <typename DType>
cudaError_t PlanVerify(const DType* survival, const DType* lagged, int64_t R, int32_t G,
                       const int64_t* tokens, const double* rate, int64_t n_probes, int32_t mode,
                       double threshold, int32_t* rank, float* sorted, float* sorted_lagged,
                       int32_t* verify_len, int64_t* budget, cudaStream_t stream) {
  const int64_t n = R * G;
  const bool ranked = mode == kPlanEarlyStop || mode == kPlanLaggedTopK;
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
