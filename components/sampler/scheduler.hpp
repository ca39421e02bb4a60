#pragma once
/// `Scheduler`: which sequences run in the next engine step and which of
/// their tokens, vLLM-style. Torch-free, so its policy is tested without a
/// model.
///
/// Continuous batching: sequences wait in arrival order, join the running
/// set when there are free blocks and room under max_num_seqs, and leave it
/// one by one as they finish, while others keep generating. A step spends
/// at most max_num_batched_tokens: running sequences first, each its
/// pending tokens (one when decoding, a chunk of the prompt when
/// prefilling), then waiting ones in order; a prompt longer than what is
/// left is prefilled in chunks over several steps. When a running sequence
/// needs a block and none is free, the latest-arrived running sequence is
/// preempted: its blocks are freed and it goes back to the head of the
/// queue, to be recomputed (prompt and output so far) when it is admitted
/// again. First come, first served: a waiting sequence that does not fit
/// blocks those behind it.
///
/// The scheduler owns the sequences and the block pool; the engine owns the
/// tensors. Not thread-safe.

#include "components/sampler/block_pool.hpp"

#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <vector>

namespace glint::components {

struct SchedulerConfig {
  int64_t block_size = 16;
  int32_t num_blocks = 0;
  int64_t max_num_seqs = 256;
  int64_t max_num_batched_tokens = 2048;
  bool enable_prefix_caching = true;
};

struct Sequence {
  enum class Status : uint8_t { waiting, running, finished };
  uint64_t id = 0;
  uint64_t request = 0;
  int32_t sample = 0;               ///< index among its request's samples
  std::vector<int64_t> tokens;      ///< prompt, then output
  int64_t prompt_len = 0;
  int64_t num_computed = 0;         ///< leading tokens whose keys and values are in the cache
  std::vector<int32_t> blocks;      ///< block table
  std::vector<uint64_t> block_keys; ///< prefix keys of the leading full blocks registered so far
  uint64_t salt = 0;                ///< prefix-key seed: what else the cached values depend on
  bool read_prefix_cache = true;
  int32_t reserved = 0;             ///< sequence slots held for samples not forked yet
  int64_t arrival = 0;
  Status status = Status::waiting;
  bool preempted = false;           ///< was preempted at least once
  int64_t cached_tokens = 0;        ///< prompt tokens the prefix cache served at its first admission
  /// The prefix-cache generation it was admitted in: a sequence admitted
  /// before the cache was reset (new weights while it ran) registers no
  /// more blocks, since its cached values mix the old weights in.
  uint64_t generation = 0;

  int64_t pending() const { return static_cast<int64_t>(tokens.size()) - num_computed; }
};

/// Tokens [begin, begin + count) of a sequence, computed in one step.
struct Chunk {
  Sequence* seq = nullptr;
  int64_t begin = 0;
  int64_t count = 0;
  bool completes() const { return begin + count == static_cast<int64_t>(seq->tokens.size()); }
};

struct Schedule {
  std::vector<Chunk> chunks;                           ///< in running order
  std::vector<std::pair<int32_t, int32_t>> copies;     ///< copy-on-write: block src -> dst, before the step
  std::vector<Sequence*> preempted;
  int64_t num_tokens() const;
};

struct SchedulerStats {
  int64_t prompt_tokens = 0;   ///< prompt tokens of first admissions
  int64_t cached_tokens = 0;   ///< of which the prefix cache served
  int64_t preemptions = 0;
  int64_t recomputed_tokens = 0;  ///< tokens computed again after preemption
};

class Scheduler {
public:
  explicit Scheduler(const SchedulerConfig& cfg);

  /// A new sequence at the back of the queue. `reserved`: slots to keep for
  /// its samples beyond the first (forked when its prompt is done).
  Sequence& add(uint64_t request, std::vector<int64_t> prompt, uint64_t salt, bool read_prefix_cache,
                int32_t reserved);
  /// The next step's work. Chunks' sequences have their blocks. Waiting
  /// sequences of requests numbered `admit_below` or higher stay waiting
  /// (a weight update waits for the ones before).
  Schedule schedule(uint64_t admit_below = UINT64_MAX);
  /// The same with a rule: sequences of a request `held` answers true for
  /// stay waiting, and the ones after them may pass them.
  Schedule schedule(const std::function<bool(uint64_t request)>& held);
  /// Marks a step's chunks computed.
  void commit(const Schedule& s);
  /// Samples 1..n-1 of `parent`'s request: copies sharing every block of
  /// the parent (their tokens are the parent's prompt; the caller appends
  /// their first tokens). They run right after the parent.
  std::vector<Sequence*> fork(Sequence& parent, int32_t n);
  /// Frees the sequence's blocks and forgets it.
  void finish(Sequence& s);

  /// Forgets every registered prefix.
  /// Sequences running now keep their blocks but register no more of them.
  void reset_prefix_cache() {
    pool_.reset_cache();
    ++generation_;
  }
  const BlockPool& pool() const { return pool_; }
  const SchedulerConfig& config() const { return cfg_; }
  const SchedulerStats& stats() const { return stats_; }
  size_t num_waiting() const { return waiting_.size(); }
  size_t num_running() const { return running_.size(); }
  bool idle() const { return waiting_.empty() && running_.empty(); }
  /// Blocks a sequence of `tokens` tokens needs.
  int64_t blocks_for(int64_t tokens) const { return (tokens + cfg_.block_size - 1) / cfg_.block_size; }

private:
  bool allocate(Sequence& s, int64_t count, Schedule& out);
  void preempt(Sequence& s);
  void release_blocks(Sequence& s);
  void match_prefix(Sequence& s);
  // Registers the sequence's blocks that are full once its first `upto`
  // tokens are computed. Done when a chunk is scheduled, not after the step:
  // the step writes every layer's keys and values before any attention
  // reads them, so a prompt scheduled later in the same step may already
  // read them (requests queued together share their common prefix).
  void register_blocks(Sequence& s, int64_t upto);
  int64_t slots_in_use() const;

  SchedulerConfig cfg_;
  BlockPool pool_;
  std::map<uint64_t, std::unique_ptr<Sequence>> seqs_;
  std::deque<Sequence*> waiting_;
  std::vector<Sequence*> running_;  // by (arrival, sample)
  uint64_t next_id_ = 1;
  int64_t next_arrival_ = 0;
  uint64_t generation_ = 0;  ///< of the prefix cache: grows at every reset
  SchedulerStats stats_;
};

}  // namespace glint::components
