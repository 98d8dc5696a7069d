// SPDX-License-Identifier: Apache-2.0
// Metadata checks of confidence shared by the CPU and CUDA launchers (no data access: no host sync).
#pragma once
#include "torch_checks.h"

namespace dspark {

inline void check_confidence_args(const at::Tensor& hidden, const at::Tensor& prev_emb,
                                  const at::Tensor& weight, const at::Tensor& bias,
                                  const at::Tensor& sts_temperature,
                                  const std::optional<at::Tensor>& sts_bias) {
  constexpr const char* op = "confidence";
  check_dim(op, hidden, "hidden", 3);
  check_dim(op, prev_emb, "prev_emb", 3);
  check_float_dtype(op, hidden, "hidden");
  check_float_dtype(op, prev_emb, "prev_emb");
  TORCH_CHECK_VALUE(prev_emb.size(0) == hidden.size(0) && prev_emb.size(1) == hidden.size(1),
                    "dspark::confidence: prev_emb must be [R, gamma, r] matching hidden [R, gamma, H] = ",
                    hidden.sizes(), ", got ", prev_emb.sizes());
  check_dim(op, weight, "weight", 1);
  check_dtype(op, weight, "weight", at::kFloat);
  TORCH_CHECK_VALUE(weight.size(0) == hidden.size(2) + prev_emb.size(2),
                    "dspark::confidence: weight must have H + r = ", hidden.size(2) + prev_emb.size(2),
                    " entries (hidden ", hidden.size(2), " + markov rank ", prev_emb.size(2), "), got ",
                    weight.size(0));
  check_dtype(op, bias, "bias", at::kFloat);
  TORCH_CHECK_VALUE(bias.numel() == 1, "dspark::confidence: bias must hold one value, got shape ",
                    bias.sizes());
  check_dim(op, sts_temperature, "sts_temperature", 1);
  check_dtype(op, sts_temperature, "sts_temperature", at::kFloat);
  TORCH_CHECK_VALUE(sts_temperature.size(0) == hidden.size(1),
                    "dspark::confidence: sts_temperature must have one entry per draft position (gamma = ",
                    hidden.size(1), "), got ", sts_temperature.size(0));
  check_same_device(op, hidden, "hidden", prev_emb, "prev_emb");
  check_same_device(op, hidden, "hidden", weight, "weight");
  check_same_device(op, hidden, "hidden", bias, "bias");
  check_same_device(op, hidden, "hidden", sts_temperature, "sts_temperature");
  if (sts_bias.has_value()) {
    check_dim(op, *sts_bias, "sts_bias", 1);
    check_dtype(op, *sts_bias, "sts_bias", at::kFloat);
    TORCH_CHECK_VALUE(sts_bias->size(0) == hidden.size(1),
                      "dspark::confidence: sts_bias must have one entry per draft position (gamma = ",
                      hidden.size(1), "), got ", sts_bias->size(0));
    check_same_device(op, hidden, "hidden", *sts_bias, "sts_bias");
  }
}

}  // namespace dspark
