// LoRA adapters on a CausalLM, in PEFT's layout and with PEFT's meaning for
// every adapter_config.json field (peft/tuners/tuners_utils.py
// check_target_module_exists, peft/utils/other.py get_pattern_key,
// peft/tuners/lora/{config,model,layer}.py).
#include "components/model/transformer.hpp"

#include "components/tensor/torch_bridge.hpp"
#include "runtime/file.hpp"
#include "runtime/log.hpp"
#include "runtime/text.hpp"

#include <ATen/CPUGeneratorImpl.h>
#include <c10/core/GradMode.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <regex>
#include <set>

namespace glint::components {

namespace fs = std::filesystem;
using json = nlohmann::ordered_json;  // keeps the file's order: patterns match first-key-first

namespace {

constexpr const char* peft_prefix = "base_model.model.";
const std::vector<std::string> all_linear = {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
                                             "self_attn.o_proj", "mlp.gate_proj",    "mlp.up_proj",
                                             "mlp.down_proj"};

bool is_all_linear(const LoraConfig& c) {
  return c.target_regex.empty() && c.target_modules.size() == 1 && c.target_modules[0] == "all-linear";
}

// Python's re.fullmatch, in ECMAScript syntax (std::regex: what configs use,
// character classes, alternation, lazy quantifiers, is the same). A pattern
// that does not compile matches nothing; validate() reports it.
bool full_match(const std::string& pattern, const std::string& s) {
  try {
    return std::regex_match(s, std::regex(pattern));
  } catch (const std::regex_error&) {
    return false;
  }
}

caf::error bad_regex(const std::string& field, const std::string& pattern) {
  try {
    std::regex re(pattern);
    return caf::none;
  } catch (const std::regex_error& e) {
    return make_error(errc::invalid_argument, "LoRA " + field + " = \"" + pattern +
                                                  "\" is not a regular expression glint can read (ECMAScript syntax; "
                                                  "Python-only forms such as (?P<name>...) and look-behind are not): " +
                                                  e.what());
  }
}

// PEFT's list form: the module's whole path is a name, or ends in "." + a name.
bool name_or_suffix(const std::vector<std::string>& names, const std::string& path) {
  for (const auto& t : names) {
    if (path == t) return true;
    if (path.size() > t.size() && path.compare(path.size() - t.size(), t.size(), t) == 0 &&
        path[path.size() - t.size() - 1] == '.')
      return true;
  }
  return false;
}

// The layer index of `path` as PEFT finds it: the number after the first
// segment matching a layers_pattern ("model.layers.3.mlp.up_proj": 3), or,
// without a pattern, after the first segment that follows a dot. -1: none.
int64_t layer_index(const LoraConfig& c, const std::string& path) {
  std::vector<std::string> patterns = c.layers_pattern;
  if (patterns.empty()) patterns.push_back("[^.]*");
  for (const auto& p : patterns) {
    try {
      std::smatch m;
      if (std::regex_search(path, m, std::regex("^.*?\\.(?:" + p + ")\\.(\\d+)\\.")))
        return std::stoll(m[1].str());
    } catch (const std::exception&) {
      // A bad pattern (validate refuses it) or an index too big: no layer.
    }
  }
  return -1;
}

// The first pattern key that matches the module's whole path, or its end
// after a "." (PEFT's get_pattern_key).
template <class V>
const V* pattern_value(const std::vector<std::pair<std::string, V>>& patterns, const std::string& path) {
  for (const auto& [key, value] : patterns)
    if (full_match("(?:.*\\.)?(?:" + key + ")", path)) return &value;
  return nullptr;
}

}  // namespace

// -- LoraConfig -----------------------------------------------------------------

double LoraConfig::scaling() const {
  return rslora ? alpha / std::sqrt(static_cast<double>(r)) : alpha / static_cast<double>(r);
}

int64_t LoraConfig::rank_of(const std::string& path) const {
  const auto* v = pattern_value(rank_pattern, path);
  return v ? *v : r;
}

double LoraConfig::alpha_of(const std::string& path) const {
  const auto* v = pattern_value(alpha_pattern, path);
  return v ? *v : alpha;
}

double LoraConfig::scaling_of(const std::string& path) const {
  const auto rank = static_cast<double>(rank_of(path));
  return alpha_of(path) / (rslora ? std::sqrt(rank) : rank);
}

bool LoraConfig::targets(const std::string& path) const {
  if (!exclude_regex.empty() ? full_match(exclude_regex, path) : name_or_suffix(exclude_modules, path)) return false;
  if (!target_regex.empty()) return full_match(target_regex, path);
  if (is_all_linear(*this)) {
    // Every projection of every layer (PEFT: every nn.Linear but the output head).
    static const std::regex projection{R"(model\.layers\.\d+\.(self_attn\.[qkvo]_proj|mlp\.(gate|up|down)_proj))"};
    return std::regex_match(path, projection);
  }
  // A module named by its whole path is taken whatever its layer; one
  // matched by its name is filtered by layers_to_transform (PEFT).
  for (const auto& t : target_modules)
    if (path == t) return true;
  if (!name_or_suffix(target_modules, path)) return false;
  if (layers_to_transform.empty()) return true;
  auto layer = layer_index(*this, path);
  return std::find(layers_to_transform.begin(), layers_to_transform.end(), layer) != layers_to_transform.end();
}

Result<void> LoraConfig::validate() const {
  auto bad = [](const std::string& what) { return make_error(errc::invalid_argument, "LoRA " + what); };
  if (r <= 0) return bad("r must be positive, not " + std::to_string(r));
  if (!(alpha > 0)) return bad("lora_alpha must be positive, not " + std::to_string(alpha));
  if (!(dropout >= 0 && dropout < 1)) return bad("lora_dropout must lie in [0, 1), not " + std::to_string(dropout));
  if (target_regex.empty() && target_modules.empty()) return bad("target_modules is empty");
  if (!target_regex.empty())
    if (auto e = bad_regex("target_modules", target_regex)) return e;
  if (!exclude_regex.empty())
    if (auto e = bad_regex("exclude_modules", exclude_regex)) return e;
  for (const auto& [key, v] : rank_pattern) {
    if (auto e = bad_regex("rank_pattern key", key)) return e;
    if (v <= 0) return bad("rank_pattern[\"" + key + "\"] must be positive, not " + std::to_string(v));
  }
  for (const auto& [key, v] : alpha_pattern) {
    if (auto e = bad_regex("alpha_pattern key", key)) return e;
    if (!(v > 0)) return bad("alpha_pattern[\"" + key + "\"] must be positive, not " + std::to_string(v));
  }
  for (const auto& p : layers_pattern)
    if (auto e = bad_regex("layers_pattern", p)) return e;
  for (auto l : layers_to_transform)
    if (l < 0) return bad("layers_to_transform holds " + std::to_string(l) + ", not a layer index");
  // PEFT's LoraConfig refuses these combinations too.
  if (!layers_pattern.empty() && layers_to_transform.empty())
    return bad("layers_pattern (" + join(layers_pattern) + ") needs layers_to_transform");
  if ((!target_regex.empty() || is_all_linear(*this)) && (!layers_to_transform.empty() || !layers_pattern.empty()))
    return bad("layers_to_transform and layers_pattern apply to a list of target_modules, not to the string " +
               (target_regex.empty() ? std::string{"\"all-linear\""} : "\"" + target_regex + "\""));
  if (!other_fields.empty()) {
    auto j = json::parse(other_fields, nullptr, /*allow_exceptions=*/false);
    if (!j.is_object()) return bad("other_fields is not a JSON object: " + other_fields);
  }
  return {};
}

namespace {

// A value that leaves a field at PEFT's default: null, false, "", [] or {}.
bool is_neutral(const json& v) {
  return v.is_null() || (v.is_boolean() && !v.get<bool>()) || (v.is_string() && v.get<std::string>().empty()) ||
         ((v.is_array() || v.is_object()) && v.empty());
}

// Fields of PEFT's LoraConfig that change nothing glint computes: metadata,
// and settings that act only when the adapter is initialised or on other
// hardware (Megatron, quantisation group size, GPU offload).
const std::set<std::string> harmless_fields = {
    "auto_mapping",  "revision",       "inference_mode", "peft_version", "init_lora_weights", "loftq_config",
    "eva_config",    "corda_config",   "lora_ga_config", "runtime_config", "megatron_config", "megatron_core",
    "qalora_group_size"};

// Fields that change the computation in ways glint does not implement:
// refused unless neutral. What to tell the user about each.
const std::map<std::string, std::string> unsupported_fields = {
    {"fan_in_fan_out", "fan_in_fan_out adapters (GPT-2's Conv1D layout) are not supported"},
    {"use_dora", "DoRA (weight-decomposed LoRA) is not supported"},
    {"modules_to_save", "modules_to_save (fully trained extra modules) is not supported"},
    {"lora_bias", "a trained bias on lora_B is not supported"},
    {"use_qalora", "QALoRA is not supported"},
    {"layer_replication", "layer replication is not supported"},
    {"trainable_token_indices", "trainable token embeddings are not supported"},
    {"target_parameters", "LoRA on parameters (target_parameters) is not supported"},
    {"alora_invocation_tokens", "activated LoRA (alora_invocation_tokens) is not supported"},
    {"use_bdlora", "block-diagonal LoRA is not supported"},
    {"velora_config", "VeLoRA is not supported"},
    {"monteclora_config", "MonteCLoRA is not supported"},
    {"arrow_config", "Arrow routing is not supported"},
    {"kasa_config", "KaSA is not supported"},
};

}  // namespace

Result<LoraConfig> LoraConfig::parse(const std::string& text, const std::string& origin) {
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return make_error(errc::invalid_argument, origin + " is not valid JSON");
  if (!j.is_object()) return make_error(errc::invalid_argument, origin + " is not a JSON object");
  // Every error names the file, the field and its value.
  auto wrong = [&](const std::string& field, const json& v, const std::string& why) {
    return make_error(errc::invalid_argument, origin + ": " + field + " = " + v.dump() + " " + why);
  };
  auto refuse = [&](const std::string& field, const json& v, const std::string& why) {
    return make_error(errc::unimplemented, origin + ": " + field + " = " + v.dump() + ": " + why);
  };
  auto strings = [&](const std::string& field, const json& v) -> Result<std::vector<std::string>> {
    std::vector<std::string> out;
    if (v.is_string()) return std::vector<std::string>{v.get<std::string>()};
    if (!v.is_array()) return wrong(field, v, "should be a string or a list of strings");
    for (const auto& s : v) {
      if (!s.is_string()) return wrong(field, v, "should be a string or a list of strings");
      out.push_back(s.get<std::string>());
    }
    return out;
  };

  LoraConfig c;
  c.alpha = 8;  // PEFT's defaults where a field is absent
  c.target_modules.clear();
  json other = json::object();
  std::vector<std::string> unknown;
  bool has_targets = false;
  for (auto& [field, v] : j.items()) {
    if (field == "peft_type") {
      if (!v.is_null() && v != "LORA") return refuse(field, v, "glint loads LORA adapters only");
      other[field] = v;
    } else if (field == "task_type") {
      if (!v.is_null() && v != "CAUSAL_LM") return refuse(field, v, "glint loads causal-LM (CAUSAL_LM) adapters only");
      other[field] = v;
    } else if (field == "r") {
      if (!v.is_number_integer()) return wrong(field, v, "should be a positive integer");
      c.r = v.get<int64_t>();
    } else if (field == "lora_alpha") {
      if (!v.is_number()) return wrong(field, v, "should be a number");
      c.alpha = v.get<double>();
    } else if (field == "lora_dropout") {
      if (!v.is_number()) return wrong(field, v, "should be a number in [0, 1)");
      c.dropout = v.get<double>();
    } else if (field == "use_rslora") {
      if (!v.is_boolean()) return wrong(field, v, "should be true or false");
      c.rslora = v.get<bool>();
    } else if (field == "target_modules") {
      if (v.is_null())
        return refuse(field, v, "PEFT then picks modules by model type; name them (e.g. [\"q_proj\", \"v_proj\"])");
      has_targets = true;
      if (v.is_string()) {
        auto s = v.get<std::string>();
        std::string lower = s;
        for (auto& ch : lower) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
        if (lower == "all-linear") c.target_modules = {"all-linear"};
        else c.target_regex = s;
      } else {
        auto l = strings(field, v);
        if (!l) return l.error();
        if (l->empty()) return wrong(field, v, "names no module");
        c.target_modules = std::move(*l);
      }
    } else if (field == "exclude_modules") {
      if (v.is_string()) c.exclude_regex = v.get<std::string>();
      else if (!v.is_null()) {
        auto l = strings(field, v);
        if (!l) return l.error();
        c.exclude_modules = std::move(*l);
      }
    } else if (field == "rank_pattern" || field == "alpha_pattern") {
      if (v.is_null()) continue;
      if (!v.is_object()) return wrong(field, v, "should be an object of pattern: value");
      for (auto& [key, value] : v.items()) {
        if (field == "rank_pattern") {
          if (!value.is_number_integer()) return wrong(field + "[\"" + key + "\"]", value, "should be a positive integer");
          c.rank_pattern.emplace_back(key, value.get<int64_t>());
        } else {
          if (!value.is_number()) return wrong(field + "[\"" + key + "\"]", value, "should be a number");
          c.alpha_pattern.emplace_back(key, value.get<double>());
        }
      }
    } else if (field == "layers_to_transform") {
      if (v.is_number_integer()) c.layers_to_transform = {v.get<int64_t>()};
      else if (v.is_array()) {
        for (const auto& l : v) {
          if (!l.is_number_integer()) return wrong(field, v, "should be a layer index or a list of them");
          c.layers_to_transform.push_back(l.get<int64_t>());
        }
      } else if (!v.is_null()) {
        return wrong(field, v, "should be a layer index or a list of them");
      }
    } else if (field == "layers_pattern") {
      if (v.is_null() || (v.is_string() && v.get<std::string>().empty())) continue;
      auto l = strings(field, v);
      if (!l) return l.error();
      c.layers_pattern = std::move(*l);
    } else if (field == "base_model_name_or_path") {
      if (v.is_string()) c.base_model_name_or_path = v.get<std::string>();
      else if (!v.is_null()) return wrong(field, v, "should be a string or null");
    } else if (field == "bias") {
      if (!v.is_null() && v != "none") return refuse(field, v, "trained biases are not supported; glint needs \"none\"");
      other[field] = v;
    } else if (auto it = unsupported_fields.find(field); it != unsupported_fields.end()) {
      if (!is_neutral(v)) return refuse(field, v, it->second);
      other[field] = v;
    } else {
      if (!harmless_fields.count(field)) unknown.push_back(field);
      other[field] = v;
    }
  }
  if (!has_targets) return make_error(errc::invalid_argument, origin + " has no target_modules");
  c.other_fields = other.dump();
  if (!unknown.empty())
    log::debug(origin + ": fields glint does not know, kept as they are when the adapter is saved: " + join(unknown));
  if (auto ok = c.validate(); !ok) return with_context(ok.error(), origin);
  return c;
}

Result<LoraConfig> LoraConfig::load(const std::string& path) {
  auto text = read_text_file(path);
  if (!text)
    return code_of(text.error()) == errc::not_found
               ? make_error(errc::not_found, context_of(text.error()) + ": is this a PEFT adapter directory?")
               : text.error();
  return parse(*text, path);
}

std::string LoraConfig::to_json() const {
  // Keys sorted, as PEFT writes them; pattern objects keep their order,
  // which is what they mean (first match wins).
  std::map<std::string, json> fields;
  if (!other_fields.empty()) {
    auto other = json::parse(other_fields, nullptr, /*allow_exceptions=*/false);
    if (other.is_object())
      for (auto& [k, v] : other.items()) fields[k] = v;
  }
  auto number = [](double x) { return std::floor(x) == x && std::abs(x) < 1e15 ? json(static_cast<int64_t>(x)) : json(x); };
  auto strings_or_one = [](const std::vector<std::string>& v) { return v.size() == 1 ? json(v[0]) : json(v); };
  fields["peft_type"] = "LORA";
  fields.try_emplace("task_type", "CAUSAL_LM");
  fields["r"] = r;
  fields["lora_alpha"] = number(alpha);
  fields["lora_dropout"] = dropout;
  fields["use_rslora"] = rslora;
  fields["target_modules"] = !target_regex.empty() ? json(target_regex)
                             : is_all_linear(*this) ? json("all-linear")
                                                    : json(target_modules);
  fields["exclude_modules"] = !exclude_regex.empty()     ? json(exclude_regex)
                              : !exclude_modules.empty() ? json(exclude_modules)
                                                         : json(nullptr);
  json ranks = json::object(), alphas = json::object();
  for (const auto& [k, v] : rank_pattern) ranks[k] = v;
  for (const auto& [k, v] : alpha_pattern) alphas[k] = number(v);
  fields["rank_pattern"] = ranks;
  fields["alpha_pattern"] = alphas;
  fields["layers_to_transform"] = layers_to_transform.empty() ? json(nullptr) : json(layers_to_transform);
  fields["layers_pattern"] = layers_pattern.empty() ? json(nullptr) : strings_or_one(layers_pattern);
  fields["base_model_name_or_path"] = base_model_name_or_path.empty() ? json(nullptr) : json(base_model_name_or_path);
  // What PEFT writes for an adapter like glint's, where the file had nothing.
  fields.try_emplace("bias", "none");
  fields.try_emplace("fan_in_fan_out", false);
  fields.try_emplace("inference_mode", true);
  fields.try_emplace("init_lora_weights", true);
  fields.try_emplace("modules_to_save", nullptr);
  fields.try_emplace("use_dora", false);
  json out = json::object();
  for (auto& [k, v] : fields) out[k] = std::move(v);
  return out.dump(2) + "\n";
}

// -- adapters on a model -------------------------------------------------------------

std::vector<std::string> CausalLM::Impl::linear_modules() const {
  std::vector<std::string> out;
  for (int64_t l = 0; l < cfg.num_hidden_layers; ++l)
    for (const auto& m : all_linear) out.push_back("model.layers." + std::to_string(l) + "." + m);
  return out;
}

namespace {

// The modules of a Hugging Face Llama / Qwen model besides the projections:
// a config that targets one wants something glint cannot adapt (PEFT would
// adapt lm_head or embed_tokens, and fails on the others).
std::vector<std::string> other_modules(const ModelConfig& c) {
  std::vector<std::string> out = {"model", "model.embed_tokens", "model.layers", "model.norm", "model.rotary_emb",
                                  "lm_head"};
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    auto p = "model.layers." + std::to_string(l);
    for (const char* m : {"", ".self_attn", ".mlp", ".mlp.act_fn", ".input_layernorm", ".post_attention_layernorm"})
      out.push_back(p + m);
    if (c.qk_norm) {
      out.push_back(p + ".self_attn.q_norm");
      out.push_back(p + ".self_attn.k_norm");
    }
  }
  return out;
}

// The projections `cfg` adapts on this model, in model order; an error when
// it targets a module glint cannot adapt, or none. `origin` prefixes errors.
Result<std::vector<std::string>> targeted_modules(const CausalLM::Impl& impl, const LoraConfig& cfg,
                                                  const std::string& origin) {
  auto targets_text = [&] {
    return cfg.target_regex.empty() ? "target_modules " + json(cfg.target_modules).dump()
                                    : "target_modules \"" + cfg.target_regex + "\"";
  };
  std::vector<std::string> unsupported;
  for (const auto& m : other_modules(impl.cfg))
    if (cfg.targets(m)) unsupported.push_back(m);
  if (!unsupported.empty())
    return make_error(errc::unimplemented, origin + targets_text() + " select " + join(unsupported) +
                                               ": glint adapts only the projections (q_proj, k_proj, v_proj, o_proj, "
                                               "gate_proj, up_proj, down_proj)");
  std::vector<std::string> out;
  for (const auto& m : impl.linear_modules())
    if (cfg.targets(m)) out.push_back(m);
  if (out.empty())
    return make_error(errc::invalid_argument,
                      origin + targets_text() +
                          (cfg.layers_to_transform.empty() ? std::string{}
                                                           : " (layers " + join(cfg.layers_to_transform) + ")") +
                          " match no projection of this model; use q_proj, k_proj, v_proj, o_proj, gate_proj, "
                          "up_proj, down_proj or all-linear");
  return out;
}

}  // namespace

