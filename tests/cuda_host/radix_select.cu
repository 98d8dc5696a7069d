// SPDX-License-Identifier: Apache-2.0
// Host checks of the radix select (include/dspark/kernels/radix_select.cuh), run by scripts/ci_cuda_build.sh
// on a machine without a GPU: on random rows (heavy ties, -0 and +0, -inf) and every k, the four digit passes
// — emulated on the host, each with RadixDigit as the kernel calls it, in one block or over random chunks
// with RadixReplay / RadixMask as the split kernels run them — find the k-th largest ordered key, and as a
// top-k threshold they keep exactly the ids search_key's threshold keeps (the CPU op's).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <random>
#include <vector>

#include "dspark/kernels/radix_select.cuh"
#include "dspark/sampling.h"

using namespace dspark;
using namespace dspark::kernels;

namespace {

uint32_t radix_kth_largest(const std::vector<float>& y, int64_t k) {
  uint32_t prefix = 0u, mask = 0u;
  for (int shift = 24; shift >= 0; shift -= 8) {
    uint32_t hist[kRadixBins] = {};
    for (float v : y) {
      const uint32_t key = ordered_key(v);
      if ((key & mask) == prefix) ++hist[(key >> shift) & 0xFFu];
    }
    prefix |= RadixDigit(hist, k) << shift;
    mask |= 0xFFu << shift;
  }
  return prefix;
}

// As the vocabulary-split kernels run it: per pass, each chunk's histogram of the keys that match the digits
// replayed from the earlier passes' summed histograms, added into the row's; the digits replayed at the end.
uint32_t chunked_kth_largest(const std::vector<float>& y, int64_t k, size_t chunk) {
  std::vector<uint32_t> hists(4 * kRadixBins, 0u);
  for (int pass = 0; pass < 4; ++pass) {
    int64_t kk = k;
    const uint32_t prefix = RadixReplay(hists.data(), pass, kk), mask = RadixMask(pass);
    for (size_t lo = 0; lo < y.size(); lo += chunk) {
      uint32_t local[kRadixBins] = {};
      for (size_t j = lo; j < std::min(y.size(), lo + chunk); ++j) {
        const uint32_t key = ordered_key(y[j]);
        if ((key & mask) == prefix) ++local[(key >> (24 - 8 * pass)) & 0xFFu];
      }
      for (int b = 0; b < kRadixBins; ++b) hists[pass * kRadixBins + b] += local[b];
    }
  }
  return RadixReplay(hists.data(), 4, k);
}

// search_key's predicate of the top-k branch: fewer than k values above v (a __host__ __device__ functor,
// as search_key is one).
struct FewerThanKAbove {
  const float* y;
  int64_t n, k;
  DSPARK_HD bool operator()(float v) const {
    int64_t c = 0;
    for (int64_t j = 0; j < n; ++j) c += y[j] > v;
    return c < k;
  }
};

// The CPU op's top-k threshold: the 32-step search over keys in [key(-inf), key(max)].
float search_threshold(const std::vector<float>& y, int64_t k) {
  float m = -INFINITY;
  for (float v : y) m = std::max(m, v);
  return key_to_float(search_key(ordered_key(-INFINITY), ordered_key(m),
                                 FewerThanKAbove{y.data(), static_cast<int64_t>(y.size()), k}));
}

}  // namespace

int main() {
  std::mt19937_64 rng(77);
  long checked = 0, failures = 0;
  auto fail = [&](int trial, int64_t k, const char* what) {
    if (++failures <= 10) std::printf("trial %d k %lld: %s\n", trial, static_cast<long long>(k), what);
  };
  const float specials[] = {0.0f, -0.0f, -INFINITY, 1.0f, -1.0f, 2.5f, 1e-30f, -1e-30f};
  for (int trial = 0; trial < 400; ++trial) {
    const int64_t n = 1 + static_cast<int64_t>(rng() % 600);
    std::vector<float> y(static_cast<size_t>(n));
    std::normal_distribution<float> normal(0.f, 3.f);
    for (auto& v : y) {
      const int kind = static_cast<int>(rng() % 4);
      v = kind == 0 ? specials[rng() % 8] : kind == 1 ? std::round(normal(rng)) : normal(rng);
    }
    std::vector<uint32_t> keys(y.size());
    for (size_t j = 0; j < y.size(); ++j) keys[j] = ordered_key(y[j]);
    std::sort(keys.begin(), keys.end(), std::greater<uint32_t>());
    for (int64_t k = 1; k < n; ++k) {  // top_k in (0, V): the op's top-k branch
      ++checked;
      const uint32_t got = radix_kth_largest(y, k);
      if (got != keys[k - 1]) fail(trial, k, "not the k-th largest key");
      if (chunked_kth_largest(y, k, 1 + rng() % 97) != got) fail(trial, k, "chunked passes differ");
      const float t_radix = key_to_float(got), t_search = search_threshold(y, k);
      for (float v : y) {
        if ((v >= t_radix) != (v >= t_search)) {
          fail(trial, k, "keeps other ids than the search's threshold");
          break;
        }
      }
    }
  }
  std::printf("radix select: %ld (row, k) checked, %ld failures\n", checked, failures);
  return failures == 0 ? 0 : 1;
}
