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
//
// tau is summed in fixed point, each survival rounded down to a multiple of 2^-32 (survival_fixed): integer
// prefix sums are exact in any order, so a parallel scan (the CUDA kernel) gives the bits of the sequential
// walk (the CPU op), and Theta_i depends on i's prefix alone. Rounding costs < 2^-32 of tau per candidate.
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

// Survival a in [0, 1] in units of 2^-32, rounded down: a * 2^32 is exact in fp64, the cast truncates.
DSPARK_HD int64_t survival_fixed(float a) {
  return static_cast<int64_t>(mul_rn(static_cast<double>(a), 4294967296.0));
}

// tau of R requests with no drafts admitted, in units of 2^-32.
DSPARK_HD int64_t tau_fixed_of_anchors(int64_t num_requests) { return num_requests * 4294967296LL; }

// Theta = tau * SPS(B) for tau in units of 2^-32 (the int64 -> fp64 conversion rounds to nearest; the
// power-of-two scaling is exact).
DSPARK_HD double plan_theta(int64_t tau_fixed, int64_t batch_tokens, const int64_t* tokens,
                            const double* rate, int64_t n_probes) {
  const double tau = mul_rn(static_cast<double>(tau_fixed), 0x1p-32);
  return mul_rn(tau, sps_ceil(tokens, rate, n_probes, batch_tokens));
}

// True when admitting candidate i (0-based, in order) does not strictly improve Theta over admitting the
// first i: Algorithm 1 stops at the first such i. tau_fixed_after = tau with candidates 0..i admitted and
// value_fixed = candidate i's survival_fixed, so the test reads i's prefix alone (a parallel scan's output).
DSPARK_HD bool admission_stops(int64_t tau_fixed_after, int64_t value_fixed, int64_t i, int64_t num_requests,
                               const int64_t* tokens, const double* rate, int64_t n_probes) {
  const double before = plan_theta(tau_fixed_after - value_fixed, num_requests + i, tokens, rate, n_probes);
  const double after = plan_theta(tau_fixed_after, num_requests + i + 1, tokens, rate, n_probes);
  return !(after > before);
}

// Algorithm 1 (paper, p. 8) on an ordered candidate list: admit while Theta strictly improves, stop at the
// first non-improvement. Returns how many leading candidates are admitted. Every admitted candidate improved
// on the one before, so the best Theta so far is the previous one's: the walk stops at the first i with
// admission_stops, and carries Theta instead of recomputing it (the same bits: the same tau and B).
DSPARK_HD int64_t early_stop_admit(const float* sorted_survival, int64_t n, int64_t num_requests,
                                   const int64_t* tokens, const double* rate, int64_t n_probes) {
  int64_t tau = tau_fixed_of_anchors(num_requests);
  double best = plan_theta(tau, num_requests, tokens, rate, n_probes);
  for (int64_t i = 0; i < n; ++i) {
    tau += survival_fixed(sorted_survival[i]);
    const double theta = plan_theta(tau, num_requests + i + 1, tokens, rate, n_probes);
    if (!(theta > best)) return i;
    best = theta;
  }
  return n;
}

// Budget K for lagged top-K: the first argmax of Theta over the whole ordered list (no early stop). Exact
// only because the survivals it reads come from an earlier round, independent of this round's draws.
DSPARK_HD int64_t argmax_budget(const float* sorted_survival, int64_t n, int64_t num_requests,
                                const int64_t* tokens, const double* rate, int64_t n_probes) {
  int64_t tau = tau_fixed_of_anchors(num_requests);
  double best = plan_theta(tau, num_requests, tokens, rate, n_probes);
  int64_t budget = 0;
  for (int64_t i = 0; i < n; ++i) {
    tau += survival_fixed(sorted_survival[i]);
    const double theta = plan_theta(tau, num_requests + i + 1, tokens, rate, n_probes);
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
