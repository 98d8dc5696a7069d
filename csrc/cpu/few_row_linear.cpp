// SPDX-License-Identifier: Apache-2.0
// CPU few_row_linear: y = x · wᵀ (+ b) for a few rows of x, reading the weight once from memory.
//
// A decode or verify step multiplies 1–64 rows by every weight of the model; the weights are far larger than
// the caches, so a step of few rows is bound by reading them. BLAS GEMMs re-pack the weight per call and
// their few-row kernels grow with the rows (MKL fp32 on a 2-thread Xeon: 2.2x the 1-row time at 4 rows). Here
// each thread owns a slice of the weight's rows: a block of w rows (4 with AVX-512, 3 with AVX2) stays in L1
// while every tile of up to 6 (AVX-512) or 4 (AVX2) rows of x is multiplied against it and the next block is
// prefetched, so w streams from memory once whatever the row count, its reads overlapping the FMAs. Sums are
// fp32 with fused multiply-adds in a fixed order per (row, output): equal to F.linear to float rounding, and
// the same for any thread count (threads split the outputs, not the sums).
#include "checks/few_row_linear.h"

#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "avx512_common.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define DSPARK_FEW_ROW_SIMD 1
#include <immintrin.h>
#define DSPARK_TARGET_AVX512 __attribute__((target("avx512f,avx2,fma")))
#define DSPARK_TARGET_AVX2 __attribute__((target("avx2,fma")))
#endif

