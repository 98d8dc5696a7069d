// SPDX-License-Identifier: Apache-2.0
// Metadata checks of philox_draw shared by the CPU and CUDA launchers.
#pragma once
#include "torch_checks.h"

namespace dspark {

inline void check_philox_draw_args(const at::Tensor& request, const at::Tensor& position, int64_t purpose,
                                   const at::Tensor& index) {
  constexpr const char* op = "philox_draw";
  check_dim(op, request, "request", 1);
  check_dim(op, position, "position", 1);
  check_dim(op, index, "index", 1);
  check_dtype(op, request, "request", at::kLong);
  check_dtype(op, position, "position", at::kLong);
  check_dtype(op, index, "index", at::kLong);
  TORCH_CHECK_VALUE(position.numel() == request.numel() && index.numel() == request.numel(),
                    "dspark::philox_draw: request, position and index must have the same length, got ",
                    request.numel(), ", ", position.numel(), ", ", index.numel());
  check_same_device(op, request, "request", position, "position");
  check_same_device(op, request, "request", index, "index");
  TORCH_CHECK_VALUE(purpose >= 0 && purpose <= 0xFFFF,
                    "dspark::philox_draw: purpose must be in [0, 65535], got ", purpose);
}

}  // namespace dspark
