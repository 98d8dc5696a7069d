// SPDX-License-Identifier: Apache-2.0
// AVX-512 row passes of the CPU rejection_sample: the same operations as its scalar loops (include/dspark
// sampling.h math, the same lane-sum order, ties to the lowest index), 16 vocabulary ids at a time, so the
// accepted counts and tokens are bit-identical to the scalar path, the reference and the CUDA kernel.
#pragma once

#include "avx512_common.h"

#if DSPARK_HAVE_AVX512_PATH
namespace dspark {
namespace avx512 {

// y[i] = float(logits[i]), divided by t when divide is set. y: [V].
template <typename T>
DSPARK_AVX512 inline void load_row(const T* logits, int64_t V, bool divide, float t, float* y) {
  const __m512 tv = _mm512_set1_ps(t);
  for (int64_t i = 0; i < V; i += 16) {
    const __mmask16 m = tail_mask(i, V);
    __m512 x = load16(logits + i, m);
    if (divide) x = _mm512_div_ps(x, tv);
    _mm512_mask_storeu_ps(y + i, m, x);
  }
}

// y[i] /= t in place.
DSPARK_AVX512 inline void divide_row(float* y, int64_t V, float t) {
  const __m512 tv = _mm512_set1_ps(t);
  for (int64_t i = 0; i < V; i += 16) {
    const __mmask16 m = tail_mask(i, V);
    _mm512_mask_storeu_ps(y + i, m, _mm512_div_ps(_mm512_maskz_loadu_ps(m, y + i), tv));
  }
}

// Index of the first maximum of y (0 when every value is -inf), as the scalar `y[i] > y[arg]` loop.
DSPARK_AVX512 inline int64_t argmax_row(const float* y, int64_t V) {
  Argmax16 a{_mm512_set1_ps(-INFINITY), _mm512_setzero_si512()};
  const __m512 ninf = _mm512_set1_ps(-INFINITY);
  for (int64_t i = 0; i < V; i += 16) {
    const __mmask16 m = tail_mask(i, V);
    argmax_update(a, _mm512_mask_loadu_ps(ninf, m, y + i), i);
  }
  float key;
  int32_t idx;
  return argmax_finish(a, key, idx) ? idx : 0;
}

// Largest y[i] / t (its sign of zero may differ from the scalar std::max; only y/t - max is used, where
// both zeros give the same value).
DSPARK_AVX512 inline float max_scaled(const float* z, int64_t V, float t) {
  const __m512 tv = _mm512_set1_ps(t), ninf = _mm512_set1_ps(-INFINITY);
  __m512 mx = ninf;
  for (int64_t i = 0; i < V; i += 16) {
    const __mmask16 m = tail_mask(i, V);
    mx = _mm512_max_ps(mx, _mm512_mask_div_ps(ninf, m, _mm512_maskz_loadu_ps(m, z + i), tv));
  }
  return _mm512_reduce_max_ps(mx);
}

// w[i] = y[i] >= thr ? exp_exact(y[i] - m) : 0 (y already divided by T).
DSPARK_AVX512 inline void exp_row(const float* y, int64_t V, float m, float thr, float* w) {
  const __m512 mv = _mm512_set1_ps(m), tv = _mm512_set1_ps(thr);
  for (int64_t i = 0; i < V; i += 16) {
    const __mmask16 lm = tail_mask(i, V);
    const __m512 x = _mm512_maskz_loadu_ps(lm, y + i);
    const __mmask16 keep = _mm512_cmp_ps_mask(x, tv, _CMP_GE_OQ);
    _mm512_mask_storeu_ps(w + i, lm, _mm512_maskz_mov_ps(keep, exp16(_mm512_sub_ps(x, mv))));
  }
}

// e[i] = exp_exact(z[i] / t - m); returns the lane sum of e (the softmax denominator of the draft row).
DSPARK_AVX512 inline float exp_scaled_row(const float* z, int64_t V, float t, float m, float* e) {
  const __m512 tv = _mm512_set1_ps(t), mv = _mm512_set1_ps(m);
  LaneSum s;
  for (int64_t i = 0; i < V; i += 16) {
    const __mmask16 lm = tail_mask(i, V);
    const __m512 x = exp16(_mm512_sub_ps(_mm512_div_ps(_mm512_maskz_loadu_ps(lm, z + i), tv), mv));
    _mm512_mask_storeu_ps(e + i, lm, x);
    s.add(i, x, lm);
  }
  return s.total();
}

// Number of y[i] > v.
DSPARK_AVX512 inline int64_t count_greater(const float* y, int64_t V, float v) {
  const __m512 vv = _mm512_set1_ps(v);
  int64_t c = 0;
  for (int64_t i = 0; i < V; i += 16) {
    const __mmask16 lm = tail_mask(i, V);
    c += __builtin_popcount(_mm512_mask_cmp_ps_mask(lm, _mm512_maskz_loadu_ps(lm, y + i), vv, _CMP_GT_OQ));
  }
  return c;
}

// Lane sum of (y[i] > v ? w[i] : 0), or of every w[i] (all = true).
DSPARK_AVX512 inline float sum_where_greater(const float* y, const float* w, int64_t V, float v, bool all) {
  const __m512 vv = _mm512_set1_ps(v);
  LaneSum s;
  for (int64_t i = 0; i < V; i += 16) {
    const __mmask16 lm = tail_mask(i, V);
    __m512 x = _mm512_maskz_loadu_ps(lm, w + i);
    if (!all)
      x = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(_mm512_maskz_loadu_ps(lm, y + i), vv, _CMP_GT_OQ), x);
    s.add(i, x, lm);
  }
  return s.total();
}

// Lane sum of w.
DSPARK_AVX512 inline float sum_row(const float* w, int64_t V) {
  return sum_where_greater(w, w, V, 0.0f, true);
}

// w[i] = 0 where !(y[i] >= thr).
DSPARK_AVX512 inline void zero_below(const float* y, float* w, int64_t V, float thr) {
  const __m512 tv = _mm512_set1_ps(thr);
  for (int64_t i = 0; i < V; i += 16) {
    const __mmask16 lm = tail_mask(i, V);
    const __mmask16 drop = _mm512_mask_cmp_ps_mask(lm, _mm512_maskz_loadu_ps(lm, y + i), tv, _CMP_NGE_UQ);
    _mm512_mask_storeu_ps(w + i, drop, _mm512_setzero_ps());
  }
}

// Gumbel-max draw (purpose kPurposeResidual) from the weights w[i] (e == nullptr: the bonus draw from p) or
// w[i] - e[i] / sq (the residual (p - q)+, q = e / sq); id `exclude` (>= 0) takes no part (the residual
// (p - onehot_x)+ of a deterministic proposal x, as proposal_residual_weight); only weights > 0 take part;
// -1 when none is. 64 ids per Philox call; blocks without a positive weight draw no noise (none of their ids
// could win).
DSPARK_AVX512 inline int64_t gumbel_draw_row(int64_t V, const float* w, const float* e, float sq,
                                             int64_t exclude, uint64_t seed, uint64_t offset,
                                             uint32_t request, uint32_t position) {
  Argmax16 a{_mm512_set1_ps(-INFINITY), _mm512_setzero_si512()};
  const __m512 ninf = _mm512_set1_ps(-INFINITY), zero = _mm512_setzero_ps(), sv = _mm512_set1_ps(sq);
  for (int64_t base = 0; base < V; base += 64) {
    __m512 x[4];
    __mmask16 pos[4];
    bool any = false;
    for (int c = 0; c < 4; ++c) {
      const int64_t i = base + 16 * c;
      const __mmask16 lm = tail_mask(i, V);
      x[c] = _mm512_maskz_loadu_ps(lm, w + i);
      if (e != nullptr) x[c] = _mm512_sub_ps(x[c], _mm512_div_ps(_mm512_maskz_loadu_ps(lm, e + i), sv));
      pos[c] = _mm512_mask_cmp_ps_mask(lm, x[c], zero, _CMP_GT_OQ);
      if (exclude >= i && exclude < i + 16) pos[c] &= static_cast<__mmask16>(~(1u << (exclude - i)));
      any = any || pos[c] != 0;
    }
    if (!any) continue;
    __m512 g[4];
    gumbel64(seed, offset, request, position, kPurposeResidual, static_cast<uint32_t>(base >> 2), g);
    for (int c = 0; c < 4; ++c) {
      if (!pos[c]) continue;
      // other lanes take log(1) and then a -inf key
      const __m512 xs = _mm512_mask_mov_ps(_mm512_set1_ps(1.0f), pos[c], x[c]);
      argmax_update(a, _mm512_mask_add_ps(ninf, pos[c], log_positive16(xs), g[c]), base + 16 * c);
    }
  }
  float key;
  int32_t idx;
  return argmax_finish(a, key, idx) ? idx : -1;
}

}  // namespace avx512
}  // namespace dspark
#endif
