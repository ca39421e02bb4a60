#pragma once
// Finite differences for gradient tests (LibTorch: components/ tests only).

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include <cstdint>
#include <functional>

namespace glint::testing {

/// The central difference (step 1e-6) of `f` in element i of `t`, a float64
/// parameter whose value is restored after.
inline double central_difference(const std::function<at::Tensor()>& f, const at::Tensor& t, int64_t i) {
  c10::NoGradGuard ng;
  auto flat = t.detach().view({-1});
  const double h = 1e-6, old = flat[i].item<double>();
  flat[i] = old + h;
  const double up = f().item<double>();
  flat[i] = old - h;
  const double down = f().item<double>();
  flat[i] = old;
  return (up - down) / (2 * h);
}

}  // namespace glint::testing