Result<const LoraAdapter*> CausalLM::Impl::adapter(const std::string& name) const {
  auto it = adapters.find(name);
  if (it != adapters.end()) return &it->second;
  std::vector<std::string> names;
  for (const auto& [n, a] : adapters) names.push_back(n);
  return make_error(errc::not_found, "no adapter '" + name + "' on this model (adapters: " +
                                         (names.empty() ? std::string{"none"} : join(names)) + ")");
}

Result<void> CausalLM::add_adapter(const std::string& name, const LoraConfig& cfg, uint64_t seed) {
  if (name.empty()) return make_error(errc::invalid_argument, "an adapter needs a name");
  if (auto ok = cfg.validate(); !ok) return ok.error();
  if (impl_->adapters.count(name)) return make_error(errc::failed_precondition, "adapter '" + name + "' exists already");
  auto modules = targeted_modules(*impl_, cfg, "adapter '" + name + "': ");
  if (!modules) return modules.error();
  LoraAdapter a;
  a.cfg = cfg;
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  for (const auto& m : *modules) {
    const auto& w = impl_->param(m + ".weight");
    const int64_t out = w.size(0), in = w.size(1), r = cfg.rank_of(m);
    // PEFT: A ~ kaiming_uniform(a = sqrt(5)) = U(-1/sqrt(in), 1/sqrt(in)); B = 0.
    double bound = 1.0 / std::sqrt(static_cast<double>(in));
    auto A = at::empty({r, in}, w.options()).uniform_(-bound, bound, gen);
    auto B = at::zeros({out, r}, w.options());
    a.modules.push_back(m);
    a.weights[m] = {A, B};
    a.scaling[m] = cfg.scaling_of(m);
  }
  impl_->adapters.emplace(name, std::move(a));
  return {};
}

