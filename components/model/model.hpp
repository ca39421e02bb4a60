#pragma once
/// `CausalLM`: a decoder-only transformer (Llama, Qwen2, Qwen3) in LibTorch,
/// loaded from and saved to a Hugging Face model directory.
///
///   auto lm = CausalLM::load("models/tiny");                 // config.json + safetensors
///   TokenBatch b{.input_ids = ids};                          // i64 [batch, seq]
///   auto out = lm->forward(b, {.entropies = true});          // log p(next token), entropies
///
/// This header does not include LibTorch (DESIGN.md: layers above see
/// components through plain glint types); tensors in and out are
/// `glint::Tensor`. Parameters keep Hugging Face's names
/// (`model.layers.0.self_attn.q_proj.weight`), so a directory saved here
/// loads in `transformers` and back, bit for bit.
///
/// Batches: right- or left-padded rows (attention_mask), and packed rows
/// (segment_ids: several sequences in one row, attending only within their
/// own segment, positions restarting at each). Positions default to the
/// count of real tokens before each token in its row or segment.

#include "components/checkpoint/safetensors.hpp"
#include "components/model/config.hpp"
#include "components/model/lora_config.hpp"

#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace glint::components {

struct TokenBatch {
  Tensor input_ids{};       ///< i64 [B, T]
  Tensor attention_mask{};  ///< optional, [B, T] of 0/1 (i64, i32, u8 or bool): 0 marks padding
  Tensor segment_ids{};     ///< optional, i64 [B, T]: packed sequences; a token attends within its segment
  Tensor position_ids{};    ///< optional, i64 [B, T]; default as described above
  /// Optional, i64 [B, T]: the token whose log-probability is wanted at each
  /// position. Default: the next input token (the last position of a row or
  /// segment has none, and gets 0).
  Tensor target_ids{};
};

struct ForwardOptions {
  bool entropies = false;  ///< also the entropy of each position's distribution
  bool logits = false;     ///< also the full logits [B, T, V] (large)
  std::string adapter{};   ///< a LoRA adapter to apply (empty: the base model)
};

struct ForwardResult {
  Tensor logprobs{};   ///< f32 [B, T]; 0 where there is no target (padding, ends)
  Tensor entropies{};  ///< f32 [B, T] if asked
  Tensor logits{};     ///< f32 [B, T, V] if asked
};

class CausalLM {
public:
  /// Loads config.json and the weights (model.safetensors or a sharded
  /// index) of a Hugging Face model directory. Names are checked strictly:
  /// missing or unexpected tensors, or a wrong shape, are an error that lists
  /// them. Weights are computed in f32 whatever their stored dtype.
  static Result<CausalLM> load(const std::string& dir);
  /// A model with random weights (normal, std 0.02; norms 1; biases 0),
  /// the same for the same seed.
  static Result<CausalLM> init_random(const ModelConfig& config, uint64_t seed);

  /// Writes config.json and the weights (in config().dtype) as transformers
  /// does: model.safetensors, or, when they pass max_shard_bytes, shards
  /// model-00001-of-0000N.safetensors and model.safetensors.index.json
  /// (write_safetensors_dir). Weights of an earlier save there are replaced.
  Result<void> save(const std::string& dir, int64_t max_shard_bytes = default_max_shard_bytes) const;

  const ModelConfig& config() const;
  /// Where the weights came from: the directory given to load (absolute),
  /// or what set_name_or_path gave; empty for a random init. Adapters name
  /// it as their base_model_name_or_path.
  const std::string& name_or_path() const;
  void set_name_or_path(std::string name);

  /// Log-probabilities of the targets (and optionally entropies and logits),
  /// without gradients. Bad input (ids outside the vocabulary, shapes that
  /// disagree, a wrong dtype) is an error naming what and where.
  Result<ForwardResult> forward(const TokenBatch& batch, const ForwardOptions& opts = {}) const;

  /// The parameters under their Hugging Face names, as f32 tensors that
  /// share the model's memory (a write changes the model).
  Result<NamedTensors> named_parameters() const;

  // -- LoRA adapters: several named ones on one frozen base (one per tenant).
  // Not thread-safe against concurrent calls on the same model (an actor
  // serialises them).

  /// Adds adapter `name`: A random (PEFT's init), B zero, so that the
  /// model's output with it equals the base's until it is trained. Each
  /// targeted module gets its own rank and scaling (rank_pattern,
  /// alpha_pattern); a config that targets a module glint cannot adapt
  /// (lm_head, embed_tokens, a norm) is an error.
  Result<void> add_adapter(const std::string& name, const LoraConfig& cfg, uint64_t seed = 0);
  Result<void> remove_adapter(const std::string& name);
  /// Gives adapter `from` the name `to` (which must be free).
  Result<void> rename_adapter(const std::string& from, const std::string& to);
  std::vector<std::string> adapters() const;
  bool has_adapter(const std::string& name) const;
  const LoraConfig* adapter_config(const std::string& name) const;
  /// Writes adapter_config.json and adapter_model.safetensors with PEFT's
  /// key names (base_model.model.<module>.lora_A.weight). The config keeps
  /// every field the adapter was loaded with, and names its base
  /// (base_model_name_or_path: the config's, else name_or_path()), so
  /// PEFT's AutoPeftModelForCausalLM finds it.
  Result<void> save_adapter(const std::string& name, const std::string& dir) const;
  /// Reads a PEFT adapter directory as adapter `name` (LoraConfig::load
  /// refuses fields glint does not implement). Every module the config
  /// targets must have lora_A and lora_B of its rank, and no other tensor
  /// may be there; the error names the file and lists what does not fit.
  /// On any error the model is unchanged.
  Result<void> load_adapter(const std::string& name, const std::string& dir);
  /// Folds the adapter into the base weights (W += scaling * B A), so that
  /// it costs nothing per call; every call then sees it, with or without
  /// naming it. `unmerge_adapter` takes it out again.
  Result<void> merge_adapter(const std::string& name);
  Result<void> unmerge_adapter(const std::string& name);
  /// The adapter's tensors under PEFT's key names, sharing memory.
  Result<NamedTensors> adapter_parameters(const std::string& name) const;
  /// Copies of every base weight with adapter `name` folded in (W + scaling
  /// * B A), for a sampler without LoRA; the model itself is not changed (a
  /// merge then unmerge would leave rounding in the base). An adapter that
  /// is merged already adds nothing more.
  Result<NamedTensors> merged_parameters(const std::string& name) const;

  struct Impl;
  /// For components/ code and tests that work with LibTorch directly.
  Impl& impl() const { return *impl_; }

private:
  std::shared_ptr<Impl> impl_;
};

}  // namespace glint::components
