#include "components/model/config.hpp"
#include "components/model/config_field.hpp"
#include "components/model/hybrid_config.hpp"
#include "components/model/moe_config.hpp"

#include "runtime/file.hpp"
#include "runtime/log.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <filesystem>
#include <set>
#include <tuple>

namespace glint::components {

using json = nlohmann::json;

std::string_view hf_class_name(Architecture a) {
  switch (a) {
    case Architecture::llama: return "LlamaForCausalLM";
    case Architecture::qwen2: return "Qwen2ForCausalLM";
    case Architecture::qwen3: return "Qwen3ForCausalLM";
    case Architecture::qwen2_moe: return "Qwen2MoeForCausalLM";
    case Architecture::qwen3_moe: return "Qwen3MoeForCausalLM";
    case Architecture::qwen3_5: return "Qwen3_5ForCausalLM";
    case Architecture::qwen3_5_moe: return "Qwen3_5MoeForCausalLM";
  }
  return "?";
}

Result<Architecture> parse_architecture(std::string_view name) {
  if (name == "LlamaForCausalLM" || name == "llama") return Architecture::llama;
  if (name == "Qwen2ForCausalLM" || name == "qwen2") return Architecture::qwen2;
  if (name == "Qwen3ForCausalLM" || name == "qwen3") return Architecture::qwen3;
  if (name == "Qwen2MoeForCausalLM" || name == "qwen2_moe") return Architecture::qwen2_moe;
  if (name == "Qwen3MoeForCausalLM" || name == "qwen3_moe") return Architecture::qwen3_moe;
  // Qwen3.6 uses Qwen3.5's classes and model_type.
  if (name == "Qwen3_5ForConditionalGeneration" || name == "Qwen3_5ForCausalLM" || name == "qwen3_5" ||
      name == "qwen3_5_text")
    return Architecture::qwen3_5;
  if (name == "Qwen3_5MoeForConditionalGeneration" || name == "Qwen3_5MoeForCausalLM" || name == "qwen3_5_moe" ||
      name == "qwen3_5_moe_text")
    return Architecture::qwen3_5_moe;
  if (name == "Qwen3NextForCausalLM" || name == "qwen3_next")
    return make_error(errc::unimplemented,
                      "architecture '" + std::string{name} +
                          "' is not supported: Qwen3-Next fuses its Gated DeltaNet projections per key head "
                          "(in_proj_qkvz, in_proj_ba) and glint reads Qwen3.5's layout only");
  return make_error(errc::unimplemented, "architecture '" + std::string{name} +
                                             "' is not supported; glint loads LlamaForCausalLM, Qwen2ForCausalLM, "
                                             "Qwen3ForCausalLM, Qwen2MoeForCausalLM, Qwen3MoeForCausalLM and the "
                                             "Qwen3.5 / Qwen3.6 family (Qwen3_5ForConditionalGeneration, "
                                             "Qwen3_5MoeForConditionalGeneration and their ForCausalLM text models)");
}

bool is_moe(Architecture a) {
  return a == Architecture::qwen2_moe || a == Architecture::qwen3_moe || a == Architecture::qwen3_5_moe;
}

bool is_hybrid(Architecture a) { return a == Architecture::qwen3_5 || a == Architecture::qwen3_5_moe; }

FeedForward ModelConfig::feed_forward(int64_t layer) const {
  if (!is_moe(architecture) || moe.num_experts <= 0 || moe.decoder_sparse_step <= 0) return FeedForward::dense;
  if ((layer + 1) % moe.decoder_sparse_step != 0) return FeedForward::dense;
  if (std::find(moe.mlp_only_layers.begin(), moe.mlp_only_layers.end(), layer) != moe.mlp_only_layers.end())
    return FeedForward::dense;
  return FeedForward::sparse;
}

bool ModelConfig::has_experts() const {
  for (int64_t l = 0; l < num_hidden_layers; ++l)
    if (feed_forward(l) == FeedForward::sparse) return true;
  return false;
}

Result<Activation> parse_activation(std::string_view name) {
  if (name == "silu" || name == "swish") return Activation::silu;
  if (name == "gelu") return Activation::gelu;
  if (name == "gelu_pytorch_tanh" || name == "gelu_new" || name == "gelu_fast") return Activation::gelu_tanh;
  if (name == "relu") return Activation::relu;
  return make_error(errc::unimplemented, "activation '" + std::string{name} +
                                             "' is not supported (glint computes silu, swish, gelu, gelu_new, "
                                             "gelu_pytorch_tanh, gelu_fast and relu)");
}

std::string_view activation_name(Activation a) {
  switch (a) {
    case Activation::silu: return "silu";
    case Activation::gelu: return "gelu";
    case Activation::gelu_tanh: return "gelu_pytorch_tanh";
    case Activation::relu: return "relu";
  }
  return "?";
}

std::string_view model_type(Architecture a) {
  switch (a) {
    case Architecture::llama: return "llama";
    case Architecture::qwen2: return "qwen2";
    case Architecture::qwen3: return "qwen3";
    case Architecture::qwen2_moe: return "qwen2_moe";
    case Architecture::qwen3_moe: return "qwen3_moe";
    case Architecture::qwen3_5: return "qwen3_5_text";
    case Architecture::qwen3_5_moe: return "qwen3_5_moe_text";
  }
  return "?";
}

namespace {

// Qwen2-MoE's attention is Qwen2's, Qwen3-MoE's is Qwen3's.
bool qwen2_like(Architecture a) { return a == Architecture::qwen2 || a == Architecture::qwen2_moe; }
bool qwen3_like(Architecture a) { return a == Architecture::qwen3 || a == Architecture::qwen3_moe; }

void apply_architecture_defaults(ModelConfig& c) {
  c.qk_norm = qwen3_like(c.architecture);
  c.qkv_bias = qwen2_like(c.architecture);
  c.o_bias = false;
  c.mlp_bias = false;
  c.moe = is_moe(c.architecture) ? model_detail::default_moe(c.architecture) : MoeConfig{};
  c.token_mixers.clear();
  c.linear_attention = {};
  c.partial_rotary_factor = 1.0;
  c.attention_gate = c.unit_offset_norms = false;
  if (is_hybrid(c.architecture)) model_detail::apply_hybrid_defaults(c);
}

}  // namespace

ModelConfig ModelConfig::make(Architecture a, int64_t vocab, int64_t hidden, int64_t intermediate, int64_t layers,
                              int64_t heads, int64_t kv_heads, int64_t head_dim) {
  ModelConfig c;
  c.architecture = a;
  apply_architecture_defaults(c);
  c.vocab_size = vocab;
  c.hidden_size = hidden;
  c.intermediate_size = intermediate;
  c.num_hidden_layers = layers;
  c.num_attention_heads = heads;
  c.num_key_value_heads = kv_heads;
  c.head_dim = head_dim > 0 ? head_dim : (heads > 0 ? hidden / heads : 0);
  c.rope_theta = a == Architecture::llama ? 10000.0 : is_hybrid(a) ? 10000000.0 : 1000000.0;
  c.rms_norm_eps = a == Architecture::llama ? 1e-5 : 1e-6;
  if (is_hybrid(a)) {
    // transformers' layout, every fourth layer full attention; a model of
    // fewer layers keeps its last one full.
    const int64_t interval = std::clamp<int64_t>(layers, 1, 4);
    for (int64_t l = 0; l < layers; ++l)
      c.token_mixers.push_back((l + 1) % interval == 0 ? TokenMixer::attention : TokenMixer::gated_deltanet);
  }
  return c;
}

namespace {

// eos_token_id as config.json and generation_config.json write it: a number,
// a list of numbers, or absent / null (none).
Result<std::vector<int64_t>> eos_ids_of(const json& j, const std::string& origin) {
  auto e = j.find("eos_token_id");
  if (e == j.end() || e->is_null()) return std::vector<int64_t>{};
  if (e->is_number_integer()) return std::vector<int64_t>{e->get<int64_t>()};
  if (e->is_array() && std::all_of(e->begin(), e->end(), [](const json& x) { return x.is_number_integer(); }))
    return e->get<std::vector<int64_t>>();
  return make_error(errc::invalid_argument, origin + ": field 'eos_token_id' should be an integer or a list of "
                                                     "integers, not " + e->dump());
}

}  // namespace

Result<ModelConfig> ModelConfig::parse(const std::string& text, const std::string& origin) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {  // parse_error, or out_of_range for a number like 1e999
    return make_error(errc::invalid_argument, origin + " is not valid JSON: " + e.what());
  }
  if (!j.is_object()) return make_error(errc::invalid_argument, origin + " should hold a JSON object");
  ModelConfig c;
  std::string arch_name;
  if (auto a = j.find("architectures"); a != j.end() && a->is_array() && !a->empty() && (*a)[0].is_string())
    arch_name = (*a)[0].get<std::string>();
  else if (auto m = j.find("model_type"); m != j.end() && m->is_string())
    arch_name = m->get<std::string>();
  else
    return make_error(errc::invalid_argument, origin + " names no architecture (\"architectures\" or \"model_type\")");
  auto arch = parse_architecture(arch_name);
  if (!arch) return with_context(arch.error(), origin);
  c.architecture = *arch;
  apply_architecture_defaults(c);
  const bool hybrid = is_hybrid(c.architecture);
  if (hybrid) {  // a vision-language checkpoint's decoder is its text_config
    auto text = model_detail::text_config_of(j, c, origin);
    if (!text) return text.error();
    j = std::move(*text);
  }
  // The families with sliding-window fields (Qwen2, Qwen3 and their MoE).
  const bool qwen = c.architecture != Architecture::llama && !hybrid;

