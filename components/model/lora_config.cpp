// adapter_config.json with PEFT's meaning for every field
// (peft/tuners/tuners_utils.py check_target_module_exists, peft/utils/other.py
// get_pattern_key, peft/tuners/lora/config.py). No LibTorch here: the
// adapters themselves are in lora.cpp.
#include "components/model/lora_config.hpp"
#include "components/model/moe_config.hpp"

#include "runtime/file.hpp"
#include "runtime/log.hpp"
#include "runtime/text.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <map>
#include <regex>
#include <set>

namespace glint::components {

using json = nlohmann::ordered_json;  // keeps the file's order: patterns match first-key-first

namespace {

bool is_all_linear(const LoraConfig& c) {
  return c.target_regex.empty() && c.target_modules.size() == 1 && c.target_modules[0] == "all-linear";
}

// The longest pattern a config may hold: far above any in use, and it keeps
// std::regex's recursive compiler off the end of the stack.
constexpr size_t kMaxPatternBytes = 1024;

// A pattern from a config, in ECMAScript syntax, matched in libstdc++'s
// polynomial mode (a Thompson NFA, O(path length x pattern size)): its
// default backtracking takes exponential time on nested quantifiers such as
// ".*+" or "(a|a)*", so one adapter_config.json could hang a loader (found
// by fuzzing). The mode refuses back-references, which no module path needs.
// Repetition counts ("{n}", "{n,m}") above 1000 are refused too: libstdc++
// parses them with an int that overflows (undefined behaviour, found by
// fuzzing), and a big count builds an automaton as big.
bool huge_repetition(const std::string& pattern) {
  for (size_t i = 0; i < pattern.size(); ++i) {
    // A count after { or , -- and a back-reference's number after \, which
    // libstdc++ reads with the same overflowing int (found by fuzzing too).
    if (pattern[i] != '{' && pattern[i] != ',' && pattern[i] != '\\') continue;
    size_t j = i + 1;
    while (j < pattern.size() && std::isdigit(static_cast<unsigned char>(pattern[j]))) ++j;
    if (j - i - 1 > 4 || (j - i - 1 == 4 && std::stoi(pattern.substr(i + 1, 4)) > 1000)) return true;
  }
  return false;
}

std::regex user_regex(const std::string& pattern) {
  if (pattern.size() > 2 * kMaxPatternBytes)  // validated ones, wrapped by layer_index
    throw std::regex_error(std::regex_constants::error_complexity);
  if (huge_repetition(pattern)) throw std::regex_error(std::regex_constants::error_badbrace);
  return std::regex(pattern, std::regex::ECMAScript | std::regex_constants::__polynomial);
}

// Python's re.fullmatch, in ECMAScript syntax (std::regex: what configs use,
// character classes, alternation, lazy quantifiers, is the same). A pattern
// that does not compile matches nothing; validate() reports it.
bool full_match(const std::string& pattern, const std::string& s) {
  try {
    return std::regex_match(s, user_regex(pattern));
  } catch (const std::regex_error&) {
    return false;
  }
}

caf::error bad_regex(const std::string& field, const std::string& pattern) {
  if (pattern.size() > kMaxPatternBytes)
    return make_error(errc::invalid_argument, "LoRA " + field + " is a pattern of " + std::to_string(pattern.size()) +
                                                  " bytes, more than glint's " + std::to_string(kMaxPatternBytes));
  try {
    user_regex(pattern);
    return caf::none;
  } catch (const std::regex_error& e) {
    return make_error(errc::invalid_argument, "LoRA " + field + " = \"" + pattern +
                                                  "\" is not a regular expression glint can read (ECMAScript syntax "
                                                  "without back-references; Python-only forms such as (?P<name>...) "
                                                  "and look-behind are not): " +
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
      if (std::regex_search(path, m, user_regex("^.*?\\.(?:" + p + ")\\.(\\d+)\\.")))
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
    // On MoE layers that includes the routers, the experts and the shared
    // expert's projections and gate, as PEFT's for transformers 4.
    static const std::regex projection{
        R"(model\.layers\.\d+\.(self_attn\.[qkvo]_proj|linear_attn\.(in_proj_(qkv|z|b|a)|out_proj)|mlp\.((experts\.\d+\.|shared_expert\.)?(gate|up|down)_proj|gate|shared_expert_gate)))"};
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

const std::vector<std::string>& projection_names() {
  static const std::vector<std::string> names = {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
                                                 "self_attn.o_proj", "mlp.gate_proj",    "mlp.up_proj",
                                                 "mlp.down_proj",    "mlp.gate",         "mlp.shared_expert_gate",
                                                 "linear_attn.in_proj_qkv", "linear_attn.in_proj_z",
                                                 "linear_attn.in_proj_b", "linear_attn.in_proj_a",
                                                 "linear_attn.out_proj"};
  return names;
}

std::vector<LinearModule> linear_modules(const ModelConfig& m) {
  const int64_t head_dim = m.head_dim > 0 ? m.head_dim : m.hidden_size / std::max<int64_t>(m.num_attention_heads, 1);
  const int64_t h = m.hidden_size, q = m.num_attention_heads * head_dim, kv = m.num_key_value_heads * head_dim;
  std::vector<LinearModule> out;
  for (int64_t l = 0; l < m.num_hidden_layers; ++l) {
    const auto p = "model.layers." + std::to_string(l) + ".";
    if (m.token_mixer(l) == TokenMixer::gated_deltanet) {
      const auto& la = m.linear_attention;
      out.push_back({p + "linear_attn.in_proj_qkv", h, la.conv_dim()});
      out.push_back({p + "linear_attn.in_proj_z", h, la.value_dim()});
      out.push_back({p + "linear_attn.in_proj_b", h, la.num_value_heads});
      out.push_back({p + "linear_attn.in_proj_a", h, la.num_value_heads});
      out.push_back({p + "linear_attn.out_proj", la.value_dim(), h});
    } else {
      // A LoRA on a gated q_proj adapts its query and gate rows together (PEFT).
      out.push_back({p + "self_attn.q_proj", h, m.attention_gate ? 2 * q : q});
      out.push_back({p + "self_attn.k_proj", h, kv});
      out.push_back({p + "self_attn.v_proj", h, kv});
      out.push_back({p + "self_attn.o_proj", q, h});
    }
    if (m.feed_forward(l) == FeedForward::dense) {
      out.push_back({p + "mlp.gate_proj", h, m.intermediate_size});
      out.push_back({p + "mlp.up_proj", h, m.intermediate_size});
      out.push_back({p + "mlp.down_proj", m.intermediate_size, h});
      continue;
    }
    auto sparse = model_detail::sparse_block_modules(m, p);
    out.insert(out.end(), std::make_move_iterator(sparse.begin()), std::make_move_iterator(sparse.end()));
  }
  return out;
}

int64_t LoraConfig::parameters(const ModelConfig& m) const {
  int64_t total = 0;
  for (const auto& mod : linear_modules(m))
    if (targets(mod.path)) total += rank_of(mod.path) * (mod.in + mod.out);
  if (targets("lm_head")) total += rank_of("lm_head") * (m.hidden_size + m.vocab_size);
  return total;
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

}  // namespace glint::components