Result<void> CausalLM::remove_adapter(const std::string& name) {
  auto a = impl_->adapter(name);
  if (!a) return a.error();
  if ((*a)->merged)
    return make_error(errc::failed_precondition, "adapter '" + name + "' is merged into the base; unmerge it first");
  impl_->adapters.erase(name);
  return {};
}

Result<void> CausalLM::rename_adapter(const std::string& from, const std::string& to) {
  if (auto a = impl_->adapter(from); !a) return a.error();
  if (to.empty()) return make_error(errc::invalid_argument, "an adapter needs a name");
  if (impl_->adapters.count(to)) return make_error(errc::failed_precondition, "adapter '" + to + "' exists already");
  auto node = impl_->adapters.extract(from);
  node.key() = to;
  impl_->adapters.insert(std::move(node));
  return {};
}

std::vector<std::string> CausalLM::adapters() const {
  std::vector<std::string> out;
  for (const auto& [n, a] : impl_->adapters) out.push_back(n);
  return out;
}

bool CausalLM::has_adapter(const std::string& name) const { return impl_->adapters.count(name) > 0; }

const LoraConfig* CausalLM::adapter_config(const std::string& name) const {
  auto it = impl_->adapters.find(name);
  return it == impl_->adapters.end() ? nullptr : &it->second.cfg;
}

