#include "components/model/moe_config.hpp"
#include "components/model/config_field.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>

namespace glint::components::model_detail {

using json = nlohmann::json;

MoeConfig default_moe(Architecture a) {
  MoeConfig m;
  if (a == Architecture::qwen3_moe) {
    m.num_experts = 128;
    m.num_experts_per_tok = 8;
    m.moe_intermediate_size = 768;
  } else if (a == Architecture::qwen2_moe) {
    m.num_experts = 60;
    m.num_experts_per_tok = 4;
    m.moe_intermediate_size = 1408;
    m.shared_expert_intermediate_size = 5632;
  } else if (a == Architecture::qwen3_5_moe) {
    m.num_experts = 256;
    m.num_experts_per_tok = 8;
    m.moe_intermediate_size = 512;
    m.shared_expert_intermediate_size = 512;
    m.norm_topk_prob = true;  // always: Qwen3.5-MoE's router has no such field
  }
  return m;
}

caf::error read_moe_fields(const json& j, ModelConfig& c, std::set<std::string>& used, const std::string& origin) {
  auto& m = c.moe;
  used.insert({"num_experts", "num_local_experts", "num_experts_per_tok", "moe_intermediate_size", "norm_topk_prob",
               "decoder_sparse_step", "mlp_only_layers", "router_aux_loss_coef", "output_router_logits"});
  const bool qwen2 = c.architecture == Architecture::qwen2_moe, qwen3_5 = c.architecture == Architecture::qwen3_5_moe;
  if (qwen2 || qwen3_5) used.insert("shared_expert_intermediate_size");
  // transformers 5 calls num_experts num_local_experts too: either spelling,
  // and both only when they agree.
  int64_t local = -1;
  if (auto e = read_field(j, "num_local_experts", local, origin)) return e;
  if (auto e = read_field(j, "num_experts", m.num_experts, origin)) return e;
  if (local >= 0) {
    if (j.contains("num_experts") && !j["num_experts"].is_null() && local != m.num_experts)
      return make_error(errc::invalid_argument, origin + ": fields 'num_experts' (" + std::to_string(m.num_experts) +
                                                    ") and 'num_local_experts' (" + std::to_string(local) +
                                                    ") disagree; keep one of them");
    m.num_experts = local;
  }
  for (auto [key, out] : {std::pair{"num_experts_per_tok", &m.num_experts_per_tok},
                          {"moe_intermediate_size", &m.moe_intermediate_size},
                          {"decoder_sparse_step", &m.decoder_sparse_step}})
    if (auto e = read_field(j, key, *out, origin)) return e;
  if (qwen2 || qwen3_5)
    if (auto e = read_field(j, "shared_expert_intermediate_size", m.shared_expert_intermediate_size, origin)) return e;
  for (auto [key, out] : {std::pair{"norm_topk_prob", &m.norm_topk_prob},
                          {"output_router_logits", &m.output_router_logits}})
    if (auto e = read_field(j, key, *out, origin)) return e;
  if (auto e = read_field(j, "router_aux_loss_coef", m.router_aux_loss_coef, origin)) return e;
  if (auto it = j.find("mlp_only_layers"); it != j.end() && !it->is_null()) {
    if (!it->is_array() || !std::all_of(it->begin(), it->end(), [](const json& x) { return x.is_number_integer(); }))
      return make_error(errc::invalid_argument, origin + ": field 'mlp_only_layers' should be a list of layer "
                                                         "indices, not " + it->dump());
    m.mlp_only_layers = it->get<std::vector<int64_t>>();
  }
  // Qwen3.5-MoE reads none of these: every layer sparse, the k weights
  // always renormalised. A file saying otherwise means what transformers
  // does not compute.
  if (qwen3_5 && (!m.norm_topk_prob || m.decoder_sparse_step != 1 || !m.mlp_only_layers.empty()))
    return make_error(errc::unimplemented,
                      origin + ": Qwen3.5-MoE makes every layer sparse and always renormalises the chosen experts' "
                               "weights; this file says norm_topk_prob " + std::string{m.norm_topk_prob ? "true" : "false"} +
                               ", decoder_sparse_step " + std::to_string(m.decoder_sparse_step) + ", mlp_only_layers " +
                               std::to_string(m.mlp_only_layers.size()) + " layers, which transformers ignores "
                               "(remove those fields)");
  return caf::none;
}

void write_moe_fields(const ModelConfig& c, json& j) {
  const auto& m = c.moe;
  j["num_experts"] = m.num_experts;
  j["num_experts_per_tok"] = m.num_experts_per_tok;
  j["moe_intermediate_size"] = m.moe_intermediate_size;
  if (c.architecture != Architecture::qwen3_moe)
    j["shared_expert_intermediate_size"] = m.shared_expert_intermediate_size;
  if (c.architecture != Architecture::qwen3_5_moe) {  // fields Qwen3.5-MoE does not have
    j["norm_topk_prob"] = m.norm_topk_prob;
    j["decoder_sparse_step"] = m.decoder_sparse_step;
    j["mlp_only_layers"] = m.mlp_only_layers;
  }
  j["router_aux_loss_coef"] = m.router_aux_loss_coef;
  j["output_router_logits"] = m.output_router_logits;
}

caf::error validate_moe(const ModelConfig& c) {
  const auto& m = c.moe;
  auto bad = [](std::string what) { return make_error(errc::invalid_argument, std::move(what)); };
  if (!is_moe(c.architecture)) {
    if (m.num_experts != 0)
      return bad(std::string{hf_class_name(c.architecture)} + " has no experts (num_experts " +
                 std::to_string(m.num_experts) + ")");
    return caf::none;
  }
  if (m.num_experts < 0) return bad("num_experts must not be negative, not " + std::to_string(m.num_experts));
  if (m.num_experts > (int64_t{1} << 12))
    return bad("num_experts " + std::to_string(m.num_experts) + " is more than glint's bound of 4096 (is it a typo?)");
  if (m.decoder_sparse_step <= 0)
    return bad("decoder_sparse_step must be positive, not " + std::to_string(m.decoder_sparse_step));
  for (auto l : m.mlp_only_layers)
    if (l < 0 || l >= c.num_hidden_layers)
      return bad("mlp_only_layers names layer " + std::to_string(l) + ", but the model has layers 0 to " +
                 std::to_string(c.num_hidden_layers - 1));
  if (m.num_experts == 0) return caf::none;  // every layer dense, as transformers builds it
  if (m.num_experts_per_tok <= 0 || m.num_experts_per_tok > m.num_experts)
    return bad("num_experts_per_tok is " + std::to_string(m.num_experts_per_tok) +
               "; each token goes to between 1 and num_experts (" + std::to_string(m.num_experts) + ") experts");
  if (m.moe_intermediate_size <= 0 || m.moe_intermediate_size > (int64_t{1} << 20))
    return bad("moe_intermediate_size must be positive and at most 2^20, not " + std::to_string(m.moe_intermediate_size));
  if (m.shared_expert_intermediate_size < 0 || m.shared_expert_intermediate_size > (int64_t{1} << 20))
    return bad("shared_expert_intermediate_size must lie in [0, 2^20], not " +
               std::to_string(m.shared_expert_intermediate_size));
  if (c.architecture == Architecture::qwen2_moe && m.shared_expert_intermediate_size == 0)
    return bad("shared_expert_intermediate_size must be positive: every Qwen2-MoE sparse block has a shared expert");
  if (c.architecture == Architecture::qwen3_5_moe) {
    if (m.shared_expert_intermediate_size == 0)
      return bad("shared_expert_intermediate_size must be positive: every Qwen3.5-MoE block has a shared expert");
    if (!m.norm_topk_prob || m.decoder_sparse_step != 1 || !m.mlp_only_layers.empty())
      return bad("Qwen3.5-MoE makes every layer sparse and renormalises the chosen experts' weights");
  }
  if (c.architecture == Architecture::qwen3_moe && m.shared_expert_intermediate_size != 0)
    return bad("Qwen3-MoE has no shared expert (shared_expert_intermediate_size " +
               std::to_string(m.shared_expert_intermediate_size) + ")");
  if (!(m.router_aux_loss_coef >= 0)) return bad("router_aux_loss_coef must not be negative");
  if (c.mlp_bias) return bad("the MoE families have no MLP biases");
  return caf::none;
}

std::vector<LinearModule> sparse_block_modules(const ModelConfig& c, const std::string& p) {
  const int64_t h = c.hidden_size;
  std::vector<LinearModule> out{{p + "mlp.gate", h, c.moe.num_experts}};
  auto mlp = [&](const std::string& prefix, int64_t width) {
    out.push_back({prefix + "gate_proj", h, width});
    out.push_back({prefix + "up_proj", h, width});
    out.push_back({prefix + "down_proj", width, h});
  };
  for (int64_t e = 0; e < c.moe.num_experts; ++e)
    mlp(p + "mlp.experts." + std::to_string(e) + ".", c.moe.moe_intermediate_size);
  if (c.moe.shared_expert_intermediate_size > 0) {
    mlp(p + "mlp.shared_expert.", c.moe.shared_expert_intermediate_size);
    out.push_back({p + "mlp.shared_expert_gate", h, 1});
  }
  return out;
}

int64_t sparse_block_parameters(const ModelConfig& c) {
  int64_t n = 0;
  for (const auto& m : sparse_block_modules(c, "")) n += m.in * m.out;  // weights only: no biases in these blocks
  return n;
}

}  // namespace glint::components::model_detail
