#pragma once
/// `Trainer`: full-parameter training of a CausalLM: forward_backward with a
/// chosen loss, gradient accumulation, clip_grad_and_step with an optimizer
/// and a learning-rate schedule (the loop users know from Twinkle).
///
///   auto tr = Trainer::create(std::move(*lm), {.optimizer = {.lr = 1e-3}});
///   for (auto& micro : batches) tr->forward_backward(micro, {.kind = LossKind::cross_entropy});
///   auto m = tr->clip_grad_and_step();   // {"grad_norm", "lr", "step", ...}
///
/// Normalisation: each forward_backward adds the gradient of the loss's *sum*
/// (over tokens, or over sequences for sequence-mean losses) and counts what
/// it summed; clip_grad_and_step divides by the total count of all
/// micro-batches since the last step. So four micro-batches of 2 give the
/// same update as one batch of 8, whatever their token counts (and, with
/// data parallelism, across ranks once counts and gradients are all-reduced).
/// DR-GRPO normalises by a constant: set LossSpec::max_tokens, or each
/// micro-batch uses its own length.
///
/// Micro-batching: a batch too large for the memory available is run in
/// slices of rows, each a forward and backward pass, whose gradients add up
/// to the whole batch's (the sums above make the split exact, up to float
/// rounding); its metrics are the whole batch's. The slices are sized from
/// model_detail::training_bytes_per_row and the memory available at the
/// call (runtime/memory.hpp), or capped by TrainConfig::micro_batch_rows. A
/// batch whose single row does not fit is refused (resource_exhausted) with
/// the estimate, before anything is allocated.
///
/// Bad input (shapes, ids, NaN advantages) is an error and leaves the
/// accumulated gradients as they were, also when a later slice fails.

#include "components/comm/process_group.hpp"
#include "components/model/model.hpp"
#include "components/model/optim.hpp"
#include "runtime/types.hpp"

#include <functional>
#include <map>
#include <memory>
#include <string>

namespace glint::components {

/// dpo and ipo are pairwise (preference) losses: see TrainBatch.
/// importance_sampling, ppo and dro (and cross_entropy and cispo with
/// reduction sum) are the token-level losses as Tinker defines them
/// (components/rl/losses.hpp, token_loss).
enum class LossKind : uint8_t {
  cross_entropy,
  grpo,
  gspo,
  dr_grpo,
  cispo,
  dpo,
  ipo,
  importance_sampling,
  ppo,
  dro,
  /// AReaL's decoupled PPO for samples from older weights (asynchronous
  /// RL): old_logps are the behaviour policy's (the sampler's), the
  /// proximal policy is the weights at the start of this step.
  decoupled_ppo,
};
Result<LossKind> parse_loss_kind(std::string_view name);
std::string_view to_string(LossKind k);
/// True for the losses over pairs of rows (dpo, ipo): a batch of them has
/// an even number of rows, and slicing it keeps each pair whole.
bool is_pairwise(LossKind k);

/// How a loss reduces its per-token terms. mean: glint's normalisation
/// (per token, per sequence or per pair, by kind; clip_grad_and_step
/// divides by the count of the whole step). sum: Tinker's, the plain sum
/// over every counted token of the step, never divided (cross_entropy,
/// importance_sampling, ppo, cispo, dro only). One step accumulates one or
/// the other, never both.
enum class LossReduction : uint8_t { mean, sum };

struct LossSpec {
  LossKind kind = LossKind::cross_entropy;
  LossReduction reduction = LossReduction::mean;
  double epsilon = 0.2;       ///< lower clip (ratio >= 1 - epsilon); cispo reads it with reduction sum only
  double epsilon_high = 0.2;  ///< upper clip (ratio <= 1 + epsilon_high)
  /// Policy losses: the KL-to-reference coefficient (k3 estimator), needs
  /// ref_logps. dpo and ipo: their beta (> 0 required; 0.1 is usual). dro:
  /// its quadratic penalty's coefficient (>= 0).
  double beta = 0.0;
  double entropy_coef = 0.0;  ///< entropy bonus
  int64_t max_tokens = 0;     ///< DR-GRPO's constant normaliser (0: the batch's sequence length)
  double label_smoothing = 0.0;  ///< dpo only: conservative DPO's label noise, in [0, 0.5]
  /// decoupled_ppo only: the cap (> 1) of the behaviour importance weight
  /// pi_prox / pi_behav (AReaL's 5; veRL's truncated IS uses 2), and what a
  /// token above it gets: mask (it counts nothing, AReaL) or clamp (its
  /// weight is the cap, veRL).
  double weight_cap = 5.0;
  enum class CapMode : uint8_t { mask, clamp } cap_mode = CapMode::mask;

