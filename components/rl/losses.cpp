#include "components/rl/losses.hpp"

#include "components/tensor/torch_bridge.hpp"  // shape_of

#include <c10/core/GradMode.h>
#include <c10/util/Exception.h>

#include <cmath>
#include <optional>
#include <sstream>
#include <string_view>

namespace glint::components::rl {
namespace {

caf::error bad(std::string_view fn, const std::string& text) {
  return make_error(errc::invalid_argument, std::string{fn} + ": " + text);
}

// A LibTorch exception after our checks passed is our bug (or an allocation failure).
caf::error torch_failed(std::string_view fn, const std::exception& e) {
  return error_of_exception(e, std::string{fn} + " (in LibTorch)");
}

std::string number(double x) {
  std::ostringstream s;
  s << x;
  return s.str();
}

double item(const at::Tensor& t) {
  c10::NoGradGuard no_grad;
  return t.item<double>();
}

// Inputs checked, cast to one floating dtype, and with every token outside the mask replaced by 0
// (so garbage there reaches neither value nor gradient).
struct Prepared {
  int64_t B = 0, T = 0;
  at::Tensor mask;        // [B, T] bool
  at::Tensor maskf;       // [B, T] 0/1 in the compute dtype
  at::Tensor tokens;      // 0-dim count of counted tokens, compute dtype
  at::Tensor logps;       // keeps its graph
  at::Tensor old_logps;   // detached
  at::Tensor ref_logps;   // detached, undefined when not given
  at::Tensor advantages;  // [B, T] detached, undefined for cross_entropy
  at::Tensor entropies;   // keeps its graph, undefined when not given
  // Packed rows (LossInputs::sequences); undefined index: a sequence per row.
  Sequences seqs;
};

// Per sequence: the sum of x [B, T] over each sequence's tokens ([B] or [count]).
at::Tensor per_sequence_sum(const at::Tensor& x, const Prepared& p) {
  return p.seqs.index.defined() ? sum_per_sequence(x, p.seqs) : x.sum(1);
}

// A value per sequence ([B] or [count]) at each of its tokens, [B, T].
at::Tensor at_tokens(const at::Tensor& v, const Prepared& p) {
  if (!p.seqs.index.defined()) return v.unsqueeze(1).expand({p.B, p.T});
  return v.index_select(0, p.seqs.index).view({p.B, p.T});
}

caf::error check_like(std::string_view fn, const char* name, const at::Tensor& t, const at::Tensor& logps) {
  if (t.sizes() != logps.sizes())
    return bad(fn, std::string{name} + " is " + shape_of(t) + " but logps is " + shape_of(logps));
  if (t.device() != logps.device())
    return bad(fn, std::string{name} + " is on " + t.device().str() + " but logps is on " + logps.device().str());
  return {};
}

}  // namespace

Sequences sequences_of(const at::Tensor& mask, const at::Tensor& ids) {
  c10::NoGradGuard no_grad;
  auto id = ids.to(at::kLong);
  // (row, id) as one key, numbered in row order, then id order.
  auto key = at::arange(id.size(0), id.options()).unsqueeze(1) * (id.max().item<int64_t>() + 1) + id;
  auto [unique, inverse, counts] = at::_unique2(key.reshape({-1}), /*sorted=*/true, /*return_inverse=*/true);
  Sequences s;
  s.index = inverse.reshape({-1});
  s.count = unique.size(0);
  auto counted = at::zeros({s.count}, at::kInt).index_add(0, s.index, mask.reshape({-1}).to(at::kInt)).gt(0);
  s.counted_ids = counted.nonzero().reshape({-1});
  s.counted = s.counted_ids.size(0);
  return s;
}

at::Tensor sum_per_sequence(const at::Tensor& x, const Sequences& s) {
  return at::zeros({s.count}, x.options()).index_add(0, s.index, x.reshape({-1}));
}

namespace {

// `policy`: also read old_logps, ref_logps, entropies and the (required) advantages.
Result<Prepared> prepare(std::string_view fn, const LossInputs& in, bool policy) {
  if (!in.logps.defined()) return bad(fn, "logps is missing");
  if (in.logps.dim() != 2) return bad(fn, "logps must be [B, T], got " + shape_of(in.logps));
  if (!at::isFloatingType(in.logps.scalar_type()))
    return bad(fn, std::string{"logps must be floating, got "} + c10::toString(in.logps.scalar_type()));
  if (!in.mask.defined()) return bad(fn, "mask is missing");
  if (auto err = check_like(fn, "mask", in.mask, in.logps)) return err;
  if (in.mask.is_complex()) return bad(fn, "mask must be bool, integer or real");

  Prepared p;
  p.B = in.logps.size(0);
  p.T = in.logps.size(1);
  auto dtype = in.logps.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  {
    c10::NoGradGuard no_grad;
    auto mask = in.mask.detach();
    if (mask.scalar_type() != at::kBool) {
      if ((mask.ne(0) & mask.ne(1)).any().item<bool>())
        return bad(fn, "mask " + shape_of(mask) + " holds values other than 0 and 1");
      mask = mask.ne(0);
    }
    p.mask = mask;
    p.maskf = mask.to(dtype);
    p.tokens = p.maskf.sum();
    if (p.tokens.item<double>() == 0) return bad(fn, "mask " + shape_of(mask) + " selects no token");
  }
  if (in.sequences.defined()) {
    if (auto err = check_like(fn, "sequences", in.sequences, in.logps)) return err;
    if (at::isFloatingType(in.sequences.scalar_type()) || in.sequences.is_complex())
      return bad(fn, std::string{"sequences must hold integers, not "} + c10::toString(in.sequences.scalar_type()));
    c10::NoGradGuard no_grad;
    if (in.sequences.lt(0).any().item<bool>()) return bad(fn, "sequences holds negative ids");
    p.seqs = sequences_of(p.mask, in.sequences.detach());
  }
  auto zero = at::zeros({}, in.logps.options().dtype(dtype));
  auto clean = [&](const at::Tensor& t) { return at::where(p.mask, t.to(dtype), zero); };
  p.logps = clean(in.logps);
  if (!policy) return p;

  if (in.old_logps.defined()) {
    if (auto err = check_like(fn, "old_logps", in.old_logps, in.logps)) return err;
    p.old_logps = clean(in.old_logps.detach());
  } else {
    p.old_logps = p.logps.detach();
  }
  if (in.ref_logps.defined()) {
    if (auto err = check_like(fn, "ref_logps", in.ref_logps, in.logps)) return err;
    p.ref_logps = clean(in.ref_logps.detach());
  }
  if (in.entropies.defined()) {
    if (auto err = check_like(fn, "entropies", in.entropies, in.logps)) return err;
    p.entropies = clean(in.entropies);
  }

  const auto& a = in.advantages;
  if (!a.defined()) return bad(fn, "advantages are missing");
  bool per_sequence = a.dim() == 1 && a.size(0) == p.B;
  // [B] advantages with sequence ids are fine while each row is one sequence.
  if (per_sequence && p.seqs.index.defined() && p.seqs.counted > p.mask.any(1).sum().item<int64_t>())
    return bad(fn, "advantages are " + shape_of(a) + ", one per row, but the rows pack several sequences "
                   "(sequences is given): give them per token, [B, T]");
  if (!per_sequence && a.sizes() != in.logps.sizes())
    return bad(fn, "advantages are " + shape_of(a) + " but must be [B] or [B, T] with logps " + shape_of(in.logps));
  if (a.device() != in.logps.device())
    return bad(fn, "advantages are on " + a.device().str() + " but logps is on " + in.logps.device().str());
  {
    c10::NoGradGuard no_grad;
    auto full = (per_sequence ? a.detach().unsqueeze(1).expand({p.B, p.T}) : a.detach()).to(dtype);
    // Checked where they count: a NaN here is usually a group whose rewards had zero std.
    auto non_finite = p.mask & at::isfinite(full).logical_not();
    if (non_finite.any().item<bool>()) {
      auto at_ = non_finite.nonzero()[0];
      int64_t row = at_[0].item<int64_t>(), col = at_[1].item<int64_t>();
      auto value = number(full[row][col].item<double>());
      return bad(fn, per_sequence ? "advantages[" + std::to_string(row) + "] is " + value
                                  : "advantages row " + std::to_string(row) + " is " + value + " at token " +
                                        std::to_string(col));
    }
    p.advantages = at::where(p.mask, full, zero);
  }
  return p;
}

// -- options -----------------------------------------------------------------

enum class Aggregation { seq_mean_token_mean, token_mean, token_sum_norm };

std::optional<Aggregation> parse_aggregation(const std::string& s) {
  if (s == "seq_mean_token_mean") return Aggregation::seq_mean_token_mean;
  if (s == "token_mean") return Aggregation::token_mean;
  if (s == "token_sum_norm") return Aggregation::token_sum_norm;
  return std::nullopt;
}

caf::error check_options(std::string_view fn, const PolicyOptions& o, const Prepared& p) {
  auto non_negative = [](double x) { return std::isfinite(x) && x >= 0; };
  if (!non_negative(o.epsilon)) return bad(fn, "epsilon must be finite and >= 0, got " + number(o.epsilon));
  if (!non_negative(o.epsilon_high))
    return bad(fn, "epsilon_high must be finite and >= 0, got " + number(o.epsilon_high));
  if (!non_negative(o.beta)) return bad(fn, "beta must be finite and >= 0, got " + number(o.beta));
  if (!std::isfinite(o.entropy_coef)) return bad(fn, "entropy_coef must be finite, got " + number(o.entropy_coef));
  if (!(std::isfinite(o.log_ratio_clamp) && o.log_ratio_clamp > 0))
    return bad(fn, "log_ratio_clamp must be finite and > 0, got " + number(o.log_ratio_clamp));
  if (o.max_tokens < 0) return bad(fn, "max_tokens must be >= 0 (0 means T), got " + std::to_string(o.max_tokens));
  if (o.beta > 0 && !p.ref_logps.defined()) return bad(fn, "beta is " + number(o.beta) + " but ref_logps is missing");
  if (o.entropy_coef != 0 && !p.entropies.defined())
    return bad(fn, "entropy_coef is " + number(o.entropy_coef) + " but entropies are missing");
  return {};
}

// -- reductions (inputs are 0 outside the mask) -----------------------------------

at::Tensor token_mean(const at::Tensor& x, const Prepared& p) { return (x * p.maskf).sum() / p.tokens; }

// Mean over each sequence's counted tokens, then over the sequences that have one.
at::Tensor seq_mean(const at::Tensor& x, const Prepared& p) {
  auto n = per_sequence_sum(p.maskf, p);
  auto has = n.gt(0).to(n.scalar_type());
  return (per_sequence_sum(x * p.maskf, p) / n.clamp_min(1) * has).sum() / has.sum();
}

at::Tensor aggregate(const at::Tensor& x, const Prepared& p, Aggregation agg, int64_t max_tokens) {
  switch (agg) {
    case Aggregation::seq_mean_token_mean: return seq_mean(x, p);
    case Aggregation::token_mean: return token_mean(x, p);
    case Aggregation::token_sum_norm:
      // Packed: the sequences, as the padded batch's rows would count them;
      // T is the rows' length, the longest sequence's when rows are packed
      // as glint packs them (no longer than it), as in the padded batch.
      return (x * p.maskf).sum() / static_cast<double>((p.seqs.index.defined() ? p.seqs.counted : p.B) *
                                                        (max_tokens > 0 ? max_tokens : p.T));
  }
  return seq_mean(x, p);
}

// Adds the KL penalty and the entropy bonus to a per-token loss; reports kl and entropy.
at::Tensor regularize(at::Tensor per_token, const Prepared& p, const PolicyOptions& o, LossOutput& out) {
  if (p.ref_logps.defined()) {
    // k3 = exp(ref - logp) - (ref - logp) - 1: unbiased for KL(pi || ref), >= 0, low variance.
    auto d = p.ref_logps - p.logps;
    auto k3 = at::exp(d) - d - 1;
    out.metrics["kl"] = item(token_mean(k3, p));
    out.weights["kl"] = item(p.tokens);
    if (o.beta > 0) per_token = per_token + o.beta * k3;
  }
  if (p.entropies.defined()) {
    out.metrics["entropy"] = item(token_mean(p.entropies, p));
    out.weights["entropy"] = item(p.tokens);
    if (o.entropy_coef != 0) per_token = per_token - o.entropy_coef * p.entropies;
  }
  return per_token;
}

// Share of counted tokens whose clipped term is the one taken (its gradient is zero), as TRL.
at::Tensor clipped(const at::Tensor& ratio, const Prepared& p, const PolicyOptions& o) {
  const auto& a = p.advantages;
  return (ratio.lt(1 - o.epsilon) & a.lt(0)) | (ratio.gt(1 + o.epsilon_high) & a.gt(0));
}

Result<LossOutput> clipped_surrogate(std::string_view fn, const LossInputs& in, const PolicyOptions& o,
                                     std::optional<Aggregation> agg) try {
  if (!agg)
    return bad(fn, "unknown aggregation '" + o.aggregation + "' (seq_mean_token_mean, token_mean, token_sum_norm)");
  auto p = prepare(fn, in, true);
  if (!p) return p.error();
  if (auto err = check_options(fn, o, *p)) return err;
  auto ratio = at::exp((p->logps - p->old_logps).clamp(-o.log_ratio_clamp, o.log_ratio_clamp));
  const auto& a = p->advantages;
  auto per_token = -at::minimum(ratio * a, ratio.clamp(1 - o.epsilon, 1 + o.epsilon_high) * a);
  LossOutput out;
  per_token = regularize(per_token, *p, o, out);
  out.loss = aggregate(per_token, *p, *agg, o.max_tokens);
  c10::NoGradGuard no_grad;
  out.metrics["clip_fraction"] = item(token_mean(clipped(ratio, *p, o).to(ratio.scalar_type()), *p));
  out.metrics["ratio_mean"] = item(token_mean(ratio, *p));
  out.weights["clip_fraction"] = out.weights["ratio_mean"] = item(p->tokens);
  return out;
} catch (const std::exception& e) {
  return torch_failed(fn, e);
}

}  // namespace

Result<LossOutput> cross_entropy(const LossInputs& in) try {
  auto p = prepare("cross_entropy", in, false);
  if (!p) return p.error();
  LossOutput out;
  out.loss = -token_mean(p->logps, *p);
  out.metrics["tokens"] = item(p->tokens);
  return out;
} catch (const std::exception& e) {
  return torch_failed("cross_entropy", e);
}

Result<LossOutput> grpo(const LossInputs& in, const PolicyOptions& options) {
  return clipped_surrogate("grpo", in, options, parse_aggregation(options.aggregation));
}

Result<LossOutput> dr_grpo(const LossInputs& in, const PolicyOptions& options) {
  return clipped_surrogate("dr_grpo", in, options, Aggregation::token_sum_norm);
}

Result<LossOutput> gspo(const LossInputs& in, const PolicyOptions& o) try {
  auto p = prepare("gspo", in, true);
  if (!p) return p.error();
  if (auto err = check_options("gspo", o, *p)) return err;
  // log s_i = mean over counted tokens of logp - old_logp. GSPO-token form: s_i,t has the value s_i
  // and d s_i,t / d logp_t = s_i, which after the per-sequence mean is the gradient of the sequence
  // form. The clamp guards the value only.
  at::Tensor seq_log_ratio;
  {
    c10::NoGradGuard no_grad;
    auto n = per_sequence_sum(p->maskf, *p).clamp_min(1);
    seq_log_ratio = per_sequence_sum((p->logps - p->old_logps) * p->maskf, *p)
                        .div(n)
                        .clamp(-o.log_ratio_clamp, o.log_ratio_clamp);
  }
  auto ratio = at::exp(at_tokens(seq_log_ratio, *p) + p->logps - p->logps.detach());
  const auto& a = p->advantages;
  auto per_token = -at::minimum(ratio * a, ratio.clamp(1 - o.epsilon, 1 + o.epsilon_high) * a);
  LossOutput out;
  per_token = regularize(per_token, *p, o, out);
  out.loss = seq_mean(per_token, *p);
  c10::NoGradGuard no_grad;
  out.metrics["clip_fraction"] = item(token_mean(clipped(ratio, *p, o).to(ratio.scalar_type()), *p));
  // The ratio is per sequence, so its mean is over sequences (with a counted token), not tokens.
  auto has = per_sequence_sum(p->maskf, *p).gt(0);
  out.metrics["ratio_mean"] = item(seq_log_ratio.exp().masked_select(has).mean());
  out.weights["clip_fraction"] = item(p->tokens);
  out.weights["ratio_mean"] = item(has.sum());
  return out;
} catch (const std::exception& e) {
  return torch_failed("gspo", e);
}

Result<LossOutput> cispo(const LossInputs& in, const PolicyOptions& o) try {
  auto p = prepare("cispo", in, true);
  if (!p) return p.error();
  if (auto err = check_options("cispo", o, *p)) return err;
  at::Tensor ratio, weight;
  {
    c10::NoGradGuard no_grad;
    ratio = at::exp((p->logps - p->old_logps).clamp(-o.log_ratio_clamp, o.log_ratio_clamp));
    weight = ratio.clamp_max(1 + o.epsilon_high);
  }
  // The weight is a constant: every token keeps a REINFORCE gradient, only its size is capped.
  auto per_token = -weight * p->advantages * p->logps;
  LossOutput out;
  per_token = regularize(per_token, *p, o, out);
  out.loss = token_mean(per_token, *p);
  c10::NoGradGuard no_grad;
  out.metrics["clip_fraction"] = item(token_mean(ratio.gt(1 + o.epsilon_high).to(ratio.scalar_type()), *p));
  out.metrics["ratio_mean"] = item(token_mean(ratio, *p));
  out.weights["clip_fraction"] = out.weights["ratio_mean"] = item(p->tokens);
  return out;
} catch (const std::exception& e) {
  return torch_failed("cispo", e);
}

Result<LossOutput> token_loss(TokenLoss kind, const LossInputs& in, const TokenLossOptions& o) try {
  constexpr const char* names[] = {"cross_entropy", "importance_sampling", "ppo", "cispo", "dro"};
  const auto index = static_cast<size_t>(kind);
  if (index >= std::size(names)) return bad("token_loss", "unknown kind " + std::to_string(index));
  const std::string_view fn = names[index];
  const bool ce = kind == TokenLoss::cross_entropy;
  if (!ce && in.weights.defined()) return bad(fn, "weights apply to cross_entropy only");
  if (in.ref_logps.defined() || in.entropies.defined())
    return bad(fn, "reads neither ref_logps nor entropies (no KL or entropy term)");
  if (!ce && !in.old_logps.defined()) return bad(fn, "old_logps (the sampler's log-probs) are missing");
  if (kind == TokenLoss::ppo || kind == TokenLoss::cispo) {
    if (!(std::isfinite(o.clip_low) && std::isfinite(o.clip_high) && o.clip_low >= 0 && o.clip_low <= o.clip_high))
      return bad(fn, "the ratio bounds must be finite with 0 <= clip_low <= clip_high, got [" + number(o.clip_low) +
                         ", " + number(o.clip_high) + "]");
  }
  if (kind == TokenLoss::dro && !(std::isfinite(o.beta) && o.beta >= 0))
    return bad(fn, "beta must be finite and >= 0, got " + number(o.beta));
  auto p = prepare(fn, in, !ce);
  if (!p) return p.error();
  LossOutput out;
  at::Tensor per_token, ratio;
  if (ce) {
    at::Tensor w = p->maskf;
    if (in.weights.defined()) {
      if (auto err = check_like(fn, "weights", in.weights, in.logps)) return err;
      c10::NoGradGuard no_grad;
      auto full = in.weights.detach().to(p->maskf.scalar_type());
      if ((p->mask & at::isfinite(full).logical_not()).any().item<bool>())
        return bad(fn, "weights hold NaN or infinite values");
      w = at::where(p->mask, full, at::zeros({}, full.options()));
    }
    per_token = -w * p->logps;
  } else {
    const auto& a = p->advantages;
    const auto& q = p->old_logps;
    ratio = at::exp(p->logps - q);
    switch (kind) {
      case TokenLoss::importance_sampling: per_token = -ratio * a; break;
      case TokenLoss::ppo: per_token = -at::minimum(ratio * a, ratio.clamp(o.clip_low, o.clip_high) * a); break;
      case TokenLoss::cispo: per_token = -ratio.clamp(o.clip_low, o.clip_high).detach() * p->logps * a; break;
      case TokenLoss::dro: per_token = -(p->logps * a - 0.5 * o.beta * (p->logps - q).pow(2)); break;
      case TokenLoss::cross_entropy: break;
    }
  }
  auto total = (per_token * p->maskf).sum();
  out.loss = o.sum ? total : total / p->tokens;
  c10::NoGradGuard no_grad;
  out.metrics["tokens"] = item(p->tokens);
  if (ratio.defined()) {
    out.metrics["ratio_mean"] = item(token_mean(ratio, *p));
    out.weights["ratio_mean"] = item(p->tokens);
    if (kind == TokenLoss::ppo || kind == TokenLoss::cispo) {
      auto outside = (ratio.lt(o.clip_low) | ratio.gt(o.clip_high)).to(ratio.scalar_type());
      out.metrics["clip_fraction"] = item(token_mean(outside, *p));
      out.weights["clip_fraction"] = item(p->tokens);
    }
  }
  return out;
} catch (const std::exception& e) {
  return torch_failed("token_loss", e);
}

Result<LossOutput> decoupled_ppo(const LossInputs& in, const DecoupledOptions& o) try {
  constexpr std::string_view fn = "decoupled_ppo";
  if (in.ref_logps.defined() || in.entropies.defined() || in.weights.defined())
    return bad(fn, "reads neither ref_logps, entropies nor weights");
  if (!in.old_logps.defined()) return bad(fn, "old_logps (the proximal policy's log-probs) are missing");
  if (!in.behavior_logps.defined()) return bad(fn, "behavior_logps (the sampler's log-probs) are missing");
  if (auto err = check_like(fn, "behavior_logps", in.behavior_logps, in.logps)) return err;
  auto finite_nonneg = [](double x) { return std::isfinite(x) && x >= 0; };
  if (!finite_nonneg(o.epsilon) || !finite_nonneg(o.epsilon_high))
    return bad(fn, "epsilon and epsilon_high must be finite and >= 0");
  if (!(std::isfinite(o.weight_cap) && o.weight_cap > 1))
    return bad(fn, "weight_cap must be finite and > 1, got " + number(o.weight_cap));
  const bool mask_mode = o.cap_mode == "mask";
  if (!mask_mode && o.cap_mode != "clamp") return bad(fn, "unknown cap_mode '" + o.cap_mode + "' (mask, clamp)");
  if (!(std::isfinite(o.log_ratio_clamp) && o.log_ratio_clamp > 0))
    return bad(fn, "log_ratio_clamp must be finite and > 0, got " + number(o.log_ratio_clamp));
  auto p = prepare(fn, in, true);
  if (!p) return p.error();
  at::Tensor weight, above, raw;
  {
    c10::NoGradGuard no_grad;
    auto behav = at::where(p->mask, in.behavior_logps.detach().to(p->logps.scalar_type()),
                           at::zeros({}, p->logps.options()));
    raw = at::exp((p->old_logps - behav).clamp(-o.log_ratio_clamp, o.log_ratio_clamp));
    above = raw.gt(o.weight_cap) & p->mask;
    weight = mask_mode ? raw.masked_fill(above, 0) : raw.clamp_max(o.weight_cap);
  }
  auto ratio = at::exp((p->logps - p->old_logps).clamp(-o.log_ratio_clamp, o.log_ratio_clamp));
  const auto& a = p->advantages;
  auto per_token = -weight * at::minimum(ratio * a, ratio.clamp(1 - o.epsilon, 1 + o.epsilon_high) * a);
  LossOutput out;
  out.loss = token_mean(per_token, *p);  // over the original count: capped tokens stay in N
  c10::NoGradGuard no_grad;
  PolicyOptions clip{.epsilon = o.epsilon, .epsilon_high = o.epsilon_high};
  out.metrics["clip_fraction"] = item(token_mean(clipped(ratio, *p, clip).to(ratio.scalar_type()), *p));
  out.metrics["ratio_mean"] = item(token_mean(ratio, *p));
  out.metrics["behavior_weight_mean"] = item(token_mean(raw, *p));
  out.metrics["capped_fraction"] = item(token_mean(above.to(ratio.scalar_type()), *p));
  for (const char* k : {"clip_fraction", "ratio_mean", "behavior_weight_mean", "capped_fraction"})
    out.weights[k] = item(p->tokens);
  return out;
} catch (const std::exception& e) {
  return torch_failed("decoupled_ppo", e);
}

Result<LossOutput> dpo(const DpoInputs& in, const DpoOptions& o) try {
  constexpr std::string_view fn = "dpo";
  const std::pair<const char*, const at::Tensor*> tensors[] = {{"chosen_logps", &in.chosen_logps},
                                                               {"rejected_logps", &in.rejected_logps},
                                                               {"ref_chosen_logps", &in.ref_chosen_logps},
                                                               {"ref_rejected_logps", &in.ref_rejected_logps}};
  for (auto [name, t] : tensors) {
    if (!t->defined()) return bad(fn, std::string{name} + " is missing");
    if (!at::isFloatingType(t->scalar_type()))
      return bad(fn, std::string{name} + " must be floating, got " + c10::toString(t->scalar_type()));
  }
  const auto& chosen = in.chosen_logps;
  if (chosen.dim() != 1 || chosen.size(0) == 0)
    return bad(fn, "chosen_logps must be [B] with B > 0, got " + shape_of(chosen));
  for (auto [name, t] : tensors) {
    if (t->sizes() != chosen.sizes())
      return bad(fn, std::string{name} + " is " + shape_of(*t) + " but chosen_logps is " + shape_of(chosen));
    if (t->device() != chosen.device())
      return bad(fn, std::string{name} + " is on " + t->device().str() + " but chosen_logps is on " +
                         chosen.device().str());
  }
  if (!(std::isfinite(o.beta) && o.beta > 0)) return bad(fn, "beta must be finite and > 0, got " + number(o.beta));
  bool ipo = o.kind == "ipo";
  if (!ipo && o.kind != "sigmoid") return bad(fn, "unknown kind '" + o.kind + "' (sigmoid, ipo)");
  if (!(o.label_smoothing >= 0 && o.label_smoothing <= 0.5))
    return bad(fn, "label_smoothing must be in [0, 0.5], got " + number(o.label_smoothing));
  if (ipo && o.label_smoothing != 0) return bad(fn, "label_smoothing applies to kind 'sigmoid' only, not 'ipo'");

  auto dtype = chosen.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  auto chosen_log_ratio = chosen.to(dtype) - in.ref_chosen_logps.detach().to(dtype);
  auto rejected_log_ratio = in.rejected_logps.to(dtype) - in.ref_rejected_logps.detach().to(dtype);
  auto logits = chosen_log_ratio - rejected_log_ratio;
  at::Tensor losses;
  if (ipo) {
    // IPO regresses the log-ratio margin to 1 / (2 beta) (TRL's form).
    losses = (logits - 1 / (2 * o.beta)).pow(2);
  } else {
    double ls = o.label_smoothing;
    losses = -(1 - ls) * at::log_sigmoid(o.beta * logits) - ls * at::log_sigmoid(-o.beta * logits);
  }
  LossOutput out;
  out.loss = losses.mean();
  c10::NoGradGuard no_grad;
  auto chosen_reward = o.beta * chosen_log_ratio;
  auto rejected_reward = o.beta * rejected_log_ratio;
  out.metrics["reward_chosen"] = item(chosen_reward.mean());
  out.metrics["reward_rejected"] = item(rejected_reward.mean());
  out.metrics["reward_margin"] = item((chosen_reward - rejected_reward).mean());
  out.metrics["reward_accuracy"] = item(chosen_reward.gt(rejected_reward).to(dtype).mean());
  for (const auto& [name, value] : out.metrics) out.weights[name] = static_cast<double>(chosen.size(0));
  return out;
} catch (const std::exception& e) {
  return torch_failed("dpo", e);
}

std::map<std::string, double> combine_metrics(const std::vector<LossOutput>& parts) {
  std::map<std::string, double> out, weight;
  for (const auto& part : parts)
    for (const auto& [name, value] : part.metrics) {
      auto w = part.weights.find(name);
      if (w == part.weights.end()) {
        out[name] += value;
      } else if (w->second > 0) {
        out[name] += value * w->second;
        weight[name] += w->second;
      } else {
        out.try_emplace(name, 0.0);  // a mean over nothing adds nothing
      }
    }
  for (const auto& [name, w] : weight) out[name] /= w;
  return out;
}

}  // namespace glint::components::rl
