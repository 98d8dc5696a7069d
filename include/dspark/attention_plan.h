// SPDX-License-Identifier: Apache-2.0
// The split plan of paged_verify_attention's CUDA kernels, shared by the host and the device: a request with
// at most kPvaSplitMaxQueries query rows (a verify block) may be split over its keys, and its rows' partial
// results sit at workspace rows split_base[r] + token, where split_base is the exclusive prefix sum of
// PvaSplitRows over the requests in order. A caller that runs many layers over one batch computes split_base
// once (on the host: dspark.ops.paged_verify_attention_split_base) and hands it to every layer; the CPU op
// checks such a plan, the CUDA op computes one itself when none is given (PvaPlanKernel).
#pragma once
#include <cstdint>

#include "dspark/macros.h"

namespace dspark {

constexpr int kPvaSplitMaxQueries = 16;

// Workspace rows of a request with n_q query rows: all of them if it may be split, none otherwise.
DSPARK_HD int PvaSplitRows(int n_q) { return n_q <= kPvaSplitMaxQueries ? n_q : 0; }

}  // namespace dspark
