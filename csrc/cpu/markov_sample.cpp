// SPDX-License-Identifier: Apache-2.0
// CPU markov_sample: the semi-autoregressive Markov draft step.
// For k = 0..g-1 (left to right): e = W1[x_{k-1}] (x_{-1} = anchor), z_k = U_k + W2 e, x_k = argmax(z_k / T +
// G) with keyed Philox Gumbel noise G (argmax of z_k when T = 0). Each step runs parallel over vocabulary
// tiles; a tile of W2 is read once per step and reused for every request from cache. The arithmetic
// (markov_dot, temperature_scaled, the Gumbel key, best_of's tie rule) is include/dspark/sampling.h, shared
// with the CUDA kernel, so tokens and z agree bit for bit across devices. CPUs with AVX-512 run tile_avx512
// (markov_sample_avx512.h: the same operations 16 lanes at a time), others tile_step.
#include "checks/markov_sample.h"

#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <atomic>
#include <cstdlib>
#include <vector>

#include "dspark/sampling.h"
#include "markov_sample_avx512.h"
#include "markov_sample_impl.h"

namespace dspark {
namespace {

constexpr int64_t kVocabTile = 256;
// A token whose scaled logit is this far below its tile's maximum can never win the Gumbel-max: the largest
// Gumbel value (u = 1 - 2^-24) is 16.64 and the smallest (u = 2^-24) is -2.82. Skipping its noise is exact.
constexpr float kGumbelSpan = 19.5f;

// The tile's winner among y[0 .. i1 - i0) = z / T (or z when T = 0): Gumbel-max with keyed Philox noise,
// ties to the lowest index.
KeyIdx select_tile(const float* y, int64_t i0, int64_t i1, float temperature, uint64_t seed, uint64_t offset,
                   uint32_t request, uint32_t position) {
  KeyIdx best{-INFINITY, -1};
  if (temperature == 0.0f) {
    for (int64_t i = i0; i < i1; ++i) best = best_of(best, KeyIdx{y[i - i0], i});
    return best;
  }
  float ymax = -INFINITY;
  for (int64_t i = i0; i < i1; ++i) ymax = y[i - i0] > ymax ? y[i - i0] : ymax;
  const float cut = add_rn(ymax, -kGumbelSpan);
  for (int64_t b = i0 & ~int64_t{3}; b < i1; b += 4) {  // Philox blocks of 4 consecutive vocabulary ids
    bool any = false;
    for (int64_t i = b < i0 ? i0 : b; i < b + 4 && i < i1; ++i) any |= y[i - i0] >= cut;
    if (!any) continue;
    const Philox4 words =
        philox_block(seed, offset, request, position, kPurposeDraftSample, static_cast<uint32_t>(b >> 2));
    for (int c = 0; c < 4; ++c) {
      const int64_t i = b + c;
      if (i < i0 || i >= i1 || !(y[i - i0] >= cut)) continue;  // -inf logits never win
      const float key = add_rn(y[i - i0], uniform_to_gumbel(bits_to_uniform(words.v[c])));
      best = best_of(best, KeyIdx{key, i});
    }
  }
  return best;
}

// One (vocab tile, request) unit of a step: writes z for the tile and returns the tile's best key.
// -ffp-contract=off keeps mul and add unfused.
template <typename TU, typename TW>
__attribute__((always_inline)) inline KeyIdx tile_step(const TU* u_row, float* z_row, const TW* w2,
                                                       const float* e, int64_t rank, int64_t i0, int64_t i1,
                                                       float temperature, uint64_t seed, uint64_t offset,
                                                       uint32_t request, uint32_t position) {
  float y[kVocabTile];
  for (int64_t i = i0; i < i1; ++i) {
    const float z = add_rn(static_cast<float>(u_row[i]), markov_dot(w2 + i * rank, e, rank));
    z_row[i] = z;
    y[i - i0] = temperature_scaled(z, temperature);
  }
  return select_tile(y, i0, i1, temperature, seed, offset, request, position);
}

using TileFn = KeyIdx (*)(const void*, float*, const void*, const float*, int64_t, int64_t, int64_t, float,
                          uint64_t, uint64_t, uint32_t, uint32_t);

#define DSPARK_TILE_CLONE(NAME, TU, TW)                                                                    \
  __attribute__((target_clones("arch=x86-64-v3", "default"))) KeyIdx NAME(                                 \
      const void* u, float* z, const void* w2, const float* e, int64_t rank, int64_t i0, int64_t i1,       \
      float t, uint64_t s, uint64_t o, uint32_t req, uint32_t pos) {                                       \
    return tile_step<TU, TW>(static_cast<const TU*>(u), z, static_cast<const TW*>(w2), e, rank, i0, i1, t, \
                             s, o, req, pos);                                                              \
  }

// An AVX2 clone (target_clones) measured ~13x slower here: the per-element calls into the SSE-compiled Gumbel
// helpers and libm fmaf pay AVX/SSE transition costs. Plain baseline code it is.
#if 0
#define DSPARK_TILE(NAME, TU, TW) DSPARK_TILE_CLONE(NAME, TU, TW)
#else
#define DSPARK_TILE(NAME, TU, TW)                                                                            \
  KeyIdx NAME(const void* u, float* z, const void* w2, const float* e, int64_t rank, int64_t i0, int64_t i1, \
              float t, uint64_t s, uint64_t o, uint32_t req, uint32_t pos) {                                 \
    return tile_step<TU, TW>(static_cast<const TU*>(u), z, static_cast<const TW*>(w2), e, rank, i0, i1, t,   \
                             s, o, req, pos);                                                                \
  }
#endif

using bf16 = c10::BFloat16;
using f16 = c10::Half;
DSPARK_TILE(tile_f32_f32, float, float)
DSPARK_TILE(tile_f32_bf16, float, bf16)
DSPARK_TILE(tile_f32_f16, float, f16)
DSPARK_TILE(tile_bf16_f32, bf16, float)
DSPARK_TILE(tile_bf16_bf16, bf16, bf16)
DSPARK_TILE(tile_bf16_f16, bf16, f16)
DSPARK_TILE(tile_f16_f32, f16, float)
DSPARK_TILE(tile_f16_bf16, f16, bf16)
DSPARK_TILE(tile_f16_f16, f16, f16)

TileFn pick_tile(at::ScalarType tu, at::ScalarType tw) {
  const int a = tu == at::kFloat ? 0 : tu == at::kBFloat16 ? 1 : 2;
  const int b = tw == at::kFloat ? 0 : tw == at::kBFloat16 ? 1 : 2;
  static const TileFn table[3][3] = {{tile_f32_f32, tile_f32_bf16, tile_f32_f16},
                                     {tile_bf16_f32, tile_bf16_bf16, tile_bf16_f16},
                                     {tile_f16_f32, tile_f16_bf16, tile_f16_f16}};
  return table[a][b];
}

#if DSPARK_HAVE_AVX512_PATH
// A whole vocabulary tile [i0, i1) of step k for every request: the bias W2 e of all requests first (each W2
// row is loaded once for all of them), then per request z, y = z / T and the Gumbel-max over the tile, 64
// ids per Philox call. u [R, G, V], z [R, G, V], e2 [ceil(R / 2), nb, 16] (avx512::dot_rows),
// out [R]. Same values and winner as tile_step; a tile holding a NaN y goes through select_tile so that its
// (order-dependent) handling stays the scalar one.
template <typename TU, typename TW>
DSPARK_AVX512 void tile_avx512(const TU* u, float* z, const TW* w2, const float* e2, int64_t nb, int64_t R,
                               int64_t G, int64_t V, int64_t rank, int64_t k, int64_t i0, int64_t i1,
                               const float* temps, uint64_t seed, uint64_t offset, const uint32_t* req,
                               KeyIdx* out) {
  using namespace avx512;
  constexpr int64_t S = kVocabTile;
  static_assert(S % 64 == 0, "tiles are whole Philox groups of 64 ids");
  thread_local std::vector<float> scratch;
  scratch.resize(static_cast<size_t>((R + 1) * S));
  float* dots = scratch.data();  // [R, S]
  float* y = dots + R * S;       // [S], -inf past the tile
  markov_bias_tile(w2, rank, i0, i1, e2, nb, R, dots, S);
  const int64_t n = i1 - i0, n64 = (n + 63) & ~int64_t{63};
  const __m512 ninf = _mm512_set1_ps(-INFINITY);
  for (int64_t r = 0; r < R; ++r) {
    const int64_t rk = r * G + k;
    const TU* ur = u + rk * V + i0;
    float* zr = z + rk * V + i0;
    const float* d = dots + r * S;
    const float t = temps[r];
    __m512 vmax = ninf;
    __mmask16 nan = 0;
    for (int64_t c = 0; c < n64; c += 16) {
      const __mmask16 m = n - c >= 16 ? __mmask16(0xFFFF) : n > c ? __mmask16((1u << (n - c)) - 1u) : 0;
      const __m512 zv = _mm512_add_ps(load16(ur + c, m), _mm512_maskz_loadu_ps(m, d + c));
      _mm512_mask_storeu_ps(zr + c, m, zv);
      const __m512 yv = _mm512_mask_mov_ps(ninf, m, t == 0.0f ? zv : _mm512_div_ps(zv, _mm512_set1_ps(t)));
      _mm512_storeu_ps(y + c, yv);
      nan |= _mm512_cmp_ps_mask(yv, yv, _CMP_UNORD_Q);
      vmax = _mm512_max_ps(vmax, yv);
    }
    if (nan) {
      out[r] = select_tile(y, i0, i1, t, seed, offset, req[r], static_cast<uint32_t>(k));
      continue;
    }
    Argmax16 am{ninf, _mm512_setzero_si512()};
    if (t == 0.0f) {
      for (int64_t c = 0; c < n64; c += 16) argmax_update(am, _mm512_loadu_ps(y + c), c);
    } else {
      // Gumbel values lie in [-2.82, 16.64]: ids kGumbelSpan below the tile's maximum cannot win (as
      // tile_step)
      const __m512 cut = _mm512_set1_ps(add_rn(_mm512_reduce_max_ps(vmax), -kGumbelSpan));
      for (int64_t c = 0; c < n64; c += 64) {
        __m512 yv[4];
        __mmask16 in[4];
        for (int q = 0; q < 4; ++q) {
          yv[q] = _mm512_loadu_ps(y + c + 16 * q);
          in[q] = _mm512_cmp_ps_mask(yv[q], cut, _CMP_GE_OQ);
        }
        if ((in[0] | in[1] | in[2] | in[3]) == 0) continue;
        __m512 g[4];
        gumbel64(seed, offset, req[r], static_cast<uint32_t>(k), kPurposeDraftSample,
                 static_cast<uint32_t>((i0 + c) >> 2), g);
        for (int q = 0; q < 4; ++q)
          argmax_update(am, _mm512_mask_mov_ps(ninf, in[q], _mm512_add_ps(yv[q], g[q])), c + 16 * q);
      }
    }
    float key;
    int32_t idx;
    // no key above -inf: every id of the tile is -inf and the lowest one wins, as in select_tile
    out[r] = argmax_finish(am, key, idx) ? KeyIdx{key, i0 + idx} : KeyIdx{-INFINITY, i0};
  }
}

using TileAllFn = void (*)(const void*, float*, const void*, const float*, int64_t, int64_t, int64_t, int64_t,
                           int64_t, int64_t, int64_t, int64_t, const float*, uint64_t, uint64_t,
                           const uint32_t*, KeyIdx*);

template <typename TU, typename TW>
void tile_avx512_erased(const void* u, float* z, const void* w2, const float* e2, int64_t nb, int64_t R,
                        int64_t G, int64_t V, int64_t rank, int64_t k, int64_t i0, int64_t i1, const float* t,
                        uint64_t s, uint64_t o, const uint32_t* req, KeyIdx* out) {
  tile_avx512<TU, TW>(static_cast<const TU*>(u), z, static_cast<const TW*>(w2), e2, nb, R, G, V, rank, k, i0,
                      i1, t, s, o, req, out);
}

TileAllFn pick_tile_avx512(at::ScalarType tu, at::ScalarType tw) {
  const int a = tu == at::kFloat ? 0 : tu == at::kBFloat16 ? 1 : 2;
  const int b = tw == at::kFloat ? 0 : tw == at::kBFloat16 ? 1 : 2;
  static const TileAllFn table[3][3] = {
      {tile_avx512_erased<float, float>, tile_avx512_erased<float, bf16>, tile_avx512_erased<float, f16>},
      {tile_avx512_erased<bf16, float>, tile_avx512_erased<bf16, bf16>, tile_avx512_erased<bf16, f16>},
      {tile_avx512_erased<f16, float>, tile_avx512_erased<f16, bf16>, tile_avx512_erased<f16, f16>}};
  return table[a][b];
}
#endif

// u: [R, g, V] (dtype tu), writes z [R, g, V] f32,
// tokens [R, g] i64, prev_emb [R, g, r] f32.
void markov_steps(const void* u, at::ScalarType tu, const at::Tensor& anchor, const at::Tensor& w1,
                  const at::Tensor& w2, const at::Tensor& temperature, int64_t seed, int64_t offset,
                  const c10::optional<at::Tensor>& request_ids, at::Tensor& z, at::Tensor& tokens,
                  at::Tensor& prev_emb) {
  const int64_t R = z.size(0), G = z.size(1), V = z.size(2), rank = w1.size(1);
  if (R == 0 || G == 0) return;
  const auto a = anchor.contiguous();
  const auto t = temperature.contiguous();
  const auto w1c = w1.contiguous(), w2c = w2.contiguous();
  const auto ids = request_ids.has_value() ? request_ids->contiguous() : at::Tensor();
  const int64_t* ap = a.data_ptr<int64_t>();
  const float* tp = t.data_ptr<float>();
  float* zp = z.data_ptr<float>();
  int64_t* xp = tokens.data_ptr<int64_t>();
  float* ep = prev_emb.data_ptr<float>();
  const TileFn tile = pick_tile(tu, w2c.scalar_type());
  const size_t u_elem = c10::elementSize(tu);
  const char* w2p = static_cast<const char*>(w2c.data_ptr());
  const int64_t n_tiles = (V + kVocabTile - 1) / kVocabTile;
  std::vector<KeyIdx> partial(static_cast<size_t>(n_tiles * R));
  std::vector<uint32_t> req(R);
  for (int64_t r = 0; r < R; ++r)
    req[r] = static_cast<uint32_t>(ids.defined() ? ids.data_ptr<int64_t>()[r] : r);
  // W1 rows are widened to f32 as they are gathered (exact), not the whole [V, r] table on every call
  const auto gather_w1 = [&](int64_t row, float* dst) {
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, w1c.scalar_type(), "markov_sample_w1", [&] {
      const scalar_t* src = w1c.data_ptr<scalar_t>() + row * rank;
      for (int64_t j = 0; j < rank; ++j) dst[j] = static_cast<float>(src[j]);
    });
  };
  const bool simd = avx512::enabled();
  const int64_t nb = (rank + 7) / 8;
  std::vector<float> e2(simd ? static_cast<size_t>((R + 1) / 2 * nb * 16) : 0);
#if DSPARK_HAVE_AVX512_PATH
  const TileAllFn tile_all = simd ? pick_tile_avx512(tu, w2c.scalar_type()) : nullptr;
#endif
  for (int64_t k = 0; k < G; ++k) {
    for (int64_t r = 0; r < R; ++r) {  // e = W1[x_{k-1}]
      gather_w1(k == 0 ? ap[r] : xp[r * G + k - 1], ep + (r * G + k) * rank);
    }
#if DSPARK_HAVE_AVX512_PATH
    if (simd) {
      // e of request pairs interleaved per 8-wide j-block, zero past rank and past R (see avx512::dot_rows)
      std::fill(e2.begin(), e2.end(), 0.0f);
      for (int64_t r = 0; r < R; ++r) {
        const float* er = ep + (r * G + k) * rank;
        float* dst = e2.data() + (r / 2) * nb * 16 + (r % 2) * 8;
        for (int64_t j = 0; j < rank; ++j) dst[(j / 8) * 16 + j % 8] = er[j];
      }
      // tiles handed out one at a time: a thread slowed down by other load does not hold back the step
      std::atomic<int64_t> next{0};
      at::parallel_for(0, std::min<int64_t>(n_tiles, at::get_num_threads()), 1, [&](int64_t, int64_t) {
        for (int64_t ti = next++; ti < n_tiles; ti = next++) {
          const int64_t i0 = ti * kVocabTile, i1 = std::min(V, i0 + kVocabTile);
          tile_all(u, zp, w2p, e2.data(), nb, R, G, V, rank, k, i0, i1, tp, static_cast<uint64_t>(seed),
                   static_cast<uint64_t>(offset), req.data(), partial.data() + ti * R);
        }
      });
    } else
#endif
    {
      // (tile, request) units, tile-major so that consecutive units reuse the W2 tile from cache
      const int64_t grain = std::max<int64_t>(1, 4096 / std::max<int64_t>(1, std::min(V, kVocabTile) * rank));
      at::parallel_for(0, n_tiles * R, grain, [&](int64_t ub, int64_t ue) {
        for (int64_t unit = ub; unit < ue; ++unit) {
          const int64_t ti = unit / R, r = unit % R;
          const int64_t i0 = ti * kVocabTile, i1 = std::min(V, i0 + kVocabTile);
          const int64_t rk = r * G + k;
          partial[unit] = tile(static_cast<const char*>(u) + rk * V * u_elem, zp + rk * V, w2p,
                               ep + rk * rank, rank, i0, i1, tp[r], static_cast<uint64_t>(seed),
                               static_cast<uint64_t>(offset), req[r], static_cast<uint32_t>(k));
        }
      });
    }
    for (int64_t r = 0; r < R; ++r) {
      KeyIdx best{-INFINITY, -1};
      for (int64_t ti = 0; ti < n_tiles; ++ti) best = best_of(best, partial[ti * R + r]);
      TORCH_CHECK(best.idx >= 0, "dspark::markov_sample: internal error: no token drawn for request ", r);
      xp[r * G + k] = best.idx;
    }
  }
}

}  // namespace

