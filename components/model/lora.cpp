// LoRA adapters on a CausalLM, in PEFT's layout.
#include "components/model/transformer.hpp"

#include "components/tensor/torch_bridge.hpp"
#include "runtime/text.hpp"

#include <ATen/CPUGeneratorImpl.h>
#include <c10/core/GradMode.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

namespace glint::components {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

constexpr const char* peft_prefix = "base_model.model.";
const std::vector<std::string> all_linear = {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
                                             "self_attn.o_proj", "mlp.gate_proj",    "mlp.up_proj",
                                             "mlp.down_proj"};

bool targets(const LoraConfig& cfg, const std::string& module) {
  for (const auto& t : cfg.target_modules) {
    if (t == "all-linear") return true;
    if (module == t || (module.size() > t.size() && module.compare(module.size() - t.size(), t.size(), t) == 0 &&
                        module[module.size() - t.size() - 1] == '.'))
      return true;
  }
  return false;
}

}  // namespace

double LoraConfig::scaling() const {
  return rslora ? alpha / std::sqrt(static_cast<double>(r)) : alpha / static_cast<double>(r);
}

Result<void> LoraConfig::validate() const {
  if (r <= 0) return make_error(errc::invalid_argument, "LoRA r must be positive, not " + std::to_string(r));
  if (!(alpha > 0)) return make_error(errc::invalid_argument, "LoRA alpha must be positive");
  if (!(dropout >= 0 && dropout < 1)) return make_error(errc::invalid_argument, "LoRA dropout must lie in [0, 1)");
  if (target_modules.empty()) return make_error(errc::invalid_argument, "LoRA target_modules is empty");
  return {};
}

std::vector<std::string> CausalLM::Impl::linear_modules() const {
  std::vector<std::string> out;
  for (int64_t l = 0; l < cfg.num_hidden_layers; ++l)
    for (const auto& m : all_linear) out.push_back("model.layers." + std::to_string(l) + "." + m);
  return out;
}

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
  LoraAdapter a;
  a.cfg = cfg;
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  for (const auto& m : impl_->linear_modules()) {
    if (!targets(cfg, m)) continue;
    const auto& w = impl_->param(m + ".weight");
    int64_t out = w.size(0), in = w.size(1);
    // PEFT: A ~ kaiming_uniform(a = sqrt(5)) = U(-1/sqrt(in), 1/sqrt(in)); B = 0.
    double bound = 1.0 / std::sqrt(static_cast<double>(in));
    auto A = at::empty({cfg.r, in}, w.options()).uniform_(-bound, bound, gen);
    auto B = at::zeros({out, cfg.r}, w.options());
    a.modules.push_back(m);
    a.weights[m] = {A, B};
  }
  if (a.modules.empty())
    return make_error(errc::invalid_argument, "adapter '" + name + "': target_modules (" + join(cfg.target_modules) +
                                                  ") match no projection; use q_proj, k_proj, v_proj, o_proj, "
                                                  "gate_proj, up_proj, down_proj or all-linear");
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
    out.emplace_back(peft_prefix + m + ".lora_A.weight", *from_torch(A));
    out.emplace_back(peft_prefix + m + ".lora_B.weight", *from_torch(B));
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
  const auto& c = (*a)->cfg;
  json j{{"peft_type", "LORA"},
         {"task_type", "CAUSAL_LM"},
         {"r", c.r},
         {"lora_alpha", c.alpha},
         {"lora_dropout", c.dropout},
         {"target_modules", c.target_modules.size() == 1 && c.target_modules[0] == "all-linear"
                                ? json("all-linear")
                                : json(c.target_modules)},
         {"use_rslora", c.rslora},
         {"bias", "none"},
         {"fan_in_fan_out", false},
         {"inference_mode", true},
         {"init_lora_weights", true},
         {"modules_to_save", nullptr},
         {"base_model_name_or_path", nullptr}};
  auto cfg_path = (fs::path{dir} / "adapter_config.json").string();
  auto tmp = temp_path_for(cfg_path);
  {
    std::ofstream f{tmp};
    f << j.dump(2) << "\n";
    if (!f) return make_error(errc::unavailable, "cannot write " + cfg_path);
  }
  fs::rename(tmp, cfg_path, ec);
  if (ec) return make_error(errc::unavailable, "cannot write " + cfg_path + ": " + ec.message());
  return write_safetensors((fs::path{dir} / "adapter_model.safetensors").string(), *tensors, {{"format", "pt"}});
}