  // The fields read below; every other one goes to extra_json.
  std::set<std::string> used = {"architectures", "model_type", "vocab_size", "hidden_size", "intermediate_size",
                                "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim",
                                "rms_norm_eps", "rope_theta", "rope_scaling", "rope_parameters",
                                "partial_rotary_factor", "tie_word_embeddings", "max_position_embeddings",
                                "torch_dtype", "dtype", "bos_token_id", "eos_token_id", "hidden_act",
                                "attention_dropout", "initializer_range", "quantization_config"};
  // transformers' Qwen2 always has q/k/v biases and reads no attention_bias;
  // its Llama reads no sliding window.
  if (!qwen2_like(c.architecture)) used.insert("attention_bias");
  if (c.architecture == Architecture::qwen2_moe) used.insert("qkv_bias");
  if (c.architecture == Architecture::llama) used.insert("mlp_bias");
  if (hybrid) used.insert("text_config");
  if (qwen) used.insert({"use_sliding_window", "sliding_window", "max_window_layers", "layer_types"});

  bool attention_bias = qwen2_like(c.architecture);
  std::string torch_dtype = "float32", hidden_act = "silu";
  double attention_dropout = 0.0, partial_rotary_factor = c.partial_rotary_factor;
  caf::error err;
  auto field = [&](const char* key, auto& out) {
    if (!err) err = model_detail::read_field(j, key, out, origin);
  };
  field("vocab_size", c.vocab_size);
  field("hidden_size", c.hidden_size);
  field("intermediate_size", c.intermediate_size);
  field("num_hidden_layers", c.num_hidden_layers);
  field("num_attention_heads", c.num_attention_heads);
  c.num_key_value_heads = 0;
  field("num_key_value_heads", c.num_key_value_heads);
  field("head_dim", c.head_dim);
  field("rms_norm_eps", c.rms_norm_eps);
  field("tie_word_embeddings", c.tie_word_embeddings);
  field("max_position_embeddings", c.max_position_embeddings);
  field("torch_dtype", torch_dtype);
  field("dtype", torch_dtype);  // current transformers' name; wins over torch_dtype
  field("hidden_act", hidden_act);
  field("attention_dropout", attention_dropout);
  field("partial_rotary_factor", partial_rotary_factor);
  field("initializer_range", c.initializer_range);
  if (!qwen2_like(c.architecture)) field("attention_bias", attention_bias);
  // Qwen2MoeConfig (transformers 5) has qkv_bias, default true.
  if (c.architecture == Architecture::qwen2_moe) field("qkv_bias", attention_bias);
  if (c.architecture == Architecture::llama) field("mlp_bias", c.mlp_bias);
  bool use_sliding_window = false;
  int64_t sliding_window = 4096;
  bool window_null = false;  // "sliding_window": null: transformers then has no window at all
  if (qwen) {
    field("use_sliding_window", use_sliding_window);
    field("sliding_window", sliding_window);
    field("max_window_layers", c.max_window_layers);
    if (auto w = j.find("sliding_window"); w != j.end() && w->is_null()) window_null = true;
  }
  if (auto b = j.find("bos_token_id"); b != j.end() && b->is_number_integer()) c.bos_token_id = b->get<int64_t>();
  if (auto ids = eos_ids_of(j, origin); !ids) return ids.error();
  else c.eos_token_ids = std::move(*ids);
  if (err) return err;
  for (auto* key : {"vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads"})
    // An MoE family's dense width has transformers' default (it is used
    // only by the layers that are not sparse).
    if (!j.contains(key) && !(is_moe(c.architecture) && std::string_view{key} == "intermediate_size"))
      return make_error(errc::invalid_argument, origin + " lacks the field '" + key + "'");
  if (is_moe(c.architecture) && !j.contains("intermediate_size"))
    // Qwen3.5-MoE has no dense layer and no such field: a placeholder.
    c.intermediate_size = c.architecture == Architecture::qwen3_moe   ? 6144
                          : c.architecture == Architecture::qwen2_moe ? 5632
                                                                      : 512;
  if (is_moe(c.architecture))
    if (auto e = model_detail::read_moe_fields(j, c, used, origin)) return e;
  if (hybrid)
    if (auto e = model_detail::read_hybrid_fields(j, c, used, origin)) return e;
  if (c.num_key_value_heads == 0) c.num_key_value_heads = c.num_attention_heads;
  if (c.head_dim == 0) {
    // transformers' defaults: Qwen3Config(head_dim=128); Llama, Qwen2 and
    // both MoE families (Qwen3MoeConfig has no head_dim default) derive it
    // from the hidden size.
    if (c.architecture == Architecture::qwen3) c.head_dim = 128;
    else if (hybrid) c.head_dim = 256;  // Qwen3_5TextConfig's
    else if (c.num_attention_heads > 0) c.head_dim = c.hidden_size / c.num_attention_heads;
  }
  if (qwen2_like(c.architecture)) {
    c.qkv_bias = attention_bias;  // Qwen2: always; Qwen2-MoE: qkv_bias
    c.o_bias = false;
  } else {
    c.qkv_bias = c.o_bias = attention_bias;
  }
  auto refuse = [&](const std::string& what) { return make_error(errc::invalid_argument, origin + ": " + what); };
  auto unsupported = [&](const std::string& what) { return make_error(errc::unimplemented, origin + ": " + what); };

