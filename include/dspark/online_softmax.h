// SPDX-License-Identifier: Apache-2.0
// Online-softmax state shared by the CPU and CUDA attention kernels (paged_verify_attention).
//
// A row's state is (m, l): the running maximum of the scaled scores seen so far and the running sum of
// exp(score - m). The output accumulator o holds sum_j exp(score_j - m) * v_j. When a new block raises the
// maximum from m to m', both l and o are multiplied by exp(m - m'). Empty rows (no key seen) keep m = -inf
// and l = 0 and finish as zeros. Two partial states over disjoint key sets merge the same way (split-KV).
#pragma once
#include <cmath>

#include "dspark/macros.h"

namespace dspark {

DSPARK_HD float softmax_neg_inf() { return -INFINITY; }

DSPARK_HD float softmax_exp(float x) {
#if defined(__CUDA_ARCH__)
  return expf(x);
#else
  return std::exp(x);
#endif
}

// Factor that rescales a state with maximum m_old to the new maximum m_new (>= m_old); 0 when m_old = -inf.
DSPARK_HD float softmax_rescale(float m_old, float m_new) {
  return m_old == -INFINITY ? 0.f : softmax_exp(m_old - m_new);
}

// exp(s - m) for a score s under the running maximum m; 0 for a masked score (s = -inf).
DSPARK_HD float softmax_weight(float s, float m) { return s == -INFINITY ? 0.f : softmax_exp(s - m); }

// 1 / l, or 0 for an empty row (l = 0): an attention row with no visible key outputs zeros.
DSPARK_HD float softmax_inv_sum(float l) { return l > 0.f ? 1.f / l : 0.f; }

// Weight of a partial (m_i, l_i) when merging partials whose overall maximum is m: exp(m_i - m).
DSPARK_HD float softmax_merge_weight(float m_i, float m) {
  return m_i == -INFINITY ? 0.f : softmax_exp(m_i - m);
}

}  // namespace dspark
