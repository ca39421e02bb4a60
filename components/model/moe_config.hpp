#pragma once
/// The mixture-of-experts part of config.json (Qwen2MoeConfig,
/// Qwen3MoeConfig): read, checked and written here, for config.cpp.

#include "components/model/config.hpp"
#include "components/model/lora_config.hpp"

#include <nlohmann/json_fwd.hpp>

#include <set>
#include <string>

namespace glint::components::model_detail {

/// transformers' class defaults for the family's expert fields.
MoeConfig default_moe(Architecture a);

/// Reads the expert fields of `j` into c.moe (defaults already there),
/// adding their names to `used`; an error names `origin` and the field.
caf::error read_moe_fields(const nlohmann::json& j, ModelConfig& c, std::set<std::string>& used,
                           const std::string& origin);

/// Writes c.moe's fields into `j` under transformers' names.
void write_moe_fields(const ModelConfig& c, nlohmann::json& j);

/// Checks the expert fields against each other and the layer count.
caf::error validate_moe(const ModelConfig& c);

/// The parameters of one sparse block: router, experts, shared expert.
int64_t sparse_block_parameters(const ModelConfig& c);

/// The Linear modules of a sparse block whose layer's names begin with
/// `prefix` ("model.layers.3."), in checkpoint order: the router mlp.gate,
/// each expert's gate/up/down_proj, the shared expert's and its gate. Both
/// the parameter list (sparse_block_shapes) and LoRA's targets
/// (linear_modules) are this.
std::vector<LinearModule> sparse_block_modules(const ModelConfig& c, const std::string& prefix);

}  // namespace glint::components::model_detail
