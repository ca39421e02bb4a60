#pragma once
// The caller's matmul, kept for an autograd node's backward pass in the
// context's saved data (which holds IValues only).

#include "components/kernels/fused.hpp"

#include <torch/csrc/autograd/custom_function.h>

#include <utility>

namespace glint::components::kernels::cpu {

struct MatmulHolder : torch::CustomClassHolder {
  explicit MatmulHolder(MatmulNT f) : mm(std::move(f)) {}
  MatmulNT mm;
};

/// Saves `mm` in ctx under "mm".
inline void save_matmul(torch::autograd::AutogradContext* ctx, const MatmulNT& mm) {
  ctx->saved_data["mm"] = c10::IValue::make_capsule(c10::make_intrusive<MatmulHolder>(mm));
}

/// The matmul save_matmul kept.
inline const MatmulNT& saved_matmul(torch::autograd::AutogradContext* ctx) {
  return static_cast<MatmulHolder*>(ctx->saved_data["mm"].toCapsule().get())->mm;
}

}  // namespace glint::components::kernels::cpu
