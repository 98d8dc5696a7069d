// SPDX-License-Identifier: Apache-2.0
// AVX-512 building blocks shared by the CPU sampling ops (markov_sample, rejection_sample;
// paged_verify_attention uses exp16 and tail_mask too): loads with exact conversions, exp_exact / log_exact /
// Philox Gumbel noise on 16 lanes, fixed-order lane sums and a running argmax. Every lane performs the
// operations of the scalar code in include/dspark (same products, sums, divisions and fmas, each correctly
// rounded, and the TUs' -ffp-contract=off keeps mul and add apart), so the values are bit-identical to the
// scalar path and to the CUDA kernels. Only compiled into functions with the target attribute; callers check
// the CPU first (avx512::enabled()).
#pragma once

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define DSPARK_HAVE_AVX512_PATH 1
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <immintrin.h>

#include <cstdint>
#include <cstdlib>

#include "dspark/sampling.h"

#define DSPARK_AVX512 __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx2,fma,f16c")))

namespace dspark {
namespace avx512 {

inline bool available() {
  static const bool ok = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                         __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl") &&
                         __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
  return ok;
}

// The vector paths run when the CPU has AVX-512, unless DSPARK_CPU_SIMD=0 (the tests compare both paths).
inline bool enabled() {
  const char* env = std::getenv("DSPARK_CPU_SIMD");
  return available() && !(env != nullptr && env[0] == '0');
}

// Lanes 0..15 as int32 (vocabulary offsets inside a block).
DSPARK_AVX512 inline __m512i iota16() {
  return _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
}

// The lane sums of 4 vectors (lane t of the result: the sum of a_t's 16 lanes), each pairing its lanes as
// _mm512_reduce_add_ps does (i with i + 8, then j with j + 4, then 0 with 2 and 1 with 3, then the two): the
// same floats in 10 vector operations for the 4 instead of 4 x 8 (the shuffles share a port with the fmas).
// AVX-512F alone, so that functions compiled for AVX-512F without BW/DQ/VL inline it too.
__attribute__((target("avx512f"))) inline __m128 sum4(__m512 a0, __m512 a1, __m512 a2, __m512 a3) {
  // [a0 lo8 + a0 hi8 | a1 lo8 + a1 hi8], [a2 .. | a3 ..]
  const __m512 v01 = _mm512_add_ps(_mm512_shuffle_f32x4(a0, a1, 0x44), _mm512_shuffle_f32x4(a0, a1, 0xEE));
  const __m512 v23 = _mm512_add_ps(_mm512_shuffle_f32x4(a2, a3, 0x44), _mm512_shuffle_f32x4(a2, a3, 0xEE));
  // 128-bit lane t holds a_t's lanes j + (j + 4)
  const __m512 q = _mm512_add_ps(_mm512_shuffle_f32x4(v01, v23, 0x88), _mm512_shuffle_f32x4(v01, v23, 0xDD));
  const __m512 h = _mm512_add_ps(q, _mm512_permute_ps(q, 0x4E));  // lanes 0 + 2, 1 + 3
  const __m512 s = _mm512_add_ps(h, _mm512_permute_ps(h, 0xB1));  // (0 + 2) + (1 + 3)
  const __m512i first_of_each = _mm512_set_epi32(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 12, 8, 4, 0);
  return _mm512_castps512_ps128(_mm512_permutexvar_ps(first_of_each, s));
}

// Mask of the lanes i with base + i < n.
inline __mmask16 tail_mask(int64_t base, int64_t n) {
  const int64_t k = n - base;
  return k >= 16 ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << (k > 0 ? k : 0)) - 1u);
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
                                   uint32_t purpose, uint32_t block0, __m512 g[4]) {
  __m512i c0 = _mm512_add_epi32(_mm512_set1_epi32(static_cast<int>(block0)), iota16());
  __m512i c1 = _mm512_set1_epi32(static_cast<int>((position & 0xFFFFu) | (purpose << 16)));
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
  a.i = _mm512_mask_mov_epi32(a.i, gt, _mm512_add_epi32(_mm512_set1_epi32(static_cast<int>(base)), iota16()));
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

// exp_exact on 16 lanes, branch for branch as masks.
DSPARK_AVX512 inline __m512 exp16(__m512 x) {
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269502f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512 r = _mm512_sub_ps(_mm512_sub_ps(x, _mm512_mul_ps(n, _mm512_set1_ps(0.693145752f))),
                                 _mm512_mul_ps(n, _mm512_set1_ps(1.42860677e-06f)));
  __m512 p = _mm512_set1_ps(1.98412698e-04f);
  p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(1.38888889e-03f));
  p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(8.33333377e-03f));
  p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(4.16666679e-02f));
  p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(1.66666672e-01f));
  p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(0.5f));
  p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(1.0f));
  p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(1.0f));
  // in range n is integral and small; out-of-range lanes are replaced below, whatever they computed
  const __m512i ni = _mm512_cvtps_epi32(n);
  const __mmask16 big = _mm512_cmp_epi32_mask(ni, _mm512_set1_epi32(127), _MM_CMPINT_GT);
  const __mmask16 small = _mm512_cmp_epi32_mask(ni, _mm512_set1_epi32(-126), _MM_CMPINT_LT);
  __m512i sh = _mm512_mask_sub_epi32(ni, big, ni, _mm512_set1_epi32(1));
  sh = _mm512_mask_add_epi32(sh, small, sh, _mm512_set1_epi32(64));
  const __m512 scale =
      _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(sh, _mm512_set1_epi32(127)), 23));
  __m512 y = _mm512_mul_ps(p, scale);
  y = _mm512_mask_mul_ps(y, big, y, _mm512_set1_ps(2.0f));
  y = _mm512_mask_mul_ps(y, small, y, _mm512_set1_ps(5.42101086e-20f));
  const __mmask16 live = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-104.0f), _CMP_GT_OQ);
  const __mmask16 huge = _mm512_cmp_ps_mask(x, _mm512_set1_ps(88.8f), _CMP_GT_OQ);
  y = _mm512_mask_mov_ps(y, huge, _mm512_castsi512_ps(_mm512_set1_epi32(0x7F800000)));
  return _mm512_maskz_mov_ps(live, y);
}

