// SPDX-License-Identifier: Apache-2.0
// Checks of markov_sample_from_hidden shared by the CPU and CUDA launchers (metadata only: no data read).
#pragma once
#include "checks/markov_sample.h"
#include "torch_checks.h"

namespace dspark {

inline void check_markov_sample_from_hidden_args(const at::Tensor& hidden, const at::Tensor& lm_head,
                                                 const at::Tensor& anchor, const at::Tensor& w1,
                                                 const at::Tensor& w2, const at::Tensor& temperature,
                                                 const c10::optional<at::Tensor>& request_ids,
                                                 const c10::optional<at::Tensor>& round_offset) {
  constexpr const char* op = "markov_sample_from_hidden";
  check_dim(op, hidden, "hidden", 3);
  check_float_dtype(op, hidden, "hidden");
  check_dim(op, lm_head, "lm_head", 2);
  const int64_t R = hidden.size(0), G = hidden.size(1), H = hidden.size(2), V = lm_head.size(0);
  TORCH_CHECK_VALUE(lm_head.size(1) == H, "dspark::", op, ": lm_head must be [V, H] with H = ", H,
                    " (hidden's last dimension), got ", lm_head.sizes());
  TORCH_CHECK_VALUE(lm_head.scalar_type() == hidden.scalar_type(), "dspark::", op,
                    ": lm_head must have hidden's dtype ", dtype_name(hidden.scalar_type()), ", got ",
                    dtype_name(lm_head.scalar_type()));
  check_same_device(op, hidden, "hidden", lm_head, "lm_head");
  check_markov_draft_args(op, hidden, "hidden", R, G, V, anchor, w1, w2, temperature, request_ids,
                          round_offset);
}

}  // namespace dspark
