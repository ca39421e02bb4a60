#pragma once
/// The sampler actor: one rank of a sampler group, owning a
/// components::Engine (paged KV cache, continuous batching, prefix caching)
/// and answering generation calls with what an RL step trains on:
///
///   auto sampler = actors::spawn_sampler_group(rt, DeviceGroup::of("sampler", 2), mesh,
///                                              {.model_dir = "models/tiny"});
///   auto seqs = sampler->call<Collect::flatten>(Dispatch::slice_dp, actors::sample_atom_v,
///                                               actors::requests_of(prompts), params, std::string{}).get();
///   auto batch = actors::training_batch(prompts, *seqs, {.advantages = adv});  // input_ids, masks, old_logps, advantages
///
/// A seeded call (SamplingParams::seed >= 0) draws request i > 0 from a seed
/// mixed from the call's and i (SampleRequest::index), and request 0 from the
/// call's seed itself: the prompts of a call do not share random numbers, and
/// a request's completions depend on (seed, index) only, not on the rest of
/// the call or the rank that serves it.
///
/// A call answers num_samples sequences per request, request by request in
/// the order given; Collect::flatten joins the dp ranks' contiguous slices
/// in rank order, so the whole answer keeps the order of the whole call. The
/// SampleRequest::index given by the caller (requests_of numbers 0..N-1) is
/// echoed in every sequence and stream chunk: a rank cannot know where its
/// slice began.
///
/// Continuous batching spans calls: a call's requests join the engine, and
/// the actor steps the engine one step per message (it sends itself the
/// next step while work is left), so concurrent calls share steps, and
/// update_weights, stats or abort are served between two steps. A call is
/// answered when its last request finishes.
///
/// Errors: a request the engine refuses (empty prompt, an id outside the
/// vocabulary, too long, an unknown adapter, too big for the cache) gets its
/// num_samples sequences with `error` set, and the rest of the call is
/// sampled. The whole call fails only for what concerns all of it: invalid
/// SamplingParams, a sleeping sampler, a model that did not load. Handlers
/// never throw and always answer; an update that does not fit (names,
/// shapes) changes nothing.

#include "actors/model.hpp"
#include "components/sampler/params.hpp"
#include "placement/device_mesh.hpp"
#include "runtime/batch.hpp"
#include "runtime/group.hpp"
#include "runtime/registry.hpp"
#include "runtime/types.hpp"

#include <caf/replies_to.hpp>
#include <caf/typed_actor.hpp>
#include <caf/typed_event_based_actor.hpp>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace glint::components {

// The sampler's parameter and log-probability types cross actor boundaries as
// they are (no mirrored structs); these make them serialisable.
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, SamplingParams& x) {
  return f(caf::meta::type_name("glint.sampling_params"), x.num_samples, x.max_tokens, x.temperature, x.top_k, x.top_p,
           x.min_p, x.repetition_penalty, x.seed, x.stop_token_ids, x.stop, x.include_stop_str_in_output, x.ignore_eos,
           x.logprobs, x.prompt_logprobs, x.return_routes);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, TokenLogprobs& x) {
  return f(caf::meta::type_name("glint.token_logprobs"), x.chosen, x.k, x.top_ids, x.top_logprobs);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, ExpertRoutes& x) {
  return f(caf::meta::type_name("glint.expert_routes"), x.layers, x.k, x.experts);
}

}  // namespace glint::components

