#pragma once
/// The Qwen3.5 / Qwen3.6 part of config.json (Qwen3_5TextConfig,
/// Qwen3_5MoeTextConfig, and the vision-language checkpoints that nest them
/// as text_config): read, checked and written here, for config.cpp
/// (../shared/reference/model-families.md section 3.1).

#include "components/model/config.hpp"

#include <nlohmann/json_fwd.hpp>

#include <set>
#include <string>

namespace glint::components::model_detail {

/// The decoder's config of a Qwen3.5 config.json `top`: its text_config
/// when the file is a vision-language checkpoint's (from_multimodal and the
/// media token ids set in `c`; tie_word_embeddings, bos and eos taken from
/// the top level where transformers reads them there, and refused when the
/// two levels disagree), else `top` itself.
Result<nlohmann::json> text_config_of(const nlohmann::json& top, ModelConfig& c, const std::string& origin);

/// transformers' defaults of the family's fields (Qwen3_5TextConfig).
void apply_hybrid_defaults(ModelConfig& c);

/// Reads the hybrid fields of the text config `j` into `c` (the layer
/// count already read): linear_*, layer_types or full_attention_interval,
/// and the fields transformers reads nowhere (attn_output_gate,
/// output_gate_type, mamba_ssm_dtype, mtp_*), each accepted only with the
/// value transformers computes as. Adds their names to `used`; an error
/// names `origin` and the field.
caf::error read_hybrid_fields(const nlohmann::json& j, ModelConfig& c, std::set<std::string>& used,
                              const std::string& origin);

/// Writes them into `j` under transformers' names (the text model's config).
void write_hybrid_fields(const ModelConfig& c, nlohmann::json& j);

/// Checks them against each other and the rest of the config (a family
/// without them must have none of them set).
caf::error validate_hybrid(const ModelConfig& c);

/// The parameters of one Gated DeltaNet layer's token mixer.
int64_t gated_deltanet_parameters(const ModelConfig& c);

}  // namespace glint::components::model_detail
