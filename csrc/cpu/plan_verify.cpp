// SPDX-License-Identifier: Apache-2.0
// CPU plan_verify: per-request verify lengths from survival and an SPS table (modes: full, threshold,
// early_stop = paper Algorithm 1, lagged_topk = budget from an earlier round + top-K of this round).
#include "checks/plan_verify.h"

#include <torch/library.h>

#include <algorithm>
#include <vector>

namespace dspark {
namespace {

struct Candidate {
  float a;
  int32_t j;
  int32_t r;
};

// Valid candidates (a > 0) of one survival matrix in the planner's total order.
std::vector<Candidate> sorted_candidates(const float* s, int64_t R, int64_t G) {
  std::vector<Candidate> c;
  c.reserve(static_cast<size_t>(R * G));
  for (int64_t r = 0; r < R; ++r) {
    for (int64_t j = 0; j < G; ++j) {
      const float a = s[r * G + j];
      if (!(a > 0.f)) break;  // rows are non-increasing: the rest of the row is zero too
      c.push_back({a, static_cast<int32_t>(j), static_cast<int32_t>(r)});
    }
  }
  std::sort(c.begin(), c.end(), [](const Candidate& x, const Candidate& y) {
    return candidate_precedes(x.a, x.j, x.r, y.a, y.j, y.r);
  });
  return c;
}

std::vector<float> values_of(const std::vector<Candidate>& c) {
  std::vector<float> v(c.size());
  for (size_t i = 0; i < c.size(); ++i) v[i] = c[i].a;
  return v;
}

}  // namespace

// survival [R, g] f32, lagged_survival [R, g] f32 or None, sps_tokens [n] i64, sps_rate [n] f64
//   -> verify_len [R] i32 in [1, g + 1], budget [] i64 (drafts admitted; K itself for lagged_topk)
std::tuple<at::Tensor, at::Tensor> plan_verify_cpu(const at::Tensor& survival,
                                                   const c10::optional<at::Tensor>& lagged_survival,
                                                   const at::Tensor& sps_tokens, const at::Tensor& sps_rate,
                                                   c10::string_view mode_name, double threshold) {
  const PlanMode mode = parse_plan_mode(std::string_view(mode_name.data(), mode_name.size()));
  check_plan_verify_meta(survival, lagged_survival, sps_tokens, sps_rate, mode);
  TORCH_CHECK_VALUE(!std::isnan(threshold), "dspark::plan_verify: threshold is NaN");
  const int64_t R = survival.size(0), G = survival.size(1);
  const auto s = survival.contiguous();
  const auto tok = sps_tokens.contiguous();
  const auto rate = sps_rate.contiguous();
  const float* sp = s.data_ptr<float>();
  const int64_t* tp = tok.data_ptr<int64_t>();
  const double* rp = rate.data_ptr<double>();
  const int64_t n_probes = tok.numel();
  check_survival_values("survival", sp, R, G);
  check_sps_values(tp, rp, n_probes);

  auto verify_len = at::empty({R}, s.options().dtype(at::kInt));
  int32_t* out = verify_len.data_ptr<int32_t>();
  int64_t budget = 0;
  switch (mode) {
    case kPlanFull:
      std::fill(out, out + R, static_cast<int32_t>(G + 1));
      budget = R * G;
      break;
    case kPlanThreshold:
      for (int64_t r = 0; r < R; ++r) {
        out[r] = threshold_verify_len(sp + r * G, static_cast<int32_t>(G), threshold);
        budget += out[r] - 1;
      }
      break;
    case kPlanEarlyStop:
    case kPlanLaggedTopK: {
      const auto cand = sorted_candidates(sp, R, G);
      int64_t take = 0;
      if (mode == kPlanEarlyStop) {
        const auto vals = values_of(cand);
        take = early_stop_admit(vals.data(), static_cast<int64_t>(vals.size()), R, tp, rp, n_probes);
        budget = take;
      } else {
        const auto lag = lagged_survival->contiguous();
        const float* lp = lag.data_ptr<float>();
        check_survival_values("lagged_survival", lp, R, G);
        const auto lag_vals = values_of(sorted_candidates(lp, R, G));
        budget = argmax_budget(lag_vals.data(), static_cast<int64_t>(lag_vals.size()), R, tp, rp, n_probes);
        take = std::min<int64_t>(budget, static_cast<int64_t>(cand.size()));
      }
      std::fill(out, out + R, 1);
      for (int64_t i = 0; i < take; ++i) out[cand[i].r] += 1;
      break;
    }
  }
  return {verify_len, at::scalar_tensor(budget, s.options().dtype(at::kLong))};
}

}  // namespace dspark

TORCH_LIBRARY_IMPL(dspark, CPU, m) { m.impl("plan_verify", &dspark::plan_verify_cpu); }
