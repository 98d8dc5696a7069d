// SPDX-License-Identifier: Apache-2.0
// CPU paged_verify_attention: ragged attention of each request's query rows over its own paged KV.
//
// Work items are (request, KV head, chunk of up to kQueryChunk query tokens, split of its keys), run with
// at::parallel_for. An item handles every query head of its KV head's GQA group, so a block of keys is
// gathered from the pages and converted to fp32 once (fp32 caches are read in place) and then used by all G *
// chunk query rows (a verify round of <= 16 tokens is one chunk: its K/V are read once per KV head). A verify
// chunk's keys are split in up to kMaxKeySplits ranges of >= kKeySplit keys, whose partial softmax states are
// merged after (split-KV): one request has only Hkv chunks, too few to keep the threads busy. The split
// depends on the chunk's own key count only, so a request's output does not depend on the batch or the thread
// count. Scores and the online softmax run in fp32 (include/dspark/online_softmax.h); the output is rounded
// to the input dtype once at the end. On a CPU with AVX-512 (unless DSPARK_CPU_SIMD=0) and D a multiple of
// 16, the scores, the softmax weights and the P·V update of a row run on 16 lanes (3x the scalar loops at 8
// decode requests, docs/benchmarks.md); with AVX2 + FMA (or DSPARK_CPU_SIMD=avx2) and D a multiple of 8, the
// scores, the weights and the P·V update run on 8 lanes.
#include "checks/paged_verify_attention.h"

#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <type_traits>
#include <utility>
#include <vector>

#include "avx512_common.h"
#include "dspark/online_softmax.h"

