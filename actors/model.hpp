#pragma once
/// The model shard actor: one rank of a model group, holding a CausalLM,
/// its LoRA adapters and one trainer (optimizer, schedule) per adapter, and
/// answering the calls users know from Twinkle:
///
///   auto model = actors::spawn_model_group(rt, DeviceGroup::of("model", 2), mesh,
///                                          {.model_dir = "models/tiny"});
///   model->call<Collect::mean>(Dispatch::slice_dp, forward_backward_atom_v, batch, std::string{""});
///   // (the ranks' mean metrics, loss_weighted and loss_count included: ModelGroup makes them the batch's)
///   model->call<Collect::first>(Dispatch::all, clip_grad_and_step_atom_v, std::string{""});
///
/// Batches are glint::Batch with named tensors: input_ids (required),
/// attention_mask, segment_ids, position_ids, target_ids, loss_mask,
/// old_logps, ref_logps, advantages (see components/model/trainer.hpp). The
/// adapter argument names a LoRA adapter; "" is the full model.
///
/// Data parallelism: ranks of a group with dp_size > 1 join one c10d process
/// group (Gloo) at their first step, through the store address in their
/// ModelSpec, and average gradients there; give every rank its slice with
/// Dispatch::slice_dp and call clip_grad_and_step on all of them.
///
/// Handlers never throw and always answer: bad input (an id outside the
/// vocabulary, mismatched shapes, an unknown adapter, NaN advantages, a
/// missing or truncated weights file) is an error naming what and where, and
/// the next call is served.

#include "components/model/model.hpp"
#include "components/model/optim.hpp"
#include "components/model/trainer.hpp"
#include "components/sampler/params.hpp"
#include "placement/device_mesh.hpp"
#include "runtime/batch.hpp"
#include "runtime/group.hpp"
#include "runtime/dispatch.hpp"
#include "runtime/registry.hpp"
#include "runtime/tensor.hpp"
#include "runtime/types.hpp"

#include <caf/actor.hpp>
#include <caf/replies_to.hpp>
#include <caf/typed_actor.hpp>
#include <caf/typed_event_based_actor.hpp>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace glint::components {

// The trainer's own settings types cross actor boundaries as they are (no
// mirrored structs); these make them serialisable. Field order is a wire
// format: append, never reorder.
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, LossSpec& x) {
  return f(caf::meta::type_name("glint.loss_spec"), x.kind, x.epsilon, x.epsilon_high, x.beta, x.entropy_coef,
           x.max_tokens, x.label_smoothing, x.reduction, x.weight_cap, x.cap_mode);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, OptimizerConfig& x) {
  return f(caf::meta::type_name("glint.optimizer_config"), x.kind, x.lr, x.weight_decay, x.beta1, x.beta2, x.eps,
           x.momentum, x.max_grad_norm, x.keep_state);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, SchedulerConfig& x) {
  return f(caf::meta::type_name("glint.scheduler_config"), x.kind, x.warmup_steps, x.total_steps, x.min_lr_ratio);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, LoraConfig& x) {
  return f(caf::meta::type_name("glint.lora_config"), x.r, x.alpha, x.dropout, x.target_modules, x.rslora,
           x.target_regex, x.rank_pattern, x.alpha_pattern, x.layers_to_transform, x.layers_pattern,
           x.exclude_modules, x.exclude_regex, x.base_model_name_or_path, x.other_fields);
}

}  // namespace glint::components

