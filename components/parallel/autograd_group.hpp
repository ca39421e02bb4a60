#pragma once
/// A process group kept in an autograd context (whose saved data holds
/// IValues only), for the collectives that parallel layouts run in their
/// backward (tensor_parallel.cpp, expert_parallel.cpp).

#include "components/comm/process_group.hpp"

#include <torch/csrc/autograd/custom_function.h>

namespace glint::components::detail {

struct GroupHolder : torch::CustomClassHolder {
  explicit GroupHolder(ProcessGroup* p) : pg(p) {}
  ProcessGroup* pg;
};

inline void keep_group(torch::autograd::AutogradContext* ctx, ProcessGroup& pg) {
  ctx->saved_data["pg"] = c10::IValue::make_capsule(c10::make_intrusive<GroupHolder>(&pg));
}

inline ProcessGroup& group_of(torch::autograd::AutogradContext* ctx) {
  return *static_cast<GroupHolder*>(ctx->saved_data["pg"].toCapsule().get())->pg;
}

}  // namespace glint::components::detail