  auto act = parse_activation(hidden_act);
  if (!act) return with_context(act.error(), origin + ": field 'hidden_act'");
  c.hidden_act = *act;
  if (attention_dropout != 0.0)
    return unsupported("field 'attention_dropout' is " + json(attention_dropout).dump() +
                       "; glint trains without dropout on attention weights (only 0.0 is supported)");
  if (partial_rotary_factor != 1.0 && !hybrid)
    return unsupported("field 'partial_rotary_factor' is " + json(partial_rotary_factor).dump() +
                       "; glint rotates every dimension of a head (only 1.0 is supported)");
  c.partial_rotary_factor = partial_rotary_factor;
  if (auto q = j.find("quantization_config"); q != j.end() && !q->is_null())
    return unsupported("field 'quantization_config' is " + q->dump() +
                       ": quantized weights are not supported; use the model's float16, bfloat16 or float32 weights");

  // RoPE: rope_parameters (current transformers) or rope_theta + rope_scaling.
  double theta = 10000.0;  // LlamaConfig's, Qwen2Config's and Qwen3Config's default
  const json* scaling = nullptr;
  std::string scaling_field = "rope_scaling";
  if (auto rp = j.find("rope_parameters"); rp != j.end() && !rp->is_null()) {
    if (!rp->is_object()) return refuse("field 'rope_parameters' should be an object, not " + rp->dump());
    if (auto t = rp->find("rope_theta"); t != rp->end()) {
      if (!t->is_number()) return refuse("field 'rope_parameters.rope_theta' should be a number, not " + t->dump());
      theta = t->get<double>();
    } else if (auto top = j.find("rope_theta"); top != j.end() && top->is_number()) {
      theta = top->get<double>();
    }
    if (auto f = rp->find("partial_rotary_factor"); f != rp->end() && !f->is_null()) {
      if (!f->is_number())
        return refuse("field 'rope_parameters.partial_rotary_factor' should be a number, not " + f->dump());
      if (!hybrid && f->get<double>() != 1.0)
        return unsupported("field 'rope_parameters.partial_rotary_factor' is " + f->dump() +
                           "; glint rotates every dimension of a head (only 1.0 is supported)");
      // transformers moves a top-level factor into rope_parameters: two
      // values would leave one of them ignored.
      if (auto top = j.find("partial_rotary_factor"); top != j.end() && top->is_number() && *top != *f)
        return refuse("fields 'partial_rotary_factor' (" + top->dump() + ") and 'rope_parameters.partial_rotary_factor' (" +
                      f->dump() + ") disagree; keep one of them");
      c.partial_rotary_factor = f->get<double>();
    }
    // Qwen3.5's multimodal RoPE (mrope_section, mrope_interleaved) is, for
    // text, exactly RoPE: its three position rows are each the token's index
    // (reference/model-families.md 3.4); image and video input is refused.
    if (auto t = rp->find("rope_theta"); hybrid && (t == rp->end() || t->is_null()) && !j.contains("rope_theta"))
      return refuse("field 'rope_parameters' gives no rope_theta; the Qwen3.5 family's config must (every "
                    "shipped model has 10000000)");
    scaling = &*rp;
    scaling_field = "rope_parameters";
    // A legacy rope_scaling beside it must say the same, or one of the two
    // would be silently ignored.
    if (auto rs = j.find("rope_scaling"); rs != j.end() && !rs->is_null()) {
      if (!rs->is_object()) return refuse("field 'rope_scaling' should be an object or null, not " + rs->dump());
      auto type_of = [](const json& o) {
        auto t = o.find("rope_type");
        if (t == o.end() || t->is_null()) t = o.find("type");
        return t == o.end() || t->is_null() ? json("default") : *t;
      };
      if (type_of(*rs) != type_of(*rp))
        return refuse("fields 'rope_parameters' (" + rp->dump() + ") and 'rope_scaling' (" + rs->dump() +
                      ") disagree on the rope type; keep one of them");
      for (const auto& [key, v] : rs->items()) {
        if (key == "type" || key == "rope_type" || v.is_null()) continue;  // compared above; null says nothing
        const auto* other = rp->contains(key) && !(*rp)[key].is_null() ? &(*rp)[key] : nullptr;
        // An absent factor is 1; numbers compare by value (8 == 8.0).
        const bool same = other ? *other == v : key == "factor" && v == 1;
        if (!same)
          return refuse("fields 'rope_parameters' (" + rp->dump() + ") and 'rope_scaling' (" + rs->dump() +
                        ") disagree on '" + key + "'; keep one of them");
      }
    }
  } else {
    if (hybrid && !j.contains("rope_theta"))
      return refuse("lacks rope_parameters.rope_theta (or rope_theta); the Qwen3.5 family's config must give it "
                    "(every shipped model has 10000000)");
    field("rope_theta", theta);
    if (err) return err;
    if (auto rs = j.find("rope_scaling"); rs != j.end() && !rs->is_null()) {
      if (!rs->is_object()) return refuse("field 'rope_scaling' should be an object or null, not " + rs->dump());
      scaling = &*rs;
    }
  }
  c.rope_theta = theta;
  if (scaling) {
    std::string type = "default";
    if (auto t = scaling->find("rope_type"); t != scaling->end() && t->is_string()) type = t->get<std::string>();
    else if (auto t2 = scaling->find("type"); t2 != scaling->end() && t2->is_string()) type = t2->get<std::string>();
    auto number = [&](const char* key, auto& out) -> caf::error {
      // An integer field takes integers only: a float outside int64's
      // range has no conversion (undefined behaviour, found by fuzzing).
      constexpr bool integral = std::is_integral_v<std::remove_reference_t<decltype(out)>>;
      auto f = scaling->find(key);
      if (f == scaling->end() || !(integral ? f->is_number_integer() : f->is_number()))
        return refuse("field '" + scaling_field + "." + key + "' of rope type " + type + " should be " +
                      (integral ? "an integer" : "a number") + ", not " +
                      (f == scaling->end() ? std::string{"absent"} : f->dump()));
      out = f->template get<std::remove_reference_t<decltype(out)>>();
      return caf::none;
    };
    if (type == "linear") {
      c.rope_scaling.type = RopeScaling::Type::linear;
      if (auto e = number("factor", c.rope_scaling.factor)) return e;
    } else if (type == "llama3") {
      c.rope_scaling.type = RopeScaling::Type::llama3;
      if (auto e = number("factor", c.rope_scaling.factor)) return e;
      if (auto e = number("low_freq_factor", c.rope_scaling.low_freq_factor)) return e;
      if (auto e = number("high_freq_factor", c.rope_scaling.high_freq_factor)) return e;
      if (auto e = number("original_max_position_embeddings", c.rope_scaling.original_max_position_embeddings)) return e;
    } else if (type != "default") {
      return unsupported("field '" + scaling_field + "' has rope type '" + type +
                         "', which glint does not support (it supports default, linear and llama3)");
    }
  }

