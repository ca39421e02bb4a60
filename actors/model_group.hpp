#pragma once
/// `ModelGroup`: a driver's typed client of a model group, Twinkle's
/// TransformersModel in C++. Each method owns its calling convention (how
/// the call is spread over the ranks and how their answers combine), so a
/// driver never names an atom, a dispatch or a collect mode:
///
///   auto model = actors::open_model_group(rt, DeviceGroup::of("model", 2), mesh, {.model_dir = dir});
///   model->add_adapter("default", {.r = 8}, /*seed=*/1).get();
///   auto policy = model->with_adapter("default");       // the calls below train the adapter
///   policy.set_optimizer({.lr = 1e-4}).get();
///   auto m = policy.forward_backward(batch).take();     // sliced by dp rank; the whole batch's metrics
///   auto s = policy.clip_grad_and_step().take();         // every rank steps; grad_norm, lr, step
///
/// Transport boundary: a ModelGroup is a cheap, copyable handle on a
/// ModelBackend. In local and cluster mode the backend is the CAF group of
/// model actors (actors/model.hpp); in remote mode a backend over the
/// server's RPC (rpc/client.hpp) implements the same contract (below), so
/// driver code does not change between modes. `open_model_group` is the one
/// way to get a client: it spawns the group in local and cluster mode, and
/// attaches to a server's shared base model in remote mode.
///
/// Every method returns at once with a Future; a call fails as a whole (an
/// error that names the rank) when any rank it addressed fails, times out
/// or dies. Thread-safe as the backend is (the CAF backend is).

#include "actors/model.hpp"
#include "runtime/future.hpp"
#include "runtime/group.hpp"

#include <memory>
#include <string>

namespace glint::actors {

/// Where a save writes, and whether the optimizer state goes with it.
struct SaveRequest {
  std::string dir;              ///< a new directory (HF layout for the full model, PEFT for an adapter)
  /// Also the optimizer state: optimizer.safetensors (moments and step), or
  /// one file per part of the cut for a model cut over its ranks
  /// (optimizer-fsdp1-of-2.safetensors: docs/parallelism.md).
  bool with_optimizer = false;
  /// The full model's weights go in shards of at most this many bytes
  /// (transformers' max_shard_size; a bigger tensor gets a shard alone).
  int64_t max_shard_bytes = components::default_max_shard_bytes;
};

/// What a load reads: a directory written by save (or any HF / PEFT one).
struct LoadRequest {
  std::string dir;
  bool with_optimizer = false;  ///< restore the optimizer state too (else it starts afresh)
};

/// The contract of a model group, whatever carries its calls. `adapter`
/// names the LoRA adapter a call trains or reads; empty: the full model.
/// Each implementation keeps the calling convention documented on
/// ModelGroup's methods, answers every call (a value or an error with
/// context), and never throws.
class ModelBackend {
public:
  virtual ~ModelBackend() = default;
  virtual const GroupInfo& info() const = 0;
  virtual Future<Metrics> forward_backward(const Batch& batch, const std::string& adapter) = 0;
  virtual Future<TrainOutput> forward_backward_with_logps(const Batch& batch, const std::string& adapter) = 0;
  virtual Future<Tensor> forward_only(const Batch& batch, const std::string& adapter) = 0;
  virtual Future<Metrics> clip_grad_and_step(const std::string& adapter) = 0;
  virtual Future<void> set_loss(const std::string& adapter, const LossSpec& loss) = 0;
  virtual Future<void> set_optimizer(const std::string& adapter, const OptimizerConfig& optimizer) = 0;
  virtual Future<void> set_lr_scheduler(const std::string& adapter, const SchedulerConfig& scheduler) = 0;
  virtual Future<void> add_adapter(const std::string& adapter, const LoraConfig& lora, uint64_t seed) = 0;
  virtual Future<void> remove_adapter(const std::string& adapter) = 0;
  virtual Future<void> load_adapter(const std::string& adapter, const std::string& dir) = 0;
  virtual Future<Metrics> calculate_metric(const std::string& adapter) = 0;
  virtual Future<std::string> train_configs(const std::string& adapter) = 0;
  virtual Future<std::string> save(const std::string& adapter, const SaveRequest& request) = 0;
  virtual Future<void> load(const std::string& adapter, const LoadRequest& request) = 0;
  virtual Future<NamedTensors> export_weights(const std::string& adapter) = 0;
  /// The CAF group behind a local or cluster backend (the weight-sync
  /// engine moves bytes between its ranks and the samplers'); null where
  /// there is none (remote).
  virtual const Group<model_actor>* actor_group() const { return nullptr; }
};

class ModelGroup {
public:
  explicit ModelGroup(std::shared_ptr<ModelBackend> backend, std::string adapter = {})
      : backend_(std::move(backend)), adapter_(std::move(adapter)) {}

  /// The same group, with every call below training or reading LoRA adapter
  /// `name` (made with add_adapter) instead of the full model.
  ModelGroup with_adapter(std::string name) const { return ModelGroup{backend_, std::move(name)}; }
  /// The full model: the group without an adapter.
  ModelGroup base() const { return ModelGroup{backend_}; }
  /// The adapter this handle trains; empty for the full model.
  const std::string& adapter() const { return adapter_; }