namespace dspark {
namespace {

constexpr int64_t kQueryChunk = 16;  // query tokens per work item
constexpr int64_t kKeyBlock = 64;    // keys gathered per step
constexpr int64_t kKeySplit = 512;   // keys per split at least
constexpr int64_t kMaxKeySplits = 8;

#if defined(DSPARK_HAVE_AVX512_PATH)
// Scores of one query row against nk keys: S[j] = (q . k_j) * scale on 16-lane fmas and a tree reduction per
// key (the scalar dot16 below sums its 16 partials one after another, which bounds it by add latency). Four
// keys at a time keep four fma chains in flight and share one reduction (avx512::sum4, the lane pairing of
// _mm512_reduce_add_ps, which the last nk % 4 keys use). D is a multiple of 16. Returns max_j S[j]. Rounds
// differently from dot16: attention is compared to its reference with a tolerance, not bit for bit.
DSPARK_AVX512 float scores_avx512(const float* q, const float* const* krow, int64_t nk, int64_t D,
                                  float scale, float* S) {
  int64_t j = 0;
  for (; j + 4 <= nk; j += 4) {
    const float *k0 = krow[j], *k1 = krow[j + 1], *k2 = krow[j + 2], *k3 = krow[j + 3];
    const __m512 q0 = _mm512_loadu_ps(q);
    __m512 a0 = _mm512_mul_ps(q0, _mm512_loadu_ps(k0)), a1 = _mm512_mul_ps(q0, _mm512_loadu_ps(k1));
    __m512 a2 = _mm512_mul_ps(q0, _mm512_loadu_ps(k2)), a3 = _mm512_mul_ps(q0, _mm512_loadu_ps(k3));
    for (int64_t d = 16; d < D; d += 16) {
      const __m512 qd = _mm512_loadu_ps(q + d);
      a0 = _mm512_fmadd_ps(qd, _mm512_loadu_ps(k0 + d), a0);
      a1 = _mm512_fmadd_ps(qd, _mm512_loadu_ps(k1 + d), a1);
      a2 = _mm512_fmadd_ps(qd, _mm512_loadu_ps(k2 + d), a2);
      a3 = _mm512_fmadd_ps(qd, _mm512_loadu_ps(k3 + d), a3);
    }
    _mm_storeu_ps(S + j, _mm_mul_ps(avx512::sum4(a0, a1, a2, a3), _mm_set1_ps(scale)));
  }
  for (; j < nk; ++j) {
    const float* k = krow[j];
    __m512 acc = _mm512_mul_ps(_mm512_loadu_ps(q), _mm512_loadu_ps(k));
    for (int64_t d = 16; d < D; d += 16)
      acc = _mm512_fmadd_ps(_mm512_loadu_ps(q + d), _mm512_loadu_ps(k + d), acc);
    S[j] = _mm512_reduce_add_ps(acc) * scale;
  }
  float mx = softmax_neg_inf();
  for (j = 0; j < nk; ++j) mx = std::max(mx, S[j]);
  return mx;
}

// The online-softmax update of one query row by nk keys: p_j = exp(S[j] - m_new) (exp_exact on 16 lanes; a
// score of -inf gives 0), o = alpha * o + sum_j p_j v_j with each 16-lane slice of o kept in a register over
// all keys. Returns sum_j p_j. D is a multiple of 16; S is overwritten with the p_j.
DSPARK_AVX512 float accumulate_avx512(float* o, const float* const* vrow, float* S, int64_t nk, int64_t D,
                                      float m_new, float alpha) {
  const __m512 mv = _mm512_set1_ps(m_new);
  __m512 sum = _mm512_setzero_ps();
  for (int64_t j = 0; j < nk; j += 16) {
    const __mmask16 lm = avx512::tail_mask(j, nk);
    const __m512 p =
        _mm512_maskz_mov_ps(lm, avx512::exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(lm, S + j), mv)));
    _mm512_mask_storeu_ps(S + j, lm, p);
    sum = _mm512_add_ps(sum, p);
  }
  const __m512 av = _mm512_set1_ps(alpha);
  int64_t d = 0;
  // 64 columns of o at a time in 4 registers over all keys: 4 independent fma chains (one chain per 16
  // columns waits on the fma latency every key); each element's sum runs in key order, as in the loop below
  for (; d + 64 <= D; d += 64) {
    __m512 a0 = _mm512_mul_ps(_mm512_loadu_ps(o + d), av),
           a1 = _mm512_mul_ps(_mm512_loadu_ps(o + d + 16), av);
    __m512 a2 = _mm512_mul_ps(_mm512_loadu_ps(o + d + 32), av),
           a3 = _mm512_mul_ps(_mm512_loadu_ps(o + d + 48), av);
    for (int64_t j = 0; j < nk; ++j) {
      const __m512 p = _mm512_set1_ps(S[j]);
      const float* v = vrow[j] + d;
      a0 = _mm512_fmadd_ps(p, _mm512_loadu_ps(v), a0);
      a1 = _mm512_fmadd_ps(p, _mm512_loadu_ps(v + 16), a1);
      a2 = _mm512_fmadd_ps(p, _mm512_loadu_ps(v + 32), a2);
      a3 = _mm512_fmadd_ps(p, _mm512_loadu_ps(v + 48), a3);
    }
    _mm512_storeu_ps(o + d, a0);
    _mm512_storeu_ps(o + d + 16, a1);
    _mm512_storeu_ps(o + d + 32, a2);
    _mm512_storeu_ps(o + d + 48, a3);
  }
  for (; d < D; d += 16) {
    __m512 acc = _mm512_mul_ps(_mm512_loadu_ps(o + d), av);
    for (int64_t j = 0; j < nk; ++j)
      acc = _mm512_fmadd_ps(_mm512_set1_ps(S[j]), _mm512_loadu_ps(vrow[j] + d), acc);
    _mm512_storeu_ps(o + d, acc);
  }
  return _mm512_reduce_add_ps(sum);
}

#define DSPARK_AVX2 __attribute__((target("avx2,fma")))

DSPARK_AVX2 inline float hsum8(__m256 v) {
  const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
  return _mm_cvtss_f32(_mm_add_ss(s2, _mm_movehdup_ps(s2)));
}