  // Sliding window, as transformers' Qwen2Config and Qwen3Config derive it:
  // the window exists only with use_sliding_window; layer_types, when given,
  // says which layers use it, else the layers from max_window_layers on.
  if (qwen) {
    if (use_sliding_window && !window_null) {
      if (sliding_window <= 0)
        return refuse("field 'sliding_window' is " + std::to_string(sliding_window) +
                      "; with use_sliding_window it must be a positive number of positions");
      c.sliding_window = sliding_window;
    }
    c.sliding_layers.clear();
    if (auto lt = j.find("layer_types"); lt != j.end() && !lt->is_null()) {
      if (!lt->is_array() || static_cast<int64_t>(lt->size()) != c.num_hidden_layers)
        return refuse("field 'layer_types' should list one type per layer (" + std::to_string(c.num_hidden_layers) +
                      "), not " + lt->dump());
      for (size_t i = 0; i < lt->size(); ++i) {
        const auto& t = (*lt)[i];
        if (t == "sliding_attention") {
          if (c.sliding_window == 0)
            return refuse("field 'layer_types' marks layer " + std::to_string(i) +
                          " sliding_attention, but there is no window (use_sliding_window is false or absent)");
          c.sliding_layers.push_back(true);
        } else if (t == "full_attention") {
          c.sliding_layers.push_back(false);
        } else {
          return unsupported("field 'layer_types' has " + t.dump() + " for layer " + std::to_string(i) +
                             " (glint supports full_attention and sliding_attention)");
        }
      }
    } else if (c.sliding_window > 0) {
      for (int64_t l = 0; l < c.num_hidden_layers; ++l) c.sliding_layers.push_back(l >= c.max_window_layers);
    }
    if (c.sliding_window > 0 && std::none_of(c.sliding_layers.begin(), c.sliding_layers.end(), [](bool b) { return b; }))
      c.sliding_window = 0, c.sliding_layers.clear();  // a window no layer uses
  }