namespace glint::actors {

using components::LoraConfig;
using components::LossKind;
using components::LossSpec;
using components::OptimizerConfig;
using components::SchedulerConfig;
using components::UpdatePolicy;

/// What a model rank loads and where its data-parallel group meets.
struct ModelSpec {
  std::string model_dir{};    ///< a Hugging Face directory to load, or
  std::string config_json{};  ///< a config.json text for random weights
  uint64_t seed = 0;        ///< of the random weights (the same on every rank)
  std::string store_host = "127.0.0.1";  ///< the dp group's TCPStore (hosted by dp rank 0);
  int32_t store_port = 0;                 ///< spawn_model_group fills both in
  friend bool operator==(const ModelSpec&, const ModelSpec&) = default;
};

/// One tensor of a weight sync, without its data.
struct TensorSpec {
  std::string name;
  std::vector<int64_t> shape;
  Dtype dtype = Dtype::f32;  ///< checked when read: the wire can carry any number
  friend bool operator==(const TensorSpec&, const TensorSpec&) = default;
};

/// What a weight sync over a collective carries, without the data: the
/// receivers allocate from it (CheckpointEngine, cluster transport).
struct SyncManifest {
  std::vector<TensorSpec> tensors;
  friend bool operator==(const SyncManifest&, const SyncManifest&) = default;
};

/// Which weights a sampler's update replaces, the version it makes, and what
/// happens to requests in flight.
struct WeightUpdate {
  std::string adapter{};  ///< empty: base weights (HF names); else this adapter's (PEFT names)
  int64_t version = 0;    ///< reported by every sequence sampled with the new weights
  UpdatePolicy policy = UpdatePolicy::finish_old;
  friend bool operator==(const WeightUpdate&, const WeightUpdate&) = default;
};

/// A model rank's push of its weights straight to sampler ranks (the
/// checkpoint engine's messages transport): the tensors go in buckets of
/// about bucket_bytes, each staged on every sampler, the last as
/// update_weights(update), so no message holds all the weights and none
/// passes through the driver.
struct WeightPush {
  std::string adapter{};         ///< what to export: "" the base weights, else this adapter
  bool merged = false;           ///< with an adapter: the base with it folded in
  WeightUpdate update{};         ///< what the samplers apply (adapter "" when merged)
  int64_t bucket_bytes = int64_t{256} << 20;
  std::vector<caf::actor> samplers{};  ///< the sampler ranks (glint.sampler actors)
  int64_t timeout_ms = 300000;   ///< per bucket and sampler
};

/// Where the members of a weight-sync collective meet: model rank 0 (rank 0
/// of the collective, hosting its store at host:port) and the sampler ranks.
/// Where a sampler rank fetches a streamed weight sync: model rank 0's
/// listener (SyncOptions::store_host, the port it answered).
struct StreamAddress {
  std::string host = "127.0.0.1";
  int32_t port = 0;
  int64_t timeout_ms = 300000;
  int32_t receiver = 0;  ///< which of the sync's receivers this rank is (0 .. sampler ranks - 1)
  friend bool operator==(const StreamAddress&, const StreamAddress&) = default;
};

struct SyncGroupAddress {
  std::string host = "127.0.0.1";
  int32_t port = 0;
  int32_t rank = 0;   ///< this member's rank in the collective
  int32_t world = 1;  ///< members: 1 + sampler ranks
  int64_t bucket_bytes = int64_t{256} << 20;
  friend bool operator==(const SyncGroupAddress&, const SyncGroupAddress&) = default;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, SyncManifest& x) {
  return f(caf::meta::type_name("glint.sync_manifest"), x.tensors);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, TensorSpec& x) {
  return f(caf::meta::type_name("glint.tensor_spec"), x.name, x.shape, x.dtype);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, WeightUpdate& x) {
  return f(caf::meta::type_name("glint.weight_update"), x.adapter, x.version, x.policy);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, WeightPush& x) {
  return f(caf::meta::type_name("glint.weight_push"), x.adapter, x.merged, x.update, x.bucket_bytes, x.samplers,
           x.timeout_ms);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, StreamAddress& x) {
  return f(caf::meta::type_name("glint.stream_address"), x.host, x.port, x.timeout_ms, x.receiver);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, SyncGroupAddress& x) {
  return f(caf::meta::type_name("glint.sync_group_address"), x.host, x.port, x.rank, x.world, x.bucket_bytes);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, ModelSpec& x) {
  return f(caf::meta::type_name("glint.model_spec"), x.model_dir, x.config_json, x.seed, x.store_host, x.store_port);
}

/// forward_backward's answer with the batch's target log-probs (f32 [B, T],
/// under the weights before the call's update): what Tinker's API answers.
struct TrainOutput {
  Metrics metrics;
  Tensor logps;
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, TrainOutput& x) {
  return f(caf::meta::type_name("glint.train_output"), x.metrics, x.logps);
}

using forward_backward_atom = caf::atom_constant<caf::atom("fwd_bwd")>;
using forward_backward_logps_atom = caf::atom_constant<caf::atom("fwd_bwd_lp")>;
using forward_only_atom = caf::atom_constant<caf::atom("fwd_only")>;
using clip_grad_and_step_atom = caf::atom_constant<caf::atom("step")>;
using set_loss_atom = caf::atom_constant<caf::atom("set_loss")>;
using set_optimizer_atom = caf::atom_constant<caf::atom("set_optim")>;
using set_lr_scheduler_atom = caf::atom_constant<caf::atom("set_sched")>;
using add_adapter_atom = caf::atom_constant<caf::atom("add_lora")>;
using remove_adapter_atom = caf::atom_constant<caf::atom("rm_lora")>;
using calculate_metric_atom = caf::atom_constant<caf::atom("metrics")>;
using get_train_configs_atom = caf::atom_constant<caf::atom("configs")>;
using save_atom = caf::atom_constant<caf::atom("save")>;
using load_atom = caf::atom_constant<caf::atom("load")>;
/// Also the sampler's (actors/sampler.hpp): the same message, the same meaning.
using load_adapter_atom = caf::atom_constant<caf::atom("load_lora")>;
using export_weights_atom = caf::atom_constant<caf::atom("export")>;
using sync_manifest_atom = caf::atom_constant<caf::atom("sync_man")>;
using sync_send_atom = caf::atom_constant<caf::atom("sync_send")>;
using push_weights_atom = caf::atom_constant<caf::atom("push_wts")>;
using stream_listen_atom = caf::atom_constant<caf::atom("ws_listen")>;
using stream_send_atom = caf::atom_constant<caf::atom("ws_send")>;

inline constexpr forward_backward_atom forward_backward_atom_v{};
inline constexpr forward_backward_logps_atom forward_backward_logps_atom_v{};
inline constexpr forward_only_atom forward_only_atom_v{};
inline constexpr clip_grad_and_step_atom clip_grad_and_step_atom_v{};

using model_actor = caf::typed_actor<
    /// Adds the gradients of a batch for `adapter`; answers its metrics (loss, tokens, ...).
    caf::replies_to<forward_backward_atom, Batch, std::string>::with<Metrics>,
    /// The same, answering the batch's target log-probs besides.
    caf::replies_to<forward_backward_logps_atom, Batch, std::string>::with<TrainOutput>,
    /// Log-probabilities of the batch's targets (f32 [B, T]), no gradients.
    caf::replies_to<forward_only_atom, Batch, std::string>::with<Tensor>,
    /// Clips, steps the optimizer of `adapter`, clears its gradients; answers grad_norm, lr, step.
    caf::replies_to<clip_grad_and_step_atom, std::string>::with<Metrics>,
    /// The loss `adapter` trains with from now on.
    caf::replies_to<set_loss_atom, std::string, LossSpec>::with<bool>,
    /// A new optimizer for `adapter` (OptimizerConfig::keep_state: new settings, the same state).
    caf::replies_to<set_optimizer_atom, std::string, OptimizerConfig>::with<bool>,
    caf::replies_to<set_lr_scheduler_atom, std::string, SchedulerConfig>::with<bool>,
    /// A LoRA adapter `name`; A drawn from `seed` (the same on every rank), B zero.
    caf::replies_to<add_adapter_atom, std::string, LoraConfig, uint64_t>::with<bool>,
    caf::replies_to<remove_adapter_atom, std::string>::with<bool>,
    /// The mean of each metric over the forward_backward calls since the last
    /// calculate_metric for `adapter`, and clears them.
    caf::replies_to<calculate_metric_atom, std::string>::with<Metrics>,
    /// A JSON text: the model config, adapters, loss, optimizer and schedule of `adapter`.
    caf::replies_to<get_train_configs_atom, std::string>::with<std::string>,
    /// Saves into directory `dir`: the full model (HF layout, sharded above
    /// `max_shard_bytes`) for "", else the adapter (PEFT layout); with the
    /// optimizer state (optimizer.safetensors) when `with_optimizer`.
    /// Answers the directory.
    caf::replies_to<save_atom, std::string, std::string, bool, int64_t>::with<std::string>,
    /// Loads `dir` into adapter `adapter` ("" : the full weights), and the
    /// optimizer state too when `with_optimizer` (else it starts afresh).
    /// The loss, optimizer and schedule settings of `adapter` stay; loading
    /// full weights drops every adapter.
    caf::replies_to<load_atom, std::string, std::string, bool>::with<bool>,
    /// A new adapter `name` from the PEFT adapter directory `dir`: its
    /// adapter_config.json and adapter_model.safetensors, checked as a model
    /// load is (CausalLM::load_adapter). Error: the name is taken, or the
    /// directory does not fit (the model is then unchanged).
    caf::replies_to<load_adapter_atom, std::string, std::string>::with<bool>,
    /// The weights to sync to samplers: every base weight for "", else the
    /// adapter's tensors under PEFT's names.
    caf::replies_to<export_weights_atom, std::string>::with<NamedTensors>,
    /// The names, shapes and dtypes the weight sync of (adapter, merged)
    /// sends: as export_weights, or with `merged` every base weight with
    /// `adapter` folded in (the model is not changed).
    caf::replies_to<sync_manifest_atom, std::string, bool>::with<SyncManifest>,
    /// Broadcasts the weights of (adapter, merged), sharing the live ones, as rank 0 of the c10d
    /// group at `address`, whose store it hosts (made at the first call, kept
    /// for the next), in buckets of address.bucket_bytes. Answers the
    /// buckets. Blocks this rank until the receivers join.
    caf::replies_to<sync_send_atom, std::string, bool, SyncGroupAddress>::with<int64_t>,
    /// Sends its weights to the sampler ranks of `push` itself (see
    /// WeightPush), serving nothing else until they all answered the last
    /// bucket (in local mode the buckets share the live weights). Answers
    /// tensors, buckets and bytes (per sampler); the first refusal fails it.
    caf::replies_to<push_weights_atom, WeightPush>::with<Metrics>,
    /// The stream transport, step 1: listens on a free TCP port of address
    /// `host` (this node's, as the job knows it) for `receivers` sampler
    /// ranks; answers the port.
    caf::replies_to<stream_listen_atom, int32_t, std::string>::with<int32_t>,
    /// Step 2: accepts the receivers and sends each the raw bytes of the
    /// weights of (adapter, merged), sharing the live ones, in
    /// sync_manifest order (actors/weight_sync/stream.hpp). Answers the
    /// bytes per receiver. Blocks this rank until all have them or
    /// `timeout_ms` passes.
    caf::replies_to<stream_send_atom, std::string, bool, int64_t>::with<int64_t>>;

inline constexpr const char* model_type = "glint.model";

model_actor::behavior_type model_shard(model_actor::pointer self, RankContext ctx, ModelSpec spec);

/// Whether a rank's mesh cuts the model over the group's ranks (fsdp, tp or
/// pp above 1): then saves, exports and weight syncs of the base weights
/// are collectives that every rank of the group takes part in.
bool model_parallel(const RankContext& ctx);

/// Whether a model group can run `mesh`: dp, with one of fsdp, tp and pp
/// (the trainer cuts the model one way at a time); `who` names it in the error.
Result<void> check_model_mesh(const placement::DeviceMesh& mesh, const std::string& who);

/// The address the other processes of the job reach node `node` by
/// (loopback in local mode).
std::string address_of_node(Runtime& rt, int node);

/// Places and spawns a model group. Its ranks get the address of their
/// process groups' store: a free port on the machine of the node that hosts
/// rank 0 (spec.store_host/store_port, when not given). The mesh may have
/// dp, and one of fsdp, tp and pp (the model cut over those ranks at the
/// first training call: docs/parallelism.md); other sizes are refused.
Result<Group<model_actor>> spawn_model_group(Runtime& rt, const placement::DeviceGroup& group,
                                             const placement::DeviceMesh& mesh, ModelSpec spec);

GLINT_REGISTRATIONS(model);

}  // namespace glint::actors