Result<NamedTensors> CausalLM::adapter_parameters(const std::string& name) const {
  auto a = impl_->adapter(name);
  if (!a) return a.error();
  NamedTensors out;
  for (const auto& m : (*a)->modules) {
    const auto& [A, B] = (*a)->weights.at(m);
    auto a_t = from_torch(A), b_t = from_torch(B);
    if (!a_t) return a_t.error();
    if (!b_t) return b_t.error();
    out.emplace_back(peft_prefix + m + ".lora_A.weight", std::move(*a_t));
    out.emplace_back(peft_prefix + m + ".lora_B.weight", std::move(*b_t));
  }
  return out;
}

Result<void> CausalLM::save_adapter(const std::string& name, const std::string& dir) const {
  auto a = impl_->adapter(name);
  if (!a) return a.error();
  auto tensors = adapter_parameters(name);
  if (!tensors) return tensors.error();
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return make_error(errc::unavailable, "cannot create " + dir + ": " + ec.message());
  auto c = (*a)->cfg;
  if (c.base_model_name_or_path.empty()) c.base_model_name_or_path = impl_->name_or_path;
  auto cfg_path = (fs::path{dir} / "adapter_config.json").string();
  auto tmp = temp_path_for(cfg_path);
  {
    std::ofstream f{tmp};
    f << c.to_json();
    f.flush();
    if (!f) {
      fs::remove(tmp, ec);
      return make_error(errc::unavailable, "cannot write " + cfg_path);
    }
  }
  fs::rename(tmp, cfg_path, ec);
  if (ec) return make_error(errc::unavailable, "cannot write " + cfg_path + ": " + ec.message());
  return write_safetensors((fs::path{dir} / "adapter_model.safetensors").string(), *tensors, {{"format", "pt"}});
}

