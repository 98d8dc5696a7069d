// SPDX-License-Identifier: Apache-2.0
// CPU rejection_sample: exact speculative verification (DESIGN.md §4.2) with target-side processors.
// Per request, row by row: p from the processed target row, q = softmax(z / T) from the draft row; accept
// x_i iff u_i * q(x_i) < p(x_i); on the first rejection a residual draw from (p - q)+; after a fully accepted
// prefix a bonus draw from p at the last verified row. Rows after a rejection are never processed. Requests
// with deterministic proposals (draft_one_hot, or no draft_logits at all) have q one-hot at x_i, never
// materialised: accept iff u_i < p(x_i), the residual is p with x_i excluded. The math (exp, sums, threshold
// search, accept tests, keys, argmax) is include/dspark/sampling.h, shared with the CUDA kernel.
#include "checks/rejection_sample.h"

#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <vector>

#include "dspark/sampling.h"
#include "rejection_sample_avx512.h"

// target_logits' dtypes (float32, bfloat16, float16; checked before dispatch)
#define DSPARK_DISPATCH_LOGITS(TYPE, NAME, ...)                                                             \
  AT_DISPATCH_SWITCH(TYPE, NAME,                                                                            \
                     AT_DISPATCH_CASE(at::kFloat, __VA_ARGS__) AT_DISPATCH_CASE(at::kBFloat16, __VA_ARGS__) \
                         AT_DISPATCH_CASE(at::kHalf, __VA_ARGS__))

