#pragma once
/// How much memory this process may use, and a check to run before a large
/// allocation, so that too large is a clear error rather than bad_alloc or
/// the kernel's OOM killer:
///
///   if (auto ok = check_memory(cfg.num_parameters() * 4, "the model's float32 weights"); !ok) return ok.error();

#include "runtime/error.hpp"

#include <cstdint>
#include <string>
#include <string_view>

namespace glint {

/// The machine's physical memory, or the container's (cgroup) limit where
/// that is smaller.
uint64_t memory_limit_bytes();

/// The memory this process could still allocate now: the kernel's
/// MemAvailable, or what the container's (cgroup) limit leaves where that
/// is smaller. It changes as other processes run; use it to size work
/// (micro-batches), memory_limit_bytes() to refuse what can never fit.
uint64_t memory_available_bytes();

/// "24.0 GiB", "512 MiB", "3.1 TiB".
std::string format_bytes(double bytes);

/// resource_exhausted naming `what`, the bytes it needs and the limit when
/// `bytes` exceeds memory_limit_bytes().
Result<void> check_memory(double bytes, std::string_view what);

/// Keeps the memory a training step frees for the next step instead of
/// giving it back to the kernel: glibc returns every block over its mmap
/// threshold (128 KiB to 32 MiB) to the kernel when freed, and a step then
/// faults the same activations in again (19% of a `glint bench train` step
/// was page faults; 7% more tokens/s with this). Sets M_MMAP_THRESHOLD to
/// 32 MiB and M_TRIM_THRESHOLD to 1 GiB, once per process; blocks over 32
/// MiB are still mapped and unmapped. The trainer calls it; the environment
/// GLINT_MALLOC_TUNING=0 leaves the allocator alone (a process that must give
/// memory back between steps). Does nothing but with glibc.
void keep_freed_memory();

}  // namespace glint
