#pragma once
/// `Engine`: generation with a paged KV cache, continuous batching, prefix
/// caching and vLLM's sampling parameters, on a CausalLM.
///
///   auto engine = Engine::load("models/tiny", {.cache_bytes = 64 << 20});
///   auto outs = engine->generate({prompt_a, prompt_b}, {.num_samples = 4, .max_tokens = 128});
///   for (auto& o : outs) if (o) use(o->sequences[0].tokens, o->sequences[0].logprobs.chosen);
///
/// Or step by step, with requests joining and leaving between steps:
///
///   auto id = engine->add_request(prompt, params);   // per-request errors here
///   while (engine->has_unfinished()) for (auto done : *engine->step()) ...
///
/// Each step runs one forward pass over every scheduled token (prefill
/// chunks and decodes together, several LoRA adapters in one batch) and
/// samples what completes. See scheduler.hpp for the policy, docs/sampler.md
/// for the guide.
///
/// Weight updates, adapters, sleep and the prefix cache are changed between
/// steps. Not thread-safe: one owner (the sampler actor) calls it. A failed
/// call leaves the engine as it was, unless it says otherwise.

#include "components/data/tokenizer.hpp"
#include "components/model/model.hpp"
#include "components/sampler/params.hpp"

#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace glint::components {

struct EngineStats {
  int64_t num_blocks = 0;
  int64_t free_blocks = 0;
  int64_t block_size = 0;
  /// Gated DeltaNet layers (Qwen3.5): the sequences whose conv and
  /// recurrent states the engine holds at once, and the bytes of one's.
  int64_t state_slots = 0, state_bytes_per_sequence = 0;
  int64_t steps = 0;
  int64_t prompt_tokens = 0;      ///< prompt tokens of admitted requests
  int64_t cached_tokens = 0;      ///< of which the prefix cache served
  int64_t generated_tokens = 0;
  int64_t preemptions = 0;
  int64_t recomputed_tokens = 0;  ///< computed again after a preemption
  int64_t running = 0, waiting = 0;
  /// Wall time of the steps so far: scheduling and batch building, the
  /// forward pass (with the logits), sampling and bookkeeping.
  double schedule_seconds = 0, forward_seconds = 0, sample_seconds = 0;
  double prefix_cache_hit_rate() const {
    return prompt_tokens ? static_cast<double>(cached_tokens) / static_cast<double>(prompt_tokens) : 0.0;
  }
};

class Engine {
public:
  /// An engine on `model` (shared: weight updates change it). Its KV cache
  /// gets as many blocks as cfg.cache_bytes holds; too small a budget for
  /// one block is an error that says how much one block takes. Without a
  /// tokenizer, outputs have no text and stop strings are refused.
  static Result<Engine> create(CausalLM model, const EngineConfig& cfg, std::optional<Tokenizer> tokenizer = {});
  /// Loads a model directory, with its tokenizer.json when there is one.
  static Result<Engine> load(const std::string& model_dir, const EngineConfig& cfg);

  Engine(Engine&&) noexcept;
  Engine& operator=(Engine&&) noexcept;
  ~Engine();

  /// Queues a request; its id, or an error that concerns this request only
  /// (an empty prompt, an id outside the vocabulary, a prompt longer than
  /// max_model_len, bad parameters, an unknown adapter, a request that can
  /// never fit in the cache). `adapter` empty: the base model.
  Result<uint64_t> add_request(std::vector<int64_t> prompt, const SamplingParams& params,
                               const std::string& adapter = "");
  /// Stops a request: its unfinished sequences end with StopReason::abort.
  /// Unknown or finished ids are ignored.
  void abort(uint64_t id);
  bool has_unfinished() const;

  /// One engine step; the ids of the requests with new output (finished or
  /// not). An error means the forward pass failed (a bug, or memory): the
  /// step's requests are aborted and the engine stays usable.
  Result<std::vector<uint64_t>> step();
  /// What request `id` has produced so far; null for an unknown id.
  const RequestOutput* output(uint64_t id) const;
  /// Removes a finished request and hands its output over.
  std::optional<RequestOutput> take(uint64_t id);

  /// Adds every prompt, steps until all are done, and takes their outputs:
  /// one result per prompt, an error for a prompt that was refused.
  std::vector<Result<RequestOutput>> generate(const std::vector<std::vector<int64_t>>& prompts,
                                              const SamplingParams& params, const std::string& adapter = "");

  // -- weights and adapters --------------------------------------------------

  /// New weights under their Hugging Face names (adapter empty: base
  /// weights, any subset) or a LoRA adapter's tensors under PEFT's names.
  /// Names and shapes are checked first; nothing changes on an error. With
  /// UpdatePolicy::finish_old the update waits until the requests already
  /// admitted finish (new ones wait for it); with abort, they stop now; with
  /// continue_new it applies before the next step and running requests go on
  /// with it. Updates that must wait queue up (at most 8) and apply in the
  /// order they came, each once the requests before it are done, so a
  /// request added between two updates runs wholly on the first. An
  /// adapter's update touches only that adapter's requests (waits for,
  /// holds back, aborts); the base's touches all. The prefix cache is
  /// cleared when one applies. `version` is reported by every sequence
  /// sampled after it with what it changed. `weights` are only read during the call (an
  /// update that applies now copies them once, straight into the model; one
  /// that must wait keeps its own copy), so the caller may reuse them after.
  Result<void> update_weights(const NamedTensors& weights, const std::string& adapter, int64_t version,
                              UpdatePolicy policy = UpdatePolicy::finish_old);
  /// Whether an update waits for requests in flight (or for one before it).
  bool update_pending() const;
  /// The highest version applied (any adapter's). A sequence reports the
  /// version of the last update that changed its weights: its adapter's or
  /// the base's, whichever applied later.
  int64_t weight_version() const;
  Result<void> add_adapter(const std::string& name, const LoraConfig& cfg);
  Result<void> load_adapter(const std::string& name, const std::string& dir);
  /// Refused while a request uses the adapter.
  Result<void> remove_adapter(const std::string& name);
  std::vector<std::string> adapters() const;

  // -- memory ------------------------------------------------------------------

  /// Forgets every cached prefix (blocks in use stay valid).
  void reset_prefix_cache();
  /// Frees the KV cache, keeping the weights. Refused while requests are in
  /// flight; requests are refused until wake().
  Result<void> sleep();
  Result<void> wake();
  bool sleeping() const;

  EngineStats stats() const;
  const EngineConfig& config() const;
  const CausalLM& model() const;
  const Tokenizer* tokenizer() const;
  /// The longest prompt + completion.
  int64_t max_model_len() const;

  struct Impl;

private:
  Engine() = default;
  std::unique_ptr<Impl> impl_;
};

}  // namespace glint::components
