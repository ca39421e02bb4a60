#include "components/sampler/block_pool.hpp"

#include "runtime/hash.hpp"

#include <algorithm>
#include <cassert>
#include <string_view>

namespace glint::components {

namespace {

// splitmix64's finaliser: every input bit reaches every output bit.
uint64_t mix(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

}  // namespace

uint64_t chain_hash(uint64_t parent, std::span<const int64_t> tokens) {
  uint64_t h = mix(parent ^ 0x9e3779b97f4a7c15ULL);
  for (auto t : tokens) h = mix(h ^ static_cast<uint64_t>(t));
  return mix(h ^ tokens.size());
}

uint64_t hash_seed(std::string_view salt) {
  Fnv1a h;
  h.add(salt.data(), salt.size());
  return mix(h.value);
}

BlockPool::BlockPool(int32_t num_blocks)
    : refs_(static_cast<size_t>(num_blocks), 0),
      prev_(static_cast<size_t>(num_blocks), -1),
      next_(static_cast<size_t>(num_blocks), -1),
      in_free_(static_cast<size_t>(num_blocks), false),
      entries_(static_cast<size_t>(num_blocks)) {
  for (int32_t b = 0; b < num_blocks; ++b) push_back(b);
}

void BlockPool::unlink(int32_t b) {
  auto i = static_cast<size_t>(b);
  assert(in_free_[i]);
  if (prev_[i] >= 0) next_[static_cast<size_t>(prev_[i])] = next_[i];
  else head_ = next_[i];
  if (next_[i] >= 0) prev_[static_cast<size_t>(next_[i])] = prev_[i];
  else tail_ = prev_[i];
  prev_[i] = next_[i] = -1;
  in_free_[i] = false;
  --num_free_;
}

void BlockPool::push_back(int32_t b) {
  auto i = static_cast<size_t>(b);
  assert(!in_free_[i]);
  prev_[i] = tail_;
  next_[i] = -1;
  if (tail_ >= 0) next_[static_cast<size_t>(tail_)] = b;
  else head_ = b;
  tail_ = b;
  in_free_[i] = true;
  ++num_free_;
}

void BlockPool::uncache(int32_t b) {
  auto& e = entries_[static_cast<size_t>(b)];
  if (!e.registered) return;
  if (auto it = by_key_.find(e.key); it != by_key_.end() && it->second == b) by_key_.erase(it);
  e = Entry{};
}

std::optional<int32_t> BlockPool::allocate() {
  if (head_ < 0) return std::nullopt;
  int32_t b = head_;
  unlink(b);
  uncache(b);
  refs_[static_cast<size_t>(b)] = 1;
  return b;
}

void BlockPool::retain(int32_t b) {
  assert(refs_[static_cast<size_t>(b)] > 0);
  ++refs_[static_cast<size_t>(b)];
}

void BlockPool::release(int32_t b) {
  auto& r = refs_[static_cast<size_t>(b)];
  assert(r > 0);
  if (--r == 0) push_back(b);
}

std::optional<int32_t> BlockPool::acquire_cached(uint64_t key, uint64_t parent, std::span<const int64_t> tokens) {
  auto it = by_key_.find(key);
  if (it == by_key_.end()) return std::nullopt;
  int32_t b = it->second;
  const auto& e = entries_[static_cast<size_t>(b)];
  // A 64-bit key collision must not hand out another prefix's values.
  if (e.parent != parent || !std::equal(tokens.begin(), tokens.end(), e.tokens.begin(), e.tokens.end()))
    return std::nullopt;
  if (refs_[static_cast<size_t>(b)] == 0) unlink(b);
  ++refs_[static_cast<size_t>(b)];
  return b;
}

void BlockPool::register_cached(int32_t b, uint64_t key, uint64_t parent, std::span<const int64_t> tokens) {
  auto& e = entries_[static_cast<size_t>(b)];
  if (e.registered || by_key_.count(key)) return;
  e.key = key;
  e.parent = parent;
  e.tokens.assign(tokens.begin(), tokens.end());
  e.registered = true;
  by_key_.emplace(key, b);
}

void BlockPool::reset_cache() {
  for (auto& [key, b] : by_key_) entries_[static_cast<size_t>(b)] = Entry{};
  by_key_.clear();
}

}  // namespace glint::components
