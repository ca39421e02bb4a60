#pragma once
/// `LoraConfig`: a LoRA adapter's adapter_config.json (PEFT's LoraConfig),
/// read, checked and written back without LibTorch; CausalLM (model.hpp)
/// adds adapters of this shape to a model.
///
///   auto cfg = LoraConfig::load("adapters/math/adapter_config.json");
///   if (cfg && cfg->targets("model.layers.0.self_attn.q_proj")) ...

#include "components/model/config.hpp"
#include "runtime/error.hpp"

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace glint::components {

/// A LoRA adapter's shape, as PEFT's LoraConfig (adapter_config.json), with
/// PEFT's meaning for every field. Modules are named by their path in the
/// Hugging Face model ("model.layers.0.self_attn.q_proj"); only the seven
/// projections of each layer can be adapted.
///
/// Field order is a wire format (actors/model.hpp): append, never reorder.
/// The projections of a decoder layer an adapter can target, by their path
/// under "model.layers.<i>." (an MoE layer's experts, "mlp.experts.<e>.",
/// have gate_proj, up_proj and down_proj too; its router is "mlp.gate", a
/// Qwen2-MoE shared expert "mlp.shared_expert.*" and its gate
/// "mlp.shared_expert_gate").
const std::vector<std::string>& projection_names();

/// A projection an adapter can target: its path and its weight's widths.
struct LinearModule {
  std::string path;
  int64_t in = 0, out = 0;
};
/// Every projection of a model of config `m`, in model order (per layer,
/// its feed-forward block's kind decides which); the LM head is not one.
std::vector<LinearModule> linear_modules(const ModelConfig& m);

struct LoraConfig {
  int64_t r = 8;
  double alpha = 16;
  double dropout = 0.0;  ///< on the adapter's input, in training only
  /// Module names: a module is targeted when its path is one of them or
  /// ends in "." + one of them ("q_proj"). {"all-linear"}: every projection
  /// of every layer (PEFT's string "all-linear").
  std::vector<std::string> target_modules = {"q_proj", "k_proj", "v_proj", "o_proj"};
  bool rslora = false;  ///< scale by alpha / sqrt(r) instead of alpha / r
  /// When set, used instead of target_modules: a regular expression that
  /// must match a module's whole path (PEFT's target_modules as a string).
  std::string target_regex{};
  /// Per-module rank and alpha: the first key (a regular expression) that
  /// matches the module's whole path or its end after a "." gives that
  /// module's r / alpha; other modules keep r / alpha. Keys in file order.
  std::vector<std::pair<std::string, int64_t>> rank_pattern{};
  std::vector<std::pair<std::string, double>> alpha_pattern{};
  /// Only layers with these indices (empty: every layer). As in PEFT, it
  /// filters modules that target_modules matches by suffix, not a
  /// target_regex or a module named by its whole path.
  std::vector<int64_t> layers_to_transform{};
  /// The name of the module list the layer index follows ("layers"), as
  /// regular expressions; empty: the first numbered path segment.
  std::vector<std::string> layers_pattern{};
  /// Modules never adapted: by name or suffix as target_modules, or, when
  /// exclude_regex is set, by a full match of that regex.
  std::vector<std::string> exclude_modules{};
  std::string exclude_regex{};
  /// The base model, as adapter_config.json names it (a directory or a hub
  /// name). Empty: save_adapter writes the directory the model was loaded
  /// from (CausalLM::name_or_path).
  std::string base_model_name_or_path{};
  /// The other fields of the adapter_config.json this was loaded from (a
  /// JSON object), which change nothing glint computes; save_adapter
  /// writes them back as they were.
  std::string other_fields{};

  /// alpha / r (or alpha / sqrt(r)) of a module without a pattern.
  double scaling() const;
  /// The rank, alpha and scaling of the module at `path`.
  int64_t rank_of(const std::string& path) const;
  double alpha_of(const std::string& path) const;
  double scaling_of(const std::string& path) const;
  /// Whether the module at `path` gets the adapter (call validate first:
  /// a regex that does not compile matches nothing).
  bool targets(const std::string& path) const;
  Result<void> validate() const;
  /// How many parameters the adapter adds to a model of `model`'s shape:
  /// r * (in + out) for each projection it targets, at that module's rank.
  int64_t parameters(const ModelConfig& model) const;

  /// Reads a PEFT adapter_config.json. A field that would change what the
  /// adapter computes and that glint does not implement (DoRA, bias
  /// training, fan_in_fan_out, modules_to_save, ...) is an error naming
  /// the file, the field and its value; fields that change nothing are
  /// kept in other_fields and listed in one debug log line.
  static Result<LoraConfig> load(const std::string& path);
  static Result<LoraConfig> parse(const std::string& json_text, const std::string& origin = "adapter_config.json");
  /// adapter_config.json's text, as PEFT writes it (keys sorted), with
  /// other_fields back in place.
  std::string to_json() const;
};

}  // namespace glint::components
