#pragma once
// Timing helpers shared by the benchmarks.

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <vector>

namespace glint::bench {

/// Wall-clock seconds `f` takes.
inline double seconds_of(const std::function<void()>& f) {
  auto t0 = std::chrono::steady_clock::now();
  f();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

/// The median (the upper one of an even count); `v` must not be empty.
inline double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

/// One machine-readable result line, `name: value`.
inline void print_metric(const char* name, double v, int decimals) {
  std::printf("%s: %.*f\n", name, decimals, v);
  std::fflush(stdout);
}

}  // namespace glint::bench
