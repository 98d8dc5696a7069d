// SPDX-License-Identifier: Apache-2.0
// CPU markov_sample_from_hidden: U = hidden · lm_headᵀ in fp32 (inputs widened exactly, one matmul), then the
// CPU markov_sample on U. The CPU op is the reference composition; the fusion that pays is the CUDA kernel's
// (include/dspark/kernels/markov_sample_from_hidden.cuh), which also keeps U in fp32.
#include "checks/markov_sample_from_hidden.h"

#include <ATen/ATen.h>
#include <torch/library.h>

#include "markov_sample_impl.h"

namespace dspark {

// hidden [R, g, H], lm_head [V, H], anchor [R] i64, w1/w2 [V, r], temperature [R] f32
//   -> tokens [R, g] i64, draft_logits [R, g, V] f32, prev_emb [R, g, r] f32
std::tuple<at::Tensor, at::Tensor, at::Tensor> markov_sample_from_hidden_cpu(
    const at::Tensor& hidden, const at::Tensor& lm_head, const at::Tensor& anchor, const at::Tensor& w1,
    const at::Tensor& w2, const at::Tensor& temperature, int64_t seed, int64_t offset,
    const c10::optional<at::Tensor>& request_ids, const c10::optional<at::Tensor>& round_offset) {
  constexpr const char* op = "markov_sample_from_hidden";
  check_markov_sample_from_hidden_args(hidden, lm_head, anchor, w1, w2, temperature, request_ids,
                                       round_offset);
  const int64_t R = hidden.size(0), G = hidden.size(1), H = hidden.size(2), V = lm_head.size(0);
  check_markov_draft_values(op, V, anchor, temperature, request_ids);
  const at::Tensor u =
      at::matmul(hidden.reshape({R * G, H}).to(at::kFloat), lm_head.to(at::kFloat).t()).view({R, G, V});
  check_markov_logit_values(op, u, "hidden · lm_headᵀ");
  const auto off = static_cast<int64_t>(philox_offset(offset, round_offset).value());
  return markov_sample_cpu_checked(u, anchor, w1, w2, temperature, seed, off, request_ids);
}

}  // namespace dspark

TORCH_LIBRARY_IMPL(dspark, CPU, m) {
  m.impl("markov_sample_from_hidden", &dspark::markov_sample_from_hidden_cpu);
}
