// SPDX-License-Identifier: Apache-2.0
// Switches the CUDA launchers read per call, so benchmarks and tests can compare kernels in one process.
//   switched_off(name): the environment variable `name` is "0" (DSPARK_CUDA_TENSOR_CORES,
//     DSPARK_CUDA_REJECTION_SPLIT).
//   tensor_cores_allowed(device): the GPU has compute capability 8.0 or later (the kernels use
//     mma.sync.m16n8k16; torch caches the device properties) and DSPARK_CUDA_TENSOR_CORES is not "0". The ops
//     add their own dtype / shape / alignment conditions.
#pragma once
#include <ATen/cuda/CUDAContext.h>

#include <cstdlib>
#include <string>

namespace dspark {

inline bool switched_off(const char* name) {
  const char* env = std::getenv(name);
  return env != nullptr && std::string(env) == "0";
}

inline bool tensor_cores_allowed(int device) {
  return !switched_off("DSPARK_CUDA_TENSOR_CORES") && at::cuda::getDeviceProperties(device)->major >= 8;
}

}  // namespace dspark