namespace glint::actors {

using components::SamplingParams;
using components::StopReason;
using components::TokenLogprobs;
using components::ExpertRoutes;

/// What a sampler rank loads and how its engine lays out its cache.
struct SamplerSpec {
  std::string model_dir{};    ///< a Hugging Face directory to load (with its tokenizer.json), or
  std::string config_json{};  ///< a config.json text for random weights
  uint64_t seed = 0;          ///< of the random weights (the same on every rank, as ModelSpec's)
  /// Draws of requests without a seed; rank r uses sampling_seed + r, so
  /// that ranks do not draw the same numbers.
  uint64_t sampling_seed = 0;
  int64_t cache_bytes = 256ll << 20;  ///< the KV cache's budget per rank
  int64_t max_num_seqs = 256;
  int64_t max_num_batched_tokens = 2048;
  int64_t max_model_len = 0;  ///< 0: the model's max_position_embeddings
  bool enable_prefix_caching = true;
  int64_t block_size = 16;
  friend bool operator==(const SamplerSpec&, const SamplerSpec&) = default;
};

/// One prompt of a sample call.
struct SampleRequest {
  int64_t index = 0;  ///< the caller's id for it, echoed in its sequences and chunks
  std::vector<int64_t> prompt;
  friend bool operator==(const SampleRequest&, const SampleRequest&) = default;
};

/// Requests for `prompts`, numbered 0..N-1.
std::vector<SampleRequest> requests_of(const std::vector<std::vector<int64_t>>& prompts);

/// One completion: its tokens and their log-probabilities, and why it
/// stopped. It does not repeat its prompt; training_batch joins the two.
struct SampledSequence {
  int64_t index = 0;   ///< SampleRequest::index
  int64_t sample = 0;  ///< which of the request's num_samples
  std::string error;   ///< why the request was refused; empty when it was sampled
  std::vector<int64_t> tokens;  ///< the completion
  /// Per completion token: `chosen` always (old_logps needs it), the top k
  /// when SamplingParams::logprobs > 0.
  TokenLogprobs logprobs;
  StopReason stop_reason = StopReason::none;  ///< length, stop or abort; none with an error
  int64_t stop_token = -1;  ///< the token that stopped it, or -1
  std::string stop_string;  ///< the stop string that matched, or empty
  std::string text;         ///< the decoded completion (empty without a tokenizer)
  /// The weight version of its last token; its tokens span
  /// [first_weight_version, weight_version], one version unless an update
  /// with policy continue_new landed while it ran.
  int64_t weight_version = 0;
  int64_t first_weight_version = 0;
  TokenLogprobs prompt_logprobs;  ///< for prompt tokens 1..P-1, when asked
  int64_t cached_tokens = 0;      ///< prompt tokens the prefix cache served
  /// Per completion token, the experts it was routed to (with
  /// SamplingParams::return_routes, on a model with experts).
  ExpertRoutes routes;
  friend bool operator==(const SampledSequence&, const SampledSequence&) = default;
};

/// What one sequence of a streamed call produced since its last chunk.
/// Every sequence ends with exactly one chunk that has `finished` set (a
/// refused request's sequences get just that one, with `error`).
struct SampleChunk {
  int64_t index = 0;
  int64_t sample = 0;
  std::vector<int64_t> tokens;  ///< new tokens
  std::vector<float> logprobs;  ///< their log-probabilities
  bool finished = false;
  StopReason stop_reason = StopReason::none;  ///< when finished: length, stop or abort
  std::string error;        ///< when the request was refused
  friend bool operator==(const SampleChunk&, const SampleChunk&) = default;
};

/// Where a streamed call sends its chunks.
using sample_listener = caf::typed_actor<caf::reacts_to<SampleChunk>>;

/// How training_batch builds a batch of sampled sequences.
struct TrainingBatchOptions {
  int64_t pad_id = 0;               ///< fills input_ids past a sequence's end
  std::vector<double> advantages{};  ///< one per sequence (GRPO, RLOO); empty: none in the batch
  /// Padding-free: the sequences end to end in rows as long as the longest
  /// one, told apart by segment_ids, at least `min_rows` rows (a model
  /// group's data-parallel size), with the advantages per token. The
  /// trainer's per-sequence losses read (row, segment) as the sequence, so
  /// the loss is the padded batch's.
  bool pack = false;
  int64_t min_rows = 1;
  /// Routing replay: put each sequence's routes (sampled with
  /// SamplingParams::return_routes) in the batch as `routes` [B, T, S, k],
  /// at the positions that predict its completion tokens, -1 elsewhere; the
  /// trainer then uses the sampler's experts there. A sequence without
  /// routes is an error.
  bool routing_replay = false;
  /// Multi-turn rollouts (agents.hpp): per sequence, per completion token, 1
  /// where the model sampled it and 0 where the environment's observation
  /// put it (kept in the context, left out of the loss). Empty: every
  /// completion token is learned; else one vector per sequence, as long as
  /// its tokens.
  std::vector<std::vector<float>> learned{};
};

/// The right-padded [B, T] (or, with options.pack, packed) training batch of `seqs` that the model's
/// forward_backward reads: each row is a sequence's prompt
/// (prompts[seq.index], as requests_of numbers them) and its completion;
/// input_ids, attention_mask, loss_mask (1 where the target is a completion
/// token), old_logps (the sampler's log-probabilities there) and advantages
/// [B] when given. Position t predicts token t + 1, so a completion of C
/// tokens after a prompt of P is trained at positions P-1 .. P+C-2. An
/// error for no sequences, one that carries an error or whose index has no
/// prompt, or advantages that are not one per sequence or not finite.
Result<Batch> training_batch(const std::vector<std::vector<int64_t>>& prompts, const std::vector<SampledSequence>& seqs,
                             const TrainingBatchOptions& options = {});

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, SamplerSpec& x) {
  return f(caf::meta::type_name("glint.sampler_spec"), x.model_dir, x.config_json, x.seed, x.sampling_seed,
           x.cache_bytes, x.max_num_seqs, x.max_num_batched_tokens, x.max_model_len, x.enable_prefix_caching,
           x.block_size);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, SampleRequest& x) {
  return f(caf::meta::type_name("glint.sample_request"), x.index, x.prompt);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, SampledSequence& x) {
  return f(caf::meta::type_name("glint.sampled_sequence"), x.index, x.sample, x.error, x.tokens, x.logprobs,
           x.stop_reason, x.stop_token, x.stop_string, x.text, x.weight_version, x.first_weight_version, x.prompt_logprobs,
           x.cached_tokens, x.routes);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, SampleChunk& x) {
  return f(caf::meta::type_name("glint.sample_chunk"), x.index, x.sample, x.tokens, x.logprobs, x.finished,
           x.stop_reason, x.error);
}

