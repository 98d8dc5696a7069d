// SPDX-License-Identifier: Apache-2.0
// Asynchronous 16-byte global -> shared copies (cp.async, sm_80+), so a CTA can fetch its next tile while it
// computes on the current one. A thread's copies become visible to the block after CpAsyncWait (its own
// groups) and a __syncthreads (everyone's).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

namespace dspark::kernels {

// Copies 16 bytes from global `src` to shared `dst` (both 16-byte aligned), or writes 16 zero bytes when
// !fill (src is then not read, but must still be a valid address).
__device__ __forceinline__ void CpAsync16(void* dst, const void* src, bool fill) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const uint32_t d = static_cast<uint32_t>(__cvta_generic_to_shared(dst));
  const int src_bytes = fill ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(d), "l"(src), "r"(src_bytes));
#else
  *reinterpret_cast<uint4*>(dst) = fill ? *reinterpret_cast<const uint4*>(src) : make_uint4(0u, 0u, 0u, 0u);
#endif
}

// Closes the group of copies this thread issued since the last commit (an empty group is allowed).
__device__ __forceinline__ void CpAsyncCommit() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;\n" ::);
#endif
}

// Waits until at most `kPending` of this thread's most recent groups are still in flight.
template <int kPending>
__device__ __forceinline__ void CpAsyncWait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending));
#endif
}

}  // namespace dspark::kernels
