#pragma once
// The caller's matmul, kept for an autograd node's backward pass in the
// context's saved data (which holds IValues only).

#include "components/kernels/fused.hpp"

#include <torch/csrc/autograd/custom_function.h>

#include <utility>

namespace glint::components::kernels::cpu {

template <typename F>
struct MatmulHolder : torch::CustomClassHolder {
  explicit MatmulHolder(F f) : mm(std::move(f)) {}
  F mm;
};

/// Saves `mm` (a MatmulNT or MatmulIntoNT) in ctx under "mm".
template <typename F>
void save_matmul(torch::autograd::AutogradContext* ctx, const F& mm) {
  ctx->saved_data["mm"] = c10::IValue::make_capsule(c10::make_intrusive<MatmulHolder<F>>(mm));
}

/// The matmul save_matmul<F> kept.
template <typename F>
const F& saved_matmul(torch::autograd::AutogradContext* ctx) {
  return static_cast<MatmulHolder<F>*>(ctx->saved_data["mm"].toCapsule().get())->mm;
}

}  // namespace glint::components::kernels::cpu