std::tuple<at::Tensor, at::Tensor, at::Tensor> markov_sample_cpu_checked(
    const at::Tensor& base_logits, const at::Tensor& anchor, const at::Tensor& w1, const at::Tensor& w2,
    const at::Tensor& temperature, int64_t seed, int64_t offset,
    const c10::optional<at::Tensor>& request_ids) {
  const int64_t R = base_logits.size(0), G = base_logits.size(1), V = base_logits.size(2), rank = w1.size(1);
  const auto u = base_logits.contiguous();
  auto opts = u.options().dtype(at::kFloat);
  auto z = at::empty({R, G, V}, opts);
  auto tokens = at::empty({R, G}, opts.dtype(at::kLong));
  auto prev_emb = at::empty({R, G, rank}, opts);
  markov_steps(u.data_ptr(), u.scalar_type(), anchor, w1, w2, temperature, seed, offset, request_ids, z,
               tokens, prev_emb);
  return {tokens, z, prev_emb};
}

// base_logits [R, g, V] f32/bf16/f16, anchor [R] i64, w1 [V, r], w2 [V, r], temperature [R] f32
//   -> tokens [R, g] i64, draft_logits [R, g, V] f32, prev_emb [R, g, r] f32
std::tuple<at::Tensor, at::Tensor, at::Tensor> markov_sample_cpu(
    const at::Tensor& base_logits, const at::Tensor& anchor, const at::Tensor& w1, const at::Tensor& w2,
    const at::Tensor& temperature, int64_t seed, int64_t offset, const c10::optional<at::Tensor>& request_ids,
    const c10::optional<at::Tensor>& round_offset) {
  check_markov_sample_args(base_logits, anchor, w1, w2, temperature, request_ids, round_offset);
  check_markov_sample_values(base_logits, anchor, temperature, request_ids);
  const auto off = static_cast<int64_t>(philox_offset(offset, round_offset).value());
  return markov_sample_cpu_checked(base_logits, anchor, w1, w2, temperature, seed, off, request_ids);
}

}  // namespace dspark

TORCH_LIBRARY_IMPL(dspark, CPU, m) { m.impl("markov_sample", &dspark::markov_sample_cpu); }
