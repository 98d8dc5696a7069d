// SPDX-License-Identifier: Apache-2.0
// The CPU and CUDA markov_sample, for ops that compose it (markov_sample_from_hidden).
#pragma once
#include <ATen/ATen.h>

#include <tuple>

#include "dspark/philox.h"

namespace dspark {

// The op's Philox offset: `offset`, plus round_offset[0] where given ((1,) int64 on the op's device, checked
// by check_markov_draft_args), read where the op runs: on CUDA by the kernels, so that a CUDA graph replays
// the op with a round counter it refills.
inline PhiloxOffset philox_offset(int64_t offset, const c10::optional<at::Tensor>& round_offset) {
  return {static_cast<uint64_t>(offset),
          round_offset.has_value() ? round_offset->data_ptr<int64_t>() : nullptr};
}

// base_logits [R, g, V], anchor [R] i64, w1/w2 [V, r], temperature [R] f32
//   -> tokens [R, g] i64, draft_logits [R, g, V] f32, prev_emb [R, g, r] f32

// On CPU without its argument and value checks: the caller has made them (shapes, dtypes, devices, anchors in
// range, finite temperatures, base_logits free of NaN / +inf).
std::tuple<at::Tensor, at::Tensor, at::Tensor> markov_sample_cpu_checked(
    const at::Tensor& base_logits, const at::Tensor& anchor, const at::Tensor& w1, const at::Tensor& w2,
    const at::Tensor& temperature, int64_t seed, int64_t offset,
    const c10::optional<at::Tensor>& request_ids);

// On CUDA (defined in CUDA builds only), with its checks.
std::tuple<at::Tensor, at::Tensor, at::Tensor> markov_sample_cuda(
    const at::Tensor& base_logits, const at::Tensor& anchor, const at::Tensor& w1, const at::Tensor& w2,
    const at::Tensor& temperature, int64_t seed, int64_t offset, const c10::optional<at::Tensor>& request_ids,
    const c10::optional<at::Tensor>& round_offset);

}  // namespace dspark
