// SPDX-License-Identifier: Apache-2.0
// CUDA markov_sample_from_hidden (kernel: include/dspark/kernels/markov_sample_from_hidden.cuh). Where the
// fused tensor-core kernel does not apply (fp32, H % 8 or rank % 16 not 0, rows off 16-byte alignment,
// tensor cores switched off or absent), U = hidden · lm_headᵀ goes through cuBLAS in fp32 and then the CUDA
// markov_sample: the same values up to the order of the sums, at the cost of fp32 copies of the operands.
#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <cstdint>

#include "checks/markov_sample_from_hidden.h"
#include "cuda/tensor_cores.h"
#include "dspark/kernels/markov_sample_from_hidden.cuh"
#include "markov_sample_impl.h"

namespace dspark {
namespace {

bool aligned16(const at::Tensor& t) { return reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0; }

bool use_fused(const at::Tensor& h, const at::Tensor& lm, const at::Tensor& w1, const at::Tensor& w2) {
  const auto dt = h.scalar_type();
  if (dt != at::kBFloat16 && dt != at::kHalf) return false;
  if (w1.scalar_type() != dt || h.size(2) % 8 != 0 || w1.size(1) % 16 != 0) return false;
  if (!aligned16(h) || !aligned16(lm) || !aligned16(w1) || !aligned16(w2)) return false;
  return tensor_cores_allowed(h.get_device()) && kernels::MarkovMmaTiles(lm.size(0)) <= 65535;  // grid.y
}

}  // namespace

// hidden [R, g, H], lm_head [V, H], anchor [R] i64, w1/w2 [V, r], temperature [R] f32 (cuda)
//   -> tokens [R, g] i64, draft_logits [R, g, V] f32, prev_emb [R, g, r] f32
std::tuple<at::Tensor, at::Tensor, at::Tensor> markov_sample_from_hidden_cuda(
    const at::Tensor& hidden, const at::Tensor& lm_head, const at::Tensor& anchor, const at::Tensor& w1,
    const at::Tensor& w2, const at::Tensor& temperature, int64_t seed, int64_t offset,
    const c10::optional<at::Tensor>& request_ids, const c10::optional<at::Tensor>& round_offset) {
  check_markov_sample_from_hidden_args(hidden, lm_head, anchor, w1, w2, temperature, request_ids,
                                       round_offset);
  const c10::cuda::CUDAGuard guard(hidden.device());
  const int64_t R = hidden.size(0), G = hidden.size(1), H = hidden.size(2), V = lm_head.size(0);
  const auto h = hidden.contiguous(), lm = lm_head.contiguous(), w1c = w1.contiguous(), w2c = w2.contiguous();
  if (!use_fused(h, lm, w1c, w2c)) {
    const at::Tensor u =
        at::matmul(h.reshape({R * G, H}).to(at::kFloat), lm.to(at::kFloat).t()).view({R, G, V});
    return markov_sample_cuda(u, anchor, w1c, w2c, temperature, seed, offset, request_ids, round_offset);
  }
  const int64_t rank = w1.size(1), n_tiles = kernels::MarkovMmaTiles(V);
  auto opts = h.options().dtype(at::kFloat);
  auto z = at::empty({R, G, V}, opts);
  auto tokens = at::empty({R, G}, opts.dtype(at::kLong));
  auto prev_emb = at::empty({R, G, rank}, opts);
  auto part_key = at::empty({R, n_tiles}, opts);
  auto part_idx = at::empty({R, n_tiles}, opts.dtype(at::kLong));
  const auto a = anchor.contiguous(), t = temperature.contiguous();
  const auto ids = request_ids.has_value() ? request_ids->contiguous() : at::Tensor();
  const auto bits = [](const at::Tensor& x) { return reinterpret_cast<const uint16_t*>(x.data_ptr()); };
  auto* launch = h.scalar_type() == at::kBFloat16 ? kernels::MarkovSampleFromHiddenMma<true>
                                                  : kernels::MarkovSampleFromHiddenMma<false>;
  const cudaError_t status = launch(
      bits(h), bits(lm), a.data_ptr<int64_t>(), bits(w1c), bits(w2c), t.data_ptr<float>(),
      ids.defined() ? ids.data_ptr<int64_t>() : nullptr, tokens.data_ptr<int64_t>(), z.data_ptr<float>(),
      prev_emb.data_ptr<float>(), part_key.data_ptr<float>(), part_idx.data_ptr<int64_t>(), R, G, V, H, rank,
      static_cast<uint64_t>(seed), philox_offset(offset, round_offset), c10::cuda::getCurrentCUDAStream());
  TORCH_CHECK(status == cudaSuccess,
              "dspark::markov_sample_from_hidden: CUDA kernel launch failed: ", cudaGetErrorString(status));
  return {tokens, z, prev_emb};
}

}  // namespace dspark

TORCH_LIBRARY_IMPL(dspark, CUDA, m) {
  m.impl("markov_sample_from_hidden", &dspark::markov_sample_from_hidden_cuda);
}
