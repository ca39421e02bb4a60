#pragma once
/// What one sampler rank is, without the actor: its engine, the sample
/// calls in flight, the step loop and the weight updates being staged. The
/// actor (actors/sampler.cpp) turns messages into these methods and their
/// callbacks into messages (answers, chunks to a listener, its own step
/// messages), so tests drive a SamplerState directly
/// (tests/actors/sampler_state_test.cpp):
///
///   std::deque<uint64_t> steps;
///   SamplerState st{ctx, spec, [&](uint64_t loop) { steps.push_back(loop); }};
///   st.sample(requests, params, "", nullptr, [&](auto r) { answer = std::move(r); });
///   while (!steps.empty()) { auto l = steps.front(); steps.pop_front(); st.step(l); }
///
/// The step loop: while work is left, the state asks for one step at a time
/// through `schedule_step(loop)` and runs it when `step(loop)` comes; a
/// stray step of an older loop is ignored. Calls that arrive in between
/// join the engine before the next step (continuous batching across calls).

#include "actors/sampler.hpp"
#include "components/sampler/engine.hpp"

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace glint::actors {

class SamplerState {
public:
  using Answer = std::function<void(Result<std::vector<SampledSequence>>)>;
  using OnChunk = std::function<void(SampleChunk)>;

  /// Loads the engine `spec` names (a load error is kept and answered by
  /// every call). `schedule_step(loop)` must make step(loop) run later, after
  /// whatever calls are already queued.
  SamplerState(RankContext ctx, SamplerSpec spec, std::function<void(uint64_t)> schedule_step);

  std::string where() const;
  caf::error fail(const caf::error& e) const { return with_context(e, where()); }
  Result<components::Engine*> engine();

  /// Starts a sample call; `answer` gets num_samples sequences per request
  /// (or the call's error, named with this rank) when its last request
  /// finishes, or at once when no request was admitted. With `on_chunk`,
  /// every engine step sends each sequence's new tokens there.
  void sample(const std::vector<SampleRequest>& requests, const SamplingParams& params, const std::string& adapter,
              OnChunk on_chunk, Answer answer);
  /// One step of step loop `loop`, then asks for the next while work is left.
  void step(uint64_t loop);

  /// Applies the staged buckets of u.version and `weights` as one update.
  Result<void> update_weights(NamedTensors weights, const WeightUpdate& u);
  /// Keeps a bucket of the update with version `version` until it comes.
  Result<void> stage_weights(NamedTensors weights, int64_t version);
  /// Receives the tensors of `m` over the c10d weight-sync group at `at`
  /// (the model's sync_send is its rank 0), then applies them as
  /// update_weights(tensors, u).
  Result<void> sync_recv(const SyncManifest& m, const WeightUpdate& u, const SyncGroupAddress& at);
  /// Receives the tensors of `m` from model rank 0's weight stream at `at`,
  /// then applies them as update_weights(tensors, u).
  Result<void> stream_recv(const SyncManifest& m, const WeightUpdate& u, const StreamAddress& at);

  /// Long sampling says where it is: while the step loop runs, every
  /// `every` (10 s by default) one line goes to `say` (log::info by
  /// default: `glint sft/grpo/dpo` show it) with the sequences of the calls
  /// in flight finished so far and the tokens generated.
  void report_progress(std::chrono::milliseconds every, std::function<void(const std::string&)> say);

  /// Stops every request in flight; answers how many.
  Result<int64_t> abort_all();
  Result<void> wake();
  Result<Metrics> stats();

private:
  /// One unanswered sample call. Its answer is laid out from the start:
  /// out[r * n + k] is request r's sample k.
  struct Call {
    Answer answer;
    OnChunk on_chunk;              ///< streams chunks here when set
    size_t n = 1;                  ///< num_samples
    std::vector<SampledSequence> out;
    std::vector<size_t> streamed;  ///< per sequence: tokens already streamed
    std::vector<char> closed;      ///< per sequence: its finished chunk was sent
    size_t remaining = 0;          ///< requests still in the engine
  };
  bool has_work() const;
  void kick();
  void collect_all();
  void collect(const std::vector<uint64_t>& ids);
  void stream(Call& call, size_t r, const components::RequestOutput& o);
  void refuse(Call& call, size_t r, const std::string& why);
  void finish(uint64_t cid);
  void drop(uint64_t cid, const caf::error& err);
  void fail_all(const caf::error& err);
  /// Tensors for what `m` lists, to receive into.
  static Result<std::vector<Tensor>> allocate(const SyncManifest& m);
  /// `tensors` under the names of `m`, applied as one update.
  Result<void> apply(const SyncManifest& m, std::vector<Tensor> tensors, const WeightUpdate& u);

  RankContext ctx_;
  SamplerSpec spec_;
  std::function<void(uint64_t)> schedule_step_;
  std::optional<components::Engine> engine_;
  caf::error load_error_;
  struct Sync;
  std::shared_ptr<Sync> sync_;   ///< the c10d weight-sync group, joined at the first sync_recv
  NamedTensors staged_;          ///< buckets of a weight update not yet applied
  int64_t staged_version_ = -1;  ///< the version they belong to
  std::map<uint64_t, Call> calls_;
  uint64_t next_call_ = 0;
  std::map<uint64_t, std::pair<uint64_t, size_t>> owner_;  ///< engine request id -> (call, request)
  uint64_t loop_ = 0;      ///< the id of the current step loop
  bool stepping_ = false;  ///< a step of loop_ is on its way
  /// Progress of a long step loop (report_progress).
  std::chrono::milliseconds progress_every_{10000};
  std::function<void(const std::string&)> say_;
  std::optional<std::chrono::steady_clock::time_point> busy_since_, said_at_;
  int64_t tokens_at_start_ = 0;
  void tell_progress();
};

/// The most sequences one call may ask for (requests x num_samples): each
/// costs memory before it is scheduled, and the count comes from the network.
inline constexpr size_t max_sequences_per_call = size_t{1} << 20;

}  // namespace glint::actors