namespace dspark {
namespace {

constexpr int64_t kOutBlock = 4;  // rows of w per register tile

// Outputs [n0, n1) of every row, one output at a time (the fallback and the last n % 4 outputs).
void outputs_scalar(const float* x, const float* w, const float* b, float* y, int64_t M, int64_t N, int64_t K,
                    int64_t n0, int64_t n1) {
  for (int64_t n = n0; n < n1; ++n) {
    const float* wn = w + n * K;
    for (int64_t m = 0; m < M; ++m) {
      const float* xm = x + m * K;
      float acc[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
      int64_t k = 0;
      for (; k + 8 <= K; k += 8) {
        for (int l = 0; l < 8; ++l) acc[l] += xm[k + l] * wn[k + l];
      }
      for (; k < K; ++k) acc[0] += xm[k] * wn[k];
      float s = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
      y[m * N + n] = b == nullptr ? s : s + b[n];
    }
  }
}

#ifdef DSPARK_FEW_ROW_SIMD

// The vector paths run where the CPU has them; DSPARK_CPU_SIMD=0 forces the scalar loop and
// DSPARK_CPU_SIMD=avx2 the AVX2 path on an AVX-512 CPU (the tests run every path the CPU has).
int simd_level() {
  static const int level = !__builtin_cpu_supports("fma")      ? 0
                           : __builtin_cpu_supports("avx512f") ? 2
                           : __builtin_cpu_supports("avx2")    ? 1
                                                               : 0;
  const char* env = std::getenv("DSPARK_CPU_SIMD");
  if (env == nullptr) return level;
  if (env[0] == '0') return 0;
  return std::strcmp(env, "avx2") == 0 ? std::min(level, 1) : level;
}

// 4 outputs n..n+3 for MT (1..6) rows of x starting at row m0: 4·MT accumulators of 16 lanes, named one by
// one (an array of them is kept on the stack by GCC, a store per FMA).
#define DSPARK_FMA_ROW(i, load, fma)            \
  if constexpr (MT > i) {                       \
    const auto xv = load(x + (m0 + i) * K + k); \
    a##i##0 = fma(xv, w0, a##i##0);             \
    a##i##1 = fma(xv, w1, a##i##1);             \
    a##i##2 = fma(xv, w2, a##i##2);             \
    a##i##3 = fma(xv, w3, a##i##3);             \
  }
// The same 64 bytes of the next block's ROWS weight rows: the rows are read while this block's products run
// (without it the reads and the FMAs take turns). A prefetch past the end of the weight is a no-op.
template <int ROWS = kOutBlock>
inline void prefetch_next_block(const float* p, int64_t K) {
  for (int j = 0; j < ROWS; ++j) {
    _mm_prefetch(reinterpret_cast<const char*>(p + (ROWS + j) * K), _MM_HINT_T0);
  }
}

DSPARK_TARGET_AVX512 inline __m512 load512(const float* p) { return _mm512_loadu_ps(p); }

#define DSPARK_STORE_ROW512(i)                                   \
  if constexpr (MT > i) {                                        \
    __m128 s = avx512::sum4(a##i##0, a##i##1, a##i##2, a##i##3); \
    if (b != nullptr) s = _mm_add_ps(s, _mm_loadu_ps(b + n));    \
    _mm_storeu_ps(y + (m0 + i) * N + n, s);                      \
  }
#define DSPARK_LOAD_ACC512(i)                     \
  if constexpr (MT > i) {                         \
    a##i##0 = _mm512_loadu_ps(acc + 64 * i);      \
    a##i##1 = _mm512_loadu_ps(acc + 64 * i + 16); \
    a##i##2 = _mm512_loadu_ps(acc + 64 * i + 32); \
    a##i##3 = _mm512_loadu_ps(acc + 64 * i + 48); \
  }
#define DSPARK_SAVE_ACC512(i)                     \
  if constexpr (MT > i) {                         \
    _mm512_storeu_ps(acc + 64 * i, a##i##0);      \
    _mm512_storeu_ps(acc + 64 * i + 16, a##i##1); \
    _mm512_storeu_ps(acc + 64 * i + 32, a##i##2); \
    _mm512_storeu_ps(acc + 64 * i + 48, a##i##3); \
  }

constexpr int64_t kRowTile512 = 6;  // rows of x per AVX-512 register tile
// columns per pass: a 6-row chunk of x (18 KB) and the block's weights (12 KB) stay in L1
constexpr int64_t kChunk512 = 768;

// Outputs n..n+3 for MT (1..6) rows of x from row m0, columns [k0, k1): 4 · MT accumulators (24 of the 32
// registers at 6 rows, the 4 weight vectors and one x vector beside them), 4 + MT loads per 4 · MT FMAs. The
// sums continue from ``acc`` when k0 > 0 and are kept there when k1 < K (registers and memory hold the same
// floats: chunking changes no sum's order). Each pass also requests weight rows [j0, j1) of the block
// two blocks ahead (into L2) over the same columns, so the passes of a block share the next reads evenly.
// When one pass does all the rows (ONE_PASS: M <= 6) it requests all 4 rows of the next block into L1, as the
// 4 x 4 loops before it did (the spread, looped requests cost 7 % at 4 rows, docs/benchmarks.md).
template <int MT, bool ONE_PASS>
DSPARK_TARGET_AVX512 void block_avx512(const float* x, const float* w, const float* b, float* y, int64_t m0,
                                       int64_t N, int64_t K, int64_t n, int64_t k0, int64_t k1, float* acc,
                                       int j0, int j1) {
  const __m512 zero = _mm512_setzero_ps();
  __m512 a00 = zero, a01 = zero, a02 = zero, a03 = zero, a10 = zero, a11 = zero, a12 = zero, a13 = zero;
  __m512 a20 = zero, a21 = zero, a22 = zero, a23 = zero, a30 = zero, a31 = zero, a32 = zero, a33 = zero;
  __m512 a40 = zero, a41 = zero, a42 = zero, a43 = zero, a50 = zero, a51 = zero, a52 = zero, a53 = zero;
  if (k0 > 0) {
    DSPARK_LOAD_ACC512(0)
    DSPARK_LOAD_ACC512(1)
    DSPARK_LOAD_ACC512(2)
    DSPARK_LOAD_ACC512(3)
    DSPARK_LOAD_ACC512(4)
    DSPARK_LOAD_ACC512(5)
  }
  const float *r0 = w + n * K, *r1 = r0 + K, *r2 = r1 + K, *r3 = r2 + K;
  const float* ahead = r0 + 2 * kOutBlock * K;  // past the weight: a no-op prefetch
  const int64_t k16 = k0 + (k1 - k0) / 16 * 16;
  int64_t k = k0;
  for (; k < k16; k += 16) {
    if constexpr (ONE_PASS) {
      prefetch_next_block(r0 + k, K);
    } else {
      for (int j = j0; j < j1; ++j)
        _mm_prefetch(reinterpret_cast<const char*>(ahead + j * K + k), _MM_HINT_T1);
    }
    const __m512 w0 = load512(r0 + k), w1 = load512(r1 + k), w2 = load512(r2 + k), w3 = load512(r3 + k);
    DSPARK_FMA_ROW(0, load512, _mm512_fmadd_ps)
    DSPARK_FMA_ROW(1, load512, _mm512_fmadd_ps)
    DSPARK_FMA_ROW(2, load512, _mm512_fmadd_ps)
    DSPARK_FMA_ROW(3, load512, _mm512_fmadd_ps)
    DSPARK_FMA_ROW(4, load512, _mm512_fmadd_ps)
    DSPARK_FMA_ROW(5, load512, _mm512_fmadd_ps)
  }
  // the last K % 16 columns (earlier chunks end on multiples of 16): masked loads read nothing past the rows
  if (k < k1) {
    const __mmask16 mask = static_cast<__mmask16>((1u << (k1 - k)) - 1u);
#define DSPARK_TAIL_LOAD(p) _mm512_maskz_loadu_ps(mask, p)
    const __m512 w0 = DSPARK_TAIL_LOAD(r0 + k), w1 = DSPARK_TAIL_LOAD(r1 + k);
    const __m512 w2 = DSPARK_TAIL_LOAD(r2 + k), w3 = DSPARK_TAIL_LOAD(r3 + k);
    DSPARK_FMA_ROW(0, DSPARK_TAIL_LOAD, _mm512_fmadd_ps)
    DSPARK_FMA_ROW(1, DSPARK_TAIL_LOAD, _mm512_fmadd_ps)
    DSPARK_FMA_ROW(2, DSPARK_TAIL_LOAD, _mm512_fmadd_ps)
    DSPARK_FMA_ROW(3, DSPARK_TAIL_LOAD, _mm512_fmadd_ps)
    DSPARK_FMA_ROW(4, DSPARK_TAIL_LOAD, _mm512_fmadd_ps)
    DSPARK_FMA_ROW(5, DSPARK_TAIL_LOAD, _mm512_fmadd_ps)
#undef DSPARK_TAIL_LOAD
  }
  if (k1 < K) {
    DSPARK_SAVE_ACC512(0)
    DSPARK_SAVE_ACC512(1)
    DSPARK_SAVE_ACC512(2)
    DSPARK_SAVE_ACC512(3)
    DSPARK_SAVE_ACC512(4)
    DSPARK_SAVE_ACC512(5)
    return;
  }
  DSPARK_STORE_ROW512(0)
  DSPARK_STORE_ROW512(1)
  DSPARK_STORE_ROW512(2)
  DSPARK_STORE_ROW512(3)
  DSPARK_STORE_ROW512(4)
  DSPARK_STORE_ROW512(5)
}

template <bool ONE_PASS>
DSPARK_TARGET_AVX512 void tile_avx512(const float* x, const float* w, const float* b, float* y, int64_t m,
                                      int64_t rows, int64_t N, int64_t K, int64_t n, int64_t k0, int64_t k1,
                                      float* acc, int j0, int j1) {
  switch (rows) {
    case 6:
      return block_avx512<6, ONE_PASS>(x, w, b, y, m, N, K, n, k0, k1, acc, j0, j1);
    case 5:
      return block_avx512<5, ONE_PASS>(x, w, b, y, m, N, K, n, k0, k1, acc, j0, j1);
    case 4:
      return block_avx512<4, ONE_PASS>(x, w, b, y, m, N, K, n, k0, k1, acc, j0, j1);
    case 3:
      return block_avx512<3, ONE_PASS>(x, w, b, y, m, N, K, n, k0, k1, acc, j0, j1);
    case 2:
      return block_avx512<2, ONE_PASS>(x, w, b, y, m, N, K, n, k0, k1, acc, j0, j1);
    default:
      return block_avx512<1, ONE_PASS>(x, w, b, y, m, N, K, n, k0, k1, acc, j0, j1);
  }
}

DSPARK_TARGET_AVX512 void outputs_avx512(const float* x, const float* w, const float* b, float* y, int64_t M,
                                         int64_t N, int64_t K, int64_t n0, int64_t n1) {
  const int64_t tiles = (M + kRowTile512 - 1) / kRowTile512;
  // partial sums of every tile between column chunks (only when K > kChunk512)
  std::vector<float> partial(K > kChunk512 ? static_cast<size_t>(64 * kRowTile512 * tiles) : 0);
  for (int64_t n = n0; n < n1; n += kOutBlock) {
    for (int64_t k0 = 0; k0 < K; k0 += kChunk512) {
      const int64_t k1 = std::min(K, k0 + kChunk512);
      for (int64_t t = 0; t < tiles; ++t) {
        const int64_t m = t * kRowTile512, rows = std::min(kRowTile512, M - m);
        float* acc = partial.empty() ? nullptr : partial.data() + 64 * kRowTile512 * t;
        const int j0 = static_cast<int>(kOutBlock * t / tiles),
                  j1 = static_cast<int>(kOutBlock * (t + 1) / tiles);
        if (tiles == 1) {
          tile_avx512<true>(x, w, b, y, m, rows, N, K, n, k0, k1, acc, j0, j1);
        } else {
          tile_avx512<false>(x, w, b, y, m, rows, N, K, n, k0, k1, acc, j0, j1);
        }
      }
    }
  }
}

// AVX2: 8 lanes, 16 registers: 3 outputs × 4 rows of accumulators, the 3 weight vectors and one x vector.
// Each x vector feeds 3 FMAs and each weight vector 4: 7 loads per 12 FMAs. (A 4 × 2 tile needs 6 loads per 8
// FMAs and has only the 8 independent sums two FMA units of latency 4 need: on a Zen 3 it ran at 0.73-0.95x
// this tile's speed at 8-32 rows, cold weights.) Any tile gives each (row, output) the same sum in the same
// order. The K tail goes through a scalar loop.
DSPARK_TARGET_AVX2 inline float hsum8(__m256 v) {
  const __m128 lo = _mm256_castps256_ps128(v), hi = _mm256_extractf128_ps(v, 1);
  __m128 s = _mm_add_ps(lo, hi);
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

DSPARK_TARGET_AVX2 inline __m256 load256(const float* p) { return _mm256_loadu_ps(p); }
DSPARK_TARGET_AVX2 inline float finish256(__m256 v, const float* xr, const float* wr, int64_t K8, int64_t K,
                                          const float* b, int64_t n) {
  float s = hsum8(v);
  for (int64_t k = K8; k < K; ++k) s += xr[k] * wr[k];
  return b == nullptr ? s : s + b[n];
}

constexpr int64_t kOutBlockAvx2 = 3;  // rows of w per AVX2 register tile

// x row m0 + i against the NW weight vectors of this k
#define DSPARK_FMA_ROW3(i)                                            \
  if constexpr (MT > i) {                                             \
    const __m256 xv = load256(x + (m0 + i) * K + k);                  \
    a##i##0 = _mm256_fmadd_ps(xv, w0, a##i##0);                       \
    if constexpr (NW > 1) a##i##1 = _mm256_fmadd_ps(xv, w1, a##i##1); \
    if constexpr (NW > 2) a##i##2 = _mm256_fmadd_ps(xv, w2, a##i##2); \
  }
#define DSPARK_STORE_ROW3(i)                                                   \
  if constexpr (MT > i) {                                                      \
    float* yr = y + (m0 + i) * N + n;                                          \
    const float* xr = x + (m0 + i) * K;                                        \
    yr[0] = finish256(a##i##0, xr, r0, K8, K, b, n);                           \
    if constexpr (NW > 1) yr[1] = finish256(a##i##1, xr, r1, K8, K, b, n + 1); \
    if constexpr (NW > 2) yr[2] = finish256(a##i##2, xr, r2, K8, K, b, n + 2); \
  }

// outputs n..n+NW-1 (NW = 1..3) for MT (1..4) rows of x starting at row m0
template <int NW, int MT>
DSPARK_TARGET_AVX2 void block_avx2(const float* x, const float* w, const float* b, float* y, int64_t m0,
                                   int64_t N, int64_t K, int64_t n) {
  const __m256 zero = _mm256_setzero_ps();
  __m256 a00 = zero, a01 = zero, a02 = zero, a10 = zero, a11 = zero, a12 = zero;
  __m256 a20 = zero, a21 = zero, a22 = zero, a30 = zero, a31 = zero, a32 = zero;
  // rows past NW alias row 0: never read (the loads below are compiled out)
  const float* r0 = w + n * K;
  const float* r1 = NW > 1 ? r0 + K : r0;
  const float* r2 = NW > 2 ? r0 + 2 * K : r0;
  const int64_t K8 = K - K % 8;
  for (int64_t k = 0; k < K8; k += 8) {
    // every pass prefetches: the first alone left the next block's reads late at 8-16 rows
    if (k % 16 == 0) prefetch_next_block<kOutBlockAvx2>(r0 + k, K);
    const __m256 w0 = load256(r0 + k);
    const __m256 w1 = NW > 1 ? load256(r1 + k) : zero;
    const __m256 w2 = NW > 2 ? load256(r2 + k) : zero;
    DSPARK_FMA_ROW3(0)
    DSPARK_FMA_ROW3(1)
    DSPARK_FMA_ROW3(2)
    DSPARK_FMA_ROW3(3)
  }
  DSPARK_STORE_ROW3(0)
  DSPARK_STORE_ROW3(1)
  DSPARK_STORE_ROW3(2)
  DSPARK_STORE_ROW3(3)
}

template <int NW>
DSPARK_TARGET_AVX2 void rows_avx2(const float* x, const float* w, const float* b, float* y, int64_t M,
                                  int64_t N, int64_t K, int64_t n) {
  int64_t m = 0;
  for (; m + 4 <= M; m += 4) block_avx2<NW, 4>(x, w, b, y, m, N, K, n);
  switch (M - m) {
    case 3:
      block_avx2<NW, 3>(x, w, b, y, m, N, K, n);
      break;
    case 2:
      block_avx2<NW, 2>(x, w, b, y, m, N, K, n);
      break;
    case 1:
      block_avx2<NW, 1>(x, w, b, y, m, N, K, n);
      break;
    default:
      break;
  }
}

DSPARK_TARGET_AVX2 void outputs_avx2(const float* x, const float* w, const float* b, float* y, int64_t M,
                                     int64_t N, int64_t K, int64_t n0, int64_t n1) {
  int64_t n = n0;
  for (; n + kOutBlockAvx2 <= n1; n += kOutBlockAvx2) rows_avx2<3>(x, w, b, y, M, N, K, n);
  if (n1 - n == 2) rows_avx2<2>(x, w, b, y, M, N, K, n);
  if (n1 - n == 1) rows_avx2<1>(x, w, b, y, M, N, K, n);
}

#else
int simd_level() { return 0; }
#endif

}  // namespace

// x [M, K] f32, weight [N, K] f32, bias [N] f32 or none -> y [M, N] f32
at::Tensor few_row_linear_cpu(const at::Tensor& x, const at::Tensor& weight,
                              const std::optional<at::Tensor>& bias) {
  check_few_row_linear_args(x, weight, bias);
  const int64_t M = x.size(0), K = x.size(1), N = weight.size(0);
  const auto xc = x.contiguous();
  const auto wc = weight.contiguous();
  const at::Tensor bc = bias.has_value() ? bias->contiguous() : at::Tensor();
  auto y = at::empty({M, N}, x.options());
  if (M == 0 || N == 0) return y;
  if (K == 0) return bc.defined() ? y.copy_(bc.expand({M, N})) : y.zero_();
  const float* xp = xc.data_ptr<float>();
  const float* wp = wc.data_ptr<float>();
  const float* bp = bc.defined() ? bc.data_ptr<float>() : nullptr;
  float* yp = y.data_ptr<float>();
  [[maybe_unused]] const int level = simd_level();
  const int64_t blocks = N / kOutBlock;
  // each thread a contiguous run of output blocks: the weight rows it streams
  const int64_t grain = std::max<int64_t>(1, blocks / (4 * at::get_num_threads()));
  at::parallel_for(0, blocks, grain, [&](int64_t b0, int64_t b1) {
    const int64_t n0 = b0 * kOutBlock, n1 = b1 * kOutBlock;
#ifdef DSPARK_FEW_ROW_SIMD
    if (level == 2) return outputs_avx512(xp, wp, bp, yp, M, N, K, n0, n1);
    if (level == 1) return outputs_avx2(xp, wp, bp, yp, M, N, K, n0, n1);
#endif
    outputs_scalar(xp, wp, bp, yp, M, N, K, n0, n1);
  });
  outputs_scalar(xp, wp, bp, yp, M, N, K, blocks * kOutBlock, N);
  return y;
}

}  // namespace dspark

TORCH_LIBRARY_IMPL(dspark, CPU, m) { m.impl("few_row_linear", &dspark::few_row_linear_cpu); }
