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
#include <map>
#include <mutex>
#include <unordered_map>

namespace glint::components {

/// Installs the block cache, once per process; the trainer calls it beside
/// keep_freed_memory(). The environment GLINT_MALLOC_TUNING=0 leaves LibTorch's
/// allocator alone, as it leaves glibc's. Tensors allocated before it stay
/// with the allocator that made them (each tensor's storage carries its own
/// deleter). c10 asks that the CPU allocator be set before other threads
/// allocate; a thread allocating while it is set gets the old allocator or
/// the new one, both of which free what they made, so an embedding program
/// that wants it from the start calls this first thing in main. An
/// allocation that fails hands the kept blocks back and tries once more.
/// Large blocks are reported to LibTorch's memory profiler as the default
/// allocator reports them, when handed out and when given back.
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

namespace detail {

/// The cache's bookkeeping, apart from LibTorch: which blocks are in use
/// (with their sizes) and which are kept. Thread-safe. The allocator holds
/// one with kKeptBlocksMaxBytes; tests make their own with small ceilings.
class BlockKeeper {
public:
  /// `release` frees a block this keeper no longer keeps.
  BlockKeeper(size_t max_bytes, void (*release)(void*)) : max_(max_bytes), release_(release) {}
  BlockKeeper(const BlockKeeper&) = delete;
  BlockKeeper& operator=(const BlockKeeper&) = delete;
  ~BlockKeeper() { release_all(); }

  /// A kept block for a request of n bytes (the smallest of n to 4n/3
  /// bytes), now in use; null when none fits.
  void* take(size_t n);
  /// p, of n bytes, is in use from now on.
  void track(void* p, size_t n);
  /// p is free again: kept while there is room (the largest kept blocks go
  /// to make room for a smaller one), else released. False, and nothing
  /// done, when p is not a block in use here.
  bool give_back(void* p);
  /// Releases every kept block.
  void release_all();
  size_t kept_bytes() const;
  size_t blocks_kept() const;

private:
  mutable std::mutex mu_;
  std::unordered_map<void*, size_t> in_use_;
  std::multimap<size_t, void*> kept_;
  size_t kept_bytes_ = 0;
  const size_t max_;
  void (*release_)(void*);
};

}  // namespace detail

}  // namespace glint::components