// CAF 0.17 atoms: at most 10 characters. add_adapter_atom,
// load_adapter_atom and remove_adapter_atom are the model's (actors/model.hpp).
using sample_atom = caf::atom_constant<caf::atom("sample")>;
using sample_stream_atom = caf::atom_constant<caf::atom("sample_str")>;
using update_weights_atom = caf::atom_constant<caf::atom("upd_weight")>;
using stage_weights_atom = caf::atom_constant<caf::atom("stg_weight")>;
using sync_recv_atom = caf::atom_constant<caf::atom("sync_recv")>;
using stream_recv_atom = caf::atom_constant<caf::atom("ws_recv")>;
using reset_prefix_cache_atom = caf::atom_constant<caf::atom("reset_pc")>;
using sleep_atom = caf::atom_constant<caf::atom("sleep")>;  // also the probe's (same type)
using wake_atom = caf::atom_constant<caf::atom("wake")>;
using abort_atom = caf::atom_constant<caf::atom("abort")>;
using stats_atom = caf::atom_constant<caf::atom("stats")>;
/// The sampler's message to itself: run one engine step (internal).
using engine_step_atom = caf::atom_constant<caf::atom("smp_step")>;

inline constexpr sample_atom sample_atom_v{};
inline constexpr sample_stream_atom sample_stream_atom_v{};