// exp_exact (include/dspark/sampling.h) on 8 lanes, branch for branch as blends, like avx512::exp16.
DSPARK_AVX2 inline __m256 exp8(__m256 x) {
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269502f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m256 r = _mm256_sub_ps(_mm256_sub_ps(x, _mm256_mul_ps(n, _mm256_set1_ps(0.693145752f))),
                                 _mm256_mul_ps(n, _mm256_set1_ps(1.42860677e-06f)));
  __m256 p = _mm256_set1_ps(1.98412698e-04f);
  for (const float c : {1.38888889e-03f, 8.33333377e-03f, 4.16666679e-02f, 1.66666672e-01f, 0.5f, 1.0f, 1.0f})
    p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(c));
  // in range n is integral and small; out-of-range lanes are replaced below, whatever they computed
  const __m256i ni = _mm256_cvtps_epi32(n);
  const __m256i big = _mm256_cmpgt_epi32(ni, _mm256_set1_epi32(127));
  const __m256i small = _mm256_cmpgt_epi32(_mm256_set1_epi32(-126), ni);
  __m256i sh = _mm256_sub_epi32(ni, _mm256_and_si256(big, _mm256_set1_epi32(1)));
  sh = _mm256_add_epi32(sh, _mm256_and_si256(small, _mm256_set1_epi32(64)));
  const __m256 scale =
      _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(sh, _mm256_set1_epi32(127)), 23));
  __m256 y = _mm256_mul_ps(p, scale);
  y = _mm256_blendv_ps(y, _mm256_mul_ps(y, _mm256_set1_ps(2.0f)), _mm256_castsi256_ps(big));
  y = _mm256_blendv_ps(y, _mm256_mul_ps(y, _mm256_set1_ps(5.42101086e-20f)), _mm256_castsi256_ps(small));
  const __m256 huge = _mm256_cmp_ps(x, _mm256_set1_ps(88.8f), _CMP_GT_OQ);
  y = _mm256_blendv_ps(y, _mm256_castsi256_ps(_mm256_set1_epi32(0x7F800000)), huge);
  return _mm256_and_ps(y, _mm256_cmp_ps(x, _mm256_set1_ps(-104.0f), _CMP_GT_OQ));  // also -inf and NaN: 0
}

// One key's score on 8 lanes: q . k over D (a multiple of 8) in one fma chain, times scale.
DSPARK_AVX2 inline float score8(const float* q, const float* k, int64_t D, float scale) {
  __m256 acc = _mm256_mul_ps(_mm256_loadu_ps(q), _mm256_loadu_ps(k));
  for (int64_t d = 8; d < D; d += 8)
    acc = _mm256_fmadd_ps(_mm256_loadu_ps(q + d), _mm256_loadu_ps(k + d), acc);
  return hsum8(acc) * scale;
}

// scores_avx512 on 8 lanes (D a multiple of 8). Four keys at a time keep four independent fma chains in
// flight (one chain is bound by the fma latency); each key's sum is the same chain as score8's.
DSPARK_AVX2 float scores_avx2(const float* q, const float* const* krow, int64_t nk, int64_t D, float scale,
                              float* S) {
  int64_t j = 0;
  for (; j + 4 <= nk; j += 4) {
    const float *k0 = krow[j], *k1 = krow[j + 1], *k2 = krow[j + 2], *k3 = krow[j + 3];
    const __m256 q0 = _mm256_loadu_ps(q);
    __m256 a0 = _mm256_mul_ps(q0, _mm256_loadu_ps(k0)), a1 = _mm256_mul_ps(q0, _mm256_loadu_ps(k1));
    __m256 a2 = _mm256_mul_ps(q0, _mm256_loadu_ps(k2)), a3 = _mm256_mul_ps(q0, _mm256_loadu_ps(k3));
    for (int64_t d = 8; d < D; d += 8) {
      const __m256 qd = _mm256_loadu_ps(q + d);
      a0 = _mm256_fmadd_ps(qd, _mm256_loadu_ps(k0 + d), a0);
      a1 = _mm256_fmadd_ps(qd, _mm256_loadu_ps(k1 + d), a1);
      a2 = _mm256_fmadd_ps(qd, _mm256_loadu_ps(k2 + d), a2);
      a3 = _mm256_fmadd_ps(qd, _mm256_loadu_ps(k3 + d), a3);
    }
    S[j] = hsum8(a0) * scale;
    S[j + 1] = hsum8(a1) * scale;
    S[j + 2] = hsum8(a2) * scale;
    S[j + 3] = hsum8(a3) * scale;
  }
  for (; j < nk; ++j) S[j] = score8(q, krow[j], D, scale);
  float mx = softmax_neg_inf();
  for (j = 0; j < nk; ++j) mx = std::max(mx, S[j]);
  return mx;
}

