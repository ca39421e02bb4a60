#include "components/tensor/block_cache.hpp"

#include <c10/core/CPUAllocator.h>
#include <c10/core/impl/alloc_cpu.h>
#include <c10/util/Exception.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <vector>

namespace glint::components {

namespace detail {

void* BlockKeeper::take(size_t n) {
  std::lock_guard lock{mu_};
  auto it = kept_.lower_bound(n);
  if (it == kept_.end() || it->first > n + n / 3) return nullptr;
  void* p = it->second;
  in_use_.insert_or_assign(p, it->first);
  kept_bytes_ -= it->first;
  kept_.erase(it);
  return p;
}

void BlockKeeper::track(void* p, size_t n) {
  std::lock_guard lock{mu_};
  const bool fresh = in_use_.insert_or_assign(p, n).second;
  TORCH_INTERNAL_ASSERT(fresh, "the block cache was handed a block it already has in use");
}

bool BlockKeeper::give_back(void* p) {
  std::vector<void*> to_release;
  {
    std::lock_guard lock{mu_};
    auto it = in_use_.find(p);
    if (it == in_use_.end()) return false;
    const size_t size = it->second;
    in_use_.erase(it);
    while (kept_bytes_ + size > max_ && !kept_.empty() && std::prev(kept_.end())->first > size) {
      auto largest = std::prev(kept_.end());
      kept_bytes_ -= largest->first;
      to_release.push_back(largest->second);
      kept_.erase(largest);
    }
    if (kept_bytes_ + size <= max_) {
      kept_.emplace(size, p);
      kept_bytes_ += size;
    } else {
      to_release.push_back(p);
    }
  }
  for (void* q : to_release) release_(q);
  return true;
}

void BlockKeeper::release_all() {
  std::multimap<size_t, void*> all;
  {
    std::lock_guard lock{mu_};
    all.swap(kept_);
    kept_bytes_ = 0;
  }
  for (auto& [size, p] : all) release_(p);
}

size_t BlockKeeper::kept_bytes() const {
  std::lock_guard lock{mu_};
  return kept_bytes_;
}

size_t BlockKeeper::blocks_kept() const {
  std::lock_guard lock{mu_};
  return kept_.size();
}

}  // namespace detail

namespace {

detail::BlockKeeper& keeper() {
  static auto* k = new detail::BlockKeeper{kKeptBlocksMaxBytes, &c10::free_cpu};  // never destroyed: tensors may
  return *k;                                                                       // be freed at exit
}

// The deleter of the allocator below, for the pointers raw_deallocate hands
// back that this cache did not make.
std::atomic<c10::DeleterFnPtr> below_deleter{nullptr};

void free_block(void* p) {
  if (keeper().give_back(p)) {
    c10::profiledCPUMemoryReporter().Delete(p);
    return;
  }
  if (auto d = below_deleter.load()) {
    d(p);
  } else {
    c10::free_cpu(p);
  }
}

// Holds no state of its own (see keep_freed_tensor_blocks): what it keeps is
// keeper()'s, and the allocator below is LibTorch's default one.
class BlockCache final : public c10::Allocator {
public:
  c10::DataPtr allocate(size_t n) const override {
    if (n < kKeptBlockMinBytes) return c10::GetDefaultCPUAllocator()->allocate(n);
    void* p = keeper().take(n);
    if (!p) {
      try {
        p = c10::alloc_cpu(n);
      } catch (const c10::Error&) {
        // Out of memory: what the cache keeps goes back, and one more try
        // (which throws LibTorch's own error, naming the size, if it fails).
        keeper().release_all();
        p = c10::alloc_cpu(n);
      }
      keeper().track(p, n);
    }
    c10::profiledCPUMemoryReporter().New(p, n);
    return {p, p, &free_block, c10::Device(c10::DeviceType::CPU)};
  }

  // raw_allocate's context is its data (as here), and raw_deallocate hands
  // back through this deleter the blocks of both allocators.
  c10::DeleterFnPtr raw_deleter() const override { return &free_block; }
};

std::atomic<bool> installed{false};

}  // namespace

void keep_freed_tensor_blocks() {
  static std::once_flag once;
  std::call_once(once, [] {
    const char* v = std::getenv("GLINT_MALLOC_TUNING");
    if (v && std::strcmp(v, "0") == 0) return;
    // Only in front of LibTorch's own allocator, whose blocks free_cpu frees.
    c10::Allocator* below = c10::GetDefaultCPUAllocator();
    if (c10::GetCPUAllocator() != below) return;
    below_deleter.store(below->raw_deleter());
    static auto* cache = new BlockCache{};  // never destroyed, as keeper()
    // c10 publishes the allocator with a plain store (SetCPUAllocator is
    // meant for static initialisation), and other threads may be allocating
    // now (a sampler beside this trainer). So the cache has no fields for
    // them to read before they are written (TSan found one: the allocator
    // below, now looked up at each call), and the fence orders its vtable
    // pointer before the store: a thread that loads the new allocator reads
    // a whole object through it.
    std::atomic_thread_fence(std::memory_order_release);
    c10::SetCPUAllocator(cache, /*priority=*/1);
    installed = true;
  });
}

bool tensor_block_cache_installed() { return installed; }

void release_kept_tensor_blocks() { keeper().release_all(); }

size_t kept_tensor_block_bytes() { return keeper().kept_bytes(); }

}  // namespace glint::components
