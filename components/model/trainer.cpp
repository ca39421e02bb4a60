#include "components/model/trainer.hpp"

#include "components/comm/process_group_impl.hpp"
#include "components/model/optim_impl.hpp"
#include "components/model/transformer.hpp"
#include "components/rl/losses.hpp"
#include "components/tensor/torch_bridge.hpp"

#include <c10/core/GradMode.h>
#include <torch/csrc/autograd/autograd.h>

#include <cmath>

namespace glint::components {

Result<LossKind> parse_loss_kind(std::string_view name) {
  for (auto k : {LossKind::cross_entropy, LossKind::grpo, LossKind::gspo, LossKind::dr_grpo, LossKind::cispo})
    if (to_string(k) == name) return k;
  return make_error(errc::invalid_argument, "loss '" + std::string{name} +
                                                "' is unknown; use cross_entropy, grpo, gspo, dr_grpo or cispo");
}

std::string_view to_string(LossKind k) {
  switch (k) {
    case LossKind::cross_entropy: return "cross_entropy";
    case LossKind::grpo: return "grpo";
    case LossKind::gspo: return "gspo";
    case LossKind::dr_grpo: return "dr_grpo";
    case LossKind::cispo: return "cispo";
  }
  return "?";
}

Result<void> LossSpec::validate() const {
  auto bad = [](const std::string& what) { return make_error(errc::invalid_argument, "loss: " + what); };
  if (to_string(kind) == "?")
    return bad("kind " + std::to_string(static_cast<int>(kind)) + " is not cross_entropy, grpo, gspo, dr_grpo or cispo");
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
  if (kind == LossKind::cispo && epsilon != defaults.epsilon) return unread("epsilon", epsilon);
  if (kind != LossKind::dr_grpo && max_tokens != 0) return unread("max_tokens", static_cast<double>(max_tokens));
  return {};
}

struct Trainer::Impl {
  CausalLM model;
  TrainConfig cfg;
  std::unique_ptr<Optimizer> opt;
  double accumulated = 0;  ///< what the accumulated gradients are a sum over
  int64_t micro_batches = 0;

  ParamList params() const {
    ParamList out;
    auto& m = model.impl();
    if (!cfg.adapter.empty()) {
      auto it = m.adapters.find(cfg.adapter);
      if (it == m.adapters.end()) return out;  // removed since; pass() reports it
      const auto& a = it->second;
      for (const auto& mod : a.modules) {
        out.emplace_back(mod + ".lora_A", a.weights.at(mod).first);
        out.emplace_back(mod + ".lora_B", a.weights.at(mod).second);
      }
      return out;
    }
    for (const auto& n : m.names) out.emplace_back(n, m.params.at(n));
    return out;
  }

