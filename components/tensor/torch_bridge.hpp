#pragma once
/// Zero-copy conversion between glint::Tensor and LibTorch's at::Tensor.
/// Both directions share the bytes: the at::Tensor keeps the glint storage
/// alive and vice versa. Only components/ sees LibTorch.

#include "runtime/tensor.hpp"

#include <ATen/ATen.h>

#include <string>

namespace glint::components {

/// A CPU at::Tensor over the same bytes. bool maps to at::kBool, u8 to kByte.
at::Tensor to_torch(const Tensor& t);

/// A glint::Tensor over the same bytes; fails for non-CPU, non-contiguous or
/// unsupported dtypes (with the dtype named), so the caller can `.contiguous()`
/// first where a copy is acceptable.
Result<Tensor> from_torch(const at::Tensor& t);

at::ScalarType to_torch(Dtype d);
Result<Dtype> from_torch(at::ScalarType s);

/// A tensor's shape for error messages: "[2, 3]", or "none" when undefined.
std::string shape_of(const at::Tensor& t);

}  // namespace glint::components
