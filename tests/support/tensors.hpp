#pragma once
// Small tensors for tests.

#include "runtime/tensor.hpp"

#include <cstdint>
#include <vector>

namespace glint::testing {

/// An i64 [rows, cols] tensor from equally long rows.
inline Tensor ids_of(const std::vector<std::vector<int64_t>>& rows) {
  std::vector<int64_t> flat;
  for (const auto& r : rows) flat.insert(flat.end(), r.begin(), r.end());
  return *Tensor::from_values(flat, {static_cast<int64_t>(rows.size()), static_cast<int64_t>(rows.at(0).size())});
}

/// A 1-d tensor of `values`.
template <class T>
Tensor vector_of(const std::vector<T>& values) {
  return *Tensor::from_values(std::span<const T>(values), {static_cast<int64_t>(values.size())});
}

}  // namespace glint::testing