  /// Adds the gradients of `batch` (named tensors: input_ids, and any of
  /// attention_mask, position_ids, target_ids, loss_mask, old_logps,
  /// ref_logps, advantages; components/model/trainer.hpp). Sliced by
  /// data-parallel rank, rows in order; answers the whole batch's metrics:
  /// loss (each rank's mean weighed by its loss_count), tokens, sequences
  /// and loss_count (summed), and the loss's own (the ranks' means; a
  /// pairwise loss's reward_* weighed by its pairs, as the loss).
  Future<Metrics> forward_backward(const Batch& batch) const { return backend_->forward_backward(batch, adapter_); }
  /// forward_backward, answering also the batch's target log-probs (f32
  /// [B, T], rows in order, 0 where a position has no target) under the
  /// weights before this call: Tinker's forward_backward in one pass.
  Future<TrainOutput> forward_backward_with_logps(const Batch& batch) const {
    return backend_->forward_backward_with_logps(batch, adapter_);
  }
  /// Log-probabilities of the batch's targets, f32 [B, T], no gradients.
  /// Sliced by data-parallel rank; the rows come back in order.
  Future<Tensor> forward_only(const Batch& batch) const { return backend_->forward_only(batch, adapter_); }
  /// On every rank: clips the accumulated gradients (global norm), steps the
  /// optimizer and clears them. Answers rank 0's grad_norm, lr and step
  /// (the ranks of a data-parallel group take the same step).
  Future<Metrics> clip_grad_and_step() const { return backend_->clip_grad_and_step(adapter_); }
  /// On every rank: the loss this handle's adapter trains with from now on.
  Future<void> set_loss(const LossSpec& loss) const { return backend_->set_loss(adapter_, loss); }
  /// On every rank: a new optimizer (its state starts afresh), or with
  /// OptimizerConfig::keep_state new hyperparameters for the one there is.
  Future<void> set_optimizer(const OptimizerConfig& optimizer) const {
    return backend_->set_optimizer(adapter_, optimizer);
  }
  /// On every rank: the learning-rate schedule.
  Future<void> set_lr_scheduler(const SchedulerConfig& scheduler) const {
    return backend_->set_lr_scheduler(adapter_, scheduler);
  }
  /// On every rank: a new LoRA adapter `name` on the base model (then use
  /// with_adapter(name)), A drawn from `seed` (the same on every rank), B
  /// zero. Error: the name is taken, or an invalid config.
  Future<void> add_adapter(const std::string& name, const LoraConfig& lora, uint64_t seed = 0) const {
    return backend_->add_adapter(name, lora, seed);
  }
  /// On every rank: a new LoRA adapter `name` read from a PEFT adapter
  /// directory (adapter_config.json + adapter_model.safetensors, as
  /// save or PEFT's save_pretrained write it); then use with_adapter(name).
  /// Checked as a model load is: a missing file, a tensor of the wrong
  /// shape, or a config field glint does not implement is an error naming
  /// the file and what is wrong, and the rank's model is left unchanged
  /// (a directory that only some ranks can read leaves the adapter on the
  /// others: remove_adapter clears it). Error too: the name is taken.
  Future<void> load_adapter(const std::string& name, const std::string& dir) const {
    return backend_->load_adapter(name, dir);
  }
  /// On every rank: drops adapter `name`, its optimizer and its loss.
  Future<void> remove_adapter(const std::string& name) const { return backend_->remove_adapter(name); }
  /// The mean of each metric over the forward_backward calls since the
  /// last calculate_metric (rank 0's), and clears them.
  Future<Metrics> calculate_metric() const { return backend_->calculate_metric(adapter_); }
  /// A JSON text: the model config, adapters, loss, optimizer and schedule.
  Future<std::string> train_configs() const { return backend_->train_configs(adapter_); }
  /// Rank 0 saves the full model (HF layout) or the adapter (PEFT layout);
  /// answers the directory.
  Future<std::string> save(const SaveRequest& request) const { return backend_->save(adapter_, request); }
  /// Every rank loads the directory into the full model or the adapter. The
  /// loss, optimizer and schedule settings stay; loading full weights drops
  /// every adapter.
  Future<void> load(const LoadRequest& request) const { return backend_->load(adapter_, request); }
  /// Rank 0's weights: every base weight (full model), or the adapter's
  /// tensors under PEFT's names. For sampling, use the weight-sync engine.
  Future<NamedTensors> export_weights() const { return backend_->export_weights(adapter_); }

  /// Where the ranks live.
  const GroupInfo& info() const { return backend_->info(); }
  ModelBackend& backend() const { return *backend_; }

private:
  std::shared_ptr<ModelBackend> backend_;
  std::string adapter_;
};

/// The one way to get a ModelGroup. Local and cluster mode: places and
/// spawns a model group of `group`'s ranks on `mesh` (data-parallel ranks
/// average gradients over Gloo), each loading `spec`. Remote mode: attaches
/// to the server's base model (docs/remote.md: `spec.model_dir` must name
/// it, and `group` and `mesh` are the server's business).
Result<ModelGroup> open_model_group(Runtime& rt, const placement::DeviceGroup& group,
                                    const placement::DeviceMesh& mesh, ModelSpec spec);

/// A client over an existing CAF group of model actors (tests, benchmarks,
/// and upper layers that spawn their own).
ModelGroup model_group_of(Group<model_actor> group);

}  // namespace glint::actors
