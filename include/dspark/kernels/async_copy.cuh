// SPDX-License-Identifier: Apache-2.0
// Asynchronous 16-byte global -> shared copies (cp.async, sm_80+), so a CTA can fetch its next tile while it
// computes on the current one. A thread's copies become visible to the block after CpAsyncWait (its own
// groups) and a __syncthreads (everyone's). The instructions are CuTe's SM80 copy atom
// (SM80_CP_ASYNC_CACHEGLOBAL_ZFILL: cp.async.cg, zero-filled when the predicate is false) and its group fence
// and wait.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <cute/arch/copy_sm80.hpp>

namespace dspark::kernels {

// Copies 16 bytes from global `src` to shared `dst` (both 16-byte aligned), or writes 16 zero bytes when
// !fill (src is then not read, but must still be a valid address).
__device__ __forceinline__ void CpAsync16(void* dst, const void* src, bool fill) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  using Atom = cute::SM80_CP_ASYNC_CACHEGLOBAL_ZFILL<cute::uint128_t>;
  Atom::copy(*reinterpret_cast<const cute::uint128_t*>(src), *reinterpret_cast<cute::uint128_t*>(dst), fill);
#else
  *reinterpret_cast<uint4*>(dst) = fill ? *reinterpret_cast<const uint4*>(src) : make_uint4(0u, 0u, 0u, 0u);
#endif
}

// Closes the group of copies this thread issued since the last commit (an empty group is allowed).
__device__ __forceinline__ void CpAsyncCommit() { cute::cp_async_fence(); }

// Waits until at most `kPending` of this thread's most recent groups are still in flight.
template <int kPending>
__device__ __forceinline__ void CpAsyncWait() {
  cute::cp_async_wait<kPending>();
}

}  // namespace dspark::kernels
