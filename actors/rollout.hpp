#pragma once
/// Asynchronous RL: a rollout pipeline that keeps the sampler group
/// generating while the model group trains, under a staleness bound, as
/// AReaL and veRL's fully-async mode do (docs/rl.md, "Asynchronous RL"):
///
///   actors::CheckpointEngine ckpt{*model, *sampler};
///   actors::RolloutPipeline rollouts{ckpt, *sampler, source, {.max_staleness = 2}};
///   for (int step = 1; step <= steps; ++step) {
///     auto r = rollouts.next().take();          // batch `step`, every group whole
///     ... rewards, advantages, training_batch(r->batch.prompts, r->sequences, ...)
///     model->forward_backward(batch).take();    // decoupled_ppo corrects for staleness
///     model->clip_grad_and_step().take();
///     rollouts.weights_updated();               // sync, then admit what the bound allows
///   }
///
/// `source(step)` gives batch `step`'s prompts and sampling parameters (its
/// seed should depend on the step, so a batch's samples do not depend on
/// when it was sampled). Batches are numbered from 1 and trained in order.
///
/// The bound (AReaL's): with v the number of weight updates published
/// (weights_updated calls) and B prompts per batch, a prompt is admitted
/// while accepted + running < (max_staleness + v + 1) * B, and while fewer
/// than max_running prompts run: batch k may start once v >= k - 1 -
/// max_staleness, so it is trained at most max_staleness updates after the
/// weights it was sampled with. max_staleness 0 is the synchronous loop
/// (sync, sample, train) step for step; 1 is one-step-off (batch k+1 samples
/// while batch k trains).
///
/// Each sampled sequence carries its weight version. What happens to
/// requests in flight when new weights arrive is the sync's policy
/// (RolloutOptions::sync.policy): finish_old (default) finishes them on the
/// weights they began with, so every sequence is sampled by one version,
/// which version samples what does not depend on timing (and a whole batch
/// has one version unless max_running spreads its admission over
/// updates); continue_new moves them to the new
/// weights at the next engine step (fresher, timing-dependent) and each
/// sequence records the versions it spans.
///
/// Not thread-safe: one driver thread calls it.

#include "actors/checkpoint_engine.hpp"
#include "actors/dataloader.hpp"
#include "actors/sampler_group.hpp"

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

namespace glint::actors {

/// One batch of prompts, and how to sample them.
struct RolloutBatch {
  std::vector<std::vector<int64_t>> prompts;
  SamplingParams params;            ///< num_samples is the group size
  std::vector<DataRow> rows{};      ///< the caller's rows (solutions, ...), carried along untouched
  /// Where the dataloader stood after this batch: a checkpoint of step k
  /// saves batch k's, not the loader's own, which is ahead by the batches in
  /// flight.
  std::optional<LoaderState> loader_state{};
};

struct RolloutOptions {
  /// eta: how many weight updates a batch may lag behind the weights it is
  /// trained on; 0 to 8 (each update waiting for requests in flight holds a
  /// copy of the weights on every sampler rank).
  int64_t max_staleness = 0;
  /// At most this many prompts sampling at once (0: no limit but the bound).
  int64_t max_running = 0;
  /// The number of the first batch (a resumed run starts after its
  /// checkpoint's step); the bound counts from it.
  int64_t first_batch = 1;
  /// The last batch (0: until the source answers nullopt): nothing after it
  /// is admitted.
  int64_t last_batch = 0;
  /// How weights travel, and the policy for requests in flight: finish_old
  /// or continue_new (abort is refused).
  SyncOptions sync{};
  /// What samples the prompts `requests` of batch `step` (default: the
  /// sampler group's sample with batch.params). Multi-turn rollouts run
  /// their episodes here (agents.hpp): the answer is num_samples sequences
  /// per request, in order, each with the request's index.
  std::function<Future<std::vector<SampledSequence>>(int64_t step, const RolloutBatch& batch,
                                                     const std::vector<SampleRequest>& requests)>
      sample{};
};

/// A whole batch of samples.
struct Rollout {
  int64_t step = 0;  ///< the batch's number (from 1)
  RolloutBatch batch;
  /// num_samples per prompt, prompt by prompt.
  std::vector<SampledSequence> sequences;
  int64_t admitted_version = 0;  ///< the sampler's weight version when the batch was admitted
  int64_t trained_version = 0;   ///< the newest version synced when next() answered
  /// Over its sequences: trained_version - first_weight_version, the most
  /// and the mean (0 for the synchronous loop).
  int64_t staleness_max = 0;
  double staleness_mean = 0;
  double sample_seconds = 0;  ///< admission to the last sequence's arrival
  double wait_seconds = 0;    ///< how long next() waited for it
};

/// Counters since the pipeline began.
struct RolloutStats {
  int64_t admitted = 0;   ///< prompts
  int64_t finished = 0;   ///< prompts whose samples arrived
  int64_t updates = 0;    ///< weights_updated calls
  double wait_seconds = 0;   ///< next() waiting for samples (the trainer idle)
  double sync_seconds = 0;   ///< inside sync_weights
};

class RolloutPipeline {
public:
  using Source = std::function<Result<std::optional<RolloutBatch>>(int64_t step)>;

  /// Errors (at the first call): max_staleness outside 0..8, max_running < 0.
  RolloutPipeline(CheckpointEngine& engine, SamplerGroup sampler, Source source, RolloutOptions options = {});
  ~RolloutPipeline();
  RolloutPipeline(const RolloutPipeline&) = delete;
  RolloutPipeline& operator=(const RolloutPipeline&) = delete;

  /// The next batch, whole. The first call syncs the model's weights to the
  /// samplers. Error: the source's, a sample call's, a refused prompt or an
  /// aborted sample (the pipeline is then broken: later calls repeat it);
  /// not_found past the last batch; failed_precondition when the bound
  /// holds the next batch back (weights_updated was not called).
  Result<Rollout> next();
  /// The model took an optimizer step: syncs its weights to the samplers
  /// (requests in flight per options.sync.policy), then admits what the
  /// bound now allows.
  Result<SyncReport> weights_updated();
  /// Stops the samples in flight and waits for their answers; next() fails
  /// after it. The destructor does the same. The sampler group's abort stops
  /// every request on it, the pipeline's and any other caller's; a remote
  /// server refuses abort, and close() then waits for the batches in flight
  /// to finish.
  void close();

  const RolloutStats& stats() const { return stats_; }
  int64_t max_staleness() const { return options_.max_staleness; }

private:
  struct Chunk {
    size_t begin = 0, end = 0;  ///< the batch's prompts it holds
    Future<std::vector<SampledSequence>> answer;
    std::shared_ptr<std::chrono::steady_clock::time_point> arrived;  ///< set when the answer comes
  };
  struct Pending {
    int64_t step = 0;
    RolloutBatch batch;
    size_t admitted = 0;  ///< prompts sent so far
    int64_t version = 0;
    std::chrono::steady_clock::time_point start;
    std::vector<Chunk> chunks;
  };
  Result<void> check() const;
  Result<void> admit();
  size_t running() const;
  /// Waits for the oldest chunk still sampling; false when none is.
  bool wait_for_one();

  CheckpointEngine& engine_;
  SamplerGroup sampler_;
  Source source_;
  RolloutOptions options_;
  std::deque<Pending> pending_;  ///< batches fetched and not yet handed out, oldest first
  int64_t fetched_ = 0;          ///< batches taken from the source
  bool source_done_ = false;
  bool synced_ = false;
  bool closed_ = false;
  std::optional<caf::error> broken_;
  RolloutStats stats_;
};

}  // namespace glint::actors