Result<void> CausalLM::load_adapter(const std::string& name, const std::string& dir) {
  if (name.empty()) return make_error(errc::invalid_argument, "an adapter needs a name");
  if (impl_->adapters.count(name)) return make_error(errc::failed_precondition, "adapter '" + name + "' exists already");
  // Everything is read and checked before the model changes.
  auto cfg_path = (fs::path{dir} / "adapter_config.json").string();
  auto c = LoraConfig::load(cfg_path);
  if (!c) return c.error();
  auto modules = targeted_modules(*impl_, *c, cfg_path + ": ");
  if (!modules) return modules.error();
  auto weights_path = (fs::path{dir} / "adapter_model.safetensors").string();
  if (!fs::exists(weights_path) && fs::exists(fs::path{dir} / "adapter_model.bin"))
    return make_error(errc::unimplemented, dir + " holds adapter_model.bin (a pickle); glint reads "
                                                 "adapter_model.safetensors (save with safe_serialization=True)");
  auto file = SafetensorsFile::open(weights_path);
  if (!file) return file.error();
  LoraAdapter a;
  a.cfg = *c;
  std::set<std::string> expected;
  std::vector<std::string> problems;
  for (const auto& m : *modules) {
    const auto& w = impl_->param(m + ".weight");
    auto key_a = peft_prefix + m + ".lora_A.weight", key_b = peft_prefix + m + ".lora_B.weight";
    expected.insert(key_a);
    expected.insert(key_b);
    bool has_a = file->contains(key_a), has_b = file->contains(key_b);
    if (!has_a || !has_b) {
      problems.push_back(m + " has no " + (has_a ? "lora_B" : has_b ? "lora_A" : "lora_A or lora_B") +
                         " (adapter_config.json targets it)");
      continue;
    }
    auto A = file->get(key_a), B = file->get(key_b);
    if (!A) return A.error();
    if (!B) return B.error();
    const int64_t r = c->rank_of(m);
    std::vector<int64_t> sa{r, w.size(1)}, sb{w.size(0), r};
    if (A->shape() != sa || B->shape() != sb) {
      problems.push_back(m + ": lora_A is " + A->describe() + " and lora_B " + B->describe() + ", expected [" +
                         join(sa) + "] and [" + join(sb) + "] (r = " + std::to_string(r) + ")");
      continue;
    }
    if (A->dtype() != Dtype::f32 && A->dtype() != Dtype::bf16 && A->dtype() != Dtype::f16) {
      problems.push_back(m + ": lora_A is " + A->describe() + ", not floating point");
      continue;
    }
    if (B->dtype() != Dtype::f32 && B->dtype() != Dtype::bf16 && B->dtype() != Dtype::f16) {
      problems.push_back(m + ": lora_B is " + B->describe() + ", not floating point");
      continue;
    }
    a.modules.push_back(m);
    a.weights[m] = {to_torch(*A).to(w.scalar_type(), false, true), to_torch(*B).to(w.scalar_type(), false, true)};
    a.scaling[m] = c->scaling_of(m);
  }
  for (const auto& key : file->names())
    if (!expected.count(key)) problems.push_back("unexpected tensor " + key);
  if (!problems.empty())
    return make_error(errc::invalid_argument,
                      weights_path + " does not fit this model (" + std::string{hf_class_name(impl_->cfg.architecture)} +
                          ") and " + cfg_path + ": " + join(problems, "; "));
  impl_->adapters.emplace(name, std::move(a));
  return {};
}

