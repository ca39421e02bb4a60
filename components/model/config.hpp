#pragma once
/// `ModelConfig`: the shape of a decoder-only transformer, read from and
/// written to a Hugging Face `config.json` (LlamaForCausalLM,
/// Qwen2ForCausalLM, Qwen3ForCausalLM, the mixture-of-experts
/// Qwen2MoeForCausalLM and Qwen3MoeForCausalLM, and the hybrid Qwen3.5 /
/// Qwen3.6 family: Qwen3_5ForCausalLM, Qwen3_5MoeForCausalLM and their
/// vision-language ConditionalGeneration checkpoints, whose text_config is
/// read and whose vision tower is left out).
///
/// A decoder layer is a stack of typed blocks: a token mixer and a
/// feed-forward, chosen per layer (`token_mixer(l)`: softmax attention or
/// a Gated DeltaNet; `feed_forward(l)`: a dense SwiGLU MLP, or a sparse
/// mixture of experts as `moe` describes it).
///
///   auto cfg = ModelConfig::load("models/tiny/config.json");
///   if (!cfg) std::puts(describe(cfg.error()).c_str());  // says which field and why
///
/// Every field that changes what the model computes is honoured as
/// transformers defines it, or refused with an error naming the file, the
/// field and its value: hidden_act, sliding-window attention
/// (use_sliding_window, sliding_window, max_window_layers, layer_types),
/// the RoPE settings in both spellings (rope_theta + rope_scaling, and
/// current transformers' rope_parameters), torch_dtype or dtype,
/// attention_dropout, partial_rotary_factor, quantization_config. Fields
/// absent from the file take the architecture's defaults as Hugging Face's
/// classes do (Qwen2 always has q/k/v biases; head_dim is hidden_size /
/// num_attention_heads, except Qwen3's, which is 128). Fields glint does
/// not use and that change nothing (use_cache, transformers_version,
/// pad_token_id, ...) are listed once at debug level (GLINT_LOG=debug) and
/// kept: to_json writes them back.

