// SPDX-License-Identifier: Apache-2.0
// Argument checks of plan_verify shared by the CPU and CUDA launchers. Metadata checks never touch data (no
// host sync on CUDA); the value checks run on CPU tensors only.
#pragma once
#include <string_view>

#include "dspark/planner.h"
#include "torch_checks.h"

namespace dspark {

inline PlanMode parse_plan_mode(std::string_view mode) {
  if (mode == "full") return kPlanFull;
  if (mode == "threshold") return kPlanThreshold;
  if (mode == "early_stop") return kPlanEarlyStop;
  if (mode == "lagged_topk") return kPlanLaggedTopK;
  TORCH_CHECK_VALUE(false,
                    "dspark::plan_verify: mode must be one of 'full', 'threshold', 'early_stop', "
                    "'lagged_topk', got '",
                    std::string(mode), "'");
  return kPlanFull;
}

inline void check_plan_verify_meta(const at::Tensor& survival, const c10::optional<at::Tensor>& lagged,
                                   const at::Tensor& sps_tokens, const at::Tensor& sps_rate, PlanMode mode) {
  constexpr const char* op = "plan_verify";
  check_dim(op, survival, "survival", 2);
  check_dtype(op, survival, "survival", at::kFloat);
  TORCH_CHECK_VALUE(survival.size(1) >= 1, "dspark::plan_verify: survival must have gamma >= 1 columns, got ",
                    survival.sizes());
  // tau = R + admitted survivals is an int64 in units of 2^-32 (planner.h): R * (gamma + 1) < 2^31 bounds it.
  TORCH_CHECK_VALUE(survival.size(0) * (survival.size(1) + 1) < (int64_t{1} << 31),
                    "dspark::plan_verify: survival must have R * (gamma + 1) < 2^31, got shape ",
                    survival.sizes());
  if (mode == kPlanLaggedTopK) {
    TORCH_CHECK_VALUE(lagged.has_value(),
                      "dspark::plan_verify: mode 'lagged_topk' needs lagged_survival (the "
                      "survival of an earlier round), got None");
  }
  if (lagged.has_value()) {
    check_dtype(op, *lagged, "lagged_survival", at::kFloat);
    TORCH_CHECK_VALUE(lagged->sizes() == survival.sizes(),
                      "dspark::plan_verify: lagged_survival must have the "
                      "shape of survival ",
                      survival.sizes(), ", got ", lagged->sizes());
    check_same_device(op, survival, "survival", *lagged, "lagged_survival");
  }
  check_dim(op, sps_tokens, "sps_tokens", 1);
  check_dim(op, sps_rate, "sps_rate", 1);
  check_dtype(op, sps_tokens, "sps_tokens", at::kLong);
  check_dtype(op, sps_rate, "sps_rate", at::kDouble);
  TORCH_CHECK_VALUE(
      sps_tokens.numel() >= 1 && sps_tokens.numel() == sps_rate.numel(),
      "dspark::plan_verify: sps_tokens and sps_rate must be non-empty and of equal length, got ",
      sps_tokens.numel(), " and ", sps_rate.numel());
  check_same_device(op, survival, "survival", sps_tokens, "sps_tokens");
  check_same_device(op, survival, "survival", sps_rate, "sps_rate");
}

// Survival rows must lie in [0, 1], hold no NaN and never increase along a row.
inline void check_survival_values(const char* name, const float* s, int64_t R, int64_t G) {
  for (int64_t r = 0; r < R; ++r) {
    float prev = 1.0f;
    for (int64_t j = 0; j < G; ++j) {
      const float v = s[r * G + j];
      TORCH_CHECK_VALUE(v >= 0.f && v <= 1.f, "dspark::plan_verify: ", name, "[", r, ", ", j, "] = ", v,
                        " is not a probability in [0, 1]");
      TORCH_CHECK_VALUE(v <= prev, "dspark::plan_verify: ", name, "[", r, "] increases at position ", j, " (",
                        prev, " -> ", v, "); survival is a cumulative product and must be non-increasing");
      prev = v;
    }
  }
}

inline void check_sps_values(const int64_t* tokens, const double* rate, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    TORCH_CHECK_VALUE(
        tokens[i] >= 1 && (i == 0 || tokens[i] > tokens[i - 1]),
        "dspark::plan_verify: sps_tokens must be strictly increasing positive token counts, got ", tokens[i],
        " at index ", i);
    TORCH_CHECK_VALUE(std::isfinite(rate[i]) && rate[i] > 0.0, "dspark::plan_verify: sps_rate[", i,
                      "] = ", rate[i], " must be a finite rate > 0 (steps per second)");
  }
}

}  // namespace dspark
