// SPDX-License-Identifier: Apache-2.0
// CUDA rejection_sample (kernels: include/dspark/kernels/rejection_sample.cuh, rejection_sample_greedy.cuh,
// rejection_sample_split.cuh).
// Value checks that read data (verify_len range, qo_indptr consistency, temperatures, token ranges, NaN
// logits) are CPU-only: on CUDA they would sync with the host; the kernel trusts them.
#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdlib>

#include "checks/rejection_sample.h"
#include "cuda/tensor_cores.h"
#include "dspark/kernels/rejection_sample_split.cuh"

namespace dspark {
namespace {

// The one-block-per-request kernel alone when DSPARK_CUDA_REJECTION_SPLIT=0 (read per call, for
// comparisons); otherwise greedy requests take the vocabulary-split greedy kernels and sampled requests the
// vocabulary-split sampled kernels, for every batch size: the batch runs in chunks of requests whose per-row
// workspace fits a budget, so which kernels sample a request depends on (G, V) alone, never on R (contract
// C2; the split top-p threshold is summed in fixed point, the one-block kernel's is not). Every choice gives
// the CPU op's tokens, except that split top-p threshold (rejection_sample_split.cuh: contract C4).
bool split_fits(int64_t G, int64_t V) { return G + 1 <= 65535 && V < (int64_t{1} << 32); }

// Requests per launch of the split kernels: their [2, n, G + 1, V] fp32 workspace within
// DSPARK_CUDA_REJECTION_WS_BYTES (default 1 GiB: R = 64 verify rows of 8 at V = 151,936 take 622 MB in one
// launch), and at most 65535 (grid.y).
int64_t chunk_requests(int64_t G, int64_t V) {
  int64_t budget = int64_t{1} << 30;
  if (const char* env = std::getenv("DSPARK_CUDA_REJECTION_WS_BYTES")) budget = std::atoll(env);
  return std::clamp<int64_t>(budget / (2 * (G + 1) * V * 4), 1, 65535);
}

// Buffers of the vocabulary-split sampled kernels (kernels::SampledWork), kept alive for the call.
struct SampledBuffers {
  at::Tensor chunk_max, hist, mass_hist, sums, stop, best;
  kernels::SampledWork work{};
};

SampledBuffers sampled_buffers(int64_t R, int64_t G, int64_t V, bool top_k, bool top_p,
                               const at::TensorOptions& o) {
  SampledBuffers b;
  if (top_k) {
    b.hist = at::empty({R, G + 1, 4, kernels::kRadixBins}, o.dtype(at::kInt));
    b.work.hist = reinterpret_cast<uint32_t*>(b.hist.data_ptr<int32_t>());
  }
  if (top_p) {
    b.mass_hist = at::empty({R, G + 1, 4, kernels::kRadixBins}, o.dtype(at::kLong));
    b.work.mass_hist = reinterpret_cast<unsigned long long*>(b.mass_hist.data_ptr<int64_t>());
  }
  b.work.chunks = kernels::VocabChunks(V);
  b.chunk_max = at::empty({R, G + 1, b.work.chunks, 2}, o.dtype(at::kInt));
  b.sums = at::empty({R, G + 1, 2}, o.dtype(at::kFloat));
  b.stop = at::empty({R, 2}, o.dtype(at::kInt));
  b.best = at::empty({R, 2}, o.dtype(at::kLong));
  b.work.chunk_max = reinterpret_cast<uint32_t*>(b.chunk_max.data_ptr<int32_t>());
  b.work.sums = b.sums.data_ptr<float>();
  b.work.stop = b.stop.data_ptr<int32_t>();
  b.work.best = reinterpret_cast<uint64_t*>(b.best.data_ptr<int64_t>());
  return b;
}

// best defined: greedy requests to the greedy split kernels; sampled non-null: the sampled requests to the
// sampled split kernels, else to the one-block-per-request kernel.
template <typename TL>
cudaError_t launch(const TL* target, kernels::RejectionParams& p, int64_t R, const at::Tensor& best,
                   const kernels::SampledWork* sampled, cudaStream_t stream) {
  p.greedy_elsewhere = best.defined();
  const cudaError_t status = sampled != nullptr
                                 ? kernels::RejectionSampleSampledSplit<TL>(target, p, R, *sampled, stream)
                                 : kernels::RejectionSample<TL>(target, p, R, stream);
  if (status != cudaSuccess || !best.defined()) return status;
  return kernels::RejectionSampleGreedy<TL>(target, p, R,
                                            reinterpret_cast<uint64_t*>(best.data_ptr<int64_t>()), stream);
}

}  // namespace

// target_logits [T, V], qo_indptr [R + 1] i32, draft_logits [R, g, V] f32 or None (deterministic proposals),
// draft_tokens [R, g] i64, verify_len [R] i32, temperature [R] f32, optional processors and draft_one_hot [R]
// bool (cuda; with draft_logits None every request is taken as deterministic)
//   -> accepted [R] i32, out_tokens [R, g + 1] i64
std::tuple<at::Tensor, at::Tensor> rejection_sample_cuda(
    const at::Tensor& target_logits, const at::Tensor& qo_indptr,
    const c10::optional<at::Tensor>& draft_logits, const at::Tensor& draft_tokens,
    const at::Tensor& verify_len, const at::Tensor& temperature, int64_t seed, int64_t offset,
    const c10::optional<at::Tensor>& request_ids, const c10::optional<at::Tensor>& top_k,
    const c10::optional<at::Tensor>& top_p, const c10::optional<at::Tensor>& repetition_penalty,
    const c10::optional<at::Tensor>& penalty_tokens, const c10::optional<at::Tensor>& penalty_indptr,
    const c10::optional<at::Tensor>& draft_one_hot) {
  check_rejection_sample_args(target_logits, qo_indptr, draft_logits, draft_tokens, verify_len, temperature,
                              request_ids, top_k, top_p, repetition_penalty, penalty_tokens, penalty_indptr,
                              draft_one_hot);
  const c10::cuda::CUDAGuard guard(target_logits.device());
  const int64_t R = draft_tokens.size(0), G = draft_tokens.size(1), V = target_logits.size(1);
  TORCH_CHECK_VALUE(R <= 0x7FFFFFFF, "dspark::rejection_sample: at most 2^31 - 1 requests on CUDA, got ", R);
  auto accepted = at::zeros({R}, draft_tokens.options().dtype(at::kInt));
  auto out = at::full({R, G + 1}, -1, draft_tokens.options());
  if (R == 0 || V == 0) return {accepted, out};
  const auto tl = target_logits.contiguous();
  const auto dt = draft_tokens.contiguous();
  const auto qo = qo_indptr.contiguous(), vl = verify_len.contiguous(), tt = temperature.contiguous();
  auto opt = [](const c10::optional<at::Tensor>& t) {
    return t.has_value() ? t->contiguous() : at::Tensor();
  };
  const auto ids = opt(request_ids), tk = opt(top_k), tp = opt(top_p), pen = opt(repetition_penalty);
  const auto ptok = opt(penalty_tokens), pptr = opt(penalty_indptr);
  const auto zl = opt(draft_logits), oh = opt(draft_one_hot);
  const bool split = !switched_off("DSPARK_CUDA_REJECTION_SPLIT") && split_fits(G, V);
  const int64_t chunk = split ? chunk_requests(G, V) : R;
  // Philox keys by request: without request_ids a request's key is its index, which a later chunk's launch
  // would count from 0, so a chunked batch gets the indices as ids
  const at::Tensor keys = ids.defined() || R <= chunk ? ids : at::arange(R, dt.options());
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  for (int64_t r0 = 0; r0 < R; r0 += chunk) {
    const int64_t n = std::min(chunk, R - r0);
    // y and w per request (one-block kernel), or per verify row (split kernels)
    auto ws = split ? at::empty({2, n, G + 1, V}, tl.options().dtype(at::kFloat))
                    : at::empty({2, n, V}, tl.options().dtype(at::kFloat));
    kernels::RejectionParams p;
    p.qo_indptr = qo.data_ptr<int32_t>() + r0;  // absolute row indices into target_logits
    p.draft_logits = zl.defined() ? zl.data_ptr<float>() + r0 * G * V : nullptr;
    p.draft_one_hot = oh.defined() ? oh.data_ptr<bool>() + r0 : nullptr;
    p.draft_tokens = dt.data_ptr<int64_t>() + r0 * G;
    p.verify_len = vl.data_ptr<int32_t>() + r0;
    p.temperature = tt.data_ptr<float>() + r0;
    p.request_ids = keys.defined() ? keys.data_ptr<int64_t>() + r0 : nullptr;
    p.top_k = tk.defined() ? tk.data_ptr<int64_t>() + r0 : nullptr;
    p.top_p = tp.defined() ? tp.data_ptr<float>() + r0 : nullptr;
    p.penalty = pen.defined() ? pen.data_ptr<float>() + r0 : nullptr;
    p.penalty_tokens = ptok.defined() ? ptok.data_ptr<int64_t>() : nullptr;  // indexed by penalty_indptr
    p.penalty_indptr = pptr.defined() ? pptr.data_ptr<int64_t>() + r0 : nullptr;
    p.ws_y = ws[0].data_ptr<float>();
    p.ws_w = ws[1].data_ptr<float>();
    p.accepted = accepted.data_ptr<int32_t>() + r0;
    p.out_tokens = out.data_ptr<int64_t>() + r0 * (G + 1);
    p.G = G;
    p.V = V;
    p.seed = static_cast<uint64_t>(seed);
    p.offset = static_cast<uint64_t>(offset);
    // [n, g + 1, chunks] packed (value, id) maxima of the greedy rows; the sampled rows' buffers
    const at::Tensor best =
        split ? at::empty({n, G + 1, kernels::VocabChunks(V)}, dt.options()) : at::Tensor();
    SampledBuffers sampled;
    if (split) sampled = sampled_buffers(n, G, V, tk.defined(), tp.defined(), dt.options());
    const kernels::SampledWork* sw = split ? &sampled.work : nullptr;
    cudaError_t status;
    switch (tl.scalar_type()) {
      case at::kFloat:
        status = launch<float>(tl.data_ptr<float>(), p, n, best, sw, stream);
        break;
      case at::kBFloat16:
        status = launch<__nv_bfloat16>(reinterpret_cast<const __nv_bfloat16*>(tl.data_ptr()), p, n, best, sw,
                                       stream);
        break;
      default:
        status = launch<__half>(reinterpret_cast<const __half*>(tl.data_ptr()), p, n, best, sw, stream);
    }
    TORCH_CHECK(status == cudaSuccess,
                "dspark::rejection_sample: CUDA kernel launch failed: ", cudaGetErrorString(status));
  }
  return {accepted, out};
}

}  // namespace dspark

TORCH_LIBRARY_IMPL(dspark, CUDA, m) { m.impl("rejection_sample", &dspark::rejection_sample_cuda); }
