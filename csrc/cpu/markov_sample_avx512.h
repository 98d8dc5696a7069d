// SPDX-License-Identifier: Apache-2.0
// AVX-512 pieces of the CPU markov_sample step: the Markov bias W2 e for a vocabulary tile and every request,
// and the keyed Philox Gumbel noise 64 vocabulary ids at a time. Every lane performs the operations of the
// scalar code in include/dspark (same products, sums, divisions and fmas, each correctly rounded, and the
// TU's -ffp-contract=off keeps mul and add apart), so the values are bit-identical to the scalar path and
// to the CUDA kernel. Only compiled into functions with the target attribute; callers check the CPU first
// (avx512_available()).
#pragma once

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define DSPARK_HAVE_AVX512_PATH 1
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <immintrin.h>

#include <cstdint>

#include "dspark/philox.h"

#define DSPARK_AVX512 __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx2,fma,f16c")))

namespace dspark {
namespace avx512 {

inline bool available() {
  static const bool ok = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                         __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl") &&
                         __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
  return ok;
}

// 16 values as f32 (exact conversions); lanes outside `m` read nothing and are 0.
DSPARK_AVX512 inline __m512 load16(const float* p, __mmask16 m) { return _mm512_maskz_loadu_ps(m, p); }
DSPARK_AVX512 inline __m512 load16(const c10::BFloat16* p, __mmask16 m) {
  const __m256i h = _mm256_maskz_loadu_epi16(m, p);
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}
DSPARK_AVX512 inline __m512 load16(const c10::Half* p, __mmask16 m) {
  return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, p));
}
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

// 32x32 -> 64-bit products of 16 lanes: even lanes through one vpmuludq, odd lanes through another.
DSPARK_AVX512 inline void mulhilo16(__m512i m, __m512i x, __m512i& hi, __m512i& lo) {
  const __m512i pe = _mm512_mul_epu32(m, x);
  const __m512i po = _mm512_mul_epu32(m, _mm512_srli_epi64(x, 32));
  hi = _mm512_mask_blend_epi32(0xAAAA, _mm512_srli_epi64(pe, 32), po);
  lo = _mm512_mask_blend_epi32(0xAAAA, pe, _mm512_slli_epi64(po, 32));
}

// log_exact on 16 lanes (positive normal inputs), operation for operation.
DSPARK_AVX512 inline __m512 log16(__m512 x) {
  const __m512i bits = _mm512_castps_si512(x);
  __m512i e = _mm512_sub_epi32(_mm512_and_si512(_mm512_srli_epi32(bits, 23), _mm512_set1_epi32(0xFF)),
                               _mm512_set1_epi32(127));
  __m512 m = _mm512_castsi512_ps(
      _mm512_or_si512(_mm512_and_si512(bits, _mm512_set1_epi32(0x007FFFFF)), _mm512_set1_epi32(0x3F800000)));
  const __mmask16 big = _mm512_cmp_ps_mask(m, _mm512_set1_ps(1.41421356f), _CMP_GT_OQ);
  m = _mm512_mask_mul_ps(m, big, m, _mm512_set1_ps(0.5f));
  e = _mm512_mask_add_epi32(e, big, e, _mm512_set1_epi32(1));
  const __m512 f = _mm512_add_ps(m, _mm512_set1_ps(-1.0f));
  const __m512 s = _mm512_div_ps(f, _mm512_add_ps(_mm512_set1_ps(2.0f), f));
  const __m512 s2 = _mm512_mul_ps(s, s);
  __m512 p = _mm512_fmadd_ps(s2, _mm512_set1_ps(0.11111111f), _mm512_set1_ps(0.14285715f));
  p = _mm512_fmadd_ps(s2, p, _mm512_set1_ps(0.2f));
  p = _mm512_fmadd_ps(s2, p, _mm512_set1_ps(0.33333334f));
  p = _mm512_fmadd_ps(s2, p, _mm512_set1_ps(1.0f));
  const __m512 log_m = _mm512_mul_ps(_mm512_mul_ps(_mm512_set1_ps(2.0f), s), p);
  const __m512 ef = _mm512_cvtepi32_ps(e);
  return _mm512_add_ps(_mm512_fmadd_ps(ef, _mm512_set1_ps(1.42860682e-06f), log_m),
                       _mm512_mul_ps(ef, _mm512_set1_ps(0.693145752f)));
}

DSPARK_AVX512 inline __m512 neg16(__m512 x) {
  return _mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(x), _mm512_set1_epi32(INT32_MIN)));
}

// uniform_to_gumbel(bits_to_uniform(w)) on 16 words.
DSPARK_AVX512 inline __m512 gumbel16(__m512i w) {
  const __m512i b = _mm512_or_si512(_mm512_srli_epi32(w, 8), _mm512_set1_epi32(1));
  const __m512 u = _mm512_mul_ps(_mm512_cvtepi32_ps(b), _mm512_set1_ps(5.9604644775390625e-08f));
  return neg16(log16(neg16(log16(u))));
}