  /// A known kind (one read from another process can hold any number),
  /// clip bounds >= 0, beta and entropy_coef finite, max_tokens >= 0; a
  /// field the kind does not read left at its default.
  Result<void> validate() const;
};

/// dpo and ipo read rows in pairs: row 2i is pair i's chosen response, row
/// 2i + 1 its rejected one (each with its prompt); loss_mask marks the
/// response tokens, whose log-probs are summed per row (ipo: averaged, as
/// TRL does), and ref_logps holds
/// the reference model's per-token log-probs of the same rows (what
/// forward_only answers). Each row needs a counted token; old_logps and
/// advantages are refused. The loss is a mean over pairs.
struct TrainBatch {
  TokenBatch tokens;
  /// Optional [B, T] 0/1: which positions' targets the loss counts (e.g. the
  /// completion). Default: every position with a target.
  Tensor loss_mask{};
  Tensor old_logps{};   ///< [B, T] f32, for policy losses (default: the current ones, ratio 1)
  Tensor ref_logps{};   ///< [B, T] f32, when beta > 0
  Tensor advantages{};  ///< [B] or [B, T] f32, for policy losses
  /// [B, T] f32 per-token weights of cross_entropy with reduction sum (any
  /// sign: Tinker's forward_backward_custom sends -dC/dlogp); the positions
  /// loss_mask and the targets leave out count nothing.
  Tensor loss_weights{};
  /// Routing replay (a model with experts): integer [B, T, S, k], at each
  /// position the k experts of each of the S sparse layers (in order) that
  /// the sampler chose there (SamplingParams::return_routes;
  /// actors::training_batch places them), used instead of the router's
  /// own top k; every entry -1 at a position that routes itself (the
  /// prompt's). The router's probabilities still weight them and get the
  /// gradients. Undefined: every position routes itself.
  Tensor routes{};
};

struct TrainConfig {
  OptimizerConfig optimizer{};  ///< with max_grad_norm, the clipping bound
  SchedulerConfig scheduler{};
  /// Train only this LoRA adapter of the model (its A and B), the base
  /// frozen; empty: every base parameter. Several trainers, one per adapter,
  /// may share one model (one per tenant).
  std::string adapter{};
  /// Data-parallel ranks to average with: clip_grad_and_step sums gradients
  /// and counts over the group before it divides, so dp ranks with the
  /// same weights take the same step (null or size 1: alone).
  std::shared_ptr<ProcessGroup> dp_group{};
  /// Fully sharded data parallelism (FSDP, ZeRO-3) over this group (null or
  /// size 1: none): the base parameters, their gradients and optimizer
  /// state are sharded over its ranks, one flat shard per decoder layer
  /// (components/parallel/fsdp.hpp), each layer gathered for its forward
  /// and again for its backward. Its ranks are data-parallel too (each has
  /// its own batch); with dp_group as well (HSDP), the shards are
  /// replicated across dp_group and their gradients all-reduced there.
  /// Every rank of the group calls forward_backward and clip_grad_and_step
  /// the same number of times: each call is collective (a rank with fewer
  /// micro-batches, or a bad batch, joins the others' passes with none).
  /// With an adapter, the base is sharded and frozen and the adapter is
  /// trained data-parallel over both groups.
  std::shared_ptr<ProcessGroup> fsdp_group{};
  /// Tensor parallelism over this group (null or size 1: none): the model
  /// is cut into shards in place (tp::shard_model: heads, MLP features and
  /// the vocabulary split; components/parallel/tensor_parallel.hpp). Its
  /// ranks take the same batch, each call on every rank; the gradient norm
  /// is the whole model's. Not with an adapter or fsdp_group yet.
  std::shared_ptr<ProcessGroup> tp_group{};
  /// Pipeline parallelism over this group (null or size 1: none): the model
  /// is cut in place to this rank's stage (pp::shard_model: an even split
  /// of the decoder layers, the embeddings on the first stage, the final
  /// norm and the LM head on the last), and each forward_backward runs the
  /// 1F1B schedule over micro-batches of the call's batch
  /// (components/parallel/pipeline.hpp), activations and their gradients
  /// sent between neighbouring stages. The micro-batches are
  /// micro_batch_rows rows each (0: the batch cut in 2 x stages, as the
  /// memory allows). Its ranks take the same batch, each call on every
  /// rank; the last stage's loss, metrics and log-probs are every rank's
  /// answer, and the gradient norm is the whole model's. With dp_group as
  /// well, each stage's gradients are averaged over its dp replicas. Not
  /// with an adapter, fsdp_group or tp_group yet.
  std::shared_ptr<ProcessGroup> pp_group{};
  /// Expert parallelism over this group (null or size 1: none), for a model
  /// with experts: each rank keeps num_experts / size of every sparse
  /// layer's experts (ep::shard_model, components/parallel/
  /// expert_parallel.hpp) and a whole copy of the rest. Its ranks are
  /// data-parallel (each its own batch): tokens travel to their experts'
  /// ranks and back by all-to-all in every sparse layer, so every pass is
  /// collective, and the ranks run the same number of passes per call, as
  /// under FSDP (one with fewer joins the others' with none). The step sums
  /// the replicated parameters' gradients over the group (the experts' hold
  /// every rank's tokens already) and the counts; with dp_group as well,
  /// everything is summed over dp_group too (replicas of the same experts).
  /// Not with an adapter, fsdp_group, tp_group or pp_group yet.
  std::shared_ptr<ProcessGroup> ep_group{};
  /// At most this many rows per forward and backward pass (0: as many as
  /// fit in memory_budget_bytes); a pairwise loss takes whole pairs, so at
  /// least 2.
  int64_t micro_batch_rows = 0;
  /// The memory a pass may take (0: 80% of what is available at the call).
  uint64_t memory_budget_bytes = 0;
};

class Trainer {
public:
  static Result<Trainer> create(CausalLM model, TrainConfig cfg);

