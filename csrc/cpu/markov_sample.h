// SPDX-License-Identifier: Apache-2.0
// The CPU markov_sample for ops that compose it (markov_sample_from_hidden).
#pragma once
#include <ATen/ATen.h>

#include <tuple>

namespace dspark {

// markov_sample on CPU without its argument and value checks: the caller has made them (shapes, dtypes,
// devices, anchors in range, finite temperatures, base_logits free of NaN / +inf).
std::tuple<at::Tensor, at::Tensor, at::Tensor> markov_sample_cpu_checked(
    const at::Tensor& base_logits, const at::Tensor& anchor, const at::Tensor& w1, const at::Tensor& w2,
    const at::Tensor& temperature, int64_t seed, int64_t offset,
    const c10::optional<at::Tensor>& request_ids);

}  // namespace dspark