// log_positive on 16 lanes (x > 0, subnormals included).
DSPARK_AVX512 inline __m512 log_positive16(__m512 x) {
  const __mmask16 sub = _mm512_cmp_ps_mask(x, _mm512_set1_ps(1.17549435e-38f), _CMP_LT_OQ);
  const __m512 l = log16(_mm512_mask_mul_ps(x, sub, x, _mm512_set1_ps(1.84467441e+19f)));
  return _mm512_mask_add_ps(l, sub, l, _mm512_set1_ps(-44.3614196f));
}

// A row sum in the order of sampling.h's lane sums: lane l of kSumLanes is acc[l / 16] lane l % 16. add()
// takes the 16 values of ids [i, i + 16) (i a multiple of 16, chunks in increasing i; lanes off m unchanged).
struct LaneSum {
  static constexpr int kVecs = kSumLanes / 16;
  __m512 acc[kVecs];

  DSPARK_AVX512 LaneSum() {
    for (int v = 0; v < kVecs; ++v) acc[v] = _mm512_setzero_ps();
  }
  DSPARK_AVX512 void add(int64_t i, __m512 x, __mmask16 m) {
    const int v = static_cast<int>((i >> 4) & (kVecs - 1));
    acc[v] = _mm512_mask_add_ps(acc[v], m, acc[v], x);
  }
  DSPARK_AVX512 float total() const {
    alignas(64) float lanes[kSumLanes];
    for (int v = 0; v < kVecs; ++v) _mm512_store_ps(lanes + 16 * v, acc[v]);
    return lane_tree(lanes);
  }
};

}  // namespace avx512
}  // namespace dspark
#else
#define DSPARK_HAVE_AVX512_PATH 0
namespace dspark {
namespace avx512 {
inline bool enabled() { return false; }  // no vector path in this build
}  // namespace avx512
}  // namespace dspark
#endif