Result<void> CausalLM::load_adapter(const std::string& name, const std::string& dir) {
  if (impl_->adapters.count(name)) return make_error(errc::failed_precondition, "adapter '" + name + "' exists already");
  auto cfg_path = (fs::path{dir} / "adapter_config.json").string();
  std::ifstream in{cfg_path};
  if (!in) return make_error(errc::not_found, "cannot read " + cfg_path + ": is this a PEFT adapter directory?");
  json j;
  try {
    j = json::parse(in);
  } catch (const json::parse_error& e) {
    return make_error(errc::invalid_argument, cfg_path + " is not valid JSON: " + e.what());
  }
  LoraConfig c;
  try {
    if (j.value("peft_type", std::string{"LORA"}) != "LORA")
      return make_error(errc::unimplemented, cfg_path + ": only LORA adapters are supported, not " +
                                                 j.value("peft_type", std::string{}));
    c.r = j.at("r").get<int64_t>();
    c.alpha = j.value("lora_alpha", 8.0);
    c.dropout = j.value("lora_dropout", 0.0);
    c.rslora = j.value("use_rslora", false);
    auto tm = j.at("target_modules");
    if (tm.is_string()) c.target_modules = {tm.get<std::string>()};
    else c.target_modules = tm.get<std::vector<std::string>>();
    if (j.value("fan_in_fan_out", false))
      return make_error(errc::unimplemented, cfg_path + ": fan_in_fan_out adapters (GPT-2 style) are not supported");
  } catch (const json::exception& e) {
    return make_error(errc::invalid_argument, cfg_path + " has a missing or mistyped field: " + e.what());
  }
  if (auto ok = c.validate(); !ok) return with_context(ok.error(), cfg_path);
  auto file = SafetensorsFile::open((fs::path{dir} / "adapter_model.safetensors").string());
  if (!file) return file.error();
  LoraAdapter a;
  a.cfg = c;
  std::set<std::string> expected;
  std::vector<std::string> problems;
  for (const auto& m : impl_->linear_modules()) {
    const auto& w = impl_->param(m + ".weight");
    auto key_a = peft_prefix + m + ".lora_A.weight", key_b = peft_prefix + m + ".lora_B.weight";
    bool has_a = file->contains(key_a), has_b = file->contains(key_b);
    if (!has_a && !has_b) continue;
    expected.insert(key_a);
    expected.insert(key_b);
    if (has_a != has_b) {
      problems.push_back(m + " has only one of lora_A and lora_B");
      continue;
    }
    auto A = file->get(key_a), B = file->get(key_b);
    if (!A) return A.error();
    if (!B) return B.error();
    std::vector<int64_t> sa{c.r, w.size(1)}, sb{w.size(0), c.r};
    if (A->shape() != sa || B->shape() != sb) {
      problems.push_back(m + ": lora_A is " + A->describe() + " and lora_B " + B->describe() + ", expected [" +
                         join(sa) + "] and [" + join(sb) + "]");
      continue;
    }
    a.modules.push_back(m);
    a.weights[m] = {to_torch(*A).to(w.scalar_type(), false, true), to_torch(*B).to(w.scalar_type(), false, true)};
  }
  for (const auto& key : file->names())
    if (!expected.count(key)) problems.push_back("unexpected tensor " + key);
  if (a.modules.empty() && problems.empty()) problems.push_back("no LoRA tensor for any projection of this model");
  if (!problems.empty())
    return make_error(errc::invalid_argument,
                      dir + " does not fit this model (" + std::string{hf_class_name(impl_->cfg.architecture)} +
                          "): " + join(problems, "; "));
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
  double s = a.cfg.scaling() * (merge ? 1.0 : -1.0);
  for (const auto& m : a.modules) {
    const auto& [A, B] = a.weights.at(m);
    impl.params.at(m + ".weight").add_(at::matmul(B, A), s);
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
    if (!a.merged && n.size() > 7 && n.compare(n.size() - 7, 7, ".weight") == 0)
      if (auto m = a.weights.find(n.substr(0, n.size() - 7)); m != a.weights.end())
        w.add_(at::matmul(m->second.second, m->second.first).to(w.scalar_type()), a.cfg.scaling());
    out.emplace_back(n, *from_torch(w));
  }
  return out;
}

Result<void> CausalLM::merge_adapter(const std::string& name) { return fold(*impl_, name, true); }
Result<void> CausalLM::unmerge_adapter(const std::string& name) { return fold(*impl_, name, false); }

}  // namespace glint::components
