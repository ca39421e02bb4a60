#pragma once
/// `ModelConfig`: the shape of a decoder-only transformer, read from and
/// written to a Hugging Face `config.json` (LlamaForCausalLM,
/// Qwen2ForCausalLM, Qwen3ForCausalLM).
///
///   auto cfg = ModelConfig::load("models/tiny/config.json");
///   if (!cfg) std::puts(describe(cfg.error()).c_str());  // says which field and why
///
/// Fields absent from the file take the defaults of the architecture as
/// Hugging Face's classes do (e.g. Qwen2 always has q/k/v biases, head_dim
/// defaults to hidden_size / num_attention_heads). A field with the wrong type
/// or an impossible value (heads not dividing the hidden size, a key/value
/// head count that does not divide the query heads) is an error that names it.

#include "runtime/error.hpp"
#include "runtime/tensor.hpp"

#include <cstdint>
#include <string>

namespace glint::components {

enum class Architecture : uint8_t { llama, qwen2, qwen3 };

/// "LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM".
std::string_view hf_class_name(Architecture a);
/// Parses an HF class name or a short name ("llama", "qwen2", "qwen3").
Result<Architecture> parse_architecture(std::string_view name);

struct ModelConfig {
  Architecture architecture = Architecture::qwen3;
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int64_t num_hidden_layers = 0;
  int64_t num_attention_heads = 0;
  int64_t num_key_value_heads = 0;
  int64_t head_dim = 0;
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;
  /// rope_scaling: none, or linear with this factor (positions divided by it).
  double rope_linear_factor = 1.0;
  bool tie_word_embeddings = false;
  /// Bias on q, k, v (Qwen2 always; Llama and Qwen3 when attention_bias).
  bool qkv_bias = false;
  /// Bias on o_proj (Llama and Qwen3 when attention_bias).
  bool o_bias = false;
  /// Bias on the MLP projections (Llama's mlp_bias).
  bool mlp_bias = false;
  /// RMSNorm of q and k per head before RoPE (Qwen3).
  bool qk_norm = false;
  int64_t max_position_embeddings = 2048;
  /// Dtype the weights are stored in (torch_dtype).
  Dtype dtype = Dtype::f32;
  int64_t bos_token_id = -1;
  int64_t eos_token_id = -1;

  /// A config with the architecture's defaults for the given sizes.
  static ModelConfig make(Architecture a, int64_t vocab, int64_t hidden, int64_t intermediate, int64_t layers,
                          int64_t heads, int64_t kv_heads, int64_t head_dim = 0);

  /// Parses the text of a config.json; `origin` names it in errors.
  static Result<ModelConfig> parse(const std::string& json_text, const std::string& origin = "config.json");
  /// Reads a config.json file.
  static Result<ModelConfig> load(const std::string& path);
  /// The config.json text, in Hugging Face's field names.
  std::string to_json() const;

  /// Checks the sizes fit together; the error names the field.
  Result<void> validate() const;

  /// Number of parameters (embeddings counted once when tied).
  int64_t num_parameters() const;
};

}  // namespace glint::components
