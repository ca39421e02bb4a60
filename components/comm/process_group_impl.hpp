#pragma once
/// The c10d side of ProcessGroup (components/ and tests only).

#include "components/comm/process_group.hpp"

#include <ATen/ATen.h>

#include <vector>

namespace glint::components {

/// Sums LibTorch tensors over all ranks, in place (one coalesced buffer per dtype).
Result<void> all_reduce_sum(ProcessGroup& pg, std::vector<at::Tensor>& tensors);

}  // namespace glint::components