  /// Adds the gradients of one batch (in slices when it does not fit at
  /// once: see above). Metrics: loss (the batch's mean loss), loss_count
  /// (what that mean is over: tokens, or sequences for sequence-mean
  /// losses; 0 for reduction sum), tokens, sequences, and the loss's own
  /// (clip_fraction, kl, ...); with reduction sum also loss_sum (= loss,
  /// which data-parallel ranks add up). `logps`: when not null, set to the
  /// f32 [B, T] log-probs of the batch's targets under the weights before
  /// this call's update (0 where a position has no target).
  Result<Metrics> forward_backward(const TrainBatch& batch, const LossSpec& loss, Tensor* logps = nullptr);
  /// Clips the accumulated gradients by global norm, steps the optimizer at
  /// the scheduled rate and clears the gradients. With a dp_group, call it
  /// on every rank (a rank without gradients adds zeros). Metrics: grad_norm (before
  /// clipping), lr, step. A non-finite gradient norm skips the update and is
  /// an error (the gradients are cleared).
  Result<Metrics> clip_grad_and_step();
  /// Drops accumulated gradients without stepping.
  void zero_grad();

  /// Another optimizer config: a fresh optimizer, or with
  /// OptimizerConfig::keep_state and the same kind, the same moments and
  /// step count under the new hyperparameters.
  Result<void> set_optimizer(const OptimizerConfig& cfg);
  Result<void> set_lr_scheduler(const SchedulerConfig& cfg);
  const TrainConfig& config() const;
  int64_t step() const;
  /// The learning rate the next step will use.
  double current_lr() const;

