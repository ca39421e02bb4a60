#pragma once
/// What one model rank is, without the actor: a CausalLM, its adapters, one
/// trainer per adapter ("tenant"), the data-parallel group, and every call
/// the model actor answers as a plain method. The actor (actors/model.cpp)
/// only unpacks messages and answers these methods' results, so tests call
/// them directly (tests/actors/model_state_test.cpp).
///
/// Every method returns an error for bad input and leaves the state as it
/// was; none throws on purpose (the actor turns what LibTorch throws into
/// an error with error_of_exception).

#include "actors/model.hpp"
#include "components/model/trainer.hpp"

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace glint::components {
class ProcessGroup;
class StoreHost;
}

namespace glint::actors {

class ModelState {
public:
  /// Loads the model `spec` names (its error is kept and answered by every
  /// call until a full-weights load succeeds).
  ModelState(RankContext ctx, ModelSpec spec);
  ~ModelState();
  ModelState(ModelState&&) noexcept;
  ModelState& operator=(ModelState&&) noexcept;

  /// "rank R of model group 'G'": what errors are prefixed with.
  std::string where() const;
  caf::error fail(const caf::error& e) const { return with_context(e, where()); }

  /// The model; the load error when there is none.
  Result<components::CausalLM*> ready();

  /// `logps`: when not null, set to the batch's target log-probs.
  Result<Metrics> forward_backward(const Batch& batch, const std::string& adapter, Tensor* logps = nullptr);
  /// Log-probabilities of the batch's targets, no gradients.
  Result<Tensor> forward_only(const Batch& batch, const std::string& adapter);
  Result<Metrics> clip_grad_and_step(const std::string& adapter);

  Result<void> set_loss(const std::string& adapter, const LossSpec& s);
  Result<void> set_optimizer(const std::string& adapter, const OptimizerConfig& s);
  Result<void> set_lr_scheduler(const std::string& adapter, const SchedulerConfig& s);
  Result<void> add_adapter(const std::string& name, const LoraConfig& c, uint64_t seed);
  Result<void> remove_adapter(const std::string& name);

  /// The mean of each metric since the last call (and step, lr); clears them.
  Result<Metrics> calculate_metric(const std::string& adapter);
  /// A JSON text of the model config, adapters and `adapter`'s settings.
  Result<std::string> train_configs(const std::string& adapter);

  /// Saves `adapter` ("" : the full model, sharded above max_shard_bytes)
  /// into `dir`; answers `dir`.
  Result<std::string> save(const std::string& adapter, const std::string& dir, bool with_optimizer,
                           int64_t max_shard_bytes = components::default_max_shard_bytes);
  /// Loads `dir` into `adapter` ("" : new full weights, which drop every
  /// adapter). Reads everything before it changes anything.
  Result<void> load(const std::string& adapter, const std::string& dir, bool with_optimizer);
  /// A new adapter `name` read from the PEFT directory `dir`; refused when
  /// the name is taken. On error nothing changes.
  Result<void> load_adapter(const std::string& name, const std::string& dir);

  /// The weights to sync or save: the base ("") under HF names, an
  /// adapter's under PEFT's, or with `merged` the base with the adapter
  /// folded in. `snapshot`: copies, so training may go on; else they share
  /// the live tensors.
  Result<NamedTensors> export_weights(const std::string& adapter, bool merged, bool snapshot);
  /// Names, shapes and dtypes of export_weights(adapter, merged).
  Result<SyncManifest> sync_manifest(const std::string& adapter, bool merged);
  /// Broadcasts export_weights(adapter, merged) as rank 0 of the c10d
  /// weight-sync group at `at`; answers the buckets sent.
  Result<int64_t> sync_send(const std::string& adapter, bool merged, const SyncGroupAddress& at);
  /// The messages transport: `push`'s samplers get export_weights(adapter,
  /// merged) in buckets from rank 0. On a model cut over its ranks every
  /// rank takes part (the buckets gathered one piece at a time); on a
  /// data-parallel group only rank 0 does anything.
  Result<Metrics> push_weights(caf::actor_system& sys, const WeightPush& push);
  /// The stream transport: a listener for `receivers` sampler ranks (its port) ...
  Result<int32_t> stream_listen(int32_t receivers, const std::string& host);
  /// ... then export_weights(adapter, merged) down a socket to each; bytes per receiver.
  Result<int64_t> stream_send(const std::string& adapter, bool merged, int64_t timeout_ms);

private:
  /// One adapter's (or the full model's, "") training state.
  struct Tenant {
    LossSpec loss;
    OptimizerConfig optimizer;
    SchedulerConfig scheduler;
    std::optional<components::Trainer> trainer;  ///< made at the first forward_backward
    std::map<std::string, std::pair<double, int64_t>> metric_sums;
  };
  Result<Tenant*> tenant(const std::string& adapter);
  Result<components::Trainer*> trainer(const std::string& adapter);
  /// The process groups of the trainers (null where a dimension is 1).
  struct Groups {
    std::shared_ptr<components::ProcessGroup> dp, fsdp, ep, tp, pp;
  };
  Result<const Groups*> groups();
  /// Whether the mesh cuts the model over the ranks (fsdp, ep, tp or pp above 1).
  bool model_parallel() const;
  /// The trainer that cut the model over the ranks, once one did; else null.
  components::Trainer* cutter();
  /// cutter() where the weights of (adapter, merged) are the cut base's,
  /// gathered a piece at a time (the base, or an adapter merged into it);
  /// else null (a whole model, or an adapter whole on every rank).
  components::Trainer* gatherer(const std::string& adapter, bool merged);
  /// An error for what a model cut over its ranks cannot do (`what`).
  caf::error refused_when_cut(const std::string& what) const;
  /// Whether this rank answers for the group where only one does (rank 0).
  bool first() const { return ctx_.rank == 0; }
  /// The optimizer state's file in a saved directory: one per rank when
  /// the model is cut over them (its shards), else one.
  std::string optimizer_file() const;
  void load_initial();

  RankContext ctx_;
  ModelSpec spec_;
  std::unique_ptr<components::StoreHost> store_host_;  ///< rank 0 of a model-parallel group (outlives its groups)
  std::optional<components::CausalLM> model_;
  caf::error load_error_;  ///< why there is no model
  std::map<std::string, Tenant> tenants_;
  placement::DeviceMesh mesh_;
  caf::error mesh_error_;  ///< a RankContext::mesh the model cannot run: every call answers it
  std::optional<Groups> groups_;
  /// Model parallel: the tenant whose trainer cut the model, once one did.
  std::optional<std::string> cut_for_;
  struct Sync;
  std::unique_ptr<Sync> sync_;  ///< the c10d weight-sync group, made at the first sync_send
};

}  // namespace glint::actors
