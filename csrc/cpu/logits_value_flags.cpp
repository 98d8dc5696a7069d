// SPDX-License-Identifier: Apache-2.0
// The logits scan behind the ops' NaN / +inf checks (checks/logits_value_flags.h). It reads every logit once
// per call, so on CPUs with AVX-512 it runs 16 values at a time (a scalar pass cost more than the sampling).
#include "checks/logits_value_flags.h"

#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>

#include <atomic>
#include <cmath>
#include <type_traits>

#include "avx512_common.h"

namespace dspark {
namespace {

template <typename T>
int row_flags(const T* x, int64_t n) {
  unsigned nan = 0, pinf = 0, fin = 0;
  for (int64_t i = 0; i < n; ++i) {
    const float v = static_cast<float>(x[i]);
    nan |= v != v;
    pinf |= v == INFINITY;
    fin |= (v > -INFINITY) & (v < INFINITY);
  }
  return (nan ? 1 : 0) | (pinf ? 2 : 0) | (fin ? 0 : 4);
}

#if DSPARK_HAVE_AVX512_PATH
template <typename T>
DSPARK_AVX512 int row_flags_avx512(const T* x, int64_t n) {
  const __m512 inf = _mm512_set1_ps(INFINITY), ninf = _mm512_set1_ps(-INFINITY);
  __mmask16 nan = 0, pinf = 0, fin = 0;
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 m = avx512::tail_mask(i, n);
    const __m512 v = avx512::load16(x + i, m);
    nan |= _mm512_mask_cmp_ps_mask(m, v, v, _CMP_UNORD_Q);
    pinf |= _mm512_mask_cmp_ps_mask(m, v, inf, _CMP_EQ_OQ);
    fin |= _mm512_mask_cmp_ps_mask(_mm512_mask_cmp_ps_mask(m, v, ninf, _CMP_GT_OQ), v, inf, _CMP_LT_OQ);
  }
  return (nan ? 1 : 0) | (pinf ? 2 : 0) | (fin ? 0 : 4);
}
#endif

}  // namespace

// One pass over CPU logits [..., n] (n > 0), no temporaries: bit 1 = some NaN, 2 = some +inf, 4 = some row
// without a finite entry.
int logits_value_flags(const at::Tensor& logits) {
  const auto l = logits.contiguous();
  const int64_t n = l.size(-1), rows = l.numel() / n;
  std::atomic<int> flags{0};
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, l.scalar_type(), "logits_value_flags", [&] {
    const scalar_t* p = l.const_data_ptr<scalar_t>();
    int (*scan)(const scalar_t*, int64_t) = row_flags<scalar_t>;
#if DSPARK_HAVE_AVX512_PATH
    if constexpr (!std::is_same_v<scalar_t, double>) {  // the vector loads take f32 / bf16 / f16
      if (avx512::enabled()) scan = row_flags_avx512<scalar_t>;
    }
#endif
    at::parallel_for(0, rows, std::max<int64_t>(1, (1 << 16) / n), [&](int64_t begin, int64_t end) {
      int f = 0;
      for (int64_t row = begin; row < end; ++row) f |= scan(p + row * n, n);
      flags.fetch_or(f);
    });
  });
  return flags.load();
}

}  // namespace dspark
