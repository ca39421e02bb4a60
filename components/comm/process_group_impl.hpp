#pragma once
/// The c10d side of ProcessGroup (components/ and tests only).

#include "components/comm/process_group.hpp"

#include <ATen/ATen.h>

#include <optional>
#include <stdexcept>
#include <vector>

namespace glint::components {

/// Sums LibTorch tensors over all ranks, in place (one coalesced buffer per dtype).
Result<void> all_reduce_sum(ProcessGroup& pg, std::vector<at::Tensor>& tensors);

/// An error carried out of code that can only throw: a collective inside
/// autograd's forward or backward (FSDP's gathers, tensor parallelism's
/// all-reduces). carried_error gets it back, code and all.
struct CarriedError : std::runtime_error {
  explicit CarriedError(caf::error e);
  caf::error err;
};
[[noreturn]] void throw_error(caf::error e);
/// The error `e` carries (nullopt: another exception).
std::optional<caf::error> carried_error(const std::exception& e);

}  // namespace glint::components
