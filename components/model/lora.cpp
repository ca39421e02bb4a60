// LoRA adapters on a CausalLM, in PEFT's layout and with PEFT's meaning for
// every adapter_config.json field (peft/tuners/lora/{model,layer}.py); the
// config itself is read and written in lora_config.cpp.
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

namespace glint::components {

namespace fs = std::filesystem;
using json = nlohmann::ordered_json;

namespace {

constexpr const char* peft_prefix = "base_model.model.";

}  // namespace

// -- adapters on a model -------------------------------------------------------------

std::vector<std::string> CausalLM::Impl::linear_modules() const {
  std::vector<std::string> out;
  for (auto& m : components::linear_modules(cfg)) out.push_back(std::move(m.path));
  return out;
}

namespace {

// The modules of a Hugging Face Llama / Qwen model besides the projections
// and the LM head: a config that targets one wants something glint cannot
// adapt (PEFT would adapt embed_tokens, and fails on the others).
std::vector<std::string> other_modules(const ModelConfig& c) {
  std::vector<std::string> out = {"model", "model.embed_tokens", "model.layers", "model.norm", "model.rotary_emb"};
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    auto p = "model.layers." + std::to_string(l);
    const bool linear = c.token_mixer(l) == TokenMixer::gated_deltanet;
    for (const char* m : {"", linear ? ".linear_attn" : ".self_attn", ".mlp", ".input_layernorm", ".post_attention_layernorm"})
      out.push_back(p + m);
    if (linear)  // the Gated DeltaNet's conv (an nn.Conv1d), gated norm and activation
      for (const char* m : {".linear_attn.conv1d", ".linear_attn.norm", ".linear_attn.act"}) out.push_back(p + m);
    if (c.feed_forward(l) == FeedForward::dense) {
      out.push_back(p + ".mlp.act_fn");
    } else {
      // The experts' containers and activations (transformers 4's
      // per-expert modules); the router and the projections are Linear.
      out.push_back(p + ".mlp.experts");
      for (int64_t e = 0; e < c.moe.num_experts; ++e) {
        out.push_back(p + ".mlp.experts." + std::to_string(e));
        out.push_back(p + ".mlp.experts." + std::to_string(e) + ".act_fn");
      }
      if (c.moe.shared_expert_intermediate_size > 0) {
        out.push_back(p + ".mlp.shared_expert");
        out.push_back(p + ".mlp.shared_expert.act_fn");
      }
    }
    if (c.qk_norm && !linear) {
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
                                               "gate_proj, up_proj, down_proj; on MoE layers also the router gate, "
                                               "the experts' projections and shared_expert_gate; on Gated DeltaNet "
                                               "layers in_proj_qkv, in_proj_z, in_proj_b, in_proj_a and out_proj) "
                                               "and the LM head (lm_head)");
  std::vector<std::string> out;
  for (const auto& m : impl.linear_modules())
    if (cfg.targets(m)) out.push_back(m);
  if (cfg.targets("lm_head")) out.push_back("lm_head");
  if (out.empty())
    return make_error(errc::invalid_argument,
                      origin + targets_text() +
                          (cfg.layers_to_transform.empty() ? std::string{}
                                                           : " (layers " + join(cfg.layers_to_transform) + ")") +
                          " match no projection of this model; use q_proj, k_proj, v_proj, o_proj, gate_proj, "
                          "up_proj, down_proj, lm_head or all-linear");
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

namespace {

// LoRA reads the whole projections (their shapes, every layer's): a model
// cut into tensor-parallel shards or pipeline stages refuses adapters.
Result<void> whole_for_adapters(const CausalLM::Impl& m) {
  if (m.pp)
    return make_error(errc::unimplemented, "LoRA on a pipeline-parallel model is not built yet: this model is one "
                                           "stage (decoder layers " + std::to_string(m.pp->first_layer) + " to " +
                                           std::to_string(m.pp->end_layer - 1) + ")");
  if (m.tp)
    return make_error(errc::unimplemented, "LoRA on a tensor-parallel model is not built yet: each rank holds a part "
                                           "of every projection");
  if (m.ep)
    return make_error(errc::unimplemented, "LoRA on an expert-parallel model is not built yet: each rank holds " +
                                               std::to_string(m.ep->experts) + " of the " +
                                               std::to_string(m.cfg.moe.num_experts) + " experts of each sparse layer");
  return {};
}

}  // namespace

Result<void> CausalLM::add_adapter(const std::string& name, const LoraConfig& cfg, uint64_t seed) {
  if (name.empty()) return make_error(errc::invalid_argument, "an adapter needs a name");
  if (auto ok = whole_for_adapters(*impl_); !ok) return ok;
  if (auto ok = cfg.validate(); !ok) return ok.error();
  if (impl_->adapters.count(name)) return make_error(errc::failed_precondition, "adapter '" + name + "' exists already");
  auto modules = targeted_modules(*impl_, cfg, "adapter '" + name + "': ");
  if (!modules) return modules.error();
  LoraAdapter a;
  a.cfg = cfg;
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  for (const auto& m : *modules) {
    const auto& w = impl_->module_weight(m);
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
  if (auto ok = whole_for_adapters(*impl_); !ok) return ok;
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
    const auto& w = impl_->module_weight(m);
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
  if (auto ok = impl.have_parameters(merge ? "merge_adapter" : "unmerge_adapter", false, true); !ok) return ok;
  auto it = impl.adapters.find(name);
  if (it == impl.adapters.end()) {
    auto err = impl.adapter(name);
    return err.error();
  }
  auto& a = it->second;
  if (a.merged == merge)
    return make_error(errc::failed_precondition,
                      "adapter '" + name + "' is " + (merge ? "merged already" : "not merged"));
  if (impl.cfg.tie_word_embeddings && a.weights.count("lm_head"))
    return make_error(errc::failed_precondition,
                      "adapter '" + name + "' adapts the LM head, whose weight is tied to the embeddings: folding it "
                      "in would change the embeddings too; use it unmerged");
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
  if (auto ok = impl_->have_parameters("merged_parameters"); !ok) return ok.error();
  auto it = impl_->adapters.find(name);
  if (it == impl_->adapters.end()) return impl_->adapter(name).error();
  const auto& a = it->second;
  if (impl_->cfg.tie_word_embeddings && a.weights.count("lm_head"))
    return make_error(errc::failed_precondition,
                      "adapter '" + name + "' adapts the LM head, whose weight is tied to the embeddings: it has no "
                      "merged form in this model's parameters; sync or save it as an adapter");
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
