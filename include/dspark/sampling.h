// SPDX-License-Identifier: Apache-2.0
// Sampling math shared by markov_sample and rejection_sample on CPU and CUDA, written so that both devices
// round every operation identically (fp32, no contraction, fixed reduction orders):
//   - exp_exact: exp with explicit rounding (only mul/add/rint and exponent bit twiddling);
//   - lane sums: a row sum over V is kSumLanes strided partial sums (lane l adds i = l, l + kSumLanes, ...
//     in increasing i) combined by the fixed tree lane[l] += lane[l + s] for s = kSumLanes/2, ..., 1. The CPU
//     loops keep kSumLanes accumulators, a CUDA block of kSumLanes threads keeps one each;
//   - markov_dot: the Markov bias W2[i] . e as 8 strided partial sums of mul_rn products, combined
//     ((a0+a1)+(a2+a3))+((a4+a5)+(a6+a7)) (markov_tree);
//   - ordered_key / key_to_float / search_key: a monotone map of floats to uint32 and the bisection over it
//     that finds the top-k / top-p thresholds;
//   - the draw rules: temperature_scaled, draft_key (Gumbel-max of a draft token), draft_weight (q's
//     unnormalised weight), accept_draft (u q(x) < p(x)), accept_proposal / proposal_residual_weight (the
//     same rules for a deterministic proposal, q one-hot at x), residual_key (Gumbel-max of a residual /
//     bonus weight), and KeyIdx / best_of (a running argmax with ties to the lowest index).
#pragma once
#include "dspark/macros.h"
#include "dspark/philox.h"

namespace dspark {

constexpr int kSumLanes = 256;

DSPARK_HD float div_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}

DSPARK_HD float rint_f(float x) {
#if defined(__CUDA_ARCH__)
  return rintf(x);
#else
  return std::nearbyint(x);
#endif
}

// exp(x) in fp32, identical on both devices; ~1 ulp. -inf -> 0, large -> inf; results below 2^-126 are
// formed by two exact-or-rounded multiplications (deterministic, not necessarily correctly rounded).
DSPARK_HD float exp_exact(float x) {
  if (!(x > -104.0f)) return 0.0f;  // also -inf (NaN never reaches the ops: inputs are checked)
  if (x > 88.8f) return bits_as_float(0x7F800000u);
  const float n = rint_f(mul_rn(x, 1.44269502f));  // round(x / ln2)
  // ln2 = hi + lo with hi's low mantissa bits zero: n * hi is exact for |n| < 256, x - n*hi is exact.
  const float r = add_rn(add_rn(x, -mul_rn(n, 0.693145752f)), -mul_rn(n, 1.42860677e-06f));
  float p = 1.98412698e-04f;                  // 1/7!
  p = add_rn(mul_rn(p, r), 1.38888889e-03f);  // 1/6!
  p = add_rn(mul_rn(p, r), 8.33333377e-03f);  // 1/5!
  p = add_rn(mul_rn(p, r), 4.16666679e-02f);  // 1/4!
  p = add_rn(mul_rn(p, r), 1.66666672e-01f);  // 1/3!
  p = add_rn(mul_rn(p, r), 0.5f);
  p = add_rn(mul_rn(p, r), 1.0f);
  p = add_rn(mul_rn(p, r), 1.0f);
  const int ni = static_cast<int>(n);
  if (ni > 127) return mul_rn(mul_rn(p, bits_as_float(static_cast<uint32_t>(ni - 1 + 127) << 23)), 2.0f);
  if (ni >= -126) return mul_rn(p, bits_as_float(static_cast<uint32_t>(ni + 127) << 23));
  return mul_rn(mul_rn(p, bits_as_float(static_cast<uint32_t>(ni + 64 + 127) << 23)),
                5.42101086e-20f);  // 2^-64
}

// log(x) for x > 0 including subnormals (log_exact needs a normal input).
DSPARK_HD float log_positive(float x) {
  if (x < 1.17549435e-38f)
    return add_rn(log_exact(mul_rn(x, 1.84467441e+19f)), -44.3614196f);  // 2^64, 64 ln2
  return log_exact(x);
}

// Monotone float -> uint32 (total order of non-NaN floats; -0 and +0 map to adjacent keys, compare as 0
// below).
DSPARK_HD uint32_t ordered_key(float x) {
  const uint32_t b = float_as_bits(x);
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}
DSPARK_HD float key_to_float(uint32_t k) { return bits_as_float((k & 0x80000000u) ? (k & 0x7FFFFFFFu) : ~k); }

// Smallest key K in [lo, hi] with pred(key_to_float(K)) true (pred monotone: false ... true; true at hi). On
// CUDA every thread of a block runs it with a pred that reduces over the block, so all take the same steps.
template <typename P>
DSPARK_HD uint32_t search_key(uint32_t lo, uint32_t hi, P pred) {
  while (lo < hi) {
    const uint32_t mid = lo + (hi - lo) / 2;
    if (pred(key_to_float(mid))) {
      hi = mid;
    } else {
      lo = mid + 1;
    }
  }
  return lo;
}