#include "runtime/error.hpp"
#include "runtime/tensor.hpp"

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace glint::components {

enum class Architecture : uint8_t { llama, qwen2, qwen3, qwen2_moe, qwen3_moe, qwen3_5, qwen3_5_moe };

/// "LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM",
/// "Qwen2MoeForCausalLM", "Qwen3MoeForCausalLM", "Qwen3_5ForCausalLM",
/// "Qwen3_5MoeForCausalLM" (glint writes the Qwen3.5 family's text model).
std::string_view hf_class_name(Architecture a);
/// config.json's model_type ("llama", "qwen2", "qwen3", "qwen2_moe",
/// "qwen3_moe", "qwen3_5_text", "qwen3_5_moe_text").
std::string_view model_type(Architecture a);
/// Parses an HF class name or a model_type ("llama", "qwen3_moe",
/// "qwen3_5", "Qwen3_5ForConditionalGeneration", ...).
Result<Architecture> parse_architecture(std::string_view name);
/// Whether the family routes tokens to experts (Qwen2-MoE, Qwen3-MoE,
/// Qwen3.5-MoE).
bool is_moe(Architecture a);
/// Whether the family is Qwen3.5's: Gated DeltaNet and gated attention
/// layers, (1 + w) norms, partial RoPE.
bool is_hybrid(Architecture a);

/// A decoder layer's token mixer.
enum class TokenMixer : uint8_t {
  attention,       ///< softmax attention: self_attn.* (Qwen3.5's with an output gate)
  gated_deltanet,  ///< linear attention by the gated delta rule: linear_attn.* (Qwen3.5)
};

/// The Gated DeltaNet layers' shape (Qwen3.5's linear_* fields).
struct LinearAttentionConfig {
  int64_t num_key_heads = 0;    ///< linear_num_key_heads: query/key heads
  int64_t key_head_dim = 0;     ///< linear_key_head_dim
  int64_t num_value_heads = 0;  ///< linear_num_value_heads: a multiple of the key heads
  int64_t value_head_dim = 0;   ///< linear_value_head_dim
  int64_t conv_kernel_dim = 0;  ///< linear_conv_kernel_dim: the short causal conv's width
  int64_t key_dim() const { return num_key_heads * key_head_dim; }
  int64_t value_dim() const { return num_value_heads * value_head_dim; }
  /// in_proj_qkv's output: the q, k and v channels the conv runs over.
  int64_t conv_dim() const { return 2 * key_dim() + value_dim(); }
  /// What one layer carries per sequence from token to token: the conv
  /// window (its last conv_kernel_dim - 1 rows of in_proj_qkv's output) and
  /// the recurrent state [value heads, key_head_dim, value_head_dim].
  int64_t state_elements() const {
    return (conv_kernel_dim - 1) * conv_dim() + num_value_heads * key_head_dim * value_head_dim;
  }
};

/// A decoder layer's feed-forward block.
enum class FeedForward : uint8_t {
  dense,   ///< SwiGLU MLP of intermediate_size: mlp.{gate,up,down}_proj
  sparse,  ///< mixture of experts (MoeConfig): mlp.gate, mlp.experts.N.*
};

/// The mixture-of-experts fields of Qwen2MoeConfig / Qwen3MoeConfig, with
/// transformers' meaning (reference/model-families.md sections 1-2).
struct MoeConfig {
  int64_t num_experts = 0;            ///< E routed experts per sparse layer; 0: every layer dense
  int64_t num_experts_per_tok = 0;    ///< k experts each token goes to
  int64_t moe_intermediate_size = 0;  ///< each routed expert's SwiGLU width
  /// The shared expert's width (Qwen2-MoE: every token, gated by
  /// sigmoid(x . mlp.shared_expert_gate)); 0: none (Qwen3-MoE).
  int64_t shared_expert_intermediate_size = 0;
  bool norm_topk_prob = false;        ///< renormalise the k chosen probabilities to sum 1
  int64_t decoder_sparse_step = 1;    ///< layer l is sparse iff (l + 1) % step == 0 ...
  std::vector<int64_t> mlp_only_layers{};  ///< ... and l is not listed here
  /// The load-balancing loss's weight, added to the training loss only
  /// when output_router_logits is set (transformers' definition).
  double router_aux_loss_coef = 0.001;
  bool output_router_logits = false;
};

/// The MLP's activation (hidden_act).
enum class Activation : uint8_t {
  silu,       ///< "silu", "swish"
  gelu,       ///< "gelu": x * Phi(x), with erf
  gelu_tanh,  ///< "gelu_pytorch_tanh", "gelu_new", "gelu_fast": the tanh approximation
  relu,       ///< "relu"
};
/// Parses a hidden_act value; an error names the supported ones.
Result<Activation> parse_activation(std::string_view name);
/// The name config.json gets ("silu", "gelu", "gelu_pytorch_tanh", "relu").
std::string_view activation_name(Activation a);

/// How RoPE's frequencies are scaled (rope_scaling / rope_parameters).
struct RopeScaling {
  enum class Type : uint8_t {
    none,    ///< "default"
    linear,  ///< positions divided by `factor`
    llama3,  ///< Llama 3.1's: low frequencies divided by `factor`, smoothed between
  };
  Type type = Type::none;
  double factor = 1.0;
  double low_freq_factor = 1.0;                    ///< llama3
  double high_freq_factor = 4.0;                   ///< llama3
  int64_t original_max_position_embeddings = 8192; ///< llama3
};

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
  RopeScaling rope_scaling{};
  Activation hidden_act = Activation::silu;
  /// Sliding-window attention (Qwen2, Qwen3): a query attends to the
  /// `sliding_window` positions ending at its own on the layers marked in
  /// `sliding_layers`, to every earlier position on the others. 0: none.
  int64_t sliding_window = 0;
  /// One entry per layer when sliding_window > 0 (from layer_types, or
  /// layers >= max_window_layers as transformers derives them).
  std::vector<bool> sliding_layers{};
  /// As read (Qwen2/Qwen3 default 28), to write back.
  int64_t max_window_layers = 28;
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
  /// The experts (Qwen2-MoE, Qwen3-MoE, Qwen3.5-MoE; num_experts 0 on
  /// dense families).
  MoeConfig moe{};
  /// Qwen3.5: each layer's token mixer (from layer_types, or
  /// full_attention_interval). Empty: attention on every layer.
  std::vector<TokenMixer> token_mixers{};
  /// Qwen3.5: the Gated DeltaNet layers' heads and conv width.
  LinearAttentionConfig linear_attention{};
  /// The share of each head's dimensions RoPE rotates (the first
  /// int(head_dim * factor); Qwen3.5: 0.25); the rest pass through.
  double partial_rotary_factor = 1.0;
  /// Qwen3.5's attention output gate: q_proj gives per head a query and a
  /// gate of head_dim each, and the attention's output is multiplied by
  /// sigmoid(gate) before o_proj.
  bool attention_gate = false;
  /// Qwen3.5's RMSNorms scale by (1 + weight), their weights starting at 0
  /// (not the Gated DeltaNet's output norm, a plain weight).
  bool unit_offset_norms = false;
  /// Read from a vision-language checkpoint (Qwen3_5ForConditionalGeneration:
  /// config.json's text_config, weights under model.language_model.): the
  /// vision tower and the multi-token-prediction head were left out, and
  /// glint saves the text model (Qwen3_5ForCausalLM).
  bool from_multimodal = false;
  /// With from_multimodal: the image and video placeholder ids
  /// (image_token_id, video_token_id), refused in input since the vision
  /// tower is not run.
  std::vector<int64_t> media_token_ids{};
  /// Dtype the weights are stored in (torch_dtype).
  Dtype dtype = Dtype::f32;
  int64_t bos_token_id = -1;
  /// Every id that ends a generation (config.json's eos_token_id, a number
  /// or a list); empty: none.
  std::vector<int64_t> eos_token_ids{};
  /// generation_config.json's eos_token_id where it names more ids (Qwen2.5
  /// Instruct stops on <|im_end|> and <|endoftext|>): they end a generation
  /// too. Not written back into config.json.
  std::vector<int64_t> generation_eos_token_ids{};
  /// The standard deviation of init_random's weights (initializer_range).
  double initializer_range = 0.02;
  /// The fields of config.json glint does not use, as a JSON object's text
  /// ("{}" when none): written back by to_json.
  std::string extra_json = "{}";

  /// The window of layer `layer`'s attention: sliding_window on a sliding
  /// layer, 0 (everything before) otherwise.
  int64_t window(int64_t layer) const {
    return sliding_window > 0 && layer >= 0 && static_cast<size_t>(layer) < sliding_layers.size() &&
                   sliding_layers[static_cast<size_t>(layer)]
               ? sliding_window
               : 0;
  }
  /// Layer `layer`'s token mixer.
  TokenMixer token_mixer(int64_t layer) const {
    return layer >= 0 && static_cast<size_t>(layer) < token_mixers.size() ? token_mixers[static_cast<size_t>(layer)]
                                                                          : TokenMixer::attention;
  }
  /// How many layers have token mixer `m`.
  int64_t layers_of(TokenMixer m) const {
    int64_t n = 0;
    for (int64_t l = 0; l < num_hidden_layers; ++l) n += token_mixer(l) == m;
    return n;
  }
  /// Whether any layer is a Gated DeltaNet.
  bool has_linear_attention() const { return layers_of(TokenMixer::gated_deltanet) > 0; }
  /// The dimensions of a head RoPE rotates: int(head_dim * partial_rotary_factor).
  int64_t rotary_dim() const {
    return static_cast<int64_t>(static_cast<double>(head_dim) * partial_rotary_factor);
  }
  /// Layer `layer`'s feed-forward block: sparse where the family has
  /// experts, (layer + 1) % decoder_sparse_step == 0 and the layer is not
  /// in mlp_only_layers; dense otherwise.
  FeedForward feed_forward(int64_t layer) const;
  /// Whether any layer is sparse.
  bool has_experts() const;
  bool is_eos(int64_t id) const {
    for (auto e : eos_token_ids)
      if (e == id) return true;
    for (auto e : generation_eos_token_ids)
      if (e == id) return true;
    return false;
  }

  /// A config with the architecture's defaults for the given sizes (for an
  /// MoE family, transformers' defaults for the experts: set `moe` after).
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
