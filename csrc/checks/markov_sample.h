// SPDX-License-Identifier: Apache-2.0
// Checks of markov_sample shared by the CPU and CUDA launchers. The metadata
// checks never read data; check_markov_sample_values reads it and therefore runs on CPU only (on CUDA it
// would sync).
#pragma once
#include "checks/logits_value_flags.h"
#include "torch_checks.h"

namespace dspark {

// The Markov tables, anchors, temperatures and request ids of R requests drafting G slots over V ids, on the
// device of `like` (the op's logits or hidden states, named like_name in errors).
inline void check_markov_draft_args(const char* op, const at::Tensor& like, const char* like_name, int64_t R,
                                    int64_t G, int64_t V, const at::Tensor& anchor, const at::Tensor& w1,
                                    const at::Tensor& w2, const at::Tensor& temperature,
                                    const c10::optional<at::Tensor>& request_ids,
                                    const c10::optional<at::Tensor>& round_offset) {
  check_dim(op, anchor, "anchor", 1);
  check_dtype(op, anchor, "anchor", at::kLong);
  TORCH_CHECK_VALUE(anchor.size(0) == R, "dspark::", op, ": anchor must have one token per request (R = ", R,
                    "), got ", anchor.size(0));
  check_dim(op, w1, "w1", 2);
  check_dim(op, w2, "w2", 2);
  check_float_dtype(op, w1, "w1");
  check_float_dtype(op, w2, "w2");
  TORCH_CHECK_VALUE(w1.size(0) == V, "dspark::", op, ": w1 must be [V, r] with V = ", V, ", got ",
                    w1.sizes());
  TORCH_CHECK_VALUE(w2.sizes() == w1.sizes(), "dspark::", op, ": w2 must be [V, r] = ", w1.sizes(),
                    " (the nn.Linear(r, V) weight layout), got ", w2.sizes());
  TORCH_CHECK_VALUE(w2.scalar_type() == w1.scalar_type(), "dspark::", op, ": w2 must have w1's dtype ",
                    dtype_name(w1.scalar_type()), ", got ", dtype_name(w2.scalar_type()));
  check_dim(op, temperature, "temperature", 1);
  check_dtype(op, temperature, "temperature", at::kFloat);
  TORCH_CHECK_VALUE(temperature.size(0) == R, "dspark::", op,
                    ": temperature must have one entry per request (R = ", R, "), got ", temperature.size(0));
  TORCH_CHECK_VALUE(G <= 0xFFFF, "dspark::", op, ": at most 65535 draft positions, got gamma = ", G);
  check_same_device(op, like, like_name, anchor, "anchor");
  check_same_device(op, like, like_name, w1, "w1");
  check_same_device(op, like, like_name, w2, "w2");
  check_same_device(op, like, like_name, temperature, "temperature");
  if (request_ids.has_value()) {
    check_dim(op, *request_ids, "request_ids", 1);
    check_dtype(op, *request_ids, "request_ids", at::kLong);
    TORCH_CHECK_VALUE(request_ids->size(0) == R, "dspark::", op,
                      ": request_ids must have one entry per request (R = ", R, "), got ",
                      request_ids->size(0));
    check_same_device(op, like, like_name, *request_ids, "request_ids");
  }
  if (round_offset.has_value()) {
    check_dim(op, *round_offset, "round_offset", 1);
    check_dtype(op, *round_offset, "round_offset", at::kLong);
    TORCH_CHECK_VALUE(round_offset->size(0) == 1, "dspark::", op,
                      ": round_offset must hold one counter (shape (1,)), got ", round_offset->sizes());
    check_same_device(op, like, like_name, *round_offset, "round_offset");
  }
}

inline void check_markov_sample_args(const at::Tensor& base_logits, const at::Tensor& anchor,
                                     const at::Tensor& w1, const at::Tensor& w2,
                                     const at::Tensor& temperature,
                                     const c10::optional<at::Tensor>& request_ids,
                                     const c10::optional<at::Tensor>& round_offset) {
  constexpr const char* op = "markov_sample";
  check_dim(op, base_logits, "base_logits", 3);
  check_float_dtype(op, base_logits, "base_logits");
  const int64_t R = base_logits.size(0), G = base_logits.size(1), V = base_logits.size(2);
  check_markov_draft_args(op, base_logits, "base_logits", R, G, V, anchor, w1, w2, temperature, request_ids,
                          round_offset);
}

// Data checks (CPU only): anchors in [0, V), temperatures finite and >= 0, request ids in [0, 2^32).
inline void check_markov_draft_values(const char* op, int64_t V, const at::Tensor& anchor,
                                      const at::Tensor& temperature,
                                      const c10::optional<at::Tensor>& request_ids) {
  const auto a = anchor.contiguous();
  const int64_t* ap = a.data_ptr<int64_t>();
  for (int64_t i = 0; i < a.numel(); ++i) {
    TORCH_CHECK_VALUE(ap[i] >= 0 && ap[i] < V, "dspark::", op, ": anchor[", i, "] = ", ap[i],
                      " is outside the vocabulary [0, ", V, ")");
  }
  const auto t = temperature.contiguous();
  const float* tp = t.data_ptr<float>();
  for (int64_t i = 0; i < t.numel(); ++i) {
    TORCH_CHECK_VALUE(std::isfinite(tp[i]) && tp[i] >= 0.f, "dspark::", op, ": temperature[", i,
                      "] must be finite and >= 0 (0 = greedy), got ", tp[i]);
  }
  if (request_ids.has_value()) {
    const auto ids = request_ids->contiguous();
    const int64_t* ip = ids.data_ptr<int64_t>();
    for (int64_t i = 0; i < ids.numel(); ++i) {
      TORCH_CHECK_VALUE(ip[i] >= 0 && ip[i] <= 0xFFFFFFFFll, "dspark::", op, ": request_ids[", i,
                        "] = ", ip[i], " is outside [0, 2^32)");
    }
  }
}

// Logits free of NaN and +inf (-inf masks a token: it gets probability zero, but a row needs a finite entry).
inline void check_markov_logit_values(const char* op, const at::Tensor& logits, const char* name) {
  if (logits.numel() == 0) return;
  const int flags = logits_value_flags(logits);
  TORCH_CHECK_VALUE(!(flags & 1), "dspark::", op, ": ", name, " contains NaN");
  TORCH_CHECK_VALUE(!(flags & 2), "dspark::", op, ": ", name, " contains +inf");
  TORCH_CHECK_VALUE(!(flags & 4), "dspark::", op, ": every row of ", name,
                    " needs a finite entry (all -inf)");
}

inline void check_markov_sample_values(const at::Tensor& base_logits, const at::Tensor& anchor,
                                       const at::Tensor& temperature,
                                       const c10::optional<at::Tensor>& request_ids) {
  check_markov_draft_values("markov_sample", base_logits.size(2), anchor, temperature, request_ids);
  check_markov_logit_values("markov_sample", base_logits, "base_logits");
}

}  // namespace dspark
