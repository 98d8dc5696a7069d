// SPDX-License-Identifier: Apache-2.0
// Metadata checks of few_row_linear (no data access).
#pragma once
#include "torch_checks.h"

namespace dspark {

inline void check_few_row_linear_args(const at::Tensor& x, const at::Tensor& weight,
                                      const std::optional<at::Tensor>& bias) {
  constexpr const char* op = "few_row_linear";
  check_dim(op, x, "x", 2);
  check_dim(op, weight, "weight", 2);
  check_dtype(op, x, "x", at::kFloat);
  check_dtype(op, weight, "weight", at::kFloat);
  TORCH_CHECK_VALUE(x.size(1) == weight.size(1),
                    "dspark::few_row_linear: x must be [M, K] with K = weight's ", weight.size(1),
                    " columns (weight [N, K] = ", weight.sizes(), "), got ", x.sizes());
  check_same_device(op, x, "x", weight, "weight");
  if (bias.has_value()) {
    check_dim(op, *bias, "bias", 1);
    check_dtype(op, *bias, "bias", at::kFloat);
    TORCH_CHECK_VALUE(bias->size(0) == weight.size(0),
                      "dspark::few_row_linear: bias must be [N] with N = ", weight.size(0), ", got ",
                      bias->sizes());
    check_same_device(op, x, "x", *bias, "bias");
  }
}

}  // namespace dspark
