#include "components/model/hybrid_config.hpp"
#include "components/model/config_field.hpp"

#include "runtime/log.hpp"

#include <nlohmann/json.hpp>

namespace glint::components::model_detail {

using json = nlohmann::json;

namespace {

caf::error refuse(const std::string& origin, const std::string& what) {
  return make_error(errc::invalid_argument, origin + ": " + what);
}
caf::error unsupported(const std::string& origin, const std::string& what) {
  return make_error(errc::unimplemented, origin + ": " + what);
}

}  // namespace

Result<json> text_config_of(const json& top, ModelConfig& c, const std::string& origin) {
  auto t = top.find("text_config");
  if (t == top.end() || t->is_null()) return top;  // a text-only checkpoint (Qwen3_5ForCausalLM)
  if (!t->is_object()) return refuse(origin, "field 'text_config' should be an object, not " + t->dump());
  json text = *t;
  c.from_multimodal = true;
  // transformers' ConditionalGeneration reads these at the top level; real
  // files carry them at both levels, and two values would leave one ignored.
  for (const char* key : {"tie_word_embeddings", "bos_token_id", "eos_token_id"}) {
    auto outer = top.find(key);
    if (outer == top.end() || outer->is_null()) continue;
    auto inner = text.find(key);
    if (inner != text.end() && !inner->is_null() && *inner != *outer)
      return refuse(origin, std::string{"fields '"} + key + "' (" + outer->dump() + ") and 'text_config." + key + "' (" +
                                inner->dump() + ") disagree; keep one value");
    text[key] = *outer;
  }
  c.media_token_ids.clear();
  for (const char* key : {"image_token_id", "video_token_id"})
    if (auto id = top.find(key); id != top.end() && !id->is_null()) {
      if (!id->is_number_integer()) return refuse(origin, std::string{"field '"} + key + "' should be an integer, not " + id->dump());
      c.media_token_ids.push_back(id->get<int64_t>());
    }
  std::string skipped;
  for (const auto& [key, value] : top.items())
    if (key != "text_config" && key != "architectures" && key != "model_type" && key != "tie_word_embeddings" &&
        key != "bos_token_id" && key != "eos_token_id")
      skipped += (skipped.empty() ? "" : ", ") + key;
  log::debug(origin + ": a vision-language checkpoint; glint reads its text_config and runs the text model only (not "
                      "read: " + skipped + ")");
  return text;
}

void apply_hybrid_defaults(ModelConfig& c) {
  c.qk_norm = true;
  c.qkv_bias = c.o_bias = false;
  c.attention_gate = true;
  c.unit_offset_norms = true;
  c.partial_rotary_factor = 0.25;
  c.linear_attention = {.num_key_heads = 16, .key_head_dim = 128, .num_value_heads = 32, .value_head_dim = 128,
                        .conv_kernel_dim = 4};
}

caf::error read_hybrid_fields(const json& j, ModelConfig& c, std::set<std::string>& used, const std::string& origin) {
  used.insert({"linear_num_key_heads", "linear_key_head_dim", "linear_num_value_heads", "linear_value_head_dim",
               "linear_conv_kernel_dim", "layer_types", "full_attention_interval", "attn_output_gate",
               "output_gate_type", "mamba_ssm_dtype", "mtp_num_hidden_layers", "mtp_use_dedicated_embeddings"});
  auto& la = c.linear_attention;
  for (auto [key, out] : {std::pair{"linear_num_key_heads", &la.num_key_heads},
                          {"linear_key_head_dim", &la.key_head_dim},
                          {"linear_num_value_heads", &la.num_value_heads},
                          {"linear_value_head_dim", &la.value_head_dim},
                          {"linear_conv_kernel_dim", &la.conv_kernel_dim}})
    if (auto e = read_field(j, key, *out, origin)) return e;

  // Which layers are Gated DeltaNets: layer_types, or every interval-th
  // layer full attention (transformers' derivation when the list is absent).
  c.token_mixers.clear();
  if (auto lt = j.find("layer_types"); lt != j.end() && !lt->is_null()) {
    if (!lt->is_array() || static_cast<int64_t>(lt->size()) != c.num_hidden_layers)
      return refuse(origin, "field 'layer_types' should list one type per layer (num_hidden_layers " +
                                std::to_string(c.num_hidden_layers) + "), not " + lt->dump());
    for (size_t i = 0; i < lt->size(); ++i) {
      const auto& t = (*lt)[i];
      if (t == "linear_attention" || t == "mamba") c.token_mixers.push_back(TokenMixer::gated_deltanet);
      else if (t == "full_attention" || t == "attention") c.token_mixers.push_back(TokenMixer::attention);
      else
        return unsupported(origin, "field 'layer_types' has " + t.dump() + " for layer " + std::to_string(i) +
                                       " (the Qwen3.5 family's layers are linear_attention or full_attention)");
    }
  } else {
    int64_t interval = 4;
    if (auto e = read_field(j, "full_attention_interval", interval, origin)) return e;
    if (interval <= 0)
      return refuse(origin, "field 'full_attention_interval' must be positive, not " + std::to_string(interval));
    for (int64_t l = 0; l < c.num_hidden_layers; ++l)
      c.token_mixers.push_back((l + 1) % interval == 0 ? TokenMixer::attention : TokenMixer::gated_deltanet);
  }

  // Fields transformers' modeling never reads: accepted with the value it
  // computes as, refused with any other (the file would mean something
  // transformers does not do).
  bool gate = true;
  if (auto e = read_field(j, "attn_output_gate", gate, origin)) return e;
  if (!gate)
    return unsupported(origin, "field 'attn_output_gate' is false; transformers' Qwen3.5 gates every attention output "
                               "whatever this field says, and glint computes what transformers does (remove the field, "
                               "or set it true)");
  std::string gate_type = "swish";
  if (auto e = read_field(j, "output_gate_type", gate_type, origin)) return e;
  if (gate_type != "swish" && gate_type != "silu")
    return unsupported(origin, "field 'output_gate_type' is '" + gate_type +
                                   "'; the Gated DeltaNet's output gate is silu (swish) in transformers");
  std::string ssm_dtype = "float32";
  if (auto e = read_field(j, "mamba_ssm_dtype", ssm_dtype, origin)) return e;
  if (ssm_dtype != "float32" && ssm_dtype != "bfloat16" && ssm_dtype != "float16")
    return refuse(origin, "field 'mamba_ssm_dtype' is '" + ssm_dtype + "', not float32, bfloat16 or float16");
  int64_t mtp_layers = 0;
  if (auto e = read_field(j, "mtp_num_hidden_layers", mtp_layers, origin)) return e;
  if (mtp_layers > 0)
    log::debug(origin + ": the multi-token-prediction head (mtp_num_hidden_layers " + std::to_string(mtp_layers) +
               ") is a draft model transformers does not run either; glint leaves its mtp.* tensors out");
  bool mtp_dedicated = false;
  if (auto e = read_field(j, "mtp_use_dedicated_embeddings", mtp_dedicated, origin)) return e;
  return caf::none;
}

void write_hybrid_fields(const ModelConfig& c, json& j) {
  const auto& la = c.linear_attention;
  j["linear_num_key_heads"] = la.num_key_heads;
  j["linear_key_head_dim"] = la.key_head_dim;
  j["linear_num_value_heads"] = la.num_value_heads;
  j["linear_value_head_dim"] = la.value_head_dim;
  j["linear_conv_kernel_dim"] = la.conv_kernel_dim;
  json types = json::array();
  for (auto m : c.token_mixers) types.push_back(m == TokenMixer::gated_deltanet ? "linear_attention" : "full_attention");
  j["layer_types"] = types;
  j["partial_rotary_factor"] = c.partial_rotary_factor;
  j["rope_parameters"]["partial_rotary_factor"] = c.partial_rotary_factor;
  j["attn_output_gate"] = true;
}

caf::error validate_hybrid(const ModelConfig& c) {
  auto bad = [](std::string what) { return make_error(errc::invalid_argument, std::move(what)); };
  if (!(c.partial_rotary_factor > 0 && c.partial_rotary_factor <= 1))
    return bad("partial_rotary_factor must lie in (0, 1], not " + std::to_string(c.partial_rotary_factor));
  const int64_t rot = c.rotary_dim();
  if (rot < 2 || rot % 2 != 0)
    return bad("RoPE rotates int(head_dim x partial_rotary_factor) = " + std::to_string(rot) +
               " dimensions of each head; that must be a positive even number (head_dim " + std::to_string(c.head_dim) +
               ", partial_rotary_factor " + std::to_string(c.partial_rotary_factor) + ")");
  if (!is_hybrid(c.architecture)) {
    if (!c.token_mixers.empty() || c.attention_gate || c.unit_offset_norms)
      return bad(std::string{hf_class_name(c.architecture)} +
                 " has neither Gated DeltaNet layers nor gated attention nor (1 + w) norms");
    return caf::none;
  }
  if (static_cast<int64_t>(c.token_mixers.size()) != c.num_hidden_layers)
    return bad("the Qwen3.5 family needs one layer type per layer (" + std::to_string(c.num_hidden_layers) + "), not " +
               std::to_string(c.token_mixers.size()));
  if (!c.qk_norm || !c.attention_gate || !c.unit_offset_norms)
    return bad("the Qwen3.5 family's attention has q/k norms and an output gate, and its norms scale by (1 + w)");
  if (c.sliding_window > 0) return bad("the Qwen3.5 family has no sliding-window attention");
  if (!c.has_linear_attention()) return caf::none;
  const auto& la = c.linear_attention;
  for (auto [name, v] : {std::pair{"linear_num_key_heads", la.num_key_heads}, {"linear_key_head_dim", la.key_head_dim},
                         {"linear_num_value_heads", la.num_value_heads}, {"linear_value_head_dim", la.value_head_dim}})
    if (v <= 0 || v > (int64_t{1} << 12))
      return bad(std::string{name} + " must lie in [1, 4096], not " + std::to_string(v));
  if (la.conv_kernel_dim <= 0 || la.conv_kernel_dim > 64)
    return bad("linear_conv_kernel_dim must lie in [1, 64] (the short conv's width; Qwen3.5: 4), not " +
               std::to_string(la.conv_kernel_dim));
  if (la.num_value_heads % la.num_key_heads != 0)
    return bad("linear_num_value_heads (" + std::to_string(la.num_value_heads) +
               ") must be a multiple of linear_num_key_heads (" + std::to_string(la.num_key_heads) +
               "): each key head serves the same number of value heads");
  return caf::none;
}

int64_t gated_deltanet_parameters(const ModelConfig& c) {
  const auto& la = c.linear_attention;
  const int64_t h = c.hidden_size;
  return la.conv_dim() * h + la.value_dim() * h + 2 * la.num_value_heads * h + la.conv_dim() * la.conv_kernel_dim +
         2 * la.num_value_heads + la.value_head_dim + h * la.value_dim();
}

}  // namespace glint::components::model_detail
