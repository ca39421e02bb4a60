#pragma once
/// The LibTorch side of CausalLM, for components/ code and tests only (it
/// includes ATen; layers above use model.hpp).

#include "components/comm/process_group.hpp"
#include "components/model/gated_deltanet.hpp"
#include "components/model/model.hpp"

#include <ATen/ATen.h>

#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace glint::components {

namespace model_detail {

using ParameterShapes = std::vector<std::pair<std::string, std::vector<int64_t>>>;

/// Every parameter of a config, in Hugging Face's names and order.
ParameterShapes parameter_shapes(const ModelConfig& c);

/// The parameters of a sparse feed-forward block whose layer's names begin
/// with `prefix` ("model.layers.3."): the router, each expert's
/// projections, the shared expert and its gate (moe.cpp).
void sparse_block_shapes(const ModelConfig& c, const std::string& prefix, ParameterShapes& out);

/// Splits fused expert tensors (transformers 5's in-memory layout, which
/// some checkpoints carry: mlp.experts.gate_up_proj [E, 2I, H], each
/// expert's gate rows then its up rows, and mlp.experts.down_proj
/// [E, H, I]) into the per-expert tensors the official checkpoints hold, in
/// place. A layer with both layouts, or a fused tensor of the wrong shape,
/// is an error naming `origin`.
Result<void> unfuse_experts(const ModelConfig& c, std::map<std::string, Tensor>& weights, const std::string& origin);

/// A batch checked and turned into what the forward pass needs.
struct Prepared {
  at::Tensor ids;          ///< i64 [B, T]
  at::Tensor positions;    ///< i64 [B, T]
  at::Tensor allowed;      ///< bool [B, T, T]: query i may attend to key j
  at::Tensor targets;      ///< i64 [B, T] (0 where target_mask is false)
  at::Tensor target_mask;  ///< bool [B, T]
  at::Tensor segments;     ///< i64 [B, T]: segment_ids, undefined when the batch has none
  at::Tensor real;         ///< bool [B, T]: the real tokens (attention_mask; all of them without one)
};

Result<Prepared> prepare(const ModelConfig& c, const TokenBatch& b);

/// Writes a Hugging Face model directory of config `c`: the weights
/// (safetensors in c.dtype, sharded by max_shard_bytes) in parameter_shapes'
/// order, then config.json. `fetch(name)` answers each whole parameter,
/// called once each and in that order; each shard is written as soon as
/// its tensors are in, so a model gathered piece by piece is never held
/// whole (write_safetensors_dir_streamed).
Result<void> save_pretrained(const ModelConfig& c, const std::string& dir, int64_t max_shard_bytes,
                             const std::function<Result<at::Tensor>(const std::string&)>& fetch);

/// An estimate of the memory one row of T tokens takes through a training
/// forward and backward pass (the activations autograd keeps, the attention
/// scores, the logits and the peak of the backward pass), with elements of
/// `elem_bytes`. `entropies`: the entropies are computed too; `adapter`: a
/// LoRA adapter is trained (its inputs kept for dropout). For the path the
/// model takes (kernels::enabled: the fused kernels keep far less). Linear
/// in the rows of a batch, so a batch of B rows takes B times this.
double training_bytes_per_row(const ModelConfig& c, int64_t T, int64_t elem_bytes, bool entropies, bool adapter);

}  // namespace model_detail

/// One LoRA adapter: per target module (its path, "model.layers.0.self_attn.q_proj"),
/// A [r, in] and B [out, r], r and the scaling being that module's
/// (LoraConfig::rank_of, scaling_of).
struct LoraAdapter {
  LoraConfig cfg;
  std::vector<std::string> modules;  ///< in model order
  std::map<std::string, std::pair<at::Tensor, at::Tensor>> weights;
  std::map<std::string, double> scaling;  ///< per module: alpha / r (or / sqrt(r))
  bool merged = false;
};

/// What the sparse blocks of a pass routed (PassOptions::routes): per
/// sparse layer, in order, the router's probabilities over every expert
/// [tokens, E] (with their gradients in training) and the chosen experts,
/// i64 [tokens, k]; tokens in the order of the pass's [..., hidden] input
/// flattened (row-major [B, T] for a batch).
struct RouterRecord {
  struct Layer {
    int64_t layer = 0;
    at::Tensor probs, chosen;
  };
  std::vector<Layer> layers;
};