// accumulate_avx512 on 8 lanes (D a multiple of 8): the softmax weights 8 keys at a time (exp8; a masked
// score, -inf, gives 0 as in softmax_weight), then 64 columns of o at a time stay in 8 registers over all
// keys (8 independent fma chains); each element's sum runs in key order, as in the 8-column loop that takes
// the rest.
DSPARK_AVX2 float accumulate_avx2(float* o, const float* const* vrow, float* S, int64_t nk, int64_t D,
                                  float m_new, float alpha) {
  const __m256 mv = _mm256_set1_ps(m_new);
  __m256 lanes = _mm256_setzero_ps();
  int64_t j = 0;
  for (; j + 8 <= nk; j += 8) {
    const __m256 p = exp8(_mm256_sub_ps(_mm256_loadu_ps(S + j), mv));
    _mm256_storeu_ps(S + j, p);
    lanes = _mm256_add_ps(lanes, p);
  }
  float sum = hsum8(lanes);
  for (; j < nk; ++j) {
    S[j] = softmax_weight(S[j], m_new);
    sum += S[j];
  }
  const __m256 av = _mm256_set1_ps(alpha);
  int64_t d = 0;
  for (; d + 64 <= D; d += 64) {
    __m256 a[8];
    for (int i = 0; i < 8; ++i) a[i] = _mm256_mul_ps(_mm256_loadu_ps(o + d + 8 * i), av);
    for (int64_t j = 0; j < nk; ++j) {
      const __m256 p = _mm256_set1_ps(S[j]);
      const float* v = vrow[j] + d;
      for (int i = 0; i < 8; ++i) a[i] = _mm256_fmadd_ps(p, _mm256_loadu_ps(v + 8 * i), a[i]);
    }
    for (int i = 0; i < 8; ++i) _mm256_storeu_ps(o + d + 8 * i, a[i]);
  }
  for (; d < D; d += 8) {
    __m256 acc = _mm256_mul_ps(_mm256_loadu_ps(o + d), av);
    for (int64_t j = 0; j < nk; ++j)
      acc = _mm256_fmadd_ps(_mm256_set1_ps(S[j]), _mm256_loadu_ps(vrow[j] + d), acc);
    _mm256_storeu_ps(o + d, acc);
  }
  return sum;
}
#endif

// 2: the AVX-512 loops (D % 16 == 0), 1: the AVX2 + FMA ones (D % 8 == 0), 0: the scalar loops.
// DSPARK_CPU_SIMD=0 forces the scalar loops, DSPARK_CPU_SIMD=avx2 the AVX2 ones on an AVX-512 CPU.
int simd_level(int64_t D) {
#if defined(DSPARK_HAVE_AVX512_PATH)
  const char* env = std::getenv("DSPARK_CPU_SIMD");
  if (env != nullptr && env[0] == '0') return 0;
  const bool avx2_only = env != nullptr && std::strcmp(env, "avx2") == 0;
  if (!avx2_only && D % 16 == 0 && avx512::available()) return 2;
  static const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  if (D % 8 == 0 && avx2) return 1;
#endif
  (void)D;
  return 0;
}

// fp32 dot product with 16 independent partial sums (vectorises without reassociation flags).
inline float dot16(const float* a, const float* b, int64_t n) {
  float acc[16] = {};
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    for (int l = 0; l < 16; ++l) acc[l] += a[i + l] * b[i + l];
  }
  for (; i < n; ++i) acc[0] += a[i] * b[i];
  float s = 0.f;
  for (int l = 0; l < 16; ++l) s += acc[l];
  return s;
}

// First key of split s of n over [0, kv_end), a multiple of kKeyBlock (no extra partial key blocks); s = n
// gives kv_end.
int64_t split_start(int64_t kv_end, int64_t s, int64_t n) {
  return s == n ? kv_end : kv_end * s / n / kKeyBlock * kKeyBlock;
}

// Keys of request r: its full pages and the used part of the last one.
int64_t kv_length(const int32_t* kvp, const int32_t* last, int64_t ps, int64_t r) {
  const int64_t n_pages = kvp[r + 1] - kvp[r];
  return n_pages == 0 ? 0 : (n_pages - 1) * ps + last[r];
}

