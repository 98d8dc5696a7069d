// SPDX-License-Identifier: Apache-2.0
// Confidence → survival math shared by the CPU and CUDA confidence ops.
#pragma once
#include "dspark/macros.h"

namespace dspark {

// Calibrated confidence c = sigmoid(logit / T + b) in fp32 (b = 0 for SGLang's temperature-only STS:
// adding +0.0f leaves logit / T unchanged, so both forms give the same bits there).
DSPARK_HD float sts_sigmoid(float logit, float temperature, float offset = 0.f) {
  const float z = logit / temperature + offset;
#if defined(__CUDA_ARCH__)
  return 1.0f / (1.0f + expf(-z));
#else
  return 1.0f / (1.0f + std::exp(-z));
#endif
}

// Survival a_k = prod_{i<=k} c_i of one row of length gamma, written in place of `out` (fp32 output, the
// running product kept in fp64 and rounded per element — the same numbers torch.cumprod gives on CPU).
// Each a_k <= a_{k-1} exactly, because rounding is monotone and every c lies in [0, 1].
DSPARK_HD void survival_row(const float* conf, float* out, int gamma) {
  double run = 1.0;
  for (int k = 0; k < gamma; ++k) {
    run = mul_rn(run, static_cast<double>(conf[k]));
    out[k] = static_cast<float>(run);
  }
}

}  // namespace dspark
