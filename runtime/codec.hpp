#pragma once
/// Byte encoding of any value that crosses actor boundaries, with CAF's
/// binary format: the same bytes the cluster transport sends. `decode`
/// validates as it reads (tensor headers against their bytes, size limits)
/// and rejects trailing bytes, so malformed input is an error, never a crash.

#include "runtime/error.hpp"

#include <caf/binary_deserializer.hpp>
#include <caf/binary_serializer.hpp>

#include <span>
#include <vector>

namespace glint {

template <class T>
Result<std::vector<char>> encode(const T& value) {
  std::vector<char> buf;
  caf::binary_serializer sink{nullptr, buf};
  if (auto err = sink(const_cast<T&>(value))) return with_context(err, "encoding failed");
  return buf;
}

template <class T>
Result<T> decode(std::span<const char> bytes) {
  T value{};
  caf::binary_deserializer source{static_cast<caf::execution_unit*>(nullptr), bytes.data(), bytes.size()};
  if (auto err = source(value)) return with_context(err, "decoding failed");
  if (source.remaining() != 0)
    return make_error(errc::invalid_argument, "decoding failed: " + std::to_string(source.remaining()) +
                                                " trailing bytes after the value");
  return value;
}

}  // namespace glint
