#pragma once
// What the Tinker body targets (tinker_json, tinker_proto) ask of a
// forward_backward request read: every tensor holds as many values as its
// shape, and the whole fits the budget it was read with.

#include "common.hpp"

#include "rpc/tinker/codec.hpp"

#include <string>

namespace glint::fuzz {

inline void check_forward_backward(const rpc::tinker::ForwardBackwardRequest& r, size_t budget) {
  size_t elements = 0;
  for (const auto& d : r.data) {
    elements += d.tokens.size();
    for (const auto& [name, t] : d.inputs) {
      size_t n = 1;
      for (auto s : t.shape) {
        GLINT_FUZZ_CHECK(s >= 0, name + " has a negative dimension");
        n *= static_cast<size_t>(s);
      }
      GLINT_FUZZ_CHECK(n == t.values.size(), name + ": " + std::to_string(t.values.size()) + " values for its shape");
      elements += t.values.size();
    }
  }
  GLINT_FUZZ_CHECK(elements <= budget, std::to_string(elements) + " elements past the budget of " + std::to_string(budget));
}

}  // namespace glint::fuzz
