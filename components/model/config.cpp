#include "components/model/config.hpp"

#include <nlohmann/json.hpp>

#include <fstream>
#include <sstream>

namespace glint::components {

using json = nlohmann::json;

std::string_view hf_class_name(Architecture a) {
  switch (a) {
    case Architecture::llama: return "LlamaForCausalLM";
    case Architecture::qwen2: return "Qwen2ForCausalLM";
    case Architecture::qwen3: return "Qwen3ForCausalLM";
  }
  return "?";
}

Result<Architecture> parse_architecture(std::string_view name) {
  if (name == "LlamaForCausalLM" || name == "llama") return Architecture::llama;
  if (name == "Qwen2ForCausalLM" || name == "qwen2") return Architecture::qwen2;
  if (name == "Qwen3ForCausalLM" || name == "qwen3") return Architecture::qwen3;
  return make_error(errc::unimplemented, "architecture '" + std::string{name} +
                                             "' is not supported; glint loads LlamaForCausalLM, Qwen2ForCausalLM "
                                             "and Qwen3ForCausalLM");
}

namespace {

std::string_view model_type(Architecture a) {
  switch (a) {
    case Architecture::llama: return "llama";
    case Architecture::qwen2: return "qwen2";
    case Architecture::qwen3: return "qwen3";
  }
  return "?";
}

void apply_architecture_defaults(ModelConfig& c) {
  c.qk_norm = c.architecture == Architecture::qwen3;
  c.qkv_bias = c.architecture == Architecture::qwen2;
  c.o_bias = false;
  c.mlp_bias = false;
}

// Reads optional field `key` of `j` into `out`, checking its JSON type.
template <class T>
caf::error read(const json& j, const char* key, T& out, const std::string& origin) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return caf::none;
  bool ok = false;
  if constexpr (std::is_same_v<T, bool>) ok = it->is_boolean();
  else if constexpr (std::is_integral_v<T>) ok = it->is_number_integer();
  else if constexpr (std::is_floating_point_v<T>) ok = it->is_number();
  else ok = it->is_string();
  if (!ok)
    return make_error(errc::invalid_argument,
                      origin + ": field '" + key + "' should be a " +
                          (std::is_same_v<T, bool>         ? "boolean"
                           : std::is_integral_v<T>         ? "integer"
                           : std::is_floating_point_v<T> ? "number"
                                                           : "string") +
                          ", not " + it->dump());
  out = it->get<T>();
  return caf::none;
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
  c.rope_theta = a == Architecture::llama ? 10000.0 : 1000000.0;
  c.rms_norm_eps = a == Architecture::llama ? 1e-5 : 1e-6;
  return c;
}

Result<ModelConfig> ModelConfig::parse(const std::string& text, const std::string& origin) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::parse_error& e) {
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

  bool attention_bias = c.architecture == Architecture::qwen2;
  std::string torch_dtype = "float32";
  caf::error err;
  auto field = [&](const char* key, auto& out) {
    if (!err) err = read(j, key, out, origin);
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
  field("rope_theta", c.rope_theta);
  field("tie_word_embeddings", c.tie_word_embeddings);
  field("max_position_embeddings", c.max_position_embeddings);
  field("torch_dtype", torch_dtype);
  if (c.architecture != Architecture::qwen2) field("attention_bias", attention_bias);
  if (c.architecture == Architecture::llama) field("mlp_bias", c.mlp_bias);
  if (auto b = j.find("bos_token_id"); b != j.end() && b->is_number_integer()) c.bos_token_id = b->get<int64_t>();
  if (auto e = j.find("eos_token_id"); e != j.end()) {
    if (e->is_number_integer()) c.eos_token_id = e->get<int64_t>();
    else if (e->is_array() && !e->empty() && (*e)[0].is_number_integer()) c.eos_token_id = (*e)[0].get<int64_t>();
  }
  if (err) return err;
  for (auto* key : {"vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads"})
    if (!j.contains(key)) return make_error(errc::invalid_argument, origin + " lacks the field '" + key + "'");
  if (c.num_key_value_heads == 0) c.num_key_value_heads = c.num_attention_heads;
  if (c.head_dim == 0 && c.num_attention_heads > 0) c.head_dim = c.hidden_size / c.num_attention_heads;
  if (c.architecture == Architecture::qwen2) {
    c.qkv_bias = true;
    c.o_bias = false;
  } else {
    c.qkv_bias = c.o_bias = attention_bias;
  }

  if (auto rs = j.find("rope_scaling"); rs != j.end() && !rs->is_null()) {
    if (!rs->is_object()) return make_error(errc::invalid_argument, origin + ": rope_scaling should be an object or null");
    std::string type;
    if (auto t = rs->find("rope_type"); t != rs->end() && t->is_string()) type = t->get<std::string>();
    else if (auto t2 = rs->find("type"); t2 != rs->end() && t2->is_string()) type = t2->get<std::string>();
    if (type == "linear") {
      auto f = rs->find("factor");
      if (f == rs->end() || !f->is_number())
        return make_error(errc::invalid_argument, origin + ": rope_scaling of type linear needs a numeric factor");
      c.rope_linear_factor = f->get<double>();
    } else if (type != "default") {
      return make_error(errc::unimplemented, origin + ": rope_scaling type '" + type +
                                                 "' is not supported (glint supports none and linear)");
    }
  }

  if (torch_dtype == "float32") c.dtype = Dtype::f32;
  else if (torch_dtype == "bfloat16") c.dtype = Dtype::bf16;
  else if (torch_dtype == "float16") c.dtype = Dtype::f16;
  else
    return make_error(errc::invalid_argument, origin + ": torch_dtype '" + torch_dtype +
                                                  "' is not one of float32, bfloat16, float16");
  if (auto ok = c.validate(); !ok) return with_context(ok.error(), origin);
  return c;
}

Result<ModelConfig> ModelConfig::load(const std::string& path) {
  std::ifstream in{path};
  if (!in)
    return make_error(errc::not_found, "cannot read " + path + ": is this a Hugging Face model directory?");
  std::stringstream ss;
  ss << in.rdbuf();
  return parse(ss.str(), path);
}

std::string ModelConfig::to_json() const {
  json j;
  j["architectures"] = {std::string{hf_class_name(architecture)}};
  j["model_type"] = std::string{model_type(architecture)};
  j["vocab_size"] = vocab_size;
  j["hidden_size"] = hidden_size;
  j["intermediate_size"] = intermediate_size;
  j["num_hidden_layers"] = num_hidden_layers;
  j["num_attention_heads"] = num_attention_heads;
  j["num_key_value_heads"] = num_key_value_heads;
  j["head_dim"] = head_dim;
  j["rms_norm_eps"] = rms_norm_eps;
  j["rope_theta"] = rope_theta;
  j["rope_scaling"] = rope_linear_factor == 1.0 ? json(nullptr) : json{{"rope_type", "linear"}, {"factor", rope_linear_factor}};
  j["tie_word_embeddings"] = tie_word_embeddings;
  j["hidden_act"] = "silu";
  if (architecture != Architecture::qwen2) j["attention_bias"] = qkv_bias;
  if (architecture == Architecture::llama) j["mlp_bias"] = mlp_bias;
  j["max_position_embeddings"] = max_position_embeddings;
  j["torch_dtype"] = dtype == Dtype::bf16 ? "bfloat16" : dtype == Dtype::f16 ? "float16" : "float32";
  if (bos_token_id >= 0) j["bos_token_id"] = bos_token_id;
  if (eos_token_id >= 0) j["eos_token_id"] = eos_token_id;
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
  if (num_attention_heads % num_key_value_heads != 0)
    return bad("num_key_value_heads (" + std::to_string(num_key_value_heads) + ") must divide num_attention_heads (" +
               std::to_string(num_attention_heads) + ")");
  if (head_dim % 2 != 0) return bad("head_dim must be even for rotary embeddings, not " + std::to_string(head_dim));
  if (!(rms_norm_eps > 0)) return bad("rms_norm_eps must be positive");
  if (!(rope_theta > 0)) return bad("rope_theta must be positive");
  if (!(rope_linear_factor > 0)) return bad("rope_scaling factor must be positive");
  return {};
}

int64_t ModelConfig::num_parameters() const {
  int64_t q = num_attention_heads * head_dim, kv = num_key_value_heads * head_dim;
  int64_t attn = hidden_size * q + 2 * hidden_size * kv + q * hidden_size;
  if (qkv_bias) attn += q + 2 * kv;
  if (o_bias) attn += hidden_size;
  if (qk_norm) attn += 2 * head_dim;
  int64_t mlp = 3 * hidden_size * intermediate_size + (mlp_bias ? 2 * intermediate_size + hidden_size : 0);
  int64_t layer = attn + mlp + 2 * hidden_size;
  int64_t emb = vocab_size * hidden_size;
  return num_hidden_layers * layer + hidden_size + emb * (tie_word_embeddings ? 1 : 2);
}

}  // namespace glint::components
