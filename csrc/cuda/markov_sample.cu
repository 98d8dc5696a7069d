// SPDX-License-Identifier: Apache-2.0
// CUDA markov_sample (kernels: include/dspark/kernels/markov_sample.cuh, markov_sample_mma.cuh).
// Value checks that read data (anchor range, temperature >= 0, NaN logits) are CPU-only: on CUDA they would
// sync with the host.
#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <cstdint>

#include "checks/markov_sample.h"
#include "cuda/tensor_cores.h"
#include "dspark/kernels/markov_sample_mma.cuh"
#include "markov_sample_impl.h"

namespace dspark {
namespace {

// The tensor-core kernel for bf16 / fp16 tables with rank % 16 == 0 and a 4-byte aligned W2 where
// tensor_cores_allowed; otherwise the CUDA-core kernel (bit-equal to the CPU op).
bool use_tensor_cores(const at::Tensor& w1, const at::Tensor& w2) {
  if (w1.scalar_type() != at::kBFloat16 && w1.scalar_type() != at::kHalf) return false;
  if (w1.size(1) % 16 != 0 || reinterpret_cast<uintptr_t>(w2.data_ptr()) % 4 != 0) return false;
  return tensor_cores_allowed(w1.get_device());
}

template <typename TU>
void launch_mma(const at::Tensor& u, const at::Tensor& anchor, const at::Tensor& w1, const at::Tensor& w2,
                const at::Tensor& temperature, const at::Tensor& ids, at::Tensor& tokens, at::Tensor& z,
                at::Tensor& prev_emb, at::Tensor& part_key, at::Tensor& part_idx, int64_t seed,
                PhiloxOffset offset) {
  const int64_t R = z.size(0), G = z.size(1), V = z.size(2), rank = w1.size(1);
  const auto* w1p = reinterpret_cast<const uint16_t*>(w1.data_ptr());
  const auto* w2p = reinterpret_cast<const uint16_t*>(w2.data_ptr());
  auto* kernel = w1.scalar_type() == at::kBFloat16 ? kernels::MarkovSampleMma<TU, true>
                                                   : kernels::MarkovSampleMma<TU, false>;
  const cudaError_t status =
      kernel(reinterpret_cast<const TU*>(u.data_ptr()), anchor.data_ptr<int64_t>(), w1p, w2p,
             temperature.data_ptr<float>(), ids.defined() ? ids.data_ptr<int64_t>() : nullptr,
             tokens.data_ptr<int64_t>(), z.data_ptr<float>(), prev_emb.data_ptr<float>(),
             part_key.data_ptr<float>(), part_idx.data_ptr<int64_t>(), R, G, V, rank,
             static_cast<uint64_t>(seed), offset, 0, c10::cuda::getCurrentCUDAStream());
  TORCH_CHECK(status == cudaSuccess,
              "dspark::markov_sample: CUDA kernel launch failed: ", cudaGetErrorString(status));
}

template <typename TU, typename TW>
void launch(const at::Tensor& u, const at::Tensor& anchor, const at::Tensor& w1, const at::Tensor& w2,
            const at::Tensor& temperature, const at::Tensor& ids, at::Tensor& tokens, at::Tensor& z,
            at::Tensor& prev_emb, at::Tensor& part_key, at::Tensor& part_idx, int64_t seed,
            PhiloxOffset offset) {
  const int64_t R = z.size(0), G = z.size(1), V = z.size(2), rank = w1.size(1);
  const cudaError_t status = kernels::MarkovSample<TU, TW>(
      reinterpret_cast<const TU*>(u.data_ptr()), anchor.data_ptr<int64_t>(),
      reinterpret_cast<const TW*>(w1.data_ptr()), reinterpret_cast<const TW*>(w2.data_ptr()),
      temperature.data_ptr<float>(), ids.defined() ? ids.data_ptr<int64_t>() : nullptr,
      tokens.data_ptr<int64_t>(), z.data_ptr<float>(), prev_emb.data_ptr<float>(), part_key.data_ptr<float>(),
      part_idx.data_ptr<int64_t>(), R, G, V, rank, static_cast<uint64_t>(seed), offset,
      c10::cuda::getCurrentCUDAStream());
  TORCH_CHECK(status == cudaSuccess,
              "dspark::markov_sample: CUDA kernel launch failed: ", cudaGetErrorString(status));
}

template <typename TU>
void dispatch_w(const at::Tensor& u, const at::Tensor& anchor, const at::Tensor& w1, const at::Tensor& w2,
                const at::Tensor& temperature, const at::Tensor& ids, at::Tensor& tokens, at::Tensor& z,
                at::Tensor& prev_emb, at::Tensor& pk, at::Tensor& pi, int64_t seed, PhiloxOffset offset,
                bool tc) {
  if (tc)
    return launch_mma<TU>(u, anchor, w1, w2, temperature, ids, tokens, z, prev_emb, pk, pi, seed, offset);
  switch (w1.scalar_type()) {
    case at::kFloat:
      return launch<TU, float>(u, anchor, w1, w2, temperature, ids, tokens, z, prev_emb, pk, pi, seed,
                               offset);
    case at::kBFloat16:
      return launch<TU, __nv_bfloat16>(u, anchor, w1, w2, temperature, ids, tokens, z, prev_emb, pk, pi, seed,
                                       offset);
    default:
      return launch<TU, __half>(u, anchor, w1, w2, temperature, ids, tokens, z, prev_emb, pk, pi, seed,
                                offset);
  }
}

void run(const at::Tensor& u, const at::Tensor& anchor, const at::Tensor& w1, const at::Tensor& w2,
         const at::Tensor& temperature, const c10::optional<at::Tensor>& request_ids, at::Tensor& tokens,
         at::Tensor& z, at::Tensor& prev_emb, int64_t seed, PhiloxOffset offset) {
  const int64_t R = z.size(0), V = z.size(2);
  const auto a = anchor.contiguous(), t = temperature.contiguous();
  const auto w1c = w1.contiguous(), w2c = w2.contiguous();
  const auto ids = request_ids.has_value() ? request_ids->contiguous() : at::Tensor();
  const bool tc = use_tensor_cores(w1c, w2c) && kernels::MarkovMmaTiles(V) <= 65535;  // grid.y
  const int64_t n_tiles = tc ? kernels::MarkovMmaTiles(V) : (V + kSumLanes - 1) / kSumLanes;
  auto pk = at::empty({R, n_tiles}, z.options());
  auto pi = at::empty({R, n_tiles}, z.options().dtype(at::kLong));
  switch (u.scalar_type()) {
    case at::kFloat:
      return dispatch_w<float>(u, a, w1c, w2c, t, ids, tokens, z, prev_emb, pk, pi, seed, offset, tc);
    case at::kBFloat16:
      return dispatch_w<__nv_bfloat16>(u, a, w1c, w2c, t, ids, tokens, z, prev_emb, pk, pi, seed, offset, tc);
    default:
      return dispatch_w<__half>(u, a, w1c, w2c, t, ids, tokens, z, prev_emb, pk, pi, seed, offset, tc);
  }
}

}  // namespace

// base_logits [R, g, V], anchor [R] i64, w1/w2 [V, r], temperature [R] f32 (cuda)
//   -> tokens [R, g] i64, draft_logits [R, g, V] f32, prev_emb [R, g, r] f32
std::tuple<at::Tensor, at::Tensor, at::Tensor> markov_sample_cuda(
    const at::Tensor& base_logits, const at::Tensor& anchor, const at::Tensor& w1, const at::Tensor& w2,
    const at::Tensor& temperature, int64_t seed, int64_t offset, const c10::optional<at::Tensor>& request_ids,
    const c10::optional<at::Tensor>& round_offset) {
  check_markov_sample_args(base_logits, anchor, w1, w2, temperature, request_ids, round_offset);
  const c10::cuda::CUDAGuard guard(base_logits.device());
  const int64_t R = base_logits.size(0), G = base_logits.size(1), V = base_logits.size(2), rank = w1.size(1);
  TORCH_CHECK_VALUE(R <= 65535 * kernels::kMarkovChunk, "dspark::markov_sample: at most ",
                    65535 * kernels::kMarkovChunk, " requests on CUDA, got ", R);
  TORCH_CHECK_VALUE((V + kSumLanes - 1) / kSumLanes <= 65535,
                    "dspark::markov_sample: vocabulary too large for CUDA (", V, ")");
  const auto u = base_logits.contiguous();
  auto opts = u.options().dtype(at::kFloat);
  auto z = at::empty({R, G, V}, opts);
  auto tokens = at::empty({R, G}, opts.dtype(at::kLong));
  auto prev_emb = at::empty({R, G, rank}, opts);
  if (R > 0 && G > 0 && V > 0)
    run(u, anchor, w1, w2, temperature, request_ids, tokens, z, prev_emb, seed,
        philox_offset(offset, round_offset));
  return {tokens, z, prev_emb};
}

}  // namespace dspark

TORCH_LIBRARY_IMPL(dspark, CUDA, m) { m.impl("markov_sample", &dspark::markov_sample_cuda); }