  if (torch_dtype == "float32") c.dtype = Dtype::f32;
  else if (torch_dtype == "bfloat16") c.dtype = Dtype::bf16;
  else if (torch_dtype == "float16") c.dtype = Dtype::f16;
  else
    return refuse("field '" + std::string{j.contains("dtype") ? "dtype" : "torch_dtype"} + "' is '" + torch_dtype +
                  "', not one of float32, bfloat16, float16");

  json extra = json::object();
  std::string names;
  for (const auto& [key, value] : j.items())
    if (!used.contains(key)) {
      extra[key] = value;
      names += (names.empty() ? "" : ", ") + key;
    }
  c.extra_json = extra.dump();
  if (!names.empty()) log::debug(origin + ": fields glint does not use (kept when it saves the model): " + names);
  if (auto ok = c.validate(); !ok) return with_context(ok.error(), origin);
  return c;
}

Result<ModelConfig> ModelConfig::load(const std::string& path) {
  auto text = read_text_file(path);
  if (!text)
    return code_of(text.error()) == errc::not_found
               ? make_error(errc::not_found, context_of(text.error()) + ": is this a Hugging Face model directory?")
               : text.error();
  auto c = parse(*text, path);
  if (!c) return c;
  // generation_config.json beside it: its eos ids end a generation too.
  const auto gen_path = (std::filesystem::path{path}.parent_path() / "generation_config.json").string();
  if (!std::filesystem::exists(gen_path)) return c;
  auto gen_text = read_text_file(gen_path);
  if (!gen_text) return gen_text.error();
  try {
    auto g = json::parse(*gen_text);
    if (!g.is_object()) return make_error(errc::invalid_argument, gen_path + " is not a JSON object");
    auto ids = eos_ids_of(g, gen_path);
    if (!ids) return ids.error();
    for (auto id : *ids) {
      if (id < 0 || id >= c->vocab_size)
        return make_error(errc::invalid_argument, gen_path + ": eos_token_id " + std::to_string(id) +
                                                      " is outside the vocabulary (vocab_size " +
                                                      std::to_string(c->vocab_size) + ")");
      if (!c->is_eos(id)) c->generation_eos_token_ids.push_back(id);
    }
    std::string defaults;
    for (const auto& [key, value] : g.items())
      if (key != "eos_token_id" && key != "transformers_version" && key != "_from_model_config")
        defaults += (defaults.empty() ? "" : ", ") + key + "=" + value.dump();
    if (!defaults.empty())
      log::debug(gen_path + ": sampling defaults glint does not apply (each request sets its own): " + defaults);
  } catch (const json::exception& e) {
    return make_error(errc::invalid_argument, gen_path + " is not valid JSON: " + e.what());
  }
  return c;
}