namespace {

Result<void> fold(CausalLM::Impl& impl, const std::string& name, bool merge) {
  auto it = impl.adapters.find(name);
  if (it == impl.adapters.end()) {
    auto err = impl.adapter(name);
    return err.error();
  }
  auto& a = it->second;
  if (a.merged == merge)
    return make_error(errc::failed_precondition,
                      "adapter '" + name + "' is " + (merge ? "merged already" : "not merged"));
  if (merge)
    for (const auto& [other, o] : impl.adapters)
      if (o.merged)
        return make_error(errc::failed_precondition,
                          "adapter '" + other + "' is merged already; unmerge it before merging '" + name + "'");
  c10::NoGradGuard no_grad;
  for (const auto& m : a.modules) {
    const auto& [A, B] = a.weights.at(m);
    impl.params.at(m + ".weight").add_(at::matmul(B, A), a.scaling.at(m) * (merge ? 1.0 : -1.0));
  }
  a.merged = merge;
  return {};
}

}  // namespace

Result<NamedTensors> CausalLM::merged_parameters(const std::string& name) const {
  auto it = impl_->adapters.find(name);
  if (it == impl_->adapters.end()) return impl_->adapter(name).error();
  const auto& a = it->second;
  c10::NoGradGuard no_grad;
  NamedTensors out;
  for (const auto& n : impl_->names) {
    auto w = impl_->params.at(n).clone();
    if (!a.merged && n.size() > 7 && n.compare(n.size() - 7, 7, ".weight") == 0) {
      auto module = n.substr(0, n.size() - 7);
      if (auto m = a.weights.find(module); m != a.weights.end())
        w.add_(at::matmul(m->second.second, m->second.first).to(w.scalar_type()), a.scaling.at(module));
    }
    auto t = from_torch(w);
    if (!t) return t.error();
    out.emplace_back(n, std::move(*t));
  }
  return out;
}

Result<void> CausalLM::merge_adapter(const std::string& name) { return fold(*impl_, name, true); }
Result<void> CausalLM::unmerge_adapter(const std::string& name) { return fold(*impl_, name, false); }

const std::string& CausalLM::name_or_path() const { return impl_->name_or_path; }
void CausalLM::set_name_or_path(std::string name) { impl_->name_or_path = std::move(name); }

}  // namespace glint::components
