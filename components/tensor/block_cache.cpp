#include "components/tensor/block_cache.hpp"

#include <c10/core/CPUAllocator.h>
#include <c10/core/impl/alloc_cpu.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <map>
#include <mutex>
#include <unordered_map>
#include <vector>

namespace glint::components {

namespace {

// The blocks: those in use (pointer -> size: a DataPtr's deleter gets the
// pointer only) and those kept (size -> pointer).
struct Blocks {
  std::mutex mu;
  std::unordered_map<void*, size_t> in_use;
  std::multimap<size_t, void*> kept;
  size_t kept_bytes = 0;

  // A kept block of `size` bytes up to a third more (a request up to a
  // quarter less than the block), or null.
  void* take(size_t size) {
    std::lock_guard lock{mu};
    auto it = kept.lower_bound(size);
    if (it == kept.end() || it->first > size + size / 3) return nullptr;
    void* p = it->second;
    in_use.emplace(p, it->first);
    kept_bytes -= it->first;
    kept.erase(it);
    return p;
  }

  void track(void* p, size_t size) {
    std::lock_guard lock{mu};
    in_use.emplace(p, size);
  }

  // Keeps a freed block while the cache has room for it; frees it (or, for
  // room, the largest kept blocks) otherwise. Frees what it did not make.
  void give_back(void* p) {
    std::vector<void*> to_free;
    {
      std::lock_guard lock{mu};
      auto it = in_use.find(p);
      if (it == in_use.end()) {
        to_free.push_back(p);
      } else {
        const size_t size = it->second;
        in_use.erase(it);
        while (kept_bytes + size > kKeptBlocksMaxBytes && !kept.empty() && std::prev(kept.end())->first > size) {
          auto largest = std::prev(kept.end());
          kept_bytes -= largest->first;
          to_free.push_back(largest->second);
          kept.erase(largest);
        }
        if (kept_bytes + size <= kKeptBlocksMaxBytes) {
          kept.emplace(size, p);
          kept_bytes += size;
        } else {
          to_free.push_back(p);
        }
      }
    }
    for (void* q : to_free) c10::free_cpu(q);
  }

  void release() {
    std::multimap<size_t, void*> all;
    {
      std::lock_guard lock{mu};
      all.swap(kept);
      kept_bytes = 0;
    }
    for (auto& [size, p] : all) c10::free_cpu(p);
  }
};

Blocks& blocks() {
  static auto* b = new Blocks;  // never destroyed: tensors may be freed at exit
  return *b;
}

void free_block(void* p) { blocks().give_back(p); }

class BlockCache final : public c10::Allocator {
public:
  explicit BlockCache(c10::Allocator* below) : below_(below) {}

  c10::DataPtr allocate(size_t n) const override {
    if (n < kKeptBlockMinBytes) return below_->allocate(n);
    void* p = blocks().take(n);
    if (!p) {
      p = c10::alloc_cpu(n);  // throws, naming the size, when out of memory
      blocks().track(p, n);
    }
    return {p, p, &free_block, c10::Device(c10::DeviceType::CPU)};
  }

  // raw_allocate's blocks: free_block frees those it did not make (the
  // allocator below makes them with alloc_cpu, as this one does).
  c10::DeleterFnPtr raw_deleter() const override { return &free_block; }

private:
  c10::Allocator* below_;
};

std::atomic<bool> installed{false};

}  // namespace

void keep_freed_tensor_blocks() {
  static std::once_flag once;
  std::call_once(once, [] {
    const char* v = std::getenv("GLINT_MALLOC_TUNING");
    if (v && std::strcmp(v, "0") == 0) return;
    // Only in front of LibTorch's own allocator, whose blocks free_cpu frees.
    if (c10::GetCPUAllocator() != c10::GetDefaultCPUAllocator()) return;
    static auto* cache = new BlockCache{c10::GetDefaultCPUAllocator()};  // never destroyed, as blocks()
    c10::SetCPUAllocator(cache, /*priority=*/1);
    installed = true;
  });
}

bool tensor_block_cache_installed() { return installed; }

void release_kept_tensor_blocks() { blocks().release(); }

size_t kept_tensor_block_bytes() {
  auto& b = blocks();
  std::lock_guard lock{b.mu};
  return b.kept_bytes;
}

}  // namespace glint::components