// Gumbel noise of vocabulary ids [4 * block0, 4 * block0 + 64) in order (g[c] holds ids 16c .. 16c + 15):
// philox_block for 16 consecutive blocks at once, then a 4 x 16 transpose of the words' Gumbel values.
DSPARK_AVX512 inline void gumbel64(uint64_t seed, uint64_t offset, uint32_t request, uint32_t position,
                                   uint32_t block0, __m512 g[4]) {
  __m512i c0 = _mm512_add_epi32(_mm512_set1_epi32(static_cast<int>(block0)),
                                _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15));
  __m512i c1 = _mm512_set1_epi32(static_cast<int>((position & 0xFFFFu) | (kPurposeDraftSample << 16)));
  __m512i c2 = _mm512_set1_epi32(static_cast<int>(request));
  __m512i c3 = _mm512_set1_epi32(static_cast<int>(static_cast<uint32_t>(offset)));
  uint32_t k0 = static_cast<uint32_t>(seed);
  uint32_t k1 = static_cast<uint32_t>(seed >> 32) ^ static_cast<uint32_t>(offset >> 32);
  const __m512i m0 = _mm512_set1_epi32(static_cast<int>(kPhiloxM0));
  const __m512i m1 = _mm512_set1_epi32(static_cast<int>(kPhiloxM1));
  for (int round = 0; round < 10; ++round) {
    if (round > 0) {
      k0 += kPhiloxW0;
      k1 += kPhiloxW1;
    }
    __m512i hi0, lo0, hi1, lo1;
    mulhilo16(m0, c0, hi0, lo0);
    mulhilo16(m1, c2, hi1, lo1);
    const __m512i n0 = _mm512_xor_si512(_mm512_xor_si512(hi1, c1), _mm512_set1_epi32(static_cast<int>(k0)));
    const __m512i n2 = _mm512_xor_si512(_mm512_xor_si512(hi0, c3), _mm512_set1_epi32(static_cast<int>(k1)));
    c0 = n0;
    c1 = lo1;
    c2 = n2;
    c3 = lo0;
  }
  const __m512 a = gumbel16(c0), b = gumbel16(c1), c = gumbel16(c2), d = gumbel16(c3);
  // lane j of a/b/c/d is word 0/1/2/3 of block block0 + j, i.e. vocabulary id 4 j + word
  const __m512 ab_lo = _mm512_unpacklo_ps(a, b), ab_hi = _mm512_unpackhi_ps(a, b);
  const __m512 cd_lo = _mm512_unpacklo_ps(c, d), cd_hi = _mm512_unpackhi_ps(c, d);
  // q_k's 128-bit chunk n: the 4 words of block 4 n + k
  const __m512 q0 = _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(ab_lo), _mm512_castps_pd(cd_lo)));
  const __m512 q1 = _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(ab_lo), _mm512_castps_pd(cd_lo)));
  const __m512 q2 = _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(ab_hi), _mm512_castps_pd(cd_hi)));
  const __m512 q3 = _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(ab_hi), _mm512_castps_pd(cd_hi)));
  const __m512 t0 = _mm512_shuffle_f32x4(q0, q1, _MM_SHUFFLE(1, 0, 1, 0));
  const __m512 t1 = _mm512_shuffle_f32x4(q2, q3, _MM_SHUFFLE(1, 0, 1, 0));
  const __m512 t2 = _mm512_shuffle_f32x4(q0, q1, _MM_SHUFFLE(3, 2, 3, 2));
  const __m512 t3 = _mm512_shuffle_f32x4(q2, q3, _MM_SHUFFLE(3, 2, 3, 2));
  g[0] = _mm512_shuffle_f32x4(t0, t1, _MM_SHUFFLE(2, 0, 2, 0));
  g[1] = _mm512_shuffle_f32x4(t0, t1, _MM_SHUFFLE(3, 1, 3, 1));
  g[2] = _mm512_shuffle_f32x4(t2, t3, _MM_SHUFFLE(2, 0, 2, 0));
  g[3] = _mm512_shuffle_f32x4(t2, t3, _MM_SHUFFLE(3, 1, 3, 1));
}

// Running argmax over 16 lanes: strict > keeps each lane's lowest index among equal keys.
struct Argmax16 {
  __m512 v;
  __m512i i;
};

DSPARK_AVX512 inline void argmax_update(Argmax16& a, __m512 key, int64_t base) {
  const __mmask16 gt = _mm512_cmp_ps_mask(key, a.v, _CMP_GT_OQ);
  a.v = _mm512_mask_mov_ps(a.v, gt, key);
  a.i = _mm512_mask_mov_epi32(
      a.i, gt,
      _mm512_add_epi32(_mm512_set1_epi32(static_cast<int>(base)),
                       _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15)));
}

// Index offsets are relative to the tile (< 2^31). Returns false when no key exceeded -inf.
DSPARK_AVX512 inline bool argmax_finish(const Argmax16& a, float& key, int32_t& idx) {
  const float mx = _mm512_reduce_max_ps(a.v);
  if (!(mx > -INFINITY)) return false;
  const __mmask16 at = _mm512_cmp_ps_mask(a.v, _mm512_set1_ps(mx), _CMP_EQ_OQ);
  idx = _mm512_mask_reduce_min_epi32(at, a.i);
  key = mx;
  return true;
}

}  // namespace avx512
}  // namespace dspark
#else
#define DSPARK_HAVE_AVX512_PATH 0
#endif