/// The router's statistics over the real tokens of a pass (router_statistics).
struct RouterStatistics {
  /// transformers' load-balancing loss (load_balancing_loss_func), over
  /// every sparse layer's tokens at once: E * sum_e f_e P_e, with f_e the
  /// share of (token, slot) pairs that chose e (summing to k) and P_e the
  /// mean router probability of e. A differentiable scalar.
  at::Tensor aux_loss;
  double entropy = 0;  ///< mean entropy (nats) of a token's router distribution
  /// Per sparse layer: its most loaded expert's share over the mean share
  /// (1: balanced; E: every token to one expert).
  std::vector<std::pair<int64_t, double>> load_max_over_mean;
  int64_t tokens = 0;  ///< real tokens per layer
};

namespace model_detail {
/// The statistics of `record` over the tokens `real` marks (bool [B, T], the
/// record's tokens in row-major order), for a model of `experts` experts.
RouterStatistics router_statistics(const RouterRecord& record, const at::Tensor& real, int64_t experts);
/// A batch's routes for routing replay (TrainBatch::routes), checked
/// against the model and the batch [B, T]: i64 [B, T, S, k]. An error
/// names the shape, or the first position whose experts are out of
/// [0, num_experts), repeated, or partly -1.
Result<at::Tensor> replay_routes(const ModelConfig& c, const Tensor& routes, int64_t B, int64_t T);
}  // namespace model_detail

/// An adapter for some rows of a batch that mixes tenants: `rows` (i64)
/// index the second-to-last dimension of every projection's input.
struct RowAdapter {
  const LoraAdapter* lora = nullptr;
  at::Tensor rows;
};

/// What one pass uses besides the base weights.
struct PassOptions {
  const LoraAdapter* lora = nullptr;
  bool train = false;  ///< LoRA dropout is active
  /// Draws LoRA dropout's masks (null: LibTorch's default generator, shared
  /// by the process and so not reproducible).
  at::Generator* dropout_rng = nullptr;
  std::vector<RowAdapter> row_adapters{};  ///< per-row adapters (inference only), besides `lora`
  /// Projection weights by name, packed by pack_linear_weight, used instead
  /// of the parameters (inference only).
  const std::map<std::string, at::Tensor>* packed = nullptr;
  /// Called around each decoder layer: `enter(l)` before its first use of
  /// its parameters, `exit(l, x)` with its output, answering the output the
  /// rest of the pass uses (FSDP gathers a layer's shards on entry, frees
  /// them on exit and hooks the output's gradient to gather them again for
  /// the backward: components/parallel/fsdp.hpp). Null: none.
  struct LayerHooks {
    std::function<void(int64_t layer)> enter;
    std::function<at::Tensor(int64_t layer, at::Tensor out)> exit;
  };
  const LayerHooks* layer_hooks = nullptr;
  /// On a pipeline stage after the first: the previous stage's activations
  /// [B, T, hidden], which take the embeddings' place (PipelinePlan).
  at::Tensor stage_input{};
  /// When set, each sparse block adds what it routed (the trainer's
  /// load-balancing loss and router metrics).
  RouterRecord* routes = nullptr;
  /// Routing replay: i64 [tokens, S, k], for each token of the pass's
  /// [..., hidden] input flattened and each of the S sparse layers (in
  /// order), the k experts to use instead of the router's top k (the
  /// weights stay the router's probabilities of them, renormalised as the
  /// config says). A token whose first entry is -1 routes itself.
  /// Undefined: every token routes itself.
  at::Tensor replay{};
};

/// One layer's attention: q [..., T, heads, D], k and v [..., T, kv_heads, D]
/// (normed and rotated) to the weighted values [..., T, heads * D].
using Attention = std::function<at::Tensor(int64_t layer, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v)>;

/// One Gated DeltaNet layer's token mixer on its normed input h [..., hidden]
/// (the layer's weights in `w`, projections through the pass's adapters):
/// its output [..., hidden]. Dense batches run gdn::mix on the whole rows;
/// the sampler carries each sequence's conv and recurrent state.
using TokenMix = std::function<at::Tensor(int64_t layer, const gdn::MixerWeights& w, const at::Tensor& h)>;

