// SPDX-License-Identifier: Apache-2.0
// CPU confidence: c = sigmoid((w . [h; e] + b) / T_k + o_k) per draft position and the survival cumprod.
#include "checks/confidence.h"

#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include "dspark/survival.h"

namespace dspark {
namespace {

// Dot product in fp32 with 8 independent partial sums (vectorisable without reassociation flags).
template <typename T>
float dot_f32(const T* x, const float* w, int64_t n) {
  float acc[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    for (int l = 0; l < 8; ++l) acc[l] += static_cast<float>(x[i + l]) * w[i + l];
  }
  for (; i < n; ++i) acc[0] += static_cast<float>(x[i]) * w[i];
  return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

}  // namespace

// hidden [R, g, H], prev_emb [R, g, r], weight [H + r] f32, bias [] f32, sts_temperature [g] f32,
// sts_bias [g] f32 or none (zeros) -> logit, conf, survival: [R, g] f32
std::tuple<at::Tensor, at::Tensor, at::Tensor> confidence_cpu(
    const at::Tensor& hidden, const at::Tensor& prev_emb, const at::Tensor& weight, const at::Tensor& bias,
    const at::Tensor& sts_temperature, const std::optional<at::Tensor>& sts_bias) {
  check_confidence_args(hidden, prev_emb, weight, bias, sts_temperature, sts_bias);
  const int64_t R = hidden.size(0), G = hidden.size(1), H = hidden.size(2), r = prev_emb.size(2);
  const auto h = hidden.contiguous();
  const auto e = prev_emb.to(hidden.scalar_type()).contiguous();
  const auto w = weight.contiguous();
  const auto t = sts_temperature.contiguous();
  const float* tp = t.data_ptr<float>();
  for (int64_t k = 0; k < G; ++k) {
    TORCH_CHECK_VALUE(std::isfinite(tp[k]) && tp[k] > 0.f, "dspark::confidence: sts_temperature[", k,
                      "] must be finite and > 0, got ", tp[k]);
  }
  // no offsets: a null pointer and 0.f, no per-call zeros tensor
  const at::Tensor o = sts_bias.has_value() ? sts_bias->contiguous() : at::Tensor();
  const float* offp = o.defined() ? o.data_ptr<float>() : nullptr;
  for (int64_t k = 0; offp != nullptr && k < G; ++k) {
    TORCH_CHECK_VALUE(std::isfinite(offp[k]), "dspark::confidence: sts_bias[", k, "] must be finite, got ",
                      offp[k]);
  }
  const float b = bias.item<float>();
  auto opts = h.options().dtype(at::kFloat);
  auto logit = at::empty({R, G}, opts), conf = at::empty({R, G}, opts), surv = at::empty({R, G}, opts);
  float* lp = logit.data_ptr<float>();
  float* cp = conf.data_ptr<float>();
  float* sp = surv.data_ptr<float>();
  const float* wp = w.data_ptr<float>();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, h.scalar_type(), "dspark_confidence_cpu", [&] {
    const scalar_t* hp = h.data_ptr<scalar_t>();
    const scalar_t* ep = e.data_ptr<scalar_t>();
    at::parallel_for(0, R, 1, [&](int64_t begin, int64_t end) {
      for (int64_t row = begin; row < end; ++row) {
        for (int64_t k = 0; k < G; ++k) {
          const int64_t rk = row * G + k;
          const float z = dot_f32(hp + rk * H, wp, H) + dot_f32(ep + rk * r, wp + H, r) + b;
          lp[rk] = z;
          cp[rk] = sts_sigmoid(z, tp[k], offp == nullptr ? 0.f : offp[k]);
        }
        survival_row(cp + row * G, sp + row * G, static_cast<int>(G));
      }
    });
  });
  return {logit, conf, surv};
}

}  // namespace dspark

TORCH_LIBRARY_IMPL(dspark, CPU, m) { m.impl("confidence", &dspark::confidence_cpu); }
