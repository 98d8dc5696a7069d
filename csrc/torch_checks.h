// SPDX-License-Identifier: Apache-2.0
// Argument checks shared by the CPU and CUDA launchers. Every failure raises ValueError in Python with a
// message of the form "dspark::<op>: <argument> ...".
#pragma once
#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <string>

#define DSPARK_ARG_CHECK(op, cond, ...) TORCH_CHECK_VALUE((cond), "dspark::" op ": ", __VA_ARGS__)

namespace dspark {

// "torch.float32"-style names, as Python users know them.
inline std::string dtype_name(at::ScalarType t) {
  switch (t) {
    case at::kFloat:
      return "torch.float32";
    case at::kDouble:
      return "torch.float64";
    case at::kHalf:
      return "torch.float16";
    case at::kBFloat16:
      return "torch.bfloat16";
    case at::kLong:
      return "torch.int64";
    case at::kInt:
      return "torch.int32";
    case at::kBool:
      return "torch.bool";
    default:
      return std::string("torch.") + c10::toString(t);
  }
}

inline void check_dim(const char* op, const at::Tensor& t, const char* name, int64_t dim) {
  TORCH_CHECK_VALUE(t.dim() == dim, "dspark::", op, ": ", name, " must be ", dim, "-D, got shape ",
                    t.sizes());
}

inline void check_dtype(const char* op, const at::Tensor& t, const char* name, at::ScalarType dtype) {
  TORCH_CHECK_VALUE(t.scalar_type() == dtype, "dspark::", op, ": ", name, " must be ", dtype_name(dtype),
                    ", got ", dtype_name(t.scalar_type()));
}

inline void check_float_dtype(const char* op, const at::Tensor& t, const char* name) {
  const auto s = t.scalar_type();
  TORCH_CHECK_VALUE(s == at::kFloat || s == at::kBFloat16 || s == at::kHalf, "dspark::", op, ": ", name,
                    " must be float32, bfloat16 or float16, got ", dtype_name(s));
}

inline void check_same_device(const char* op, const at::Tensor& ref, const char* ref_name,
                              const at::Tensor& t, const char* name) {
  TORCH_CHECK_VALUE(t.device() == ref.device(), "dspark::", op, ": ", name, " is on ", t.device(), " but ",
                    ref_name, " is on ", ref.device());
}

}  // namespace dspark