/// A model whose parameters are tensor-parallel shards (tp::shard_model):
/// its passes are collective over `pg` (every rank runs each one).
struct TensorParallelPlan {
  std::shared_ptr<ProcessGroup> pg;
  int64_t heads = 0, kv_heads = 0;  ///< this rank's attention and key/value heads
  int64_t vocab_begin = 0;          ///< this rank's first row of the embeddings and the LM head
};

/// A model cut into pipeline stages (pp::shard_model): this rank holds
/// decoder layers [first_layer, end_layer), the embeddings on the first
/// stage, the final norm and the LM head on the last (the embeddings too
/// when tied). A pass runs only this stage's part: its input is the stage
/// before's activations, its output the next one's (Outputs::activations)
/// until the last stage's log-probs.
struct PipelinePlan {
  std::shared_ptr<ProcessGroup> pg;
  int64_t first_layer = 0, end_layer = 0;
  bool first() const { return pg->rank() == 0; }
  bool last() const { return pg->rank() == pg->size() - 1; }
};

/// A model whose experts are split over the ranks of `pg` (ep::shard_model):
/// this rank holds experts [first_expert, first_expert + experts) of every
/// sparse layer; its passes are collective (each rank its own tokens).
struct ExpertParallelPlan {
  std::shared_ptr<ProcessGroup> pg;
  int64_t first_expert = 0, experts = 0;
};

struct CausalLM::Impl {
  ModelConfig cfg;
  std::vector<std::string> names;            ///< parameter names in HF order
  std::map<std::string, at::Tensor> params;  ///< f32, contiguous
  std::map<std::string, LoraAdapter> adapters;
  std::string name_or_path;  ///< where the weights came from (CausalLM::name_or_path)
  /// Set when the base parameters are FSDP's (which frees their bytes
  /// between uses): what holds them. Reading them while not gathered would
  /// read freed memory, so the calls that read them refuse (have_parameters).
  std::string sharded_by;
  /// With sharded_by: the full parameters are there now (gathered, to be
  /// read until the next pass frees them).
  bool gathered = false;
  /// Set when the parameters are tensor-parallel shards: passes run on
  /// them (collectively), nothing reads them whole.
  std::shared_ptr<TensorParallelPlan> tp;
  /// Set when this model is one pipeline stage: it holds only that stage's
  /// parameters (`names` lists them), and only a pipeline runs it.
  std::shared_ptr<PipelinePlan> pp;
  /// Set when this rank holds only some experts (expert parallelism): every
  /// pass is collective over the plan's group.
  std::shared_ptr<ExpertParallelPlan> ep;
  /// An error naming `what` when the parameters cannot be read now: FSDP
  /// shards not gathered, or, unless `passes` (a forward pass, which runs
  /// on shards), tensor-parallel shards. `writes`: also when they are
  /// FSDP's at all (a write to gathered values is lost at the next pass).
  Result<void> have_parameters(const char* what, bool passes = false, bool writes = false) const;