// Keys [0, n) query token i (relative to its request's first) sees: causal rows are bottom-right aligned.
int64_t visible_keys(int64_t n_kv, int64_t n_q, int64_t i, bool causal) {
  return causal ? std::clamp<int64_t>(n_kv - n_q + i + 1, 0, n_kv) : n_kv;
}

struct Item {
  int64_t r, kvh, q0, q1;  // request, KV head, query tokens [q0, q1) relative to the request's first
  int64_t k0, k1;          // its keys [k0, k1)
  int64_t part;  // first row of its partial state in the split scratch; -1: unsplit, writes the output
};

// Partial softmax states of split items: o (unnormalised, rows x D), m and l per row.
struct Partials {
  std::vector<float> o, m, l;
};

// Splits of a chunk whose last query row sees kv_end keys: 1 for prefill chunks (a request with more query
// tokens than one chunk has enough chunks), else one per kKeySplit keys, at most kMaxKeySplits.
int64_t key_splits(int64_t n_q, int64_t kv_end) {
  if (n_q > kQueryChunk) return 1;
  return std::clamp<int64_t>(kv_end / kKeySplit, 1, kMaxKeySplits);
}

template <typename T>
void attend_item(const Item& it, const T* q, const T* kc, const T* vc, T* out, const int32_t* qo,
                 const int32_t* kvp, const int32_t* idx, const int32_t* last, int64_t Hq, int64_t Hkv,
                 int64_t D, int64_t ps, float scale, bool causal, int simd, Partials& parts) {
  const int64_t G = Hq / Hkv;
  const int64_t n_q = qo[it.r + 1] - qo[it.r];
  const int64_t n_kv = kv_length(kvp, last, ps, it.r);
  const int32_t* pages = idx + kvp[it.r];
  const int64_t nt = it.q1 - it.q0, nr = nt * G;  // query rows: token-major, then head within the group
  auto limit = [&](int64_t i) { return visible_keys(n_kv, n_q, i, causal); };
  std::vector<float> Q(nr * D), O(nr * D, 0.f), m(nr, softmax_neg_inf()), l(nr, 0.f);
  // fp32 caches are read in place; other dtypes are converted per key block into Kb/Vb.
  constexpr bool kInPlace = std::is_same_v<T, float>;
  std::vector<float> Kb(kInPlace ? 0 : kKeyBlock * D), Vb(kInPlace ? 0 : kKeyBlock * D), S(kKeyBlock);
  const float* krow[kKeyBlock];
  const float* vrow[kKeyBlock];
  for (int64_t i = 0; i < nt; ++i) {
    for (int64_t g = 0; g < G; ++g) {
      const T* src = q + ((qo[it.r] + it.q0 + i) * Hq + it.kvh * G + g) * D;
      float* dst = Q.data() + (i * G + g) * D;
      for (int64_t d = 0; d < D; ++d) dst[d] = static_cast<float>(src[d]);
    }
  }
  for (int64_t kb = it.k0; kb < it.k1; kb += kKeyBlock) {
    const int64_t nk = std::min(kKeyBlock, it.k1 - kb);
    for (int64_t j = 0; j < nk; ++j) {
      const int64_t key = kb + j;
      const int64_t slot = static_cast<int64_t>(pages[key / ps]) * ps + key % ps;
      const T* ks = kc + (slot * Hkv + it.kvh) * D;
      const T* vs = vc + (slot * Hkv + it.kvh) * D;
      if constexpr (kInPlace) {
        krow[j] = ks;
        vrow[j] = vs;
      } else {
        for (int64_t d = 0; d < D; ++d) {
          Kb[j * D + d] = static_cast<float>(ks[d]);
          Vb[j * D + d] = static_cast<float>(vs[d]);
        }
        krow[j] = Kb.data() + j * D;
        vrow[j] = Vb.data() + j * D;
      }
    }
    for (int64_t i = 0; i < nt; ++i) {
      const int64_t jn = std::min(nk, limit(it.q0 + i) - kb);
      if (jn <= 0) continue;
      for (int64_t g = 0; g < G; ++g) {
        const int64_t row = i * G + g;
        const float* qr = Q.data() + row * D;
        float mx = softmax_neg_inf();
#if defined(DSPARK_HAVE_AVX512_PATH)
        if (simd == 2) {
          mx = scores_avx512(qr, krow, jn, D, scale, S.data());
        } else if (simd == 1) {
          mx = scores_avx2(qr, krow, jn, D, scale, S.data());
        } else
#endif
        {
          for (int64_t j = 0; j < jn; ++j) {
            S[j] = dot16(qr, krow[j], D) * scale;
            mx = std::max(mx, S[j]);
          }
        }
        const float m_new = std::max(m[row], mx);
        const float alpha = softmax_rescale(m[row], m_new);
        float* o = O.data() + row * D;
        float sum = 0.f;
#if defined(DSPARK_HAVE_AVX512_PATH)
        if (simd == 2) {
          sum = accumulate_avx512(o, vrow, S.data(), jn, D, m_new, alpha);
        } else if (simd == 1) {
          sum = accumulate_avx2(o, vrow, S.data(), jn, D, m_new, alpha);
        } else
#endif
        {
          for (int64_t d = 0; d < D; ++d) o[d] *= alpha;
          for (int64_t j = 0; j < jn; ++j) {
            const float p = softmax_weight(S[j], m_new);
            sum += p;
            const float* vr = vrow[j];
            for (int64_t d = 0; d < D; ++d) o[d] += p * vr[d];
          }
        }
        l[row] = l[row] * alpha + sum;
        m[row] = m_new;
      }
    }
  }
  if (it.part >= 0) {  // a split: its state, merged by merge_splits
    std::copy(O.begin(), O.end(), parts.o.begin() + it.part * D);
    std::copy(m.begin(), m.end(), parts.m.begin() + it.part);
    std::copy(l.begin(), l.end(), parts.l.begin() + it.part);
    return;
  }
  for (int64_t i = 0; i < nt; ++i) {
    for (int64_t g = 0; g < G; ++g) {
      const int64_t row = i * G + g;
      const float inv = softmax_inv_sum(l[row]);
      T* dst = out + ((qo[it.r] + it.q0 + i) * Hq + it.kvh * G + g) * D;
      for (int64_t d = 0; d < D; ++d) dst[d] = static_cast<T>(O[row * D + d] * inv);
    }
  }
}

