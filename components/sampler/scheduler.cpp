#include "components/sampler/scheduler.hpp"

#include <algorithm>
#include <cassert>

namespace glint::components {

int64_t Schedule::num_tokens() const {
  int64_t n = 0;
  for (const auto& c : chunks) n += c.count;
  return n;
}

Scheduler::Scheduler(const SchedulerConfig& cfg) : cfg_(cfg), pool_(cfg.num_blocks) {}

Sequence& Scheduler::add(uint64_t request, std::vector<int64_t> prompt, uint64_t salt, bool read_prefix_cache,
                         int32_t reserved) {
  auto s = std::make_unique<Sequence>();
  s->id = next_id_++;
  s->request = request;
  s->prompt_len = static_cast<int64_t>(prompt.size());
  s->tokens = std::move(prompt);
  s->salt = salt;
  s->read_prefix_cache = read_prefix_cache && cfg_.enable_prefix_caching;
  s->reserved = reserved;
  s->arrival = next_arrival_++;
  auto& ref = *s;
  seqs_.emplace(ref.id, std::move(s));
  waiting_.push_back(&ref);
  return ref;
}

int64_t Scheduler::slots_in_use() const {
  int64_t n = 0;
  for (const auto* s : running_) n += 1 + s->reserved;
  return n;
}

void Scheduler::release_blocks(Sequence& s) {
  // Last block first: the free list hands out its head first, so a prompt's
  // leading blocks, the likeliest to be shared, stay cached longest.
  for (auto it = s.blocks.rbegin(); it != s.blocks.rend(); ++it) pool_.release(*it);
  s.blocks.clear();
  s.block_keys.clear();
  s.num_computed = 0;
}

void Scheduler::match_prefix(Sequence& s) {
  if (!s.read_prefix_cache) return;
  const auto bs = cfg_.block_size;
  // The last token is always computed: its logits give the next token.
  const int64_t full = (static_cast<int64_t>(s.tokens.size()) - 1) / bs;
  uint64_t parent = s.salt;
  for (int64_t i = 0; i < full; ++i) {
    std::span<const int64_t> toks{s.tokens.data() + i * bs, static_cast<size_t>(bs)};
    auto key = chain_hash(parent, toks);
    auto b = pool_.acquire_cached(key, parent, toks);
    if (!b) break;
    s.blocks.push_back(*b);
    s.block_keys.push_back(key);
    parent = key;
  }
  s.num_computed = static_cast<int64_t>(s.blocks.size()) * bs;
}

bool Scheduler::allocate(Sequence& s, int64_t count, Schedule& out) {
  const auto bs = cfg_.block_size;
  const int64_t need = blocks_for(s.num_computed + count) - static_cast<int64_t>(s.blocks.size());
  // Writing into a shared, partly filled block (a fork's last prompt block): copy it first.
  const bool cow = s.num_computed % bs != 0 && pool_.refcount(s.blocks[static_cast<size_t>(s.num_computed / bs)]) > 1;
  if (std::max<int64_t>(need, 0) + (cow ? 1 : 0) > pool_.num_free()) return false;
  if (cow) {
    auto& slot = s.blocks[static_cast<size_t>(s.num_computed / bs)];
    auto fresh = pool_.allocate();  // num_free was checked above
    if (!fresh) return false;
    out.copies.emplace_back(slot, *fresh);
    pool_.release(slot);
    slot = *fresh;
  }
  for (int64_t i = 0; i < need; ++i) {
    auto block = pool_.allocate();  // num_free was checked above
    if (!block) return false;
    s.blocks.push_back(*block);
  }
  return true;
}

void Scheduler::preempt(Sequence& s) {
  release_blocks(s);
  s.status = Sequence::Status::waiting;
  s.preempted = true;
  ++stats_.preemptions;
  running_.erase(std::find(running_.begin(), running_.end(), &s));
  waiting_.push_front(&s);
}

Schedule Scheduler::schedule(uint64_t admit_below) {
  return schedule([admit_below](uint64_t request) { return request >= admit_below; });
}

Schedule Scheduler::schedule(const std::function<bool(uint64_t request)>& held) {
  Schedule out;
  int64_t budget = cfg_.max_num_batched_tokens;
  // Running sequences, oldest first; victims come from the back.
  for (size_t i = 0; i < running_.size() && budget > 0;) {
    Sequence& s = *running_[i];
    const int64_t count = std::min(s.pending(), budget);
    if (count <= 0) {
      ++i;
      continue;
    }
    bool self_preempted = false;
    while (!allocate(s, count, out)) {
      Sequence* victim = running_.back();
      preempt(*victim);
      out.preempted.push_back(victim);
      if (victim == &s) {
        self_preempted = true;
        break;
      }
    }
    if (self_preempted) break;  // s was the last running sequence
    register_blocks(s, s.num_computed + count);
    out.chunks.push_back({&s, s.num_computed, count});
    budget -= count;
    ++i;
  }
  // Waiting sequences, in order, when nothing had to be preempted.
  for (size_t w = 0; out.preempted.empty() && budget > 0 && w < waiting_.size();) {
    Sequence& s = *waiting_[w];
    if (held(s.request)) {
      ++w;
      continue;
    }
    if (slots_in_use() + 1 + s.reserved > cfg_.max_num_seqs) break;
    const bool first_admission = s.num_computed == 0 && !s.preempted;
    match_prefix(s);
    const int64_t count = std::min(s.pending(), budget);
    if (!allocate(s, count, out)) {
      release_blocks(s);
      break;
    }
    if (first_admission) {
      stats_.prompt_tokens += s.prompt_len;
      stats_.cached_tokens += s.num_computed;
      s.cached_tokens = s.num_computed;
    } else {
      stats_.recomputed_tokens += static_cast<int64_t>(s.tokens.size()) - s.num_computed;
    }
    waiting_.erase(waiting_.begin() + static_cast<std::ptrdiff_t>(w));
    s.status = Sequence::Status::running;
    s.generation = generation_;
    auto at = std::upper_bound(running_.begin(), running_.end(), &s, [](const Sequence* a, const Sequence* b) {
      return a->arrival != b->arrival ? a->arrival < b->arrival : a->sample < b->sample;
    });
    running_.insert(at, &s);
    register_blocks(s, s.num_computed + count);
    out.chunks.push_back({&s, s.num_computed, count});
    budget -= count;
  }
  return out;
}

void Scheduler::commit(const Schedule& sched) {
  for (const auto& c : sched.chunks) c.seq->num_computed = c.begin + c.count;
}

void Scheduler::register_blocks(Sequence& s, int64_t upto) {
  if (!cfg_.enable_prefix_caching || s.generation != generation_) return;
  const auto bs = cfg_.block_size;
  const auto full = static_cast<size_t>(upto / bs);
  uint64_t parent = s.block_keys.empty() ? s.salt : s.block_keys.back();
  for (size_t i = s.block_keys.size(); i < full; ++i) {
    std::span<const int64_t> toks{s.tokens.data() + i * bs, static_cast<size_t>(bs)};
    auto key = chain_hash(parent, toks);
    pool_.register_cached(s.blocks[i], key, parent, toks);
    s.block_keys.push_back(key);
    parent = key;
  }
}

std::vector<Sequence*> Scheduler::fork(Sequence& parent, int32_t n) {
  std::vector<Sequence*> out;
  auto it = std::find(running_.begin(), running_.end(), &parent);
  assert(it != running_.end());
  ++it;
  for (int32_t k = 1; k < n; ++k) {
    auto s = std::make_unique<Sequence>();
    s->id = next_id_++;
    s->request = parent.request;
    s->sample = k;
    s->tokens.assign(parent.tokens.begin(), parent.tokens.begin() + parent.prompt_len);
    s->prompt_len = parent.prompt_len;
    s->num_computed = parent.num_computed;
    s->blocks = parent.blocks;
    s->block_keys = parent.block_keys;
    s->salt = parent.salt;
    s->generation = parent.generation;
    s->read_prefix_cache = parent.read_prefix_cache;
    s->arrival = parent.arrival;
    s->status = Sequence::Status::running;
    for (auto b : s->blocks) pool_.retain(b);
    out.push_back(s.get());
    it = running_.insert(it, s.get()) + 1;
    seqs_.emplace(s->id, std::move(s));
  }
  parent.reserved = 0;
  return out;
}

void Scheduler::finish(Sequence& s) {
  release_blocks(s);
  if (s.status == Sequence::Status::running) running_.erase(std::find(running_.begin(), running_.end(), &s));
  else if (s.status == Sequence::Status::waiting) waiting_.erase(std::find(waiting_.begin(), waiting_.end(), &s));
  s.status = Sequence::Status::finished;
  seqs_.erase(s.id);
}

}  // namespace glint::components