  const at::Tensor& param(const std::string& name) const { return params.at(name); }
  /// The parameters' dtype and device (every one shares them).
  at::TensorOptions options() const { return params.begin()->second.options(); }
  /// Every projection's module path, in model order.
  std::vector<std::string> linear_modules() const;
  /// The weight of a module a LoRA adapter may target: a projection's, or
  /// the LM head's ("lm_head": the embeddings when they are tied).
  const at::Tensor& module_weight(const std::string& module) const;
  /// y plus, for each adapter of `pass` that targets `prefix`, its scaling *
  /// dropout(x) A^T B^T (the adapter's rows only, for row adapters). `own`
  /// false: pass.lora's adapter is in y already (project's kernel added it).
  at::Tensor add_lora(const std::string& prefix, const at::Tensor& x, at::Tensor y, const PassOptions& pass,
                      bool own = true) const;
  /// What the pass's own adapter reads of a projection's input x: x, or in
  /// training with LoRA dropout, x masked and rescaled (a fresh mask each call).
  static at::Tensor lora_input(const at::Tensor& x, const PassOptions& pass);
  /// x @ w^T (+ bias) plus the adapters of `pass` that target `prefix`: the
  /// pass's own through kernels::lora_linear where it can (one node, the
  /// adapter's products accumulated in place; its dropout input beside x),
  /// else add_lora.
  at::Tensor project(const std::string& prefix, const at::Tensor& x, const at::Tensor& w,
                     const c10::optional<at::Tensor>& bias, const PassOptions& pass) const;
  /// x @ W^T (+ b) for the projection `prefix` ("model.layers.0.mlp.up_proj"),
  /// plus the adapter's scaling * dropout(x) A^T B^T when it targets it.
  at::Tensor linear(const std::string& prefix, const at::Tensor& x, bool bias, const PassOptions& pass) const;
  at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight) const;
  /// The MLP's activation (config hidden_act) applied to x.
  at::Tensor activate(const at::Tensor& x) const;
  /// The MLP's down projection `prefix` of activate(gate) * up, as linear()
  /// computes it (kernels::swiglu for SiLU; in training without an adapter
  /// there, kernels::swiglu_linear, which keeps no product for backward).
  at::Tensor mlp_down(const std::string& prefix, const at::Tensor& gate, const at::Tensor& up, bool bias,
                      const PassOptions& pass) const;
  /// The SwiGLU MLP whose projections are `prefix`.{gate,up,down}_proj
  /// ("model.layers.0.mlp", an expert "model.layers.0.mlp.experts.3") on h.
  at::Tensor swiglu_mlp(const std::string& prefix, const at::Tensor& h, bool bias, const PassOptions& pass) const;
  /// Layer `layer`'s feed-forward block on its normed input h [..., hidden]:
  /// the dense MLP or the sparse experts, as the config makes that layer.
  at::Tensor feed_forward(int64_t layer, const at::Tensor& h, const PassOptions& pass) const;
  /// The mixture of experts (moe.cpp): each token's softmax router picks
  /// its top-k experts, the tokens are grouped by expert so that each runs
  /// one GEMM over its own tokens, and the outputs are summed with the
  /// router's weights (plus the gated shared expert, Qwen2-MoE).
  at::Tensor sparse_moe(int64_t layer, const at::Tensor& h, const PassOptions& pass) const;
  /// RoPE's inverse frequencies [head_dim / 2] in f64, after the config's
  /// scaling (linear divides positions instead: see rope).
  at::Tensor inverse_frequencies() const;
  /// cos and sin tables [B, T, head_dim] for the positions.
  std::pair<at::Tensor, at::Tensor> rope(const at::Tensor& positions) const;
  /// The decoder stack on `ids` at `positions` (same shape: [B, T] or [N])
  /// with attention computed by `attend` (and Gated DeltaNet layers by `mix`;
  /// without one, such a layer throws): final hidden states [..., hidden]
  /// (after the last norm; on a pipeline stage, its layers' part, from
  /// pass.stage_input after the first stage, before the norm but on the last). Dense batches and the sampler's paged cache
  /// differ only in `attend`.
  at::Tensor decode_stack(const at::Tensor& ids, const at::Tensor& positions, const Attention& attend,
                          const PassOptions& pass = {}, const TokenMix& mix = {}) const;
  /// Layer `layer`'s Gated DeltaNet weights, its projections through
  /// linear() (the pass's adapters and packed weights).
  gdn::MixerWeights mixer_weights(int64_t layer, const PassOptions& pass) const;
  /// The chunk the Gated DeltaNet layers' training and scoring passes use.
  int64_t gdn_chunk = 64;
  /// Final hidden states [B, T, hidden] (after the last norm).
  at::Tensor hidden(const model_detail::Prepared& p, const PassOptions& pass = {}) const;
  /// Logits [B, T, vocab] from hidden states (with an adapter's LM-head
  /// LoRA, "lm_head", when it has one).
  at::Tensor logits(const at::Tensor& hidden, const PassOptions& pass = {}) const;

  struct Outputs {
    at::Tensor logprobs;   ///< [B, T], 0 where there is no target
    at::Tensor entropies;  ///< [B, T] if asked
    at::Tensor logits;     ///< [B, T, V] if asked
    /// On a pipeline stage before the last, instead of the above: the
    /// activations [B, T, hidden] for the next stage.
    at::Tensor activations;
  };
  /// The forward pass to target log-probabilities, with gradients when grad
  /// mode is on. Computes in the parameters' dtype (f32; f64 in tests).
  Outputs run(const model_detail::Prepared& p, bool entropies, bool logits, const PassOptions& pass = {}) const;
  /// The adapter `name`, or an error naming the ones there are.
  Result<const LoraAdapter*> adapter(const std::string& name) const;
};

}  // namespace glint::components