// The output rows of the chunk whose splits are items[first, first + n): their partial states folded in split
// order (the running maximum, l and o rescaled as in online_softmax.h), then normalised.
template <typename T>
void merge_splits(const Item* items, int64_t n, const Partials& parts, T* out, const int32_t* qo, int64_t Hq,
                  int64_t Hkv, int64_t D) {
  const Item& it = items[0];
  const int64_t G = Hq / Hkv, nr = (it.q1 - it.q0) * G;
  std::vector<float> o(D);
  for (int64_t row = 0; row < nr; ++row) {
    float m = softmax_neg_inf(), l = 0.f;
    std::fill(o.begin(), o.end(), 0.f);
    for (int64_t s = 0; s < n; ++s) {
      const int64_t p = items[s].part + row;
      const float m_new = std::max(m, parts.m[p]);
      const float a = softmax_rescale(m, m_new), b = softmax_merge_weight(parts.m[p], m_new);
      const float* os = parts.o.data() + p * D;
      for (int64_t d = 0; d < D; ++d) o[d] = o[d] * a + os[d] * b;
      l = l * a + parts.l[p] * b;
      m = m_new;
    }
    const float inv = softmax_inv_sum(l);
    const int64_t i = row / G, g = row % G;
    T* dst = out + ((qo[it.r] + it.q0 + i) * Hq + it.kvh * G + g) * D;
    for (int64_t d = 0; d < D; ++d) dst[d] = static_cast<T>(o[d] * inv);
  }
}

}  // namespace

