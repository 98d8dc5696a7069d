// SPDX-License-Identifier: Apache-2.0
// Checks of rejection_sample shared by the CPU and CUDA launchers. The metadata checks never read data;
// check_rejection_sample_values reads it and therefore runs on CPU only (on CUDA it would sync).
#pragma once
#include "checks/logits_value_flags.h"
#include "torch_checks.h"

namespace dspark {

inline void check_optional_per_request(const at::Tensor& ref, const c10::optional<at::Tensor>& t,
                                       const char* name, at::ScalarType dtype, int64_t R) {
  constexpr const char* op = "rejection_sample";
  if (!t.has_value()) return;
  check_dim(op, *t, name, 1);
  check_dtype(op, *t, name, dtype);
  TORCH_CHECK_VALUE(t->size(0) == R, "dspark::rejection_sample: ", name,
                    " must have one entry per request (R = ", R, "), got ", t->size(0));
  check_same_device(op, ref, "target_logits", *t, name);
}

inline void check_rejection_sample_args(
    const at::Tensor& target_logits, const at::Tensor& qo_indptr,
    const c10::optional<at::Tensor>& draft_logits, const at::Tensor& draft_tokens,
    const at::Tensor& verify_len, const at::Tensor& temperature, const c10::optional<at::Tensor>& request_ids,
    const c10::optional<at::Tensor>& top_k, const c10::optional<at::Tensor>& top_p,
    const c10::optional<at::Tensor>& repetition_penalty, const c10::optional<at::Tensor>& penalty_tokens,
    const c10::optional<at::Tensor>& penalty_indptr, const c10::optional<at::Tensor>& draft_one_hot) {
  constexpr const char* op = "rejection_sample";
  check_dim(op, target_logits, "target_logits", 2);
  check_float_dtype(op, target_logits, "target_logits");
  check_dim(op, draft_tokens, "draft_tokens", 2);
  check_dtype(op, draft_tokens, "draft_tokens", at::kLong);
  // R, gamma, V from draft_logits; without it (every draft a deterministic proposal) R, gamma from
  // draft_tokens and V from target_logits
  int64_t R = draft_tokens.size(0), G = draft_tokens.size(1);
  if (draft_logits.has_value()) {
    check_dim(op, *draft_logits, "draft_logits", 3);
    check_dtype(op, *draft_logits, "draft_logits", at::kFloat);
    R = draft_logits->size(0);
    G = draft_logits->size(1);
    const int64_t V = draft_logits->size(2);
    TORCH_CHECK_VALUE(target_logits.size(1) == V,
                      "dspark::rejection_sample: target_logits must be [T, V] with V = ", V,
                      " (draft_logits' vocabulary), got ", target_logits.sizes());
    TORCH_CHECK_VALUE(draft_tokens.size(0) == R && draft_tokens.size(1) == G,
                      "dspark::rejection_sample: draft_tokens must be [R, gamma] = [", R, ", ", G, "], got ",
                      draft_tokens.sizes());
    check_same_device(op, target_logits, "target_logits", *draft_logits, "draft_logits");
  }
  TORCH_CHECK_VALUE(G + 1 <= 0xFFFF,
                    "dspark::rejection_sample: at most 65534 draft positions, got gamma = ", G);
  check_dim(op, qo_indptr, "qo_indptr", 1);
  check_dtype(op, qo_indptr, "qo_indptr", at::kInt);
  TORCH_CHECK_VALUE(qo_indptr.size(0) == R + 1,
                    "dspark::rejection_sample: qo_indptr must have R + 1 = ", R + 1, " entries, got ",
                    qo_indptr.size(0));
  check_dim(op, verify_len, "verify_len", 1);
  check_dtype(op, verify_len, "verify_len", at::kInt);
  TORCH_CHECK_VALUE(verify_len.size(0) == R,
                    "dspark::rejection_sample: verify_len must have one entry per request (R = ", R,
                    "), got ", verify_len.size(0));
  check_dim(op, temperature, "temperature", 1);
  check_dtype(op, temperature, "temperature", at::kFloat);
  TORCH_CHECK_VALUE(temperature.size(0) == R,
                    "dspark::rejection_sample: temperature must have one entry per request (R = ", R,
                    "), got ", temperature.size(0));
  check_same_device(op, target_logits, "target_logits", draft_tokens, "draft_tokens");
  check_same_device(op, target_logits, "target_logits", qo_indptr, "qo_indptr");
  check_same_device(op, target_logits, "target_logits", verify_len, "verify_len");
  check_same_device(op, target_logits, "target_logits", temperature, "temperature");
  check_optional_per_request(target_logits, request_ids, "request_ids", at::kLong, R);
  check_optional_per_request(target_logits, top_k, "top_k", at::kLong, R);
  check_optional_per_request(target_logits, top_p, "top_p", at::kFloat, R);
  check_optional_per_request(target_logits, repetition_penalty, "repetition_penalty", at::kFloat, R);
  check_optional_per_request(target_logits, draft_one_hot, "draft_one_hot", at::kBool, R);
  TORCH_CHECK_VALUE(penalty_tokens.has_value() == penalty_indptr.has_value(),
                    "dspark::rejection_sample: penalty_tokens and penalty_indptr must be given together");
  if (penalty_tokens.has_value()) {
    TORCH_CHECK_VALUE(repetition_penalty.has_value(),
                      "dspark::rejection_sample: penalty_tokens needs repetition_penalty");
    check_dim(op, *penalty_tokens, "penalty_tokens", 1);
    check_dtype(op, *penalty_tokens, "penalty_tokens", at::kLong);
    check_dim(op, *penalty_indptr, "penalty_indptr", 1);
    check_dtype(op, *penalty_indptr, "penalty_indptr", at::kLong);
    TORCH_CHECK_VALUE(penalty_indptr->size(0) == R + 1,
                      "dspark::rejection_sample: penalty_indptr must have R + 1 = ", R + 1, " entries, got ",
                      penalty_indptr->size(0));
    check_same_device(op, target_logits, "target_logits", *penalty_tokens, "penalty_tokens");
    check_same_device(op, target_logits, "target_logits", *penalty_indptr, "penalty_indptr");
  }
}

// Data checks (CPU only). Only the rows the op reads are checked for NaN / +inf.
inline void check_rejection_sample_values(
    const at::Tensor& target_logits, const at::Tensor& qo_indptr,
    const c10::optional<at::Tensor>& draft_logits, const at::Tensor& draft_tokens,
    const at::Tensor& verify_len, const at::Tensor& temperature, const c10::optional<at::Tensor>& request_ids,
    const c10::optional<at::Tensor>& top_k, const c10::optional<at::Tensor>& top_p,
    const c10::optional<at::Tensor>& repetition_penalty, const c10::optional<at::Tensor>& penalty_tokens,
    const c10::optional<at::Tensor>& penalty_indptr, const c10::optional<at::Tensor>& draft_one_hot) {
  const int64_t R = draft_tokens.size(0), G = draft_tokens.size(1), V = target_logits.size(1);
  const int64_t T = target_logits.size(0);
  const auto qo = qo_indptr.contiguous();
  const auto vl = verify_len.contiguous();
  const int32_t* qp = qo.data_ptr<int32_t>();
  const int32_t* lp = vl.data_ptr<int32_t>();
  TORCH_CHECK_VALUE(qp[0] == 0, "dspark::rejection_sample: qo_indptr[0] must be 0, got ", qp[0]);
  for (int64_t r = 0; r < R; ++r) {
    TORCH_CHECK_VALUE(lp[r] >= 1 && lp[r] <= G + 1, "dspark::rejection_sample: verify_len[", r, "] = ", lp[r],
                      " is outside [1, gamma + 1] = [1, ", G + 1, "]");
    TORCH_CHECK_VALUE(qp[r + 1] - qp[r] == lp[r], "dspark::rejection_sample: qo_indptr must give request ", r,
                      " exactly verify_len[", r, "] = ", lp[r], " rows, got ", qp[r + 1] - qp[r]);
  }
  TORCH_CHECK_VALUE(qp[R] <= T, "dspark::rejection_sample: qo_indptr[R] = ", qp[R],
                    " exceeds the target_logits rows T = ", T);
  const auto t = temperature.contiguous();
  const float* tp = t.data_ptr<float>();
  for (int64_t r = 0; r < R; ++r) {
    TORCH_CHECK_VALUE(std::isfinite(tp[r]) && tp[r] >= 0.f, "dspark::rejection_sample: temperature[", r,
                      "] must be finite and >= 0 (0 = greedy), got ", tp[r]);
  }
  const auto dt = draft_tokens.contiguous();
  const int64_t* dp = dt.data_ptr<int64_t>();
  for (int64_t r = 0; r < R; ++r) {
    for (int64_t k = 0; k + 1 < lp[r]; ++k) {
      TORCH_CHECK_VALUE(dp[r * G + k] >= 0 && dp[r * G + k] < V, "dspark::rejection_sample: draft_tokens[", r,
                        ", ", k, "] = ", dp[r * G + k], " is outside the vocabulary [0, ", V, ")");
    }
  }
  if (request_ids.has_value()) {
    const auto ids = request_ids->contiguous();
    const int64_t* ip = ids.data_ptr<int64_t>();
    for (int64_t r = 0; r < R; ++r) {
      TORCH_CHECK_VALUE(ip[r] >= 0 && ip[r] <= 0xFFFFFFFFll, "dspark::rejection_sample: request_ids[", r,
                        "] = ", ip[r], " is outside [0, 2^32)");
    }
  }
  if (top_p.has_value()) {
    const auto x = top_p->contiguous();
    const float* xp = x.data_ptr<float>();
    for (int64_t r = 0; r < R; ++r) {
      TORCH_CHECK_VALUE(xp[r] > 0.f && xp[r] <= 1.f, "dspark::rejection_sample: top_p[", r,
                        "] must be in (0, 1], got ", xp[r]);
    }
  }
  if (repetition_penalty.has_value()) {
    const auto x = repetition_penalty->contiguous();
    const float* xp = x.data_ptr<float>();
    for (int64_t r = 0; r < R; ++r) {
      TORCH_CHECK_VALUE(std::isfinite(xp[r]) && xp[r] > 0.f, "dspark::rejection_sample: repetition_penalty[",
                        r, "] must be finite and > 0, got ", xp[r]);
    }
  }
  if (penalty_tokens.has_value()) {
    const auto ptr = penalty_indptr->contiguous();
    const auto tok = penalty_tokens->contiguous();
    const int64_t* pp = ptr.data_ptr<int64_t>();
    const int64_t* tkp = tok.data_ptr<int64_t>();
    TORCH_CHECK_VALUE(
        pp[0] == 0 && pp[R] <= tok.numel(),
        "dspark::rejection_sample: penalty_indptr must start at 0 and end within penalty_tokens (",
        tok.numel(), " tokens)");
    for (int64_t r = 0; r < R; ++r) {
      TORCH_CHECK_VALUE(pp[r + 1] >= pp[r],
                        "dspark::rejection_sample: penalty_indptr must be non-decreasing");
    }
    for (int64_t i = 0; i < pp[R]; ++i) {
      TORCH_CHECK_VALUE(tkp[i] >= 0 && tkp[i] < V, "dspark::rejection_sample: penalty_tokens[", i,
                        "] = ", tkp[i], " is outside the vocabulary [0, ", V, ")");
    }
  }
  // NaN / +inf in the rows that are read (the verify rows; the draft rows), one pass without temporaries
  if (qp[R] > 0 && V > 0) {
    const int flags = logits_value_flags(target_logits.narrow(0, 0, qp[R]));
    TORCH_CHECK_VALUE(!(flags & 3),
                      "dspark::rejection_sample: target_logits contains NaN or +inf in a verify row");
    TORCH_CHECK_VALUE(!(flags & 4),
                      "dspark::rejection_sample: every verify row of target_logits needs a finite entry");
  }
  // the draft rows of requests with deterministic proposals are never read: every run of other requests is
  // scanned (all of it when draft_one_hot is not given)
  const auto oh = draft_one_hot.has_value() ? draft_one_hot->contiguous() : at::Tensor();
  const bool* ohp = oh.defined() ? oh.data_ptr<bool>() : nullptr;
  if (!draft_logits.has_value()) {
    for (int64_t r = 0; ohp != nullptr && r < R; ++r) {
      TORCH_CHECK_VALUE(ohp[r], "dspark::rejection_sample: draft_one_hot[", r,
                        "] is False but draft_logits is None (no q for request ", r,
                        "); pass draft_logits or set draft_one_hot[", r, "]");
    }
  } else if (R > 0 && G > 0 && V > 0) {
    for (int64_t r = 0; r < R;) {
      if (ohp != nullptr && ohp[r]) {
        ++r;
        continue;
      }
      int64_t end = r + 1;
      while (end < R && !(ohp != nullptr && ohp[end])) ++end;
      TORCH_CHECK_VALUE(!(logits_value_flags(draft_logits->narrow(0, r, end - r)) & 3),
                        "dspark::rejection_sample: draft_logits contains NaN or +inf (in a request without "
                        "draft_one_hot)");
      r = end;
    }
  }
}

}  // namespace dspark