using sampler_actor = caf::typed_actor<
    /// num_samples sequences per request, in request order, with `adapter`
    /// ("" : the base model).
    caf::replies_to<sample_atom, std::vector<SampleRequest>, SamplingParams, std::string>::with<
        std::vector<SampledSequence>>,
    /// The same, sending a SampleChunk per sequence with new output to
    /// `listener` after every engine step.
    caf::replies_to<sample_stream_atom, std::vector<SampleRequest>, SamplingParams, std::string, sample_listener>::with<
        std::vector<SampledSequence>>,
    /// New weights (HF names, any subset; or an adapter's under PEFT's
    /// names), reported as `version` by the sequences sampled with them.
    /// policy finish_old: requests in flight finish on the old weights
    /// (later ones wait; updates queue up, in order); abort: they stop now,
    /// with stop_reason abort; continue_new: they go on with the new weights
    /// from the next step (first_weight_version records where they began).
    caf::replies_to<update_weights_atom, NamedTensors, WeightUpdate>::with<bool>,
    /// A bucket of the next update_weights: kept until it comes, then
    /// checked and applied with it as one version (the checkpoint engine
    /// sends big updates this way, so no message holds all the weights).
    /// Buckets are kept under their version: update_weights applies only
    /// those of its own version (what a failed sync left is dropped).
    caf::replies_to<stage_weights_atom, NamedTensors, int64_t>::with<bool>,
    /// Receives the tensors `manifest` lists as a member of the c10d
    /// weight-sync group at `address` (the model's sync_send is rank 0), in
    /// buckets of address.bucket_bytes, then applies them as
    /// update_weights(tensors, update) would. Blocks this
    /// rank until the transfer ends.
    caf::replies_to<sync_recv_atom, SyncManifest, WeightUpdate, SyncGroupAddress>::with<bool>,
    /// Receives the tensors `manifest` lists from model rank 0's stream
    /// listener at `address`, then applies them as update_weights(tensors,
    /// update) would. Blocks this rank until the transfer ends.
    caf::replies_to<stream_recv_atom, SyncManifest, WeightUpdate, StreamAddress>::with<bool>,
    /// A LoRA adapter (B zero: the base's output until its weights come).
    caf::replies_to<add_adapter_atom, std::string, LoraConfig>::with<bool>,
    /// Loads a PEFT adapter directory as adapter `name`.
    caf::replies_to<load_adapter_atom, std::string, std::string>::with<bool>,
    /// Refused while a request uses it.
    caf::replies_to<remove_adapter_atom, std::string>::with<bool>,
    caf::replies_to<reset_prefix_cache_atom>::with<bool>,
    /// Frees the KV cache (refused while requests are in flight); sample
    /// calls fail until wake.
    caf::replies_to<sleep_atom>::with<bool>, caf::replies_to<wake_atom>::with<bool>,
    /// Stops every request in flight (their sequences end with
    /// stop_reason abort; their calls are answered); answers how many.
    caf::replies_to<abort_atom>::with<int64_t>,
    /// The engine's counters: num_blocks, free_blocks, block_size, steps,
    /// prompt_tokens, cached_tokens, prefix_cache_hit_rate,
    /// generated_tokens, preemptions, recomputed_tokens, running, waiting,
    /// weight_version, update_pending, sleeping, calls (unanswered).
    caf::replies_to<stats_atom>::with<Metrics>,
    /// Internal: one engine step of the step loop with this id.
    caf::reacts_to<engine_step_atom, uint64_t>>;

inline constexpr const char* sampler_type = "glint.sampler";

sampler_actor::behavior_type sampler_rank(sampler_actor::pointer self, RankContext ctx, SamplerSpec spec);

/// Places and spawns a sampler group.
Result<Group<sampler_actor>> spawn_sampler_group(Runtime& rt, const placement::DeviceGroup& group,
                                                 const placement::DeviceMesh& mesh, SamplerSpec spec);

/// Samples `requests` on `sampler` (sliced over its dp ranks) as
/// sample_stream does, calling `on_chunk` for every chunk, on a listener
/// actor's thread, one at a time, in each sequence's order. Returns once the
/// call is answered and every sequence's last chunk has been handed to
/// `on_chunk`, which is not called after that. Blocks: call it from a
/// driver thread, not from an actor.
Result<std::vector<SampledSequence>> sample_streaming(Runtime& rt, const Group<sampler_actor>& sampler,
                                                      const std::vector<SampleRequest>& requests,
                                                      const SamplingParams& params, const std::string& adapter,
                                                      std::function<void(const SampleChunk&)> on_chunk);

GLINT_REGISTRATIONS(sampler);

}  // namespace glint::actors
