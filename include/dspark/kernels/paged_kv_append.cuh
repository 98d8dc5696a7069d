// SPDX-License-Identifier: Apache-2.0
// CUDA paged_kv_append: scatter each new token's K and V rows into its KV-cache slot (slot -1 = skip).
//
// One block per token; its threads copy the token's Hkv * D elements of K and V as 16-byte words when the
// row size and the pointers allow, element by element otherwise.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

namespace dspark::kernels {

// k, v [T, row] (row = Hkv * D elements); k_cache, v_cache [num_slots, row]; slot_mapping [T]
template <typename Word>
__global__ void PagedKvAppendKernel(const Word* __restrict__ k, const Word* __restrict__ v,
                                    Word* __restrict__ kc, Word* __restrict__ vc,
                                    const int64_t* __restrict__ slot_mapping, int64_t row_words) {
  const int64_t t = blockIdx.x;
  const int64_t slot = slot_mapping[t];
  if (slot < 0) return;
  for (int64_t i = threadIdx.x; i < row_words; i += blockDim.x) {
    kc[slot * row_words + i] = k[t * row_words + i];
    vc[slot * row_words + i] = v[t * row_words + i];
  }
}

template <typename DType>
cudaError_t PagedKvAppend(const DType* k, const DType* v, DType* k_cache, DType* v_cache,
                          const int64_t* slot_mapping, int64_t T, int64_t row, cudaStream_t stream) {
  if (T <= 0 || row <= 0) return cudaSuccess;
  const int64_t row_bytes = row * static_cast<int64_t>(sizeof(DType));
  const bool aligned = row_bytes % 16 == 0 && reinterpret_cast<uintptr_t>(k) % 16 == 0 &&
                       reinterpret_cast<uintptr_t>(v) % 16 == 0 &&
                       reinterpret_cast<uintptr_t>(k_cache) % 16 == 0 &&
                       reinterpret_cast<uintptr_t>(v_cache) % 16 == 0;
  const unsigned grid = static_cast<unsigned>(T);
  if (aligned) {
    const int64_t words = row_bytes / 16;
    const int threads = static_cast<int>(words < 256 ? ((words + 31) / 32) * 32 : 256);
    PagedKvAppendKernel<uint4><<<grid, threads, 0, stream>>>(
        reinterpret_cast<const uint4*>(k), reinterpret_cast<const uint4*>(v),
        reinterpret_cast<uint4*>(k_cache), reinterpret_cast<uint4*>(v_cache), slot_mapping, words);
  } else {
    const int threads = static_cast<int>(row < 256 ? ((row + 31) / 32) * 32 : 256);
    PagedKvAppendKernel<DType><<<grid, threads, 0, stream>>>(k, v, k_cache, v_cache, slot_mapping, row);
  }
  return cudaGetLastError();
}

}  // namespace dspark::kernels
