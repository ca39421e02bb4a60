#pragma once
/// Optimizers and learning-rate schedules for CausalLM parameters.
///
/// This header is plain C++ (no LibTorch): configs, the schedule formulas and
/// the rule for which parameters decay. The optimizer itself works on
/// LibTorch tensors and lives in optim_impl.hpp.

#include "runtime/error.hpp"

#include <cstdint>
#include <string>
#include <string_view>

namespace glint::components {

struct OptimizerConfig {
  enum class Kind : uint8_t { adamw, sgd };
  Kind kind = Kind::adamw;
  double lr = 1e-4;
  double weight_decay = 0.01;  ///< decoupled (AdamW); L2-free SGD applies it the same way
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double momentum = 0.0;  ///< SGD only
  double max_grad_norm = 1.0;  ///< clip_grad_and_step clips to this global norm; 0 disables clipping
  /// Trainer::set_optimizer: when the trainer has an optimizer of this kind
  /// already, keep its moments and step count and change only the
  /// hyperparameters (as changing a PyTorch param_group's lr does; what
  /// Tinker's optim_step does every step). false: a fresh optimizer.
  bool keep_state = false;

  /// Parses "adamw" / "sgd".
  /// (Serialised field order, in actors/model.hpp's inspect, is a wire
  /// format: add fields at the end.)
  static Result<Kind> parse_kind(std::string_view name);
  Result<void> validate() const;
};

struct SchedulerConfig {
  enum class Kind : uint8_t { constant, linear, cosine };
  Kind kind = Kind::constant;
  int64_t warmup_steps = 0;
  int64_t total_steps = 0;    ///< linear and cosine decay to min_lr_ratio * lr at this step
  double min_lr_ratio = 0.0;  ///< floor of the decay, as a share of the base lr

  /// Parses "constant" / "linear" / "cosine" (also with a "_with_warmup" suffix).
  static Result<Kind> parse_kind(std::string_view name);
  Result<void> validate() const;
};

/// "adamw", "sgd"; "constant", "linear", "cosine".
std::string_view to_string(OptimizerConfig::Kind k);
std::string_view to_string(SchedulerConfig::Kind k);

/// The learning rate at optimizer step `step` (0-based) for base rate `lr`:
/// a linear warm-up from 0 over warmup_steps, then constant, linear or
/// cosine decay (as Hugging Face's get_*_schedule_with_warmup).
double learning_rate(const SchedulerConfig& s, double lr, int64_t step);

/// Whether weight decay applies to parameter `name`: not to biases and
/// normalisation weights (Hugging Face's convention), nor to a Gated
/// DeltaNet's A_log and dt_bias.
bool decays(std::string_view name);

}  // namespace glint::components