  /// The adapter being trained, or an error if it went away.
  Result<PassOptions> pass() const {
    PassOptions p;
    p.train = true;
    if (cfg.adapter.empty()) return p;
    auto a = model.impl().adapter(cfg.adapter);
    if (!a) return a.error();
    if ((*a)->merged)
      return make_error(errc::failed_precondition, "adapter '" + cfg.adapter + "' is merged; unmerge it to train it");
    p.lora = *a;
    return p;
  }
};

Result<Trainer> Trainer::create(CausalLM model, TrainConfig cfg) {
  if (auto ok = cfg.optimizer.validate(); !ok) return ok.error();
  if (auto ok = cfg.scheduler.validate(); !ok) return ok.error();
  auto impl = std::make_shared<Impl>();
  impl->model = std::move(model);
  impl->cfg = cfg;
  impl->opt = std::make_unique<Optimizer>(cfg.optimizer);
  if (!cfg.adapter.empty()) {
    if (auto a = impl->model.impl().adapter(cfg.adapter); !a) return a.error();
    for (auto& [n, p] : impl->params()) p.requires_grad_(true);
  } else {
    for (auto& [n, p] : impl->model.impl().params) p.requires_grad_(true);
  }
  Trainer t;
  t.impl_ = std::move(impl);
  return t;
}

namespace {

// An optional [B, T] (or [B]) float tensor, checked against the batch.
Result<at::Tensor> float_input(const Tensor& t, const char* name, int64_t B, int64_t T, bool per_sequence_ok,
                               at::ScalarType dtype) {
  if (!t.defined()) return at::Tensor{};
  bool ok_shape = (t.dims() == 2 && t.size(0) == B && t.size(1) == T) || (per_sequence_ok && t.dims() == 1 && t.size(0) == B);
  if (!ok_shape)
    return make_error(errc::invalid_argument, std::string{name} + " is " + t.describe() + " but the batch is [" +
                                                  std::to_string(B) + ", " + std::to_string(T) + "]" +
                                                  (per_sequence_ok ? " (or [" + std::to_string(B) + "] per sequence)" : ""));
  if (t.dtype() != Dtype::f32 && t.dtype() != Dtype::bf16 && t.dtype() != Dtype::f16)
    return make_error(errc::invalid_argument, std::string{name} + " must be floating point, not " + t.describe());
  auto v = to_torch(t).to(dtype);
  if (!at::isfinite(v).all().item<bool>())
    return make_error(errc::invalid_argument, std::string{name} + " holds NaN or infinite values");
  return v;
}

}  // namespace

Result<Metrics> Trainer::forward_backward(const TrainBatch& b, const LossSpec& spec) try {
  if (auto ok = spec.validate(); !ok) return ok.error();
  auto& m = impl_->model.impl();
  auto prepared = model_detail::prepare(m.cfg, b.tokens);
  if (!prepared) return prepared.error();
  int64_t B = prepared->ids.size(0), T = prepared->ids.size(1);
  auto dtype = m.param("model.embed_tokens.weight").scalar_type();
  at::Tensor mask = prepared->target_mask;
  if (b.loss_mask.defined()) {
    if (b.loss_mask.dims() != 2 || b.loss_mask.size(0) != B || b.loss_mask.size(1) != T)
      return make_error(errc::invalid_argument, "loss_mask is " + b.loss_mask.describe() + " but the batch is [" +
                                                    std::to_string(B) + ", " + std::to_string(T) + "]");
    mask = mask.logical_and(to_torch(b.loss_mask).to(at::kBool));
  }
  auto old_lp = float_input(b.old_logps, "old_logps", B, T, false, dtype);
  auto ref_lp = float_input(b.ref_logps, "ref_logps", B, T, false, dtype);
  auto adv = float_input(b.advantages, "advantages", B, T, true, dtype);
  for (auto* r : {&old_lp, &ref_lp, &adv})
    if (!*r) return r->error();
  bool policy = spec.kind != LossKind::cross_entropy;
  if (policy && !adv->defined())
    return make_error(errc::invalid_argument, std::string{to_string(spec.kind)} + " needs advantages");
  if (spec.beta > 0 && !ref_lp->defined())
    return make_error(errc::invalid_argument, "beta > 0 (a KL penalty) needs ref_logps");
  // Columns the loss would not read are refused: a batch built for another
  // loss (advantages sent while the loss is still cross_entropy) must not
  // train as if they were there.
  if (!policy)
    for (auto [name, t] : {std::pair{"advantages", &*adv}, {"old_logps", &*old_lp}, {"ref_logps", &*ref_lp}})
      if (t->defined())
        return make_error(errc::invalid_argument, std::string{"the batch has "} + name +
                                                      ", which cross_entropy does not read; set a policy loss "
                                                      "(set_loss grpo, ...) first, or leave it out");


  auto pass = impl_->pass();
  if (!pass) return pass.error();
  c10::AutoGradMode grad(true);
  auto out = m.run(*prepared, spec.entropy_coef != 0, false, *pass);
  rl::LossInputs in;
  in.logps = out.logprobs;
  in.mask = mask;
  in.old_logps = old_lp->defined() ? *old_lp : out.logprobs.detach();
  in.ref_logps = *ref_lp;
  in.advantages = *adv;
  in.entropies = out.entropies;
  rl::PolicyOptions po;
  po.epsilon = spec.epsilon;
  po.epsilon_high = spec.epsilon_high;
  po.beta = spec.beta;
  po.entropy_coef = spec.entropy_coef;
  po.max_tokens = spec.max_tokens;
  Result<rl::LossOutput> loss = make_error(errc::internal, "no loss");
  // What the loss is a mean over, so that the sum can be accumulated.
  double count = 0;
  auto tokens = mask.sum().item<double>();
  auto sequences = mask.any(1).sum().item<double>();
  switch (spec.kind) {
    case LossKind::cross_entropy:
      loss = rl::cross_entropy(in);
      count = tokens;
      break;
    case LossKind::grpo:
      loss = rl::grpo(in, po);
      count = sequences;
      break;
    case LossKind::gspo:
      loss = rl::gspo(in, po);
      count = sequences;
      break;
    case LossKind::dr_grpo:
      loss = rl::dr_grpo(in, po);
      count = static_cast<double>(B);
      break;
    case LossKind::cispo:
      loss = rl::cispo(in, po);
      count = tokens;
      break;
  }
  if (!loss) return loss.error();
  auto value = loss->loss.item<double>();
  if (!std::isfinite(value))
    return make_error(errc::invalid_argument, "the loss is not finite (" + std::to_string(value) +
                                                  "); nothing was accumulated");
  auto objective = loss->loss * count;
  if (impl_->cfg.adapter.empty()) {
    objective.backward();
  } else {
    // Only the adapter's tensors: a full-model trainer on the same model
    // may have made the base weights require gradients, and they must not
    // collect this tenant's.
    auto params = impl_->params();
    std::vector<at::Tensor> inputs;
    for (auto& [n, p] : params) inputs.push_back(p);
    auto grads = torch::autograd::grad({objective}, inputs, {}, c10::nullopt, false, /*allow_unused=*/true);
    c10::NoGradGuard no_grad;
    for (size_t i = 0; i < inputs.size(); ++i) {
      if (!grads[i].defined()) continue;
      auto& p = inputs[i];
      if (p.grad().defined()) p.mutable_grad().add_(grads[i]);
      else p.mutable_grad() = grads[i].clone();
    }
  }
  impl_->accumulated += count;
  ++impl_->micro_batches;
  Metrics metrics = loss->metrics;
  metrics["loss"] = value;
  metrics["tokens"] = tokens;
  metrics["sequences"] = sequences;
  return metrics;
} catch (const std::exception& e) {
  return error_of_exception(e, "forward_backward");
}

Result<Metrics> Trainer::clip_grad_and_step() try {
  const auto& dp = impl_->cfg.dp_group;
  bool distributed = dp && dp->size() > 1;
  // With data parallelism every rank must join the all-reduce, even one
  // whose forward_backward failed (it adds zeros), or its peers would wait.
  if (impl_->micro_batches == 0 && !distributed)
    return make_error(errc::failed_precondition, "clip_grad_and_step without forward_backward since the last step");
  auto params = impl_->params();
  if (params.empty()) return make_error(errc::failed_precondition, "adapter '" + impl_->cfg.adapter + "' was removed");
  double total = impl_->accumulated;
  if (distributed) {
    // Every rank must send the same tensors: a gradient a rank did not
    // produce (a module its batch skipped) counts as zero.
    std::vector<at::Tensor> parts;
    for (auto& [n, p] : params) {
      if (!p.grad().defined()) p.mutable_grad() = at::zeros_like(p);
      parts.push_back(p.grad());
    }
    parts.push_back(at::full({1}, total, at::kDouble));
    if (auto ok = all_reduce_sum(*dp, parts); !ok) {
      zero_grad();
      return ok.error();
    }
    total = parts.back().item<double>();
    if (total == 0) {
      zero_grad();
      return make_error(errc::failed_precondition,
                        "clip_grad_and_step without forward_backward on any data-parallel rank since the last step");
    }
  }
  {
    c10::NoGradGuard no_grad;
    double scale = total > 0 ? 1.0 / total : 0.0;
    for (auto& [n, p] : params)
      if (p.grad().defined()) p.mutable_grad().mul_(scale);
  }
  double norm = clip_grad_norm(params, impl_->cfg.optimizer.max_grad_norm);
  if (!std::isfinite(norm)) {
    zero_grad();
    return make_error(errc::invalid_argument, "the gradient norm is not finite; the step was skipped");
  }
  double lr = current_lr();
  impl_->opt->step(params, lr);
  zero_grad();
  return Metrics{{"grad_norm", norm}, {"lr", lr}, {"step", static_cast<double>(impl_->opt->steps())}};
} catch (const std::exception& e) {
  return error_of_exception(e, "clip_grad_and_step");
}

void Trainer::zero_grad() {
  for (auto& [n, p] : impl_->params())
    if (p.grad().defined()) p.mutable_grad().zero_();
  impl_->accumulated = 0;
  impl_->micro_batches = 0;
}

Result<void> Trainer::set_optimizer(const OptimizerConfig& cfg) {
  if (auto ok = cfg.validate(); !ok) return ok.error();
  impl_->cfg.optimizer = cfg;
  impl_->opt = std::make_unique<Optimizer>(cfg);
  return {};
}

Result<void> Trainer::set_lr_scheduler(const SchedulerConfig& cfg) {
  if (auto ok = cfg.validate(); !ok) return ok.error();
  impl_->cfg.scheduler = cfg;
  return {};
}

const TrainConfig& Trainer::config() const { return impl_->cfg; }
int64_t Trainer::step() const { return impl_->opt->steps(); }
double Trainer::current_lr() const {
  return learning_rate(impl_->cfg.scheduler, impl_->cfg.optimizer.lr, impl_->opt->steps());
}
CausalLM& Trainer::model() { return impl_->model; }
NamedTensors Trainer::optimizer_state() const { return impl_->opt->state(); }
Result<void> Trainer::load_optimizer_state(const std::map<std::string, Tensor>& state) {
  return impl_->opt->load_state(state, impl_->params());
}

}  // namespace glint::components
