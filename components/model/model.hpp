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

#include <memory>
#include <string>

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

  /// Writes config.json and model.safetensors (weights in config().dtype).
  Result<void> save(const std::string& dir) const;

  const ModelConfig& config() const;

  /// Log-probabilities of the targets (and optionally entropies and logits),
  /// without gradients. Bad input (ids outside the vocabulary, shapes that
  /// disagree, a wrong dtype) is an error naming what and where.
  Result<ForwardResult> forward(const TokenBatch& batch, const ForwardOptions& opts = {}) const;

  /// The parameters under their Hugging Face names, as f32 tensors that
  /// share the model's memory (a write changes the model).
  NamedTensors named_parameters() const;

  struct Impl;
  /// For components/ code and tests that work with LibTorch directly.
  Impl& impl() const { return *impl_; }

private:
  std::shared_ptr<Impl> impl_;
};

}  // namespace glint::components