  /// The model. With fsdp_group, its base parameters hold no values
  /// between calls (reading it is refused) until gather_parameters.
  CausalLM& model();
  /// With fsdp_group: every rank gathers the full base parameters (a
  /// collective: call it on every rank), so that the model can be read
  /// (forward, save, weight sync) until the next forward_backward,
  /// clip_grad_and_step or release_parameters frees them (named_parameters
  /// answers copies) or save_model. Without: nothing to do.
  Result<void> gather_parameters();
  void release_parameters();
  /// Writes the whole model as a Hugging Face directory (config.json and
  /// safetensors, sharded by max_shard_bytes), whatever the groups. With
  /// fsdp_group, tp_group or pp_group it is a collective (call it on every
  /// rank of the group) that gathers one piece at a time (an FSDP layer, a
  /// tensor-parallel parameter, a later stage's parameter sent to the
  /// first) and writes on the group's rank 0 as the pieces come, so that no
  /// rank holds the whole model at once. Ranks of dp_group other than 0
  /// hold a copy and write nothing. Every rank of the group answers the
  /// writer's outcome. The directory loads into any mesh: CausalLM::load,
  /// then a Trainer with other groups (the optimizer state does not move
  /// between meshes: its names carry the layout).
  Result<void> save_model(const std::string& dir, int64_t max_shard_bytes = default_max_shard_bytes);
  /// The whole model's base parameters in Hugging Face's order, in buckets
  /// of at most bucket_bytes (a bigger parameter alone), for weight sync
  /// from any mesh: gathered piece by piece as save_model does (the same
  /// collective, on every rank of the group), `sink` called on the group's
  /// rank 0 only, with each bucket of whole parameters in the model's
  /// dtype, which it may keep or let go. So no rank holds more than a
  /// bucket and one FSDP layer besides its own part. The other ranks wait
  /// in the next collective while `sink` runs, so a sink slower than the
  /// group's timeout fails the walk. A sink error stops the buckets; every
  /// rank of the group answers it. Ranks of dp_group other than 0 call
  /// nothing.
  Result<void> stream_parameters(int64_t bucket_bytes, const std::function<Result<void>(NamedTensors)>& sink);
  /// The log-probabilities of the batch's targets (f32 [B, T], 0 where no
  /// target), without gradients, with LoRA adapter `adapter` ("" : none),
  /// whatever the groups. With fsdp_group, tp_group or pp_group it is a
  /// collective (every rank of the group calls it): FSDP gathers the base
  /// for the pass and frees it after; TP's pass is collective as it is
  /// (the ranks take the same batch); pipeline stages pass the activations
  /// on, stage by stage, and the last stage's answer is every stage's (the
  /// same batch on every stage). A failure on one stage fails the call on
  /// every stage, which stay in step.
  Result<Tensor> forward_only(const TokenBatch& batch, const std::string& adapter = "");
  /// The bytes this rank holds of the trained parameters, their gradients
  /// and the optimizer state (with FSDP, its shards' only).
  int64_t state_bytes() const;

  /// Optimizer state as named tensors (for checkpoints), and back.
  NamedTensors optimizer_state() const;
  Result<void> load_optimizer_state(const std::map<std::string, Tensor>& state);

  struct Impl;

private:
  std::shared_ptr<Impl> impl_;
};

}  // namespace glint::components
