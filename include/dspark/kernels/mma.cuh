// SPDX-License-Identifier: Apache-2.0
// Warp-level tensor-core MMA (sm_80+): mma.sync.m16n8k16 with 16-bit inputs and fp32 accumulators, and the
// packing of two fp32 values into one 16-bit pair register.
//
// Fragment layouts (PTX ISA, "Matrix Fragments for mma.m16n8k16"), with g = lane / 4 and t = lane % 4; each
// 32-bit register holds two consecutive-column elements, the lower column in the lower half:
//   A (16 x 16, row-major): a[0] = A[g][2t, 2t+1], a[1] = A[g+8][2t, 2t+1], a[2] = A[g][2t+8, 2t+9],
//                           a[3] = A[g+8][2t+8, 2t+9]
//   B (16 x 8, "col"):      b0 = B[2t, 2t+1][g], b1 = B[2t+8, 2t+9][g]  (k = row, n = column)
//   C (16 x 8, fp32):       c[0], c[1] = C[g][2t, 2t+1], c[2], c[3] = C[g+8][2t, 2t+1]
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cute/arch/mma_sm80.hpp>
#include <type_traits>

namespace dspark::kernels {

// c += A B for one 16 x 8 x 16 tile; kBf16 selects bf16 inputs, else fp16. The instruction is CuTe's MMA atom
// (SM80_16x8x16_F32{BF16BF16,F16F16}F32_TN: row-major A, column-major B, fp32 accumulators in place).
template <bool kBf16>
__device__ __forceinline__ void Mma16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  using Atom =
      std::conditional_t<kBf16, cute::SM80_16x8x16_F32BF16BF16F32_TN, cute::SM80_16x8x16_F32F16F16F32_TN>;
  Atom::fma(c[0], c[1], c[2], c[3], a[0], a[1], a[2], a[3], b0, b1, c[0], c[1], c[2], c[3]);
#else
  __trap();  // launchers choose a tensor-core kernel only on compute capability 8.0 and later
#endif
}

// (lo, hi) rounded to nearest even into one register: lo in the lower 16 bits.
template <bool kBf16>
__device__ __forceinline__ uint32_t PackPair(float lo, float hi) {
  if constexpr (kBf16) {
    const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&v);
  } else {
    const __half2 v = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&v);
  }
}

}  // namespace dspark::kernels