// q [T, Hq, D]; k_cache, v_cache [num_pages, page_size, Hkv, D]; qo_indptr, kv_indptr [R + 1] i32;
// kv_indices [nnz] i32; kv_last_page_len [R] i32; split_base [R] i32 or none (checked, not used: the CPU op
// has no split workspace) -> o [T, Hq, D] (dtype of q)
at::Tensor paged_verify_attention_cpu(const at::Tensor& q, const at::Tensor& k_cache,
                                      const at::Tensor& v_cache, const at::Tensor& qo_indptr,
                                      const at::Tensor& kv_indptr, const at::Tensor& kv_indices,
                                      const at::Tensor& kv_last_page_len, double scale, bool causal,
                                      const c10::optional<at::Tensor>& split_base) {
  check_paged_verify_attention_meta(q, k_cache, v_cache, qo_indptr, kv_indptr, kv_indices, kv_last_page_len,
                                    split_base);
  const int64_t T = q.size(0), Hq = q.size(1), D = q.size(2);
  const int64_t P = k_cache.size(0), ps = k_cache.size(1), Hkv = k_cache.size(2);
  const int64_t R = qo_indptr.size(0) - 1;
  const auto qo = qo_indptr.contiguous(), kvp = kv_indptr.contiguous(), idx = kv_indices.contiguous(),
             last = kv_last_page_len.contiguous();
  const int32_t* qop = qo.data_ptr<int32_t>();
  const int32_t* kvpp = kvp.data_ptr<int32_t>();
  const int32_t* idxp = idx.data_ptr<int32_t>();
  const int32_t* lastp = last.data_ptr<int32_t>();
  check_paged_index_values(qop, kvpp, idxp, lastp, R, T, idx.numel(), P, ps);
  if (split_base.has_value()) check_split_base_values(qop, split_base->contiguous().data_ptr<int32_t>(), R);
  const auto qc = q.contiguous(), kc = k_cache.contiguous(), vc = v_cache.contiguous();
  auto out = at::empty_like(qc);
  // items, and the chunks split over their keys (first item, splits)
  std::vector<Item> items;
  std::vector<std::pair<int64_t, int64_t>> split_chunks;
  int64_t part_rows = 0;
  const int64_t G = Hq / Hkv;
  for (int64_t r = 0; r < R; ++r) {
    const int64_t n_q = qop[r + 1] - qop[r];
    const int64_t n_kv = kv_length(kvpp, lastp, ps, r);
    for (int64_t h = 0; h < Hkv; ++h) {
      for (int64_t q0 = 0; q0 < n_q; q0 += kQueryChunk) {
        const int64_t q1 = std::min(n_q, q0 + kQueryChunk);
        const int64_t kv_end = visible_keys(n_kv, n_q, q1 - 1, causal);  // what its last row sees
        const int64_t splits = key_splits(n_q, kv_end);
        if (splits == 1) {
          items.push_back({r, h, q0, q1, 0, kv_end, -1});
          continue;
        }
        split_chunks.emplace_back(static_cast<int64_t>(items.size()), splits);
        for (int64_t s = 0; s < splits; ++s) {
          items.push_back(
              {r, h, q0, q1, split_start(kv_end, s, splits), split_start(kv_end, s + 1, splits), part_rows});
          part_rows += (q1 - q0) * G;
        }
      }
    }
  }
  Partials parts{std::vector<float>(part_rows * D), std::vector<float>(part_rows),
                 std::vector<float>(part_rows)};
  const float sc = static_cast<float>(scale);
  const int simd = simd_level(D);
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kHalf, at::kBFloat16, q.scalar_type(), "dspark_paged_verify_attention_cpu", [&] {
        const scalar_t* qp = qc.data_ptr<scalar_t>();
        const scalar_t* kp = kc.data_ptr<scalar_t>();
        const scalar_t* vp = vc.data_ptr<scalar_t>();
        scalar_t* op = out.data_ptr<scalar_t>();
        at::parallel_for(0, static_cast<int64_t>(items.size()), 1, [&](int64_t begin, int64_t end) {
          for (int64_t i = begin; i < end; ++i) {
            attend_item(items[i], qp, kp, vp, op, qop, kvpp, idxp, lastp, Hq, Hkv, D, ps, sc, causal, simd,
                        parts);
          }
        });
        at::parallel_for(0, static_cast<int64_t>(split_chunks.size()), 1, [&](int64_t begin, int64_t end) {
          for (int64_t c = begin; c < end; ++c) {
            const auto [first, n] = split_chunks[c];
            merge_splits(items.data() + first, n, parts, op, qop, Hq, Hkv, D);
          }
        });
      });
  return out;
}

}  // namespace dspark

TORCH_LIBRARY_IMPL(dspark, CPU, m) { m.impl("paged_verify_attention", &dspark::paged_verify_attention_cpu); }
