#pragma once
/// `SamplerGroup`: a driver's typed client of a sampler group, Twinkle's
/// vLLMSampler in C++. Each method owns how it is spread over the ranks:
///
///   auto sampler = actors::open_sampler_group(rt, DeviceGroup::of("sampler", 2), mesh, {.model_dir = dir});
///   auto seqs = sampler->sample(prompts, {.num_samples = 8, .max_tokens = 64}).take();
///   // prompts sliced over the dp ranks, num_samples sequences per prompt, in prompt order
///   auto batch = actors::training_batch(prompts, *seqs, {.pad_id = pad, .advantages = adv});
///
/// Transport boundary: a cheap, copyable handle on a SamplerBackend: the
/// CAF group of sampler actors in local and cluster mode (actors/sampler.hpp),
/// the server's RPC in remote mode. `open_sampler_group` is the one way to
/// get one. Errors: a refused prompt (empty, too long, an id outside the
/// vocabulary, an unknown adapter) comes back as its sequences with `error`
/// set while the rest is sampled; invalid SamplingParams, a sleeping
/// sampler or a lost rank fail the call.

#include "actors/sampler.hpp"
#include "components/sampler/params.hpp"
#include "runtime/future.hpp"
#include "runtime/group.hpp"

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace glint::actors {

/// The contract of a sampler group, whatever carries its calls; `adapter`
/// empty means the base model. Implementations keep the calling convention
/// documented on SamplerGroup's methods, answer every call and never throw.
class SamplerBackend {
public:
  virtual ~SamplerBackend() = default;
  /// The layout the group was opened with (a respawned rank's new home is
  /// in actor_group()).
  virtual const GroupInfo& info() const = 0;
  virtual Future<std::vector<SampledSequence>> sample(const std::vector<SampleRequest>& requests,
                                                      const SamplingParams& params, const std::string& adapter) = 0;
  /// As sample, every request on one rank chosen by `key` (the same key,
  /// the same rank while the group's serving ranks stay): a conversation
  /// whose turns are sampled one call at a time finds its earlier turns in
  /// that rank's prefix cache. Where the backend does not choose ranks (a
  /// remote server), the key is a hint it may drop: this is sample.
  virtual Future<std::vector<SampledSequence>> sample_on(uint64_t key, const std::vector<SampleRequest>& requests,
                                                         const SamplingParams& params, const std::string& adapter) {
    (void)key;
    return sample(requests, params, adapter);
  }
  virtual Result<std::vector<SampledSequence>> sample_streaming(const std::vector<SampleRequest>& requests,
                                                                const SamplingParams& params,
                                                                const std::string& adapter,
                                                                std::function<void(const SampleChunk&)> on_chunk) = 0;
  virtual Future<void> update_weights(const NamedTensors& weights, const std::string& adapter, int64_t version,
                                      components::UpdatePolicy policy) = 0;
  virtual Future<void> add_adapter(const std::string& name, const LoraConfig& lora) = 0;
  virtual Future<void> load_adapter(const std::string& name, const std::string& dir) = 0;
  virtual Future<void> remove_adapter(const std::string& name) = 0;
  virtual Future<void> reset_prefix_cache() = 0;
  virtual Future<void> sleep() = 0;
  virtual Future<void> wake() = 0;
  virtual Future<int64_t> abort() = 0;
  virtual Future<std::vector<Metrics>> stats() = 0;
  /// The CAF group behind a local or cluster backend, as it stands now (a
  /// supervised group replaces ranks it respawns); none where there is none.
  virtual std::optional<Group<sampler_actor>> actor_group() const { return std::nullopt; }
  /// A supervised group (RestartPolicy) respawns the ranks it lost, if its
  /// policy allows, before a weight sync and a sample call. The respawned
  /// ranks take no sample until they hold the current weights (ready()).
  virtual void heal() {}
  /// Rank `rank` (of actor_group()) holds the current weights: a weight sync
  /// of `target` (the adapter, "" for the base) reached it.
  virtual void synced(const std::string& target, const std::vector<int>& ranks) {
    (void)target;
    (void)ranks;
  }
  /// The runtime of actor_group(); null where there is none.
  virtual Runtime* runtime() const { return nullptr; }
};

class SamplerGroup {
public:
  explicit SamplerGroup(std::shared_ptr<SamplerBackend> backend, std::string adapter = {})
      : backend_(std::move(backend)), adapter_(std::move(adapter)) {}

  /// The same group, sampling with LoRA adapter `name` (add_adapter,
  /// load_adapter, or a weight sync of that adapter).
  SamplerGroup with_adapter(std::string name) const { return SamplerGroup{backend_, std::move(name)}; }
  const std::string& adapter() const { return adapter_; }

  /// num_samples completions of every prompt: the prompts are sliced over
  /// the data-parallel ranks, and the answer holds the sequences prompt by
  /// prompt (SampledSequence::index is the prompt's position).
  Future<std::vector<SampledSequence>> sample(const std::vector<std::vector<int64_t>>& prompts,
                                              const SamplingParams& params) const {
    return backend_->sample(requests_of(prompts), params, adapter_);
  }
  /// The same with the caller's own request ids (echoed in the sequences).
  Future<std::vector<SampledSequence>> sample(const std::vector<SampleRequest>& requests,
                                              const SamplingParams& params) const {
    return backend_->sample(requests, params, adapter_);
  }
  /// The requests sampled on one rank, chosen by `key` (SamplerBackend::sample_on):
  /// multi-turn rollouts key each conversation's turns the same, so that
  /// they reuse its prefix cache.
  Future<std::vector<SampledSequence>> sample_on(uint64_t key, const std::vector<SampleRequest>& requests,
                                                 const SamplingParams& params) const {
    return backend_->sample_on(key, requests, params, adapter_);
  }
  /// As sample, calling `on_chunk` with each sequence's new tokens after
  /// every engine step (one call at a time, in each sequence's order).
  /// Blocks until the answer and every last chunk came: call it from a
  /// driver thread, not from an actor.
  Result<std::vector<SampledSequence>> sample_streaming(const std::vector<std::vector<int64_t>>& prompts,
                                                        const SamplingParams& params,
                                                        std::function<void(const SampleChunk&)> on_chunk) const {
    return backend_->sample_streaming(requests_of(prompts), params, adapter_, std::move(on_chunk));
  }

  /// On every rank: new weights (HF names, any subset; or this handle's
  /// adapter's tensors under PEFT names), reported as `version` by every
  /// sequence sampled with them. To move a model group's weights, use the
  /// weight-sync engine, which sends them from model to sampler directly.
  Future<void> update_weights(const NamedTensors& weights, int64_t version,
                              components::UpdatePolicy policy = components::UpdatePolicy::finish_old) const {
    return backend_->update_weights(weights, adapter_, version, policy);
  }
  /// On every rank: a LoRA adapter (B zero, so the base's output until its
  /// weights come).
  Future<void> add_adapter(const std::string& name, const LoraConfig& lora) const {
    return backend_->add_adapter(name, lora);
  }
  /// On every rank: a PEFT adapter directory as adapter `name`.
  Future<void> load_adapter(const std::string& name, const std::string& dir) const {
    return backend_->load_adapter(name, dir);
  }
  /// On every rank; refused while a request uses it.
  Future<void> remove_adapter(const std::string& name) const { return backend_->remove_adapter(name); }
  /// On every rank: forget the cached prompt prefixes.
  Future<void> reset_prefix_cache() const { return backend_->reset_prefix_cache(); }
  /// On every rank: free the KV cache (refused while requests are in
  /// flight); sample fails until wake.
  Future<void> sleep() const { return backend_->sleep(); }
  Future<void> wake() const { return backend_->wake(); }
  /// On every rank: stop every request in flight; answers how many stopped.
  Future<int64_t> abort() const { return backend_->abort(); }
  /// Each rank's engine counters, in rank order (actors/sampler.hpp lists them).
  Future<std::vector<Metrics>> stats() const { return backend_->stats(); }

  const GroupInfo& info() const { return backend_->info(); }
  SamplerBackend& backend() const { return *backend_; }

private:
  std::shared_ptr<SamplerBackend> backend_;
  std::string adapter_;
};

/// The one way to get a SamplerGroup: places and spawns a sampler group
/// (local, cluster), or attaches to a server's samplers (remote mode;
/// docs/remote.md). With `restart.max_restarts` > 0 the group respawns the
/// ranks it loses (docs/faults.md): on the rank's own node once a restarted
/// process took its place there, else on the live node with the fewest of
/// its ranks; the new rank replays the adapters and weight updates the group
/// was given and takes samples once it holds the model's current weights
/// (at once if no weight sync ever ran, else after the next one). Remote
/// mode refuses a policy: the server supervises its samplers.
Result<SamplerGroup> open_sampler_group(Runtime& rt, const placement::DeviceGroup& group,
                                        const placement::DeviceMesh& mesh, SamplerSpec spec,
                                        RestartPolicy restart = {});

/// A client over an existing CAF group of sampler actors; calls without a
/// seed draw theirs from a stream seeded with `sampling_seed`.
SamplerGroup sampler_group_of(Runtime& rt, Group<sampler_actor> group, uint64_t sampling_seed = 0,
                              RestartPolicy restart = {});

}  // namespace glint::actors
