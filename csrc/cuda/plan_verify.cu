// SPDX-License-Identifier: Apache-2.0
// CUDA plan_verify: per-request verify lengths from survival and an SPS table (modes: full, threshold,
// early_stop = paper Algorithm 1, lagged_topk = budget from an earlier round + top-K of this round); the same
// plan as the CPU op (kernels: include/dspark/kernels/plan_verify.cuh).
#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include "checks/plan_verify.h"
#include "dspark/kernels/plan_verify.cuh"

namespace dspark {

// survival [R, g] f32, lagged_survival [R, g] f32 or None, sps_tokens [n] i64, sps_rate [n] f64 (cuda)
//   -> verify_len [R] i32 in [1, g + 1], budget [] i64 (drafts admitted; K itself for lagged_topk)
// Fixed output shapes, no host sync. Only metadata is checked: the CPU op's value checks (survival in [0, 1]
// and non-increasing, sps_tokens strictly increasing, sps_rate finite and > 0) need the data on the host and
// are CPU-only; on CUDA such inputs give an unspecified (but memory-safe) plan.
std::tuple<at::Tensor, at::Tensor> plan_verify_cuda(const at::Tensor& survival,
                                                    const c10::optional<at::Tensor>& lagged_survival,
                                                    const at::Tensor& sps_tokens, const at::Tensor& sps_rate,
                                                    c10::string_view mode_name, double threshold) {
  const PlanMode mode = parse_plan_mode(std::string_view(mode_name.data(), mode_name.size()));
  check_plan_verify_meta(survival, lagged_survival, sps_tokens, sps_rate, mode);
  TORCH_CHECK_VALUE(!std::isnan(threshold), "dspark::plan_verify: threshold is NaN");
  const c10::cuda::CUDAGuard guard(survival.device());
  const int64_t R = survival.size(0), G = survival.size(1);
  const auto s = survival.contiguous();
  const bool lagged_mode = mode == kPlanLaggedTopK;
  const at::Tensor lag = lagged_mode ? lagged_survival->contiguous() : at::Tensor();
  const auto tok = sps_tokens.contiguous();
  const auto rate = sps_rate.contiguous();

  auto verify_len = at::empty({R}, s.options().dtype(at::kInt));
  auto budget = at::empty({}, s.options().dtype(at::kLong));
  // Workspace of the ranked modes past one CTA's shared memory: per-candidate rank of this round, survivals
  // in planner order.
  const bool ranked = (mode == kPlanEarlyStop || lagged_mode) && R * G > kernels::kPlanOneBlockSlots;
  at::Tensor rank, sorted, sorted_lagged;
  if (ranked) {
    rank = at::empty({R * G}, s.options().dtype(at::kInt));
    sorted = at::empty({R * G}, s.options());
    if (lagged_mode) sorted_lagged = at::empty({R * G}, s.options());
  }
  const cudaError_t status = kernels::PlanVerify<float>(
      s.data_ptr<float>(), lagged_mode ? lag.data_ptr<float>() : nullptr, R, static_cast<int32_t>(G),
      tok.data_ptr<int64_t>(), rate.data_ptr<double>(), tok.numel(), static_cast<int32_t>(mode), threshold,
      ranked ? rank.data_ptr<int32_t>() : nullptr, ranked ? sorted.data_ptr<float>() : nullptr,
      ranked && lagged_mode ? sorted_lagged.data_ptr<float>() : nullptr, verify_len.data_ptr<int32_t>(),
      budget.data_ptr<int64_t>(), c10::cuda::getCurrentCUDAStream());
  TORCH_CHECK(status == cudaSuccess,
              "dspark::plan_verify: CUDA kernel launch failed: ", cudaGetErrorString(status));
  return {verify_len, budget};
}

}  // namespace dspark

TORCH_LIBRARY_IMPL(dspark, CUDA, m) { m.impl("plan_verify", &dspark::plan_verify_cuda); }
