// SPDX-License-Identifier: Apache-2.0
// Host checks of the top-p radix select over fixed-point masses (MassDigit / MassReplay in
// include/dspark/kernels/radix_select.cuh), run by scripts/ci_cuda_build.sh on a machine without a GPU: on
// random rows (heavy ties, -0 and +0, -inf, masses zeroed below a top-k threshold) and random top_p, the four
// passes — emulated on the host as SampledTopPPassKernel runs them, over random chunks, each chunk's
// per-digit masses of the keys that match the digits replayed from the earlier passes — find the key a
// brute-force walk finds: the largest value class at which the mass of the classes at or above it first
// reaches max(1, floor(top_p x total)). The kept set {y >= that key} then holds at least that mass and the
// classes strictly above it less.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <random>
#include <vector>

#include "dspark/kernels/radix_select.cuh"
#include "dspark/sampling.h"

using namespace dspark;
using namespace dspark::kernels;
using u64 = unsigned long long;

namespace {

uint32_t fold_key(float y) { return ordered_key(y == 0.0f ? 0.0f : y); }  // as TopPKey

u64 need_of(const std::vector<u64>& mass, float top_p) {
  u64 total = 0;
  for (u64 m : mass) total += m;
  const u64 need = static_cast<u64>(static_cast<double>(top_p) * static_cast<double>(total));
  return need == 0 ? 1 : need;
}

uint32_t chunked_select(const std::vector<float>& y, const std::vector<u64>& mass, float top_p,
                        size_t chunk) {
  std::vector<u64> hists(4 * kRadixBins, 0ull);
  for (int pass = 0; pass < 4; ++pass) {
    const uint32_t prefix = MassReplay(hists.data(), pass, top_p), mask = RadixMask(pass);
    for (size_t lo = 0; lo < y.size(); lo += chunk) {
      u64 local[kRadixBins] = {};
      for (size_t j = lo; j < std::min(y.size(), lo + chunk); ++j) {
        const uint32_t key = fold_key(y[j]);
        if ((key & mask) == prefix && mass[j] != 0) local[(key >> (24 - 8 * pass)) & 0xFFu] += mass[j];
      }
      for (int b = 0; b < kRadixBins; ++b) hists[pass * kRadixBins + b] += local[b];
    }
  }
  return MassReplay(hists.data(), 4, top_p);
}

// The definition: classes of equal (folded) key from the largest down; the first whose cumulative mass
// reaches the need (classes without mass never hold it).
uint32_t brute_select(const std::vector<float>& y, const std::vector<u64>& mass, float top_p) {
  std::map<uint32_t, u64, std::greater<uint32_t>> classes;
  for (size_t j = 0; j < y.size(); ++j) classes[fold_key(y[j])] += mass[j];
  const u64 need = need_of(mass, top_p);
  u64 cum = 0;
  for (const auto& [key, m] : classes) {
    cum += m;
    if (m != 0 && cum >= need) return key;
  }
  return 0u;  // unreachable: need <= total
}

}  // namespace

int main() {
  std::mt19937_64 rng(2026);
  long checked = 0, failures = 0;
  for (int trial = 0; trial < 4000; ++trial) {
    const size_t V = 1 + rng() % 700;
    const int levels = 1 + static_cast<int>(rng() % 40);  // few levels: heavy ties
    std::vector<float> y(V);
    for (auto& v : y) {
      const int u = static_cast<int>(rng() % (levels + 3));
      v = u == levels       ? 0.0f
          : u == levels + 1 ? -0.0f
          : u == levels + 2 ? -INFINITY
                            : (u - levels / 2) * 0.37f;
    }
    float m = -INFINITY;
    for (float v : y) m = std::max(m, v);
    if (m == -INFINITY) y[rng() % V] = 1.0f, m = 1.0f;
    const float thr_k = (rng() % 3 == 0) ? y[rng() % V] : -INFINITY;  // a top-k threshold, sometimes
    // odd trials: the kernel's masses (fixed-point exp); even ones: a few units each, so that the need often
    // equals a class boundary's cumulative mass exactly (where a `<` for `<=` would show)
    std::vector<u64> mass(V);
    for (size_t j = 0; j < V; ++j) {
      const float e = y[j] >= thr_k ? exp_exact(add_rn(y[j], -m)) : 0.0f;
      mass[j] = trial % 2 ? static_cast<u64>(e * 1099511627776.0f) : (e > 0.0f ? rng() % 4 : 0);
    }
    u64 total = 0;
    for (u64 x : mass) total += x;
    if (total == 0) continue;
    for (int t = 0; t < 5; ++t) {
      const float top_p = t == 0 ? 1e-6f : static_cast<float>((rng() % 1000) + 1) / 1001.0f;  // t 0: need < 1
      const size_t chunk = 1 + rng() % (V + 8);
      const uint32_t got = chunked_select(y, mass, top_p, chunk), want = brute_select(y, mass, top_p);
      ++checked;
      // the kept set's mass reaches the need; the classes strictly above the key hold less
      const u64 need = need_of(mass, top_p);
      u64 kept = 0, above = 0;
      for (size_t j = 0; j < V; ++j) {
        if (y[j] >= key_to_float(got)) kept += mass[j];
        if (fold_key(y[j]) > got) above += mass[j];
      }
      if (got != want || kept < need || above >= need) {
        if (++failures <= 5)
          std::printf(
              "trial %d: V %zu top_p %.4f chunk %zu: key %08x, brute force %08x (kept %llu above %llu need "
              "%llu)\n",
              trial, V, top_p, chunk, got, want, kept, above, need);
      }
    }
  }
  std::printf("top-p mass select: %ld (row, top_p) checked, %ld failures\n", checked, failures);
  return failures == 0 ? 0 : 1;
}
