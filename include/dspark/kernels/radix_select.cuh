// SPDX-License-Identifier: Apache-2.0
// The k-th largest ordered key (sampling.h's ordered_key) of a row, by radix select: four passes of 8-bit
// digit histograms from the most significant digit, instead of the 32 passes of a bisection over keys —
// in one block (BlockRadixKthLargest), or over many CTAs whose histograms are added up between passes
// (RadixReplay decides the digits from them).
// Counts are integers, so the result does not depend on the order of the additions (contract C2).
// MassDigit / MassReplay run the same passes over integer (fixed-point) masses instead of counts: the top-p
// threshold, the key at which the mass counted from the largest key down reaches a target.
//
// As a top-k threshold it keeps the same ids as search_key's (the CPU op's): the smallest key K with
// #{y > key_to_float(K)} < k is the k-th largest key K_k, except that when K_k is +0's key the search may
// stop at -0's, and y >= -0 and y >= +0 keep the same ids (tests/cuda_host/radix_select.cu).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "dspark/macros.h"

namespace dspark::kernels {

constexpr int kRadixBins = 256;

// One pass's decision from its histogram of the candidates' digits: the digit holding the k-th largest
// candidate (1-based k, counted from digit 255 down), with k made relative to that digit's candidates.
DSPARK_HD uint32_t RadixDigit(const uint32_t* hist, int64_t& k) {
  for (int d = kRadixBins - 1; d > 0; --d) {
    if (k <= static_cast<int64_t>(hist[d])) return static_cast<uint32_t>(d);
    k -= hist[d];
  }
  return 0u;
}

// The digits decided by the first `passes` passes, from their histograms (hists[p * kRadixBins + d]), as the
// high bits of the key; k is made relative to the candidates that share them.
DSPARK_HD uint32_t RadixReplay(const uint32_t* hists, int passes, int64_t& k) {
  uint32_t prefix = 0u;
  for (int p = 0; p < passes; ++p) prefix |= RadixDigit(hists + p * kRadixBins, k) << (24 - 8 * p);
  return prefix;
}

// The mask of the digits decided before pass `pass` (0 .. 3).
DSPARK_HD uint32_t RadixMask(int pass) { return pass == 0 ? 0u : 0xFFFFFFFFu << (32 - 8 * pass); }

// One top-p pass's decision from its mass histogram: the digit whose candidates hold the point where the mass
// counted from digit 255 down first reaches `need`, with need made relative to that digit's candidates.
DSPARK_HD uint32_t MassDigit(const unsigned long long* hist, unsigned long long& need) {
  for (int d = kRadixBins - 1; d > 0; --d) {
    if (need <= hist[d]) return static_cast<uint32_t>(d);
    need -= hist[d];
  }
  return 0u;
}

// The top-p key digits decided by the first `passes` passes (hists[p * kRadixBins + d]). The mass to reach is
// top_p times the row's whole mass (pass 0's histogram), at least one unit: the kept ids are those whose key
// is at least the result's, the least set whose mass reaches it (ties kept together), as the CPU's search.
DSPARK_HD uint32_t MassReplay(const unsigned long long* hists, int passes, float top_p) {
  if (passes == 0) return 0u;  // pass 0's histogram may still be filling
  unsigned long long total = 0ull;
  for (int d = 0; d < kRadixBins; ++d) total += hists[d];
  unsigned long long need =
      static_cast<unsigned long long>(static_cast<double>(top_p) * static_cast<double>(total));
  if (need == 0ull) need = 1ull;
  uint32_t prefix = 0u;
  for (int p = 0; p < passes; ++p) prefix |= MassDigit(hists + p * kRadixBins, need) << (24 - 8 * p);
  return prefix;
}

// Shared memory of BlockRadixKthLargest.
struct RadixScratch {
  uint32_t hist[kRadixBins];
  uint32_t digit;
  int64_t k;
};

// Block-wide: the k-th largest (1 <= k <= n) of key(j) over j in [0, n). Every thread must call it; every
// thread gets the result.
template <typename Key>
__device__ uint32_t BlockRadixKthLargest(int64_t n, int64_t k, Key key, RadixScratch& s) {
  uint32_t* hist = s.hist;
  uint32_t prefix = 0u, mask = 0u;
  for (int shift = 24; shift >= 0; shift -= 8) {
    for (int b = threadIdx.x; b < kRadixBins; b += blockDim.x) hist[b] = 0u;
    __syncthreads();
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
      const uint32_t kj = key(j);
      if ((kj & mask) == prefix) atomicAdd(&hist[(kj >> shift) & 0xFFu], 1u);
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      s.digit = RadixDigit(hist, k);
      s.k = k;
    }
    __syncthreads();
    prefix |= s.digit << shift;
    mask |= 0xFFu << shift;
    k = s.k;
  }
  return prefix;
}

}  // namespace dspark::kernels
