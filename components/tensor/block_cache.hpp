#pragma once
/// Keeps the large blocks LibTorch frees on the CPU for its next allocations
/// of about the same size, where glibc would give them back to the kernel.
///
/// keep_freed_memory() (runtime/memory.hpp) has glibc keep freed blocks of
/// up to 32 MiB, its ceiling for that: every larger block is mapped when
/// allocated and unmapped when freed, so each step faults it in again, page
/// by zero-filled page. A training step's largest tensors are such blocks:
/// the LM head's [tokens, vocab] logits and their gradient (64 MiB each in
/// `glint bench train`: 32,000 page faults a step, about 2% of its time).
/// keep_freed_tensor_blocks() installs an allocator in front of LibTorch's
/// CPU allocator that keeps freed blocks of 32 MiB or more, up to 1 GiB in
/// all, and hands one back for a request of its size or up to a quarter
/// less. Smaller requests go to the allocator that was there before.

#include <cstddef>

namespace glint::components {

/// Installs the block cache, once per process; the trainer calls it beside
/// keep_freed_memory(). The environment GLINT_MALLOC_TUNING=0 leaves LibTorch's
/// allocator alone, as it leaves glibc's. Tensors allocated before it stay
/// with the allocator that made them.
void keep_freed_tensor_blocks();

/// Whether the block cache is installed in this process.
bool tensor_block_cache_installed();

/// Frees every block the cache keeps (what malloc_trim is to glibc): for a
/// measurement of what a step adds to the resident memory, or to hand
/// memory back between phases.
void release_kept_tensor_blocks();

/// Bytes the cache keeps now, not in use.
size_t kept_tensor_block_bytes();

/// The smallest block the cache keeps (glibc's mmap ceiling), and the most
/// it keeps in all.
constexpr size_t kKeptBlockMinBytes = size_t{32} << 20;
constexpr size_t kKeptBlocksMaxBytes = size_t{1} << 30;

}  // namespace glint::components
