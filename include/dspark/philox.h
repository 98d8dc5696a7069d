// SPDX-License-Identifier: Apache-2.0
// Philox4x32-10 (Salmon et al., SC'11) and the keyed draws every random dspark op uses, on both devices.
//
// A draw is a pure function of (seed, offset, request, position, purpose, index):
//   counter = {index >> 2, position | purpose << 16, request, offset[31:0]}
//   key     = {seed[31:0], seed[63:32] ^ offset[63:32]}
//   word    = philox4x32_10(counter, key)[index & 3]
// so position < 2^16, purpose < 2^16 and index < 2^34. Callers advance `offset` once per decode round.
#pragma once
#include "dspark/macros.h"

namespace dspark {

// What a draw is for; distinct purposes give independent streams for the same (request, position).
enum Purpose : uint32_t {
  kPurposeTest = 0,
  kPurposeDraftSample = 1,  // Gumbel noise of markov_sample, index = vocabulary id
  kPurposeAccept = 2,       // the accept/reject uniform of rejection_sample, index 0
  kPurposeResidual = 3,     // Gumbel noise of the residual / bonus draw, index = vocabulary id
};

struct Philox4 {
  uint32_t v[4];
};

constexpr uint32_t kPhiloxM0 = 0xD2511F53u;
constexpr uint32_t kPhiloxM1 = 0xCD9E8D57u;
constexpr uint32_t kPhiloxW0 = 0x9E3779B9u;
constexpr uint32_t kPhiloxW1 = 0xBB67AE85u;

DSPARK_HD void mulhilo32(uint32_t a, uint32_t b, uint32_t& hi, uint32_t& lo) {
#if defined(__CUDA_ARCH__)
  lo = a * b;
  hi = __umulhi(a, b);
#else
  const uint64_t p = static_cast<uint64_t>(a) * static_cast<uint64_t>(b);
  hi = static_cast<uint32_t>(p >> 32);
  lo = static_cast<uint32_t>(p);
#endif
}

// The raw block function: 10 rounds, key bumped between rounds (Random123's philox4x32_R with R = 10).
DSPARK_HD Philox4 philox4x32_10(Philox4 ctr, uint32_t k0, uint32_t k1) {
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
  for (int round = 0; round < 10; ++round) {
    if (round > 0) {
      k0 += kPhiloxW0;
      k1 += kPhiloxW1;
    }
    uint32_t hi0, lo0, hi1, lo1;
    mulhilo32(kPhiloxM0, ctr.v[0], hi0, lo0);
    mulhilo32(kPhiloxM1, ctr.v[2], hi1, lo1);
    ctr = Philox4{{hi1 ^ ctr.v[1] ^ k0, lo1, hi0 ^ ctr.v[3] ^ k1, lo0}};
  }
  return ctr;
}

// A round's Philox offset as a kernel reads it: `base`, plus the int64 at `add` where that is set. A CUDA
// graph replays its launches with the arguments they were captured with, so a round counter that changes
// between replays has to live in device memory (`add`); the sum wraps modulo 2^64.
struct PhiloxOffset {
  uint64_t base;
  const int64_t* add;
  DSPARK_HD uint64_t value() const { return add == nullptr ? base : base + static_cast<uint64_t>(*add); }
};

// Four consecutive words: indices [4*block, 4*block + 4) of the keyed stream.
DSPARK_HD Philox4 philox_block(uint64_t seed, uint64_t offset, uint32_t request, uint32_t position,
                               uint32_t purpose, uint32_t block) {
  const Philox4 ctr{{block, (position & 0xFFFFu) | (purpose << 16), request, static_cast<uint32_t>(offset)}};
  return philox4x32_10(ctr, static_cast<uint32_t>(seed),
                       static_cast<uint32_t>(seed >> 32) ^ static_cast<uint32_t>(offset >> 32));
}

DSPARK_HD uint32_t philox_word(uint64_t seed, uint64_t offset, uint32_t request, uint32_t position,
                               uint32_t purpose, uint64_t index) {
  const Philox4 b = philox_block(seed, offset, request, position, purpose, static_cast<uint32_t>(index >> 2));
#if defined(__CUDA_ARCH__)
  // selects, not a runtime array index, which put b in a stack frame (local memory) of the tensor-core
  // markov_sample kernel
  const uint32_t i = static_cast<uint32_t>(index & 3);
  return i == 0 ? b.v[0] : (i == 1 ? b.v[1] : (i == 2 ? b.v[2] : b.v[3]));
#else
  return b.v[index & 3];
#endif
}

// Uniform in the open interval (0, 1): odd multiples of 2^-24, exact in fp32 (no rounding anywhere).
DSPARK_HD float bits_to_uniform(uint32_t bits) {
  return static_cast<float>((bits >> 8) | 1u) * 5.9604644775390625e-08f;  // * 2^-24
}

// Natural log for positive normal floats, written with explicit rounding so that CPU and CUDA agree bit for
// bit (libm's logf and CUDA's logf differ in the last ulp). Max error ~1 ulp on [2^-24, 32].
DSPARK_HD float log_exact(float x) {
  uint32_t bits = float_as_bits(x);
  int32_t e = static_cast<int32_t>((bits >> 23) & 0xFFu) - 127;
  float m = bits_as_float((bits & 0x007FFFFFu) | 0x3F800000u);  // [1, 2)
  if (m > 1.41421356f) {
    m = mul_rn(m, 0.5f);  // exact
    e += 1;
  }
  const float f = add_rn(m, -1.0f);  // exact (Sterbenz)
  const float s = f / add_rn(2.0f, f);
  const float s2 = mul_rn(s, s);
  float p = fma_rn(s2, 0.11111111f, 0.14285715f);  // 1/9, 1/7
  p = fma_rn(s2, p, 0.2f);
  p = fma_rn(s2, p, 0.33333334f);
  p = fma_rn(s2, p, 1.0f);
  const float log_m = mul_rn(mul_rn(2.0f, s), p);
  const float ef = static_cast<float>(e);
  // ln2 split in a high part with trailing zeros (e * hi is exact for |e| < 256) and a low correction.
  return add_rn(fma_rn(ef, 1.42860682e-06f, log_m), mul_rn(ef, 0.693145752f));
}

// Standard Gumbel from an open-interval uniform: g = -log(-log(u)).
DSPARK_HD float uniform_to_gumbel(float u) { return -log_exact(-log_exact(u)); }

DSPARK_HD float philox_uniform(uint64_t seed, uint64_t offset, uint32_t request, uint32_t position,
                               uint32_t purpose, uint64_t index) {
  return bits_to_uniform(philox_word(seed, offset, request, position, purpose, index));
}

DSPARK_HD float philox_gumbel(uint64_t seed, uint64_t offset, uint32_t request, uint32_t position,
                              uint32_t purpose, uint64_t index) {
  return uniform_to_gumbel(philox_uniform(seed, offset, request, position, purpose, index));
}

}  // namespace dspark
