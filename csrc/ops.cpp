// SPDX-License-Identifier: Apache-2.0
// The one TORCH_LIBRARY(dspark) block (every schema) and the _C Python module (build information).
// Device implementations live in csrc/cpu/<op>.cpp and csrc/cuda/<op>.cu; fakes in python/dspark/ops/<op>.py.
#include <ATen/Parallel.h>
#include <torch/extension.h>
#include <torch/library.h>

#include <mutex>
#include <set>

#include "dspark/attention_plan.h"
#include "dspark/philox.h"

#ifndef DSPARK_CUDA_ARCHS_STR
#define DSPARK_CUDA_ARCHS_STR ""
#endif

TORCH_LIBRARY(dspark, m) {
  // request, position, index: [N] int64 -> uniform [N] f32 in (0, 1), gumbel [N] f32
  m.def(
      "philox_draw(int seed, int offset, Tensor request, Tensor position, int purpose, Tensor index) "
      "-> (Tensor uniform, Tensor gumbel)");
  // hidden [R, g, H], prev_emb [R, g, r], weight [H + r] f32, bias [] f32, sts_temperature [g] f32,
  // sts_bias [g] f32 (none = zeros) -> logit, conf, survival: [R, g] f32
  m.def(
      "confidence(Tensor hidden, Tensor prev_emb, Tensor weight, Tensor bias, Tensor sts_temperature, "
      "Tensor? sts_bias=None) -> (Tensor logit, Tensor conf, Tensor survival)");
  // survival [R, g] f32, lagged_survival [R, g] f32 (lagged_topk only), sps_tokens [n] i64, sps_rate [n] f64
  //   -> verify_len [R] i32 in [1, g + 1], budget [] i64
  m.def(
      "plan_verify(Tensor survival, Tensor? lagged_survival, Tensor sps_tokens, Tensor sps_rate, str mode, "
      "float threshold) -> (Tensor verify_len, Tensor budget)");
  // k, v [T, Hkv, D]; k_cache, v_cache [num_pages, page_size, Hkv, D] written in place at
  // slot_mapping [T] i64 (slot = page * page_size + offset, -1 = skip) -> ()
  m.def(
      "paged_kv_append(Tensor k, Tensor v, Tensor(a!) k_cache, Tensor(b!) v_cache, Tensor slot_mapping) -> "
      "()");
  // q [T, Hq, D]; k_cache, v_cache [num_pages, page_size, Hkv, D]; qo_indptr, kv_indptr [R + 1] i32;
  // kv_indices [nnz_pages] i32; kv_last_page_len [R] i32; split_base [R] i32 (the split plan, computed once
  // per forward by a caller that runs many layers: dspark/attention_plan.h) -> o [T, Hq, D] (dtype of q)
  m.def(
      "paged_verify_attention(Tensor q, Tensor k_cache, Tensor v_cache, Tensor qo_indptr, Tensor kv_indptr, "
      "Tensor kv_indices, Tensor kv_last_page_len, float scale, bool causal, Tensor? split_base=None) -> "
      "Tensor");
  // base_logits [R, g, V] f32/bf16/f16, anchor [R] i64, w1 [V, r], w2 [V, r], temperature [R] f32 (0 =
  // greedy), request_ids [R] i64 (Philox request key; default r), round_offset [1] i64 (added to offset where
  // the op runs: a CUDA graph replays the op with the counter it refills)
  //   -> tokens [R, g] i64, draft_logits [R, g, V] f32 (z = U + W2 W1[x_{k-1}]), prev_emb [R, g, r] f32
  m.def(
      "markov_sample(Tensor base_logits, Tensor anchor, Tensor w1, Tensor w2, Tensor temperature, int seed, "
      "int offset, Tensor? request_ids=None, Tensor? round_offset=None) -> (Tensor tokens, Tensor "
      "draft_logits, "
      "Tensor prev_emb)");
  // hidden [R, g, H] f32/bf16/f16, lm_head [V, H] (hidden's dtype), then as markov_sample with U = hidden ·
  // lm_headᵀ summed in fp32 (never rounded to a 16-bit type)
  //   -> tokens [R, g] i64, draft_logits [R, g, V] f32 (z = U + W2 W1[x_{k-1}]), prev_emb [R, g, r] f32
  m.def(
      "markov_sample_from_hidden(Tensor hidden, Tensor lm_head, Tensor anchor, Tensor w1, Tensor w2, "
      "Tensor temperature, int seed, int offset, Tensor? request_ids=None, Tensor? round_offset=None) -> "
      "(Tensor tokens, Tensor draft_logits, Tensor prev_emb)");
  // target_logits [T, V], qo_indptr [R + 1] i32, draft_logits [R, g, V] f32 or None (every draft a
  // deterministic proposal: q one-hot at it), draft_tokens [R, g] i64, verify_len [R] i32 in [1, g + 1],
  // temperature [R] f32, optional request_ids [R] i64, top_k [R] i64, top_p [R] f32, repetition_penalty [R]
  // f32, penalty_tokens [P] i64, penalty_indptr [R + 1] i64, draft_one_hot [R] bool (request r's drafts are
  // deterministic proposals; its draft_logits rows are not read)
  //   -> accepted [R] i32, out_tokens [R, g + 1] i64 (-1 padded)
  m.def(
      "rejection_sample(Tensor target_logits, Tensor qo_indptr, Tensor? draft_logits, Tensor draft_tokens, "
      "Tensor verify_len, Tensor temperature, int seed, int offset, Tensor? request_ids=None, "
      "Tensor? top_k=None, Tensor? top_p=None, Tensor? repetition_penalty=None, Tensor? penalty_tokens=None, "
      "Tensor? penalty_indptr=None, Tensor? draft_one_hot=None) -> (Tensor accepted, Tensor out_tokens)");
  // x [M, K] f32, weight [N, K] f32, bias [N] f32 or none -> y [M, N] f32 = x · weightᵀ + bias (CPU only:
  // few-row products that read the weight once; CUDA models use cuBLAS through F.linear)
  m.def("few_row_linear(Tensor x, Tensor weight, Tensor? bias=None) -> Tensor");
}

