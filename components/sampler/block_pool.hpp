#pragma once
/// `BlockPool`: the bookkeeping of a paged KV cache. The cache's memory is
/// cut into `num_blocks` blocks of `block_size` token slots; a sequence owns
/// a list of block ids (its block table). The pool keeps a reference count
/// per block (sequences forked from one prompt share its blocks), a free
/// list, and the prefix cache: full blocks registered under a hash of their
/// tokens and of every token before them, so that a later request whose
/// prompt starts the same way reuses them instead of recomputing.
///
/// A freed block that holds a registered prefix stays cached until it is
/// allocated again: the free list is least recently freed first, so the
/// blocks freed last (and so the most likely to be asked for again) are
/// evicted last. Holds no tensors (the engine owns the memory); not
/// thread-safe (one engine drives it).

#include <cstdint>
#include <optional>
#include <span>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace glint::components {

/// The prefix-cache key of a full block: a hash of the block's tokens
/// chained onto its parent's key (`seed` for the first block, which names
/// what else the cached values depend on: the adapter, the weights).
uint64_t chain_hash(uint64_t parent, std::span<const int64_t> tokens);
/// A seed for chain_hash from a text (an adapter's name).
uint64_t hash_seed(std::string_view salt);

class BlockPool {
public:
  explicit BlockPool(int32_t num_blocks);

  int32_t num_blocks() const { return static_cast<int32_t>(refs_.size()); }
  /// Blocks nobody holds (some may still be cached).
  int32_t num_free() const { return num_free_; }

  /// A block with reference count 1, taken from the head of the free list
  /// (its prefix-cache entry, if any, is dropped); nullopt if none is free.
  std::optional<int32_t> allocate();
  /// One more holder of `block` (a fork sharing it).
  void retain(int32_t block);
  /// One holder fewer; at zero the block joins the tail of the free list.
  void release(int32_t block);
  int32_t refcount(int32_t block) const { return refs_[static_cast<size_t>(block)]; }

  /// The cached block registered under `key` whose tokens and parent match,
  /// now held once more (taken off the free list if nobody held it).
  std::optional<int32_t> acquire_cached(uint64_t key, uint64_t parent, std::span<const int64_t> tokens);
  /// Registers full `block` under `key` (no-op if the key is already taken
  /// or the block already registered).
  void register_cached(int32_t block, uint64_t key, uint64_t parent, std::span<const int64_t> tokens);
  /// Forgets every registered prefix; blocks in use stay valid.
  void reset_cache();
  int64_t num_cached() const { return static_cast<int64_t>(by_key_.size()); }

private:
  struct Entry {
    uint64_t key = 0, parent = 0;
    std::vector<int64_t> tokens;
    bool registered = false;
  };
  void unlink(int32_t b);
  void push_back(int32_t b);
  void uncache(int32_t b);

  std::vector<int32_t> refs_;
  std::vector<int32_t> prev_, next_;  // the free list, linked through block ids; -1 ends it
  std::vector<bool> in_free_;
  int32_t head_ = -1, tail_ = -1, num_free_ = 0;
  std::vector<Entry> entries_;
  std::unordered_map<uint64_t, int32_t> by_key_;
};

}  // namespace glint::components
