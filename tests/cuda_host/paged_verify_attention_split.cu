// SPDX-License-Identifier: Apache-2.0
// Host checks of paged_verify_attention's CUDA split plan (PvaRequestSplit), run by scripts/ci_cuda_build.sh
// on a machine without a GPU: for every query count 1..40 and key count 0..20,000 the ranges cover every key
// once, none is empty, each starts on a key tile, there are at most kPvaMaxSplits of them, requests longer
// than a verify block and short key ranges are not split, and the count reads nothing but (n_q, n_kv).
#include <cstdio>

#include "dspark/kernels/paged_verify_attention.cuh"

using namespace dspark::kernels;

int main() {
  long checked = 0, failures = 0;
  auto fail = [&](int n_q, int n_kv, const char* what) {
    if (++failures <= 10) std::printf("n_q %d n_kv %d: %s\n", n_q, n_kv, what);
  };
  for (int n_q = 1; n_q <= 40; ++n_q) {
    for (int n_kv = 0; n_kv <= 20000; ++n_kv) {
      const PvaSplit s = PvaRequestSplit(n_q, n_kv);
      ++checked;
      if (s.count < 1 || s.count > kPvaMaxSplits) fail(n_q, n_kv, "count out of [1, kPvaMaxSplits]");
      if (s.chunk % kPvaKeyTile != 0) fail(n_q, n_kv, "chunk not a multiple of the key tile");
      if (static_cast<long>(s.count) * s.chunk < n_kv) fail(n_q, n_kv, "keys left uncovered");
      if (n_kv > 0 && (s.count - 1) * s.chunk >= n_kv) fail(n_q, n_kv, "an empty last range");
      if (n_q > dspark::kPvaSplitMaxQueries && s.count != 1)
        fail(n_q, n_kv, "a prefill-sized request was split");
      if (n_kv < 2 * kPvaSplitKeys && s.count != 1)
        fail(n_q, n_kv, "fewer than 2 x kPvaSplitKeys keys split");
      if (s.count > 1 && n_kv / s.count < kPvaSplitKeys - kPvaKeyTile)
        fail(n_q, n_kv, "a range far too short");
    }
  }
  std::printf("paged_verify_attention split plan: %ld (n_q, n_kv) checked, %ld failures\n", checked,
              failures);
  return failures == 0 ? 0 : 1;
}
