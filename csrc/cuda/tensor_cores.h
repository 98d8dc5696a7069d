// SPDX-License-Identifier: Apache-2.0
// Whether a CUDA op may take its tensor-core kernel: the GPU has compute capability 8.0 or later (the
// kernels use mma.sync.m16n8k16) and DSPARK_CUDA_TENSOR_CORES is not "0" (read per call, so benchmarks and
// tests can compare with the CUDA-core kernels in one process). The ops add their own dtype / shape /
// alignment conditions.
#pragma once
#include <cuda_runtime.h>

#include <cstdlib>
#include <string>

namespace dspark {

inline bool tensor_cores_allowed(int device) {
  const char* env = std::getenv("DSPARK_CUDA_TENSOR_CORES");
  if (env != nullptr && std::string(env) == "0") return false;
  int major = 0;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess) return false;
  return major >= 8;
}

}  // namespace dspark
