// SPDX-License-Identifier: Apache-2.0
// Host checks of plan_verify's one-CTA CUDA plan, run by scripts/ci_cuda_build.sh on a machine without a GPU.
// On random batches (continuous survivals and survivals from four levels, full of ties):
//   - ascending plan_key order is the planner's order (candidate_precedes), keys decode to (a, r);
//   - the bitonic network of bitonic_exchange, stage by stage as the kernel runs it, sorts the keys;
//   - the parallel forms the kernel evaluates per candidate (admission_stops from its prefix sum; the least
//     index of the greatest plan_theta_key) give early_stop_admit's and argmax_budget's counts.
#include <algorithm>
#include <cstdio>
#include <random>
#include <vector>

#include "dspark/kernels/plan_verify.cuh"

using namespace dspark;
using namespace dspark::kernels;

namespace {

struct Cand {
  float a;
  int32_t j, r;
};

long failures = 0;
void fail(int trial, const char* what) {
  if (++failures <= 10) std::printf("trial %d: %s\n", trial, what);
}

}  // namespace

int main() {
  std::mt19937_64 rng(1234);
  const float levels[] = {0.f, 0.5f, 0.75f, 1.f};
  long checked = 0;
  for (int trial = 0; trial < 3000; ++trial) {
    const int64_t R = 1 + rng() % 300;
    const int32_t G = 1 + static_cast<int32_t>(rng() % 16);
    if (R * G > kPlanOneBlockSlots) continue;
    const bool tied = trial % 2 == 1;
    std::uniform_real_distribution<float> unit(0.f, 1.f);
    std::vector<float> s(static_cast<size_t>(R * G));
    for (int64_t r = 0; r < R; ++r) {
      float run = 1.f;
      for (int32_t j = 0; j < G; ++j) {
        run = run * (tied ? levels[rng() % 4] : (rng() % 8 == 0 ? 0.f : unit(rng)));
        s[r * G + j] = run;
      }
    }
    // The CPU op's order and values.
    std::vector<Cand> c;
    for (int64_t r = 0; r < R; ++r)
      for (int32_t j = 0; j < G; ++j)
        if (s[r * G + j] > 0.f) c.push_back({s[r * G + j], j, static_cast<int32_t>(r)});
    std::sort(c.begin(), c.end(),
              [](const Cand& x, const Cand& y) { return candidate_precedes(x.a, x.j, x.r, y.a, y.j, y.r); });
    // The kernel's: keys for every slot, sorted by the bitonic network.
    int64_t n_pow2 = 1;
    while (n_pow2 < R * G) n_pow2 <<= 1;
    std::vector<uint64_t> keys(static_cast<size_t>(n_pow2), kPlanNoCandidate);
    for (int64_t x = 0; x < R * G; ++x)
      if (s[x] > 0.f) keys[x] = plan_key(s[x], static_cast<int32_t>(x % G), static_cast<int32_t>(x / G), R);
    for (int64_t k = 2; k <= n_pow2; k <<= 1)
      for (int64_t j = k >> 1; j > 0; j >>= 1)
        for (int64_t i = 0; i < n_pow2; ++i) bitonic_exchange(keys.data(), i, k, j);
    const int64_t n = static_cast<int64_t>(c.size());
    for (int64_t i = 0; i < n_pow2; ++i) {
      if (i >= n) {
        if (keys[i] != kPlanNoCandidate) fail(trial, "a non-candidate sorted among the candidates");
        continue;
      }
      if (plan_key_survival(keys[i]) != c[i].a || plan_key_request(keys[i], R) != c[i].r)
        fail(trial, "sorted keys differ from the planner's order");
    }
    // SPS tables: decaying, flat, jagged.
    std::vector<int64_t> tokens;
    std::vector<double> rate;
    const int kind = trial % 3;
    for (int64_t t = 1; t <= 2048; t *= 2) {
      tokens.push_back(t);
      rate.push_back(kind == 1 ? 50.0 : 100.0 / (1.0 + t / (kind == 0 ? 64.0 : 8.0 + (rng() % 64))));
    }
    const int64_t np = static_cast<int64_t>(tokens.size());
    std::vector<float> vals(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) vals[i] = plan_key_survival(keys[i]);
    // Parallel forms, from prefix sums of the fixed-point values.
    int64_t tau = tau_fixed_of_anchors(R), stop = n;
    uint64_t best = plan_theta_key(plan_theta(tau, R, tokens.data(), rate.data(), np));
    int64_t arg = 0;
    std::vector<uint64_t> theta_keys(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) {
      const int64_t v = survival_fixed(vals[i]);
      tau += v;
      if (admission_stops(tau, v, i, R, tokens.data(), rate.data(), np)) stop = std::min(stop, i);
      theta_keys[i] = plan_theta_key(plan_theta(tau, R + i + 1, tokens.data(), rate.data(), np));
      best = std::max(best, theta_keys[i]);
    }
    if (plan_theta_key(plan_theta(tau_fixed_of_anchors(R), R, tokens.data(), rate.data(), np)) != best) {
      arg = n + 1;
      for (int64_t i = n - 1; i >= 0; --i)
        if (theta_keys[i] == best) arg = i + 1;
    }
    if (stop != early_stop_admit(vals.data(), n, R, tokens.data(), rate.data(), np))
      fail(trial, "early_stop: parallel form differs from the walk");
    if (arg != argmax_budget(vals.data(), n, R, tokens.data(), rate.data(), np))
      fail(trial, "lagged_topk budget: parallel form differs from the walk");
    ++checked;
  }
  std::printf("plan_verify one-CTA plan: %ld batches checked, %ld failures\n", checked, failures);
  return failures == 0 && checked > 1000 ? 0 : 1;
}
