// SPDX-License-Identifier: Apache-2.0
// The verify planner's scoring, ordering and admission walks, shared by the CPU and CUDA plan_verify ops.
//
// Candidates are (request r, draft position j, survival a = a_{r,j}) with a > 0. Their total order is
// value-independent and deterministic: survival descending, then position ascending, then request ascending.
// Within a request survival is non-increasing along j, so every prefix of this order is prefix-closed per
// request (admitting (r, j) implies (r, j-1) was admitted before it).
//
// Throughput of a plan: Theta = tau * SPS(B) with B = R + admitted and tau = R + sum of admitted survivals.
// SPS(B) is priced at the ceiling probe (the smallest profiled B' >= B: a forward of B tokens runs at least
// as slowly as the next tier up); past the last probe it keeps the last probe's tokens/s (rate * B_last / B).
#pragma once
#include "dspark/macros.h"

namespace dspark {

enum PlanMode : int32_t { kPlanFull = 0, kPlanThreshold = 1, kPlanEarlyStop = 2, kPlanLaggedTopK = 3 };

// Steps per second at B packed tokens from probes `tokens` (strictly increasing) and `rate` (> 0).
DSPARK_HD double sps_ceil(const int64_t* tokens, const double* rate, int64_t n, int64_t batch_tokens) {
  int64_t lo = 0, hi = n;  // first index with tokens[i] >= batch_tokens
  while (lo < hi) {
    const int64_t mid = (lo + hi) / 2;
    if (tokens[mid] < batch_tokens) {
      lo = mid + 1;
    } else {
      hi = mid;
    }
  }
  if (lo < n) return rate[lo];
  return mul_rn(rate[n - 1], static_cast<double>(tokens[n - 1])) / static_cast<double>(batch_tokens);
}

// True when candidate 1 comes strictly before candidate 2 in the planner's total order.
DSPARK_HD bool candidate_precedes(float a1, int32_t j1, int32_t r1, float a2, int32_t j2, int32_t r2) {
  if (a1 != a2) return a1 > a2;
  if (j1 != j2) return j1 < j2;
  return r1 < r2;
}

// Algorithm 1 (paper, p. 8) on an ordered candidate list: admit while Theta strictly improves, stop at the
// first non-improvement. Returns how many leading candidates are admitted.
DSPARK_HD int64_t early_stop_admit(const float* sorted_survival, int64_t n, int64_t num_requests,
                                   const int64_t* tokens, const double* rate, int64_t n_probes) {
  double tau = static_cast<double>(num_requests);
  double best = mul_rn(tau, sps_ceil(tokens, rate, n_probes, num_requests));
  int64_t admitted = 0;
  for (int64_t i = 0; i < n; ++i) {
    tau = add_rn(tau, static_cast<double>(sorted_survival[i]));
    const double theta = mul_rn(tau, sps_ceil(tokens, rate, n_probes, num_requests + i + 1));
    if (!(theta > best)) break;
    best = theta;
    admitted = i + 1;
  }
  return admitted;
}

// Budget K for lagged top-K: the first argmax of Theta over the whole ordered list (no early stop). Exact
// only because the survivals it reads come from an earlier round, independent of this round's draws.
DSPARK_HD int64_t argmax_budget(const float* sorted_survival, int64_t n, int64_t num_requests,
                                const int64_t* tokens, const double* rate, int64_t n_probes) {
  double tau = static_cast<double>(num_requests);
  double best = mul_rn(tau, sps_ceil(tokens, rate, n_probes, num_requests));
  int64_t budget = 0;
  for (int64_t i = 0; i < n; ++i) {
    tau = add_rn(tau, static_cast<double>(sorted_survival[i]));
    const double theta = mul_rn(tau, sps_ceil(tokens, rate, n_probes, num_requests + i + 1));
    if (theta > best) {
      best = theta;
      budget = i + 1;
    }
  }
  return budget;
}

// DeepSpec's static threshold: verify the longest prefix whose per-position confidence c_j = a_j / a_{j-1}
// is >= threshold; threshold <= 0 verifies everything. Returns verify_len in [1, gamma + 1].
DSPARK_HD int32_t threshold_verify_len(const float* survival_row, int32_t gamma, double threshold) {
  if (!(threshold > 0.0)) return gamma + 1;
  float prev = 1.0f;
  for (int32_t j = 0; j < gamma; ++j) {
    const float c = survival_row[j] / prev;  // prev > 0: a zero would have stopped the walk already
    if (static_cast<double>(c) < threshold) return j + 1;
    prev = survival_row[j];
  }
  return gamma + 1;
}

}  // namespace dspark