std::string ModelConfig::to_json() const {
  json j;
  j["architectures"] = {std::string{hf_class_name(architecture)}};
  j["model_type"] = std::string{model_type(architecture)};
  j["vocab_size"] = vocab_size;
  j["hidden_size"] = hidden_size;
  if (architecture != Architecture::qwen3_5_moe) j["intermediate_size"] = intermediate_size;  // it has no dense MLP
  j["num_hidden_layers"] = num_hidden_layers;
  j["num_attention_heads"] = num_attention_heads;
  j["num_key_value_heads"] = num_key_value_heads;
  j["head_dim"] = head_dim;
  j["rms_norm_eps"] = rms_norm_eps;
  // Both spellings of the RoPE settings: older transformers read rope_theta
  // and rope_scaling, current ones rope_parameters.
  json scaling = nullptr;
  switch (rope_scaling.type) {
    case RopeScaling::Type::none: break;
    case RopeScaling::Type::linear: scaling = {{"rope_type", "linear"}, {"factor", rope_scaling.factor}}; break;
    case RopeScaling::Type::llama3:
      scaling = {{"rope_type", "llama3"},
                 {"factor", rope_scaling.factor},
                 {"low_freq_factor", rope_scaling.low_freq_factor},
                 {"high_freq_factor", rope_scaling.high_freq_factor},
                 {"original_max_position_embeddings", rope_scaling.original_max_position_embeddings}};
      break;
  }
  j["rope_theta"] = rope_theta;
  j["rope_scaling"] = scaling;
  json params = scaling.is_null() ? json{{"rope_type", "default"}} : scaling;
  params["rope_theta"] = rope_theta;
  j["rope_parameters"] = params;
  j["tie_word_embeddings"] = tie_word_embeddings;
  j["hidden_act"] = std::string{activation_name(hidden_act)};
  j["initializer_range"] = initializer_range;
  if (!qwen2_like(architecture)) j["attention_bias"] = qkv_bias;
  if (architecture == Architecture::qwen2_moe) j["qkv_bias"] = qkv_bias;
  if (is_moe(architecture)) model_detail::write_moe_fields(*this, j);
  if (architecture == Architecture::llama) j["mlp_bias"] = mlp_bias;
  if (is_hybrid(architecture)) model_detail::write_hybrid_fields(*this, j);
  if (architecture != Architecture::llama && !is_hybrid(architecture)) {
    j["use_sliding_window"] = sliding_window > 0;
    j["sliding_window"] = sliding_window > 0 ? json(sliding_window) : json(nullptr);
    j["max_window_layers"] = max_window_layers;
    if (sliding_window > 0) {
      json types = json::array();
      for (bool s : sliding_layers) types.push_back(s ? "sliding_attention" : "full_attention");
      j["layer_types"] = types;
    }
  }
  j["max_position_embeddings"] = max_position_embeddings;
  const char* dt = dtype == Dtype::bf16 ? "bfloat16" : dtype == Dtype::f16 ? "float16" : "float32";
  j["torch_dtype"] = dt;  // transformers before 4.56
  j["dtype"] = dt;        // and after
  if (bos_token_id >= 0) j["bos_token_id"] = bos_token_id;
  if (eos_token_ids.size() == 1) j["eos_token_id"] = eos_token_ids[0];
  else if (!eos_token_ids.empty()) j["eos_token_id"] = eos_token_ids;
  auto extra = json::parse(extra_json, nullptr, false);
  if (extra.is_object())
    for (const auto& [key, value] : extra.items())
      if (!j.contains(key)) j[key] = value;
  return j.dump(2) + "\n";
}

