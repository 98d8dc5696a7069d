// SPDX-License-Identifier: Apache-2.0
// Portability macros and rounding-exact arithmetic helpers shared by the CPU loops and the CUDA kernels.
// The helpers exist so that the same expression rounds the same way on both devices: nvcc contracts a*b+c
// into an FMA by default, the host build uses -ffp-contract=off, so shared math spells out every fused op.
#pragma once
#include <cmath>
#include <cstdint>

#if defined(__CUDACC__)
#define DSPARK_HOST_DEVICE __host__ __device__
#define DSPARK_INLINE __forceinline__
#else
#define DSPARK_HOST_DEVICE
#define DSPARK_INLINE inline
#endif
#define DSPARK_HD DSPARK_HOST_DEVICE DSPARK_INLINE

namespace dspark {

DSPARK_HD float add_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}
DSPARK_HD float mul_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}
DSPARK_HD float fma_rn(float a, float b, float c) {
#if defined(__CUDA_ARCH__)
  return __fmaf_rn(a, b, c);
#else
  return std::fma(a, b, c);
#endif
}
DSPARK_HD double add_rn(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __dadd_rn(a, b);
#else
  return a + b;
#endif
}
DSPARK_HD double mul_rn(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __dmul_rn(a, b);
#else
  return a * b;
#endif
}

DSPARK_HD uint32_t float_as_bits(float x) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(x);
#else
  union {
    float f;
    uint32_t u;
  } v{x};
  return v.u;
#endif
}
DSPARK_HD uint64_t double_as_bits(double x) {
#if defined(__CUDA_ARCH__)
  return static_cast<uint64_t>(__double_as_longlong(x));
#else
  union {
    double d;
    uint64_t u;
  } v{x};
  return v.u;
#endif
}
DSPARK_HD float bits_as_float(uint32_t x) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(x);
#else
  union {
    uint32_t u;
    float f;
  } v{x};
  return v.f;
#endif
}

}  // namespace dspark
