#pragma once
// Comparing tensors within a bound relative to the expected one's largest
// value (the parallelism tests state theirs per test).

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <algorithm>

namespace glint::testing {

inline ::testing::AssertionResult near(const at::Tensor& a, const at::Tensor& b, double rel) {
  if (a.sizes() != b.sizes()) return ::testing::AssertionFailure() << "shape " << a.sizes() << " vs " << b.sizes();
  const double scale = std::max(b.abs().max().item<double>(), 1e-30);
  const double diff = (a - b).abs().max().item<double>();
  if (diff <= rel * scale) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "differs by " << diff << " (" << diff / scale << " of its largest value)";
}

}  // namespace glint::testing
