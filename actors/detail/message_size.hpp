#pragma once
// The one bound on what a rank sends in one message: Options::max_message_bytes,
// which every process of a job installs from its options (runtime's
// set_max_message_bytes) and its decoder enforces. Ranks check their large
// answers against it before they send them (sampled sequences, data
// batches; weight buckets in weight_sync/buckets.cpp), so an answer too
// large for the other side is a clear error here, not a dropped message
// there (actors' own; no other layer includes it).

#include "runtime/error.hpp"
#include "runtime/tensor.hpp"

#include <cstdint>
#include <string>

namespace glint::actors::detail {

/// Ok when `bytes` fit one message; else resource_exhausted naming `what`
/// and what to do (`hint`).
inline Result<void> fits_in_a_message(uint64_t bytes, const std::string& what, const std::string& hint) {
  const auto limit = max_message_bytes();
  if (bytes <= limit) return {};
  return make_error(errc::resource_exhausted, what + " is " + std::to_string(bytes) +
                                                  " bytes, over the message limit of " + std::to_string(limit) +
                                                  " bytes (Options::max_message_bytes); " + hint);
}

}  // namespace glint::actors::detail
