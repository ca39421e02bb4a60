#pragma once
// splitmix64: a small, fixed generator. Data order (shuffles, generated
// rows) must not depend on the standard library's distributions or
// std::shuffle, which differ between implementations.

#include <cstdint>
#include <vector>

namespace glint::components::detail {

struct SplitMix64 {
  uint64_t state;
  uint64_t next() {
    uint64_t z = (state += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  }
  /// Fisher-Yates over `v`.
  template <class T>
  void shuffle(std::vector<T>& v) {
    for (size_t i = v.size(); i > 1; --i) std::swap(v[i - 1], v[next() % i]);
  }
};

}  // namespace glint::components::detail