// HF RepetitionPenaltyLogitsProcessor on one raw logit of a token that occurred before.
DSPARK_HD float repetition_penalize(float logit, float penalty) {
  return logit < 0.0f ? mul_rn(logit, penalty) : div_rn(logit, penalty);
}

// The fixed combination tree of kSumLanes partial sums (in place; the total ends in lanes[0]).
DSPARK_HD float lane_tree(float* lanes) {
  for (int s = kSumLanes / 2; s > 0; s >>= 1) {
    for (int l = 0; l < s; ++l) lanes[l] = add_rn(lanes[l], lanes[l + s]);
  }
  return lanes[0];
}

// The fixed combination of markov_dot's 8 partial sums: ((a0+a1)+(a2+a3))+((a4+a5)+(a6+a7)).
DSPARK_HD float markov_tree(const float* a) {
  return add_rn(add_rn(add_rn(a[0], a[1]), add_rn(a[2], a[3])),
                add_rn(add_rn(a[4], a[5]), add_rn(a[6], a[7])));
}

// Markov bias W2[i] . e: 8 strided partial sums in increasing j, then markov_tree.
template <typename TW>
DSPARK_HD float markov_dot(const TW* w, const float* e, int64_t r) {
  float a[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
  int64_t j = 0;
  for (; j + 8 <= r; j += 8) {
    for (int l = 0; l < 8; ++l) a[l] = add_rn(a[l], mul_rn(static_cast<float>(w[j + l]), e[j + l]));
  }
  for (int l = 0; j + l < r; ++l) a[l] = add_rn(a[l], mul_rn(static_cast<float>(w[j + l]), e[j + l]));
  return markov_tree(a);
}

// A logit at temperature T: x / T, or x itself for greedy rows (T = 0), which take the argmax of x.
DSPARK_HD float temperature_scaled(float x, float temperature) {
  return temperature == 0.0f ? x : div_rn(x, temperature);
}

// Gumbel-max key of a draft token: z / T + g (T > 0), or z itself for greedy rows.
DSPARK_HD float draft_key(float z, float temperature, uint64_t seed, uint64_t offset, uint32_t request,
                          uint32_t position, uint64_t vocab_id) {
  if (temperature == 0.0f) return z;
  return add_rn(temperature_scaled(z, temperature),
                philox_gumbel(seed, offset, request, position, kPurposeDraftSample, vocab_id));
}

// exp(z / T - m): the unnormalised proposal weight of draft logit z at temperature T > 0, where m is the
// row's maximum of z / T (q = draft_weight / the lane sum of the row's weights).
DSPARK_HD float draft_weight(float z, float temperature, float m) {
  return exp_exact(add_rn(div_rn(z, temperature), -m));
}

// The acceptance test of a sampled draft x: u < p(x) / q(x), written u * q(x) < p(x) (u uniform in (0, 1)).
DSPARK_HD bool accept_draft(float u, float q, float p) { return mul_rn(u, q) < p; }

// The acceptance test of a deterministic proposal x (q one-hot at x, e.g. a looked-up token): u < p(x), the
// sampled test with q(x) = 1 (u * 1 rounds to u), so an exactly one-hot q row decides the same.
DSPARK_HD bool accept_proposal(float u, float p) { return accept_draft(u, 1.0f, p); }

// Residual weight of vocabulary id j after rejecting the deterministic proposal x: (p - onehot_x)+ = p(j) for
// j != x and 0 at x (p(x) - 1 <= 0), the values the sampled residual p - q takes when q is exactly one-hot.
DSPARK_HD float proposal_residual_weight(float p, int64_t j, int64_t x) { return j == x ? 0.0f : p; }

// Gumbel-max key of vocabulary id i with weight x > 0 in a residual or bonus draw: log x + g.
DSPARK_HD float residual_key(float x, uint64_t seed, uint64_t offset, uint32_t request, uint32_t position,
                             uint64_t vocab_id) {
  return add_rn(log_positive(x), philox_gumbel(seed, offset, request, position, kPurposeResidual, vocab_id));
}

// Argmax with ties to the lowest index: true when (v, i) beats (best_v, best_i).
DSPARK_HD bool better(float v, int64_t i, float best_v, int64_t best_i) {
  return v > best_v || (v == best_v && i < best_i);
}

// A candidate of a running argmax: its key and vocabulary id (-1: none yet).
struct KeyIdx {
  float key;
  int64_t idx;
};

// The better of two candidates (ties to the lowest id; an empty one never wins). Order-free: any reduction
// tree over the same candidates finds the same winner.
DSPARK_HD KeyIdx best_of(KeyIdx a, KeyIdx b) {
  if (b.idx < 0) return a;
  if (a.idx < 0) return b;
  return better(b.key, b.idx, a.key, a.idx) ? b : a;
}

}  // namespace dspark