namespace dspark {
namespace {

// Fixed-order lane sum of f(i) over i in [0, n) (see sampling.h).
template <typename F>
float lane_sum(int64_t n, F f) {
  float lanes[kSumLanes];
  for (int l = 0; l < kSumLanes; ++l) lanes[l] = 0.f;
  int64_t base = 0;
  for (; base + kSumLanes <= n; base += kSumLanes) {
    for (int l = 0; l < kSumLanes; ++l) lanes[l] = add_rn(lanes[l], f(base + l));
  }
  for (int l = 0; base + l < n; ++l) lanes[l] = add_rn(lanes[l], f(base + l));
  return lane_tree(lanes);
}

struct RequestParams {
  float temperature;
  int64_t top_k;  // <= 0 or >= V: off
  float top_p;    // 1: off
  float penalty;  // 1: off
  const int64_t* penalty_tokens;
  int64_t n_penalty;
  uint32_t request;
};

// y[t] = the penalised raw logit of every token seen before this row: the context plus the accepted drafts.
template <typename scalar_t>
void apply_penalty(const scalar_t* logits, const RequestParams& rp, const int64_t* drafts_before,
                   int64_t n_drafts_before, float* y) {
  for (int64_t j = 0; j < rp.n_penalty; ++j) {
    const int64_t t = rp.penalty_tokens[j];
    y[t] = repetition_penalize(static_cast<float>(logits[t]), rp.penalty);
  }
  for (int64_t j = 0; j < n_drafts_before; ++j) {
    const int64_t t = drafts_before[j];
    y[t] = repetition_penalize(static_cast<float>(logits[t]), rp.penalty);
  }
}

// Target row -> y (penalised logits, / T when sampling). Returns the argmax of y (ties: lowest index); when
// sampling also fills w with the processed, normalised probabilities p (0 outside the top-k / top-p set).
template <typename scalar_t>
int64_t target_row(const scalar_t* logits, int64_t V, const RequestParams& rp, const int64_t* drafts_before,
                   int64_t n_drafts_before, float* y, float* w) {
  for (int64_t i = 0; i < V; ++i) y[i] = static_cast<float>(logits[i]);
  if (rp.penalty != 1.0f) apply_penalty(logits, rp, drafts_before, n_drafts_before, y);
  const bool greedy = rp.temperature == 0.0f;
  if (!greedy) {
    for (int64_t i = 0; i < V; ++i) y[i] = div_rn(y[i], rp.temperature);
  }
  int64_t arg = 0;
  for (int64_t i = 1; i < V; ++i) {
    if (y[i] > y[arg]) arg = i;
  }
  if (greedy) return arg;
  const float m = y[arg];
  const uint32_t key_lo = ordered_key(-INFINITY), key_hi = ordered_key(m);
  float thr = -INFINITY;
  if (rp.top_k > 0 && rp.top_k < V) {  // HF TopK: keep y >= the k-th largest value (ties kept)
    const uint32_t k = search_key(key_lo, key_hi, [&](float v) {
      int64_t c = 0;
      for (int64_t i = 0; i < V; ++i) c += y[i] > v;
      return c < rp.top_k;
    });
    thr = key_to_float(k);
  }
  for (int64_t i = 0; i < V; ++i) w[i] = y[i] >= thr ? exp_exact(add_rn(y[i], -m)) : 0.0f;
  if (rp.top_p < 1.0f) {  // keep the value classes whose strictly-higher mass is < top_p
    const float target = mul_rn(rp.top_p, lane_sum(V, [&](int64_t i) { return w[i]; }));
    const uint32_t k = search_key(key_lo, key_hi, [&](float v) {
      return lane_sum(V, [&](int64_t i) { return y[i] > v ? w[i] : 0.0f; }) < target;
    });
    const float thr_p = key_to_float(k);
    for (int64_t i = 0; i < V; ++i) {
      if (!(y[i] >= thr_p)) w[i] = 0.0f;
    }
  }
  const float s = lane_sum(V, [&](int64_t i) { return w[i]; });
  for (int64_t i = 0; i < V; ++i) w[i] = div_rn(w[i], s);
  return arg;
}

#if DSPARK_HAVE_AVX512_PATH
// target_row with AVX-512 vocabulary passes (same values: see rejection_sample_avx512.h).
template <typename scalar_t>
DSPARK_AVX512 int64_t target_row_avx512(const scalar_t* logits, int64_t V, const RequestParams& rp,
                                        const int64_t* drafts_before, int64_t n_drafts_before, float* y,
                                        float* w) {
  using namespace avx512;
  const bool greedy = rp.temperature == 0.0f, penal = rp.penalty != 1.0f;
  load_row(logits, V, !greedy && !penal, rp.temperature, y);
  if (penal) {
    apply_penalty(logits, rp, drafts_before, n_drafts_before, y);
    if (!greedy) divide_row(y, V, rp.temperature);
  }
  const int64_t arg = argmax_row(y, V);
  if (greedy) return arg;
  const float m = y[arg];
  const uint32_t key_lo = ordered_key(-INFINITY), key_hi = ordered_key(m);
  float thr = -INFINITY;
  if (rp.top_k > 0 && rp.top_k < V) {
    // the lambdas only call the vector helpers (they cannot hold AVX-512 code themselves)
    thr =
        key_to_float(search_key(key_lo, key_hi, [&](float v) { return count_greater(y, V, v) < rp.top_k; }));
  }
  exp_row(y, V, m, thr, w);
  if (rp.top_p < 1.0f) {
    const float target = mul_rn(rp.top_p, sum_row(w, V));
    const uint32_t k =
        search_key(key_lo, key_hi, [&](float v) { return sum_where_greater(y, w, V, v, false) < target; });
    zero_below(y, w, V, key_to_float(k));
  }
  divide_row(w, V, sum_row(w, V));
  return arg;
}
#endif

// The vector path's entry points (only called when avx512::enabled()).
template <typename scalar_t>
int64_t target_row_simd(const scalar_t* logits, int64_t V, const RequestParams& rp,
                        const int64_t* drafts_before, int64_t n_drafts_before, float* y, float* w) {
#if DSPARK_HAVE_AVX512_PATH
  return target_row_avx512(logits, V, rp, drafts_before, n_drafts_before, y, w);
#else
  return target_row(logits, V, rp, drafts_before, n_drafts_before, y, w);
#endif
}

// e = exp(z / T - max z / T) of a draft row; returns its lane sum (q = e / sum).
float draft_exp_simd(const float* z, int64_t V, float temperature, float* e) {
#if DSPARK_HAVE_AVX512_PATH
  return avx512::exp_scaled_row(z, V, temperature, avx512::max_scaled(z, V, temperature), e);
#else
  TORCH_CHECK(false, "dspark rejection_sample: no vector path in this build");
#endif
}

// Residual draw from (w - e / sq)+ with the vector path (e == nullptr: from w with id `exclude` left out, the
// residual of a deterministic proposal); -1 when no weight is positive.
int64_t draw_residual_simd(const float* w, const float* e, float sq, int64_t exclude, int64_t V,
                           uint64_t seed, uint64_t offset, uint32_t request, uint32_t pos) {
#if DSPARK_HAVE_AVX512_PATH
  return avx512::gumbel_draw_row(V, w, e, sq, exclude, seed, offset, request, pos);
#else
  TORCH_CHECK(false, "dspark rejection_sample: no vector path in this build");
#endif
}

// Gumbel-max draw from weights wt(i) >= 0 (only wt > 0 can win); -1 when every weight is 0.
template <typename W>
int64_t gumbel_draw(int64_t V, W wt, uint64_t seed, uint64_t offset, uint32_t request, uint32_t position) {
  KeyIdx best{-INFINITY, -1};
  for (int64_t i = 0; i < V; ++i) {
    const float x = wt(i);
    if (!(x > 0.0f)) continue;
    best = best_of(best, KeyIdx{residual_key(x, seed, offset, request, position, i), i});
  }
  return best.idx;
}

}  // namespace

// target_logits [T, V], qo_indptr [R + 1] i32, draft_logits [R, g, V] f32 or None (every draft a
// deterministic proposal), draft_tokens [R, g] i64, verify_len [R] i32, temperature [R] f32, optional
// per-request request_ids i64 / top_k i64 / top_p f32 / repetition_penalty f32, penalty_tokens [P] i64 +
// penalty_indptr [R + 1] i64, draft_one_hot [R] bool (request r's drafts are deterministic proposals; its
// draft rows unread)
//   -> accepted [R] i32, out_tokens [R, g + 1] i64 (-1 padded)
std::tuple<at::Tensor, at::Tensor> rejection_sample_cpu(
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
  check_rejection_sample_values(target_logits, qo_indptr, draft_logits, draft_tokens, verify_len, temperature,
                                request_ids, top_k, top_p, repetition_penalty, penalty_tokens, penalty_indptr,
                                draft_one_hot);
  const int64_t R = draft_tokens.size(0), G = draft_tokens.size(1), V = target_logits.size(1);
  auto accepted = at::zeros({R}, draft_tokens.options().dtype(at::kInt));
  auto out = at::full({R, G + 1}, -1, draft_tokens.options());
  if (R == 0) return {accepted, out};
  const auto tl = target_logits.contiguous();
  const auto zl = draft_logits.has_value() ? draft_logits->contiguous() : at::Tensor();
  const auto oh = draft_one_hot.has_value() ? draft_one_hot->contiguous() : at::Tensor();
  const auto dt = draft_tokens.contiguous();
  const auto qo = qo_indptr.contiguous();
  const auto vl = verify_len.contiguous();
  const auto tt = temperature.contiguous();
  const auto ids = request_ids.has_value() ? request_ids->contiguous() : at::Tensor();
  const auto tk = top_k.has_value() ? top_k->contiguous() : at::Tensor();
  const auto tp = top_p.has_value() ? top_p->contiguous() : at::Tensor();
  const auto rpn = repetition_penalty.has_value() ? repetition_penalty->contiguous() : at::Tensor();
  const auto ptok = penalty_tokens.has_value() ? penalty_tokens->contiguous() : at::Tensor();
  const auto pptr = penalty_indptr.has_value() ? penalty_indptr->contiguous() : at::Tensor();
  const float* zp = zl.defined() ? zl.data_ptr<float>() : nullptr;
  const bool* ohp = oh.defined() ? oh.data_ptr<bool>() : nullptr;
  const int64_t* dp = dt.data_ptr<int64_t>();
  const int32_t* qp = qo.data_ptr<int32_t>();
  const int32_t* lp = vl.data_ptr<int32_t>();
  int32_t* accp = accepted.data_ptr<int32_t>();
  int64_t* outp = out.data_ptr<int64_t>();
  const uint64_t s = static_cast<uint64_t>(seed), o = static_cast<uint64_t>(offset);
  const bool simd = avx512::enabled();
  // the bonus draw (and the residual's fallback) from p = w
  auto draw_p = [&](const float* w, uint32_t request, uint32_t pos) -> int64_t {
#if DSPARK_HAVE_AVX512_PATH
    if (simd) return avx512::gumbel_draw_row(V, w, nullptr, 0.0f, -1, s, o, request, pos);
#endif
    return gumbel_draw(V, [&](int64_t j) { return w[j]; }, s, o, request, pos);
  };
  DSPARK_DISPATCH_LOGITS(tl.scalar_type(), "dspark_rejection_sample_cpu", [&] {
    const scalar_t* tlp = tl.data_ptr<scalar_t>();
    at::parallel_for(0, R, 1, [&](int64_t begin, int64_t end) {
      std::vector<float> y(V), w(V), e(simd ? V : 0);  // e: exp of the draft row (vector path)
      for (int64_t r = begin; r < end; ++r) {
        RequestParams rp;
        rp.temperature = tt.data_ptr<float>()[r];
        rp.top_k = tk.defined() ? tk.data_ptr<int64_t>()[r] : 0;
        rp.top_p = tp.defined() ? tp.data_ptr<float>()[r] : 1.0f;
        rp.penalty = rpn.defined() ? rpn.data_ptr<float>()[r] : 1.0f;
        rp.penalty_tokens = nullptr;
        rp.n_penalty = 0;
        if (ptok.defined()) {
          const int64_t* pp = pptr.data_ptr<int64_t>();
          rp.penalty_tokens = ptok.data_ptr<int64_t>() + pp[r];
          rp.n_penalty = pp[r + 1] - pp[r];
        }
        rp.request = static_cast<uint32_t>(ids.defined() ? ids.data_ptr<int64_t>()[r] : r);
        const bool greedy = rp.temperature == 0.0f;
        const bool one_hot = zp == nullptr || (ohp != nullptr && ohp[r]);  // deterministic proposals
        const int64_t n = lp[r];
        const int64_t* drafts = dp + r * G;
        int64_t* emit = outp + r * (G + 1);
        int32_t n_acc = 0;
        for (int64_t i = 0; i < n; ++i) {
          const scalar_t* row = tlp + (static_cast<int64_t>(qp[r]) + i) * V;
          const int64_t arg = simd ? target_row_simd(row, V, rp, drafts, i, y.data(), w.data())
                                   : target_row(row, V, rp, drafts, i, y.data(), w.data());
          const uint32_t pos = static_cast<uint32_t>(i);
          if (i == n - 1) {  // every verified draft accepted: bonus from p at the last verified row
            emit[i] = greedy ? arg : draw_p(w.data(), rp.request, pos);
            break;
          }
          const int64_t x = drafts[i];
          if (greedy) {
            if (arg == x) {
              emit[i] = x;
              ++n_acc;
              continue;
            }
            emit[i] = arg;
            break;
          }
          const float u = philox_uniform(s, o, rp.request, pos, kPurposeAccept, 0);
          if (one_hot) {  // q one-hot at x: accept iff u < p(x), else a draw from p without x
            if (accept_proposal(u, w[x])) {
              emit[i] = x;
              ++n_acc;
              continue;
            }
            int64_t c = simd ? draw_residual_simd(w.data(), nullptr, 0.0f, x, V, s, o, rp.request, pos)
                             : gumbel_draw(
                                   V, [&](int64_t j) { return proposal_residual_weight(w[j], j, x); }, s, o,
                                   rp.request, pos);
            if (c < 0) c = draw_p(w.data(), rp.request, pos);  // p is all at x: from p
            emit[i] = c;
            break;
          }
          // q = softmax(z / T) of the draft row: q_j = exp(z_j / T - mq) / sq
          const float* z = zp + (r * G + i) * V;
          float mq = -INFINITY, sq;
          if (simd) {
            sq = draft_exp_simd(z, V, rp.temperature, e.data());  // keeps the exps in e
          } else {
            for (int64_t j = 0; j < V; ++j) mq = std::max(mq, div_rn(z[j], rp.temperature));
            sq = lane_sum(V, [&](int64_t j) { return draft_weight(z[j], rp.temperature, mq); });
          }
          auto q_at = [&](int64_t j) {
            return div_rn(simd ? e[j] : draft_weight(z[j], rp.temperature, mq), sq);
          };
          if (accept_draft(u, q_at(x), w[x])) {
            emit[i] = x;
            ++n_acc;
            continue;
          }
          int64_t c =
              simd ? draw_residual_simd(w.data(), e.data(), sq, -1, V, s, o, rp.request, pos)
                   : gumbel_draw(V, [&](int64_t j) { return add_rn(w[j], -q_at(j)); }, s, o, rp.request, pos);
          if (c < 0) c = draw_p(w.data(), rp.request, pos);  // (p - q)+ = 0: from p
          emit[i] = c;
          break;
        }
        accp[r] = n_acc;
      }
    });
  });
  return {accepted, out};
}

}  // namespace dspark

TORCH_LIBRARY_IMPL(dspark, CPU, m) { m.impl("rejection_sample", &dspark::rejection_sample_cpu); }