Result<void> ModelConfig::validate() const {
  auto bad = [](std::string what) { return make_error(errc::invalid_argument, std::move(what)); };
  auto positive = [&](const char* name, int64_t v) -> caf::error {
    if (v <= 0) return bad(std::string{name} + " must be positive, not " + std::to_string(v));
    return caf::none;
  };
  for (auto [name, v] : {std::pair{"vocab_size", vocab_size}, {"hidden_size", hidden_size},
                         {"intermediate_size", intermediate_size}, {"num_hidden_layers", num_hidden_layers},
                         {"num_attention_heads", num_attention_heads}, {"num_key_value_heads", num_key_value_heads},
                         {"head_dim", head_dim}, {"max_position_embeddings", max_position_embeddings}})
    if (auto e = positive(name, v)) return e;
  // Bounds above every model in use (Llama 3.1 405B: hidden 16384, 126
  // layers), so a typo (1e9 layers) is an error here, before any allocation,
  // and the parameter count cannot overflow.
  for (auto [name, v, max] : {std::tuple{"vocab_size", vocab_size, int64_t{1} << 24},
                              {"hidden_size", hidden_size, int64_t{1} << 17},
                              {"intermediate_size", intermediate_size, int64_t{1} << 20},
                              {"num_hidden_layers", num_hidden_layers, int64_t{1} << 12},
                              {"num_attention_heads", num_attention_heads, int64_t{1} << 12},
                              {"head_dim", head_dim, int64_t{1} << 12},
                              {"max_position_embeddings", max_position_embeddings, int64_t{1} << 27}})
    if (v > max)
      return bad(std::string{name} + " " + std::to_string(v) + " is more than glint's bound of " + std::to_string(max) +
                 " (larger than any model in use; is it a typo?)");
  if (num_attention_heads % num_key_value_heads != 0)
    return bad("num_key_value_heads (" + std::to_string(num_key_value_heads) + ") must divide num_attention_heads (" +
               std::to_string(num_attention_heads) + ")");
  if (head_dim % 2 != 0) return bad("head_dim must be even for rotary embeddings, not " + std::to_string(head_dim));
  if (!(rms_norm_eps > 0)) return bad("rms_norm_eps must be positive");
  if (!(rope_theta > 0)) return bad("rope_theta must be positive");
  if (!(rope_scaling.factor > 0)) return bad("the rope scaling factor must be positive");
  if (rope_scaling.type == RopeScaling::Type::llama3 &&
      (!(rope_scaling.low_freq_factor > 0) || !(rope_scaling.high_freq_factor > rope_scaling.low_freq_factor) ||
       rope_scaling.original_max_position_embeddings <= 0))
    return bad("llama3 rope scaling needs 0 < low_freq_factor < high_freq_factor and a positive "
               "original_max_position_embeddings");
  if (sliding_window < 0) return bad("sliding_window must not be negative");
  if (sliding_window > 0 && static_cast<int64_t>(sliding_layers.size()) != num_hidden_layers)
    return bad("a sliding window needs one layer type per layer (" + std::to_string(num_hidden_layers) + "), not " +
               std::to_string(sliding_layers.size()));
  if (!(initializer_range > 0)) return bad("initializer_range must be positive");
  if (auto e = model_detail::validate_moe(*this)) return e;
  if (auto e = model_detail::validate_hybrid(*this)) return e;
  for (auto id : media_token_ids)
    if (id < 0 || id >= vocab_size)
      return bad("image_token_id / video_token_id " + std::to_string(id) + " is outside the vocabulary (vocab_size " +
                 std::to_string(vocab_size) + ")");
  if (auto extra = nlohmann::json::parse(extra_json, nullptr, false); !extra.is_object())
    return bad("extra_json must hold a JSON object");
  return {};
}

int64_t ModelConfig::num_parameters() const {
  int64_t q = num_attention_heads * head_dim, kv = num_key_value_heads * head_dim;
  int64_t attn = hidden_size * q * (attention_gate ? 2 : 1) + 2 * hidden_size * kv + q * hidden_size;
  if (qkv_bias) attn += q + 2 * kv;
  if (o_bias) attn += hidden_size;
  if (qk_norm) attn += 2 * head_dim;
  const int64_t mlp = 3 * hidden_size * intermediate_size + (mlp_bias ? 2 * intermediate_size + hidden_size : 0);
  int64_t layers = 0;
  for (int64_t l = 0; l < num_hidden_layers; ++l)
    layers += (token_mixer(l) == TokenMixer::gated_deltanet ? model_detail::gated_deltanet_parameters(*this) : attn) +
              2 * hidden_size +
              (feed_forward(l) == FeedForward::sparse ? model_detail::sparse_block_parameters(*this) : mlp);
  int64_t emb = vocab_size * hidden_size;
  return layers + hidden_size + emb * (tie_word_embeddings ? 1 : 2);
}

}  // namespace glint::components
