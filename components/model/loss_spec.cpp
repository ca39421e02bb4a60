// The loss's configuration: its kinds by name and LossSpec::validate, free
// of LibTorch so that whatever reads a loss from outside (the wire, the job
// file, the fuzz targets) checks it with the trainer's own rule.
#include "components/model/trainer.hpp"

#include <cmath>
#include <string>

namespace glint::components {

Result<LossKind> parse_loss_kind(std::string_view name) {
  for (auto k : {LossKind::cross_entropy, LossKind::grpo, LossKind::gspo, LossKind::dr_grpo, LossKind::cispo,
                 LossKind::dpo, LossKind::ipo, LossKind::importance_sampling, LossKind::ppo, LossKind::dro,
                 LossKind::decoupled_ppo})
    if (to_string(k) == name) return k;
  return make_error(errc::invalid_argument, "loss '" + std::string{name} +
                                                "' is unknown; use cross_entropy, grpo, gspo, dr_grpo, cispo, dpo, ipo, "
                                                "importance_sampling, ppo, dro or decoupled_ppo");
}

// The kinds reduction sum applies to: the token-level losses as Tinker
// defines them.
static bool sums(LossKind k) {
  return k == LossKind::cross_entropy || k == LossKind::importance_sampling || k == LossKind::ppo ||
         k == LossKind::cispo || k == LossKind::dro;
}

bool is_pairwise(LossKind k) { return k == LossKind::dpo || k == LossKind::ipo; }

std::string_view to_string(LossKind k) {
  switch (k) {
    case LossKind::cross_entropy: return "cross_entropy";
    case LossKind::grpo: return "grpo";
    case LossKind::gspo: return "gspo";
    case LossKind::dr_grpo: return "dr_grpo";
    case LossKind::cispo: return "cispo";
    case LossKind::dpo: return "dpo";
    case LossKind::ipo: return "ipo";
    case LossKind::importance_sampling: return "importance_sampling";
    case LossKind::ppo: return "ppo";
    case LossKind::dro: return "dro";
    case LossKind::decoupled_ppo: return "decoupled_ppo";
  }
  return "?";
}

Result<void> LossSpec::validate() const {
  auto bad = [](const std::string& what) { return make_error(errc::invalid_argument, "loss: " + what); };
  if (to_string(kind) == "?")
    return bad("kind " + std::to_string(static_cast<int>(kind)) +
               " is not cross_entropy, grpo, gspo, dr_grpo, cispo, dpo, ipo, importance_sampling, ppo, dro or "
               "decoupled_ppo");
  if (reduction != LossReduction::mean && reduction != LossReduction::sum)
    return bad("reduction " + std::to_string(static_cast<int>(reduction)) + " is not mean or sum");
  if (reduction == LossReduction::sum && !sums(kind))
    return bad(std::string{to_string(kind)} +
               " has its own normalisation: reduction sum applies to cross_entropy, importance_sampling, ppo, "
               "cispo and dro");
  if (!(epsilon >= 0) || !(epsilon_high >= 0)) return bad("epsilon and epsilon_high must be >= 0");
  if (!std::isfinite(beta) || !std::isfinite(entropy_coef)) return bad("beta and entropy_coef must be finite");
  if (max_tokens < 0) return bad("max_tokens must be >= 0");
  // A field the kind does not read is refused, not ignored: a user who set
  // it expected it to change the loss.
  const LossSpec defaults{};
  const auto kind_name = std::string{to_string(kind)};
  auto unread = [&](const char* field, double value) {
    return bad(kind_name + " does not read " + field + " (it is " + std::to_string(value) +
               "); leave it at its default or pick a loss that reads it (docs/losses.md)");
  };
  if (kind == LossKind::cross_entropy) {
    if (epsilon != defaults.epsilon) return unread("epsilon", epsilon);
    if (epsilon_high != defaults.epsilon_high) return unread("epsilon_high", epsilon_high);
    if (beta != 0) return unread("beta", beta);
    if (entropy_coef != 0) return unread("entropy_coef", entropy_coef);
  }
  const bool token_sum = reduction == LossReduction::sum;
  if (kind == LossKind::cispo && !token_sum && epsilon != defaults.epsilon) return unread("epsilon", epsilon);
  if (kind == LossKind::importance_sampling || kind == LossKind::dro) {
    if (epsilon != defaults.epsilon) return unread("epsilon", epsilon);
    if (epsilon_high != defaults.epsilon_high) return unread("epsilon_high", epsilon_high);
  }
  if (kind == LossKind::importance_sampling || kind == LossKind::ppo || (kind == LossKind::cispo && token_sum)) {
    if (beta != 0) return unread("beta", beta);
  }
  if (kind == LossKind::dro && !(beta >= 0)) return bad("dro needs beta >= 0, got " + std::to_string(beta));
  if ((token_sum || kind == LossKind::importance_sampling || kind == LossKind::ppo || kind == LossKind::dro) &&
      entropy_coef != 0)
    return unread("entropy_coef", entropy_coef);
  if ((kind == LossKind::ppo || kind == LossKind::cispo) && token_sum && !(epsilon <= 1))
    return bad("epsilon must be <= 1 (the ratio's lower bound 1 - epsilon is >= 0), got " + std::to_string(epsilon));
  if (kind != LossKind::dr_grpo && max_tokens != 0) return unread("max_tokens", static_cast<double>(max_tokens));
  if (is_pairwise(kind)) {
    if (!(beta > 0))
      return bad(kind_name + " needs beta > 0 (how far the policy may move from the reference; 0.1 is usual), got " +
                 std::to_string(beta));
    if (epsilon != defaults.epsilon) return unread("epsilon", epsilon);
    if (epsilon_high != defaults.epsilon_high) return unread("epsilon_high", epsilon_high);
    if (entropy_coef != 0) return unread("entropy_coef", entropy_coef);
  }
  if (!(label_smoothing >= 0 && label_smoothing <= 0.5))
    return bad("label_smoothing must be in [0, 0.5], got " + std::to_string(label_smoothing));
  if (kind != LossKind::dpo && label_smoothing != 0) return unread("label_smoothing", label_smoothing);
  if (cap_mode != CapMode::mask && cap_mode != CapMode::clamp)
    return bad("cap_mode " + std::to_string(static_cast<int>(cap_mode)) + " is not mask (0) or clamp (1)");
  if (kind == LossKind::decoupled_ppo) {
    if (!(weight_cap > 1) || !std::isfinite(weight_cap))
      return bad("decoupled_ppo needs a finite weight_cap > 1 (AReaL uses 5), got " + std::to_string(weight_cap));
    if (beta != 0) return unread("beta", beta);
    if (entropy_coef != 0) return unread("entropy_coef", entropy_coef);
    // Its proximal policy is the step's own weights: the ratio is 1, the clip never acts.
    if (epsilon != defaults.epsilon || epsilon_high != defaults.epsilon_high)
      return bad("decoupled_ppo's proximal policy is the weights at the start of the step, so its ratio is 1 and "
                 "no clip acts: leave epsilon and epsilon_high at their defaults (weight_cap bounds the update)");
  } else {
    if (weight_cap != defaults.weight_cap) return unread("weight_cap", weight_cap);
    if (cap_mode != defaults.cap_mode) return unread("cap_mode", static_cast<double>(cap_mode));
  }
  return {};
}

}  // namespace glint::components
