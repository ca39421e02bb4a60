#pragma once
/// The mixture-of-experts part of config.json (Qwen2MoeConfig,
/// Qwen3MoeConfig): read, checked and written here, for config.cpp.

#include "components/model/config.hpp"

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

}  // namespace glint::components::model_detail
