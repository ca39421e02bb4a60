// The optimizer's and the learning-rate schedule's configuration: kinds by
// name, validate, and the schedule's rate, free of LibTorch (what reads
// them from outside checks them with the optimizer's own rule).
#include "components/model/optim.hpp"

#include <algorithm>
#include <cmath>
#include <numbers>
#include <string>

namespace glint::components {

Result<OptimizerConfig::Kind> OptimizerConfig::parse_kind(std::string_view name) {
  if (name == "adamw") return Kind::adamw;
  if (name == "sgd") return Kind::sgd;
  return make_error(errc::invalid_argument, "optimizer '" + std::string{name} + "' is unknown; use adamw or sgd");
}

std::string_view to_string(OptimizerConfig::Kind k) {
  switch (k) {
    case OptimizerConfig::Kind::adamw: return "adamw";
    case OptimizerConfig::Kind::sgd: return "sgd";
  }
  return "?";
}

std::string_view to_string(SchedulerConfig::Kind k) {
  switch (k) {
    case SchedulerConfig::Kind::constant: return "constant";
    case SchedulerConfig::Kind::linear: return "linear";
    case SchedulerConfig::Kind::cosine: return "cosine";
  }
  return "?";
}

Result<void> OptimizerConfig::validate() const {
  auto bad = [](const std::string& what) { return make_error(errc::invalid_argument, "optimizer: " + what); };
  // A kind read from another process can hold any number.
  if (to_string(kind) == "?") return bad("kind " + std::to_string(static_cast<int>(kind)) + " is neither adamw nor sgd");
  if (!(max_grad_norm >= 0)) return bad("max_grad_norm must be >= 0 (0 disables clipping)");
  if (!(lr >= 0) || !std::isfinite(lr)) return bad("lr must be a finite number >= 0");
  if (!(weight_decay >= 0)) return bad("weight_decay must be >= 0");
  if (!(beta1 >= 0 && beta1 < 1) || !(beta2 >= 0 && beta2 < 1)) return bad("betas must lie in [0, 1)");
  if (!(eps > 0)) return bad("eps must be positive");
  if (!(momentum >= 0 && momentum < 1)) return bad("momentum must lie in [0, 1)");
  return {};
}

Result<SchedulerConfig::Kind> SchedulerConfig::parse_kind(std::string_view name) {
  auto base = name;
  if (auto at = base.find("_with_warmup"); at != std::string_view::npos) base = base.substr(0, at);
  if (base == "constant") return Kind::constant;
  if (base == "linear") return Kind::linear;
  if (base == "cosine") return Kind::cosine;
  return make_error(errc::invalid_argument,
                    "lr scheduler '" + std::string{name} + "' is unknown; use constant, linear or cosine");
}

Result<void> SchedulerConfig::validate() const {
  if (to_string(kind) == "?")
    return make_error(errc::invalid_argument, "lr scheduler: kind " + std::to_string(static_cast<int>(kind)) +
                                                  " is not constant, linear or cosine");
  if (warmup_steps < 0) return make_error(errc::invalid_argument, "lr scheduler: warmup_steps must be >= 0");
  if (kind != Kind::constant && total_steps <= warmup_steps)
    return make_error(errc::invalid_argument, "lr scheduler: total_steps (" + std::to_string(total_steps) +
                                                  ") must exceed warmup_steps (" + std::to_string(warmup_steps) +
                                                  ") for a decaying schedule");
  if (!(min_lr_ratio >= 0 && min_lr_ratio <= 1))
    return make_error(errc::invalid_argument, "lr scheduler: min_lr_ratio must lie in [0, 1]");
  return {};
}

double learning_rate(const SchedulerConfig& s, double lr, int64_t step) {
  if (step < s.warmup_steps) return lr * static_cast<double>(step) / static_cast<double>(std::max<int64_t>(1, s.warmup_steps));
  if (s.kind == SchedulerConfig::Kind::constant) return lr;
  double progress = static_cast<double>(step - s.warmup_steps) /
                    static_cast<double>(std::max<int64_t>(1, s.total_steps - s.warmup_steps));
  progress = std::min(1.0, progress);
  double factor = s.kind == SchedulerConfig::Kind::linear ? 1.0 - progress
                                                          : 0.5 * (1.0 + std::cos(std::numbers::pi * progress));
  return lr * (s.min_lr_ratio + (1.0 - s.min_lr_ratio) * factor);
}

}  // namespace glint::components
