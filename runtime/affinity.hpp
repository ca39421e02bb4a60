#pragma once
/// Binding the calling thread to a set of CPUs (Linux affinity). Placement
/// computes the sets with hwloc; binding needs nothing but the OS.

#include "runtime/error.hpp"

#include <vector>

namespace glint {

/// Binds the calling thread to `cpus` (OS CPU ids). An empty set is a no-op.
Result<void> bind_current_thread(const std::vector<int>& cpus);

/// The CPUs the calling thread may run on.
std::vector<int> current_thread_cpus();

}  // namespace glint
