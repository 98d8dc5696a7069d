// SPDX-License-Identifier: Apache-2.0
// AVX-512 pieces of the CPU markov_sample step: the Markov bias W2 e for a vocabulary tile and every request
// (the Philox Gumbel noise and the argmax come from avx512_common.h). Every lane performs the operations of
// the scalar markov_dot, so the values are bit-identical to the scalar path and to the CUDA kernel.
#pragma once

#include "avx512_common.h"

#if DSPARK_HAVE_AVX512_PATH
namespace dspark {
namespace avx512 {

// 8 values as f32, duplicated into both 256-bit halves.
DSPARK_AVX512 inline __m512 load8x2(const float* p) { return _mm512_broadcast_f32x8(_mm256_loadu_ps(p)); }
DSPARK_AVX512 inline __m512 load8x2(const c10::BFloat16* p) {
  const __m256i h = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}
DSPARK_AVX512 inline __m512 load8x2(const c10::Half* p) {
  return _mm512_cvtph_ps(_mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
}
DSPARK_AVX512 inline __m512 load8x2(const float* p, __mmask8 m) {
  return _mm512_broadcast_f32x8(_mm256_maskz_loadu_ps(m, p));
}
DSPARK_AVX512 inline __m512 load8x2(const c10::BFloat16* p, __mmask8 m) {
  const __m128i h = _mm_maskz_loadu_epi16(m, p);
  return _mm512_broadcast_f32x8(_mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16)));
}
DSPARK_AVX512 inline __m512 load8x2(const c10::Half* p, __mmask8 m) {
  return _mm512_broadcast_f32x8(_mm256_cvtph_ps(_mm_maskz_loadu_epi16(m, p)));
}

// Sums of adjacent lane pairs of a (lanes 0-7) and of b (lanes 8-15).
DSPARK_AVX512 inline __m512 pair_sums(__m512 a, __m512 b) {
  const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
  const __m512i odd = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
  return _mm512_add_ps(_mm512_permutex2var_ps(a, even, b), _mm512_permutex2var_ps(a, odd, b));
}

// markov_dot's tree ((a0+a1)+(a2+a3))+((a4+a5)+(a6+a7)) on each 256-bit half of v[0..8): lane 2 m + h of the
// result is the sum of half h of v[m]. Three levels of pair sums, each the tree's next level.
DSPARK_AVX512 inline __m512 half_trees8(const __m512 v[8]) {
  const __m512 s0 = pair_sums(v[0], v[1]), s1 = pair_sums(v[2], v[3]);
  const __m512 s2 = pair_sums(v[4], v[5]), s3 = pair_sums(v[6], v[7]);
  return pair_sums(pair_sums(s0, s1), pair_sums(s2, s3));
}

// dots[q][i - i0] = markov_dot(W2[i], e_q) for the 2 * NP requests of e2 and i in [i0, i1), NI vocabulary
// rows at a time (NP * NI <= 8 independent accumulators hide the add latency). e2: [NP, nb, 16], each 16 the
// 8 e values of a j-block of request 2p then of request 2p + 1, zero past rank. A zmm lane l < 8 is
// markov_dot's partial sum a[l] of the first request, lane 8 + l that of the second.
template <int NP, int NI, typename TW>
DSPARK_AVX512 inline void dot_rows(const TW* w2, int64_t rank, int64_t i, const float* e2, int64_t nb,
                                   float* dots, int64_t dstride, int64_t nreq) {
  static_assert(NP * NI <= 8, "at most 8 accumulators");
  __m512 acc[8];
  for (int a = 0; a < 8; ++a) acc[a] = _mm512_setzero_ps();
  const TW* w = w2 + i * rank;
  const int64_t full = rank / 8;
  for (int64_t jb = 0; jb < nb; ++jb) {
    const int64_t j = jb * 8;
    __m512 wv[NI];
    if (jb < full) {  // unmasked: a broadcast load, no shuffle
      for (int a = 0; a < NI; ++a) wv[a] = load8x2(w + a * rank + j);
    } else {
      const __mmask8 m = static_cast<__mmask8>((1u << (rank - j)) - 1u);
      for (int a = 0; a < NI; ++a) wv[a] = load8x2(w + a * rank + j, m);
    }
    for (int q = 0; q < NP; ++q) {
      const __m512 ev = _mm512_loadu_ps(e2 + (q * nb + jb) * 16);
      for (int a = 0; a < NI; ++a) acc[a * NP + q] = _mm512_add_ps(acc[a * NP + q], _mm512_mul_ps(wv[a], ev));
    }
  }
  alignas(64) float t[16];
  _mm512_store_ps(t, half_trees8(acc));
  for (int a = 0; a < NI; ++a) {
    for (int q = 0; q < NP; ++q) {
      dots[(2 * q) * dstride + a] = t[2 * (a * NP + q)];
      if (2 * q + 1 < nreq) dots[(2 * q + 1) * dstride + a] = t[2 * (a * NP + q) + 1];
    }
  }
}

template <int NP, int NI, typename TW>
DSPARK_AVX512 inline void dot_tile(const TW* w2, int64_t rank, int64_t i0, int64_t i1, const float* e2,
                                   int64_t nb, float* dots, int64_t dstride, int64_t nreq) {
  int64_t i = i0;
  for (; i + NI <= i1; i += NI) dot_rows<NP, NI>(w2, rank, i, e2, nb, dots + (i - i0), dstride, nreq);
  for (; i < i1; ++i) dot_rows<NP, 1>(w2, rank, i, e2, nb, dots + (i - i0), dstride, nreq);
}

// Markov bias of every request for vocabulary rows [i0, i1): dots [R, dstride] (row q holds i - i0).
// e2: [ceil(R / 2), nb, 16] (see dot_rows).
template <typename TW>
DSPARK_AVX512 void markov_bias_tile(const TW* w2, int64_t rank, int64_t i0, int64_t i1, const float* e2,
                                    int64_t nb, int64_t R, float* dots, int64_t dstride) {
  for (int64_t p0 = 0; 2 * p0 < R; p0 += 4) {
    const int64_t np = std::min<int64_t>(4, (R - 2 * p0 + 1) / 2);
    const int64_t nreq = R - 2 * p0;
    const float* e = e2 + p0 * nb * 16;
    float* d = dots + 2 * p0 * dstride;
    switch (np) {
      case 4:
        dot_tile<4, 2>(w2, rank, i0, i1, e, nb, d, dstride, nreq);
        break;
      case 3:
        dot_tile<3, 2>(w2, rank, i0, i1, e, nb, d, dstride, nreq);
        break;
      case 2:
        dot_tile<2, 4>(w2, rank, i0, i1, e, nb, d, dstride, nreq);
        break;
      default:
        dot_tile<1, 4>(w2, rank, i0, i1, e, nb, d, dstride, nreq);
        break;
    }
  }
}

}  // namespace avx512
}  // namespace dspark
#endif