namespace {

pybind11::dict build_info() {
  pybind11::dict info;
  info["version"] = DSPARK_VERSION;
  info["torch_version"] = DSPARK_TORCH_VERSION;
#ifdef DSPARK_WITH_CUDA
  info["cuda"] = true;
#else
  info["cuda"] = false;
#endif
  pybind11::list archs;
  std::string s = DSPARK_CUDA_ARCHS_STR;
  size_t start = 0;
  while (start < s.size()) {
    size_t end = s.find(';', start);
    if (end == std::string::npos) end = s.size();
    if (end > start) archs.append("sm_" + s.substr(start, end - start));
    start = end + 1;
  }
  info["cuda_archs"] = archs;
#ifdef _OPENMP
  info["openmp"] = true;
#else
  info["openmp"] = false;
#endif
  return info;
}

// Distinct threads an at::parallel_for over n items runs on in this library. at::parallel_for is inline code
// around `#pragma omp parallel`, so it follows torch.set_num_threads only when this library itself is
// compiled with OpenMP (otherwise 1: every CPU kernel on one thread).
int64_t parallel_threads(int64_t n) {
  std::mutex mu;
  std::set<int> seen;
  at::parallel_for(0, n, 1, [&](int64_t, int64_t) {
    const std::lock_guard<std::mutex> lock(mu);
    seen.insert(at::get_thread_num());
  });
  return static_cast<int64_t>(seen.size());
}

// Raw Philox4x32-10 block for known-answer tests: counter [4] and key [2] as Python ints.
std::vector<uint32_t> philox4x32_10_py(const std::vector<uint32_t>& ctr, const std::vector<uint32_t>& key) {
  TORCH_CHECK_VALUE(ctr.size() == 4, "philox4x32_10: counter must have 4 words, got ", ctr.size());
  TORCH_CHECK_VALUE(key.size() == 2, "philox4x32_10: key must have 2 words, got ", key.size());
  const dspark::Philox4 out =
      dspark::philox4x32_10(dspark::Philox4{{ctr[0], ctr[1], ctr[2], ctr[3]}}, key[0], key[1]);
  return {out.v[0], out.v[1], out.v[2], out.v[3]};
}

}  // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "dspark C++/CUDA extension: registers the torch.ops.dspark operators";
  m.def("build_info", &build_info, "dspark version, the torch it was built against, and compiled CUDA archs");
  m.def(
      "parallel_threads", &parallel_threads,
      "Distinct threads an at::parallel_for over n items uses in the extension (its CPU kernels' threading)");
  m.def("philox4x32_10", &philox4x32_10_py, "Raw Philox4x32-10 block (counter[4], key[2]) -> 4 words");
  m.attr("pva_split_max_queries") = dspark::kPvaSplitMaxQueries;
}
