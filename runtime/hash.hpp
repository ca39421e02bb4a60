#pragma once
/// FNV-1a 64, fed piece by piece: checkpoint manifests, the sampler's
/// prefix-cache seeds and tensor-parallel batch fingerprints hash with it.
///
///   Fnv1a h;  h.add(bytes, n);  h.add_value(x);  uint64_t d = h.value;

#include <cstddef>
#include <cstdint>

namespace glint {

struct Fnv1a {
  uint64_t value = 14695981039346656037ULL;  // the offset basis, 0xcbf29ce484222325
  void add(const void* data, size_t n) {
    const auto* c = static_cast<const unsigned char*>(data);
    for (size_t i = 0; i < n; ++i) value = (value ^ c[i]) * 1099511628211ULL;
  }
  /// The object representation of a trivially copyable value.
  template <class T>
  void add_value(const T& v) {
    add(&v, sizeof(v));
  }
};

}  // namespace glint
