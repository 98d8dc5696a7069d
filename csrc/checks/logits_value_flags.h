// SPDX-License-Identifier: Apache-2.0
// A one-pass scan of CPU logits for the ops' data checks (markov_sample, rejection_sample).
#pragma once
#include <ATen/ATen.h>

namespace dspark {

// One pass over CPU logits [..., n] (n > 0), no temporaries: bit 1 = some NaN, 2 = some +inf, 4 = some row
// without a finite entry. Values are compared as float (what the ops compute with).
int logits_value_flags(const at::Tensor& logits);

}  // namespace dspark
