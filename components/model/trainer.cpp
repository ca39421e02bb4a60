#include "components/model/trainer.hpp"

#include "components/comm/process_group_impl.hpp"
#include "components/data/detail/splitmix.hpp"
#include "components/model/optim_impl.hpp"
#include "components/model/transformer.hpp"
#include "components/parallel/expert_parallel.hpp"
#include "components/parallel/fsdp.hpp"
#include "components/parallel/pipeline.hpp"
#include "components/parallel/tensor_parallel.hpp"
#include "components/rl/losses.hpp"
#include "components/tensor/torch_bridge.hpp"
#include "runtime/hash.hpp"
#include "runtime/log.hpp"
#include "components/tensor/block_cache.hpp"
#include "runtime/memory.hpp"
#include "runtime/stop.hpp"

#include <ATen/CPUGeneratorImpl.h>
#include <c10/core/GradMode.h>
#include <torch/csrc/autograd/autograd.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <optional>

namespace glint::components {

namespace {

/// One seed from several numbers (splitmix64 over each in turn).
uint64_t mix_seed(uint64_t a, uint64_t b, uint64_t c) {
  detail::SplitMix64 g{0x6c696e74ULL};
  uint64_t s = 0;
  for (uint64_t v : {a, b, c}) {
    g.state ^= v;
    s = g.next();
  }
  return s;
}

// The rows [begin, begin + n) of a checked batch, as the model and the loss read them.
struct Slice {
  model_detail::Prepared prepared;
  at::Tensor mask, old_logps, ref_logps, advantages, weights;  // undefined when not given
  at::Tensor routes;  // i64 [B, T, S, k] for routing replay, undefined without
};

Slice rows_of(const Slice& all, int64_t begin, int64_t n) {
  auto rows = [&](const at::Tensor& t) { return t.defined() ? t.narrow(0, begin, n) : t; };
  const auto& p = all.prepared;
  return {{rows(p.ids), rows(p.positions), rows(p.allowed), rows(p.targets), rows(p.target_mask), rows(p.segments),
           rows(p.real)},
          rows(all.mask), rows(all.old_logps), rows(all.ref_logps), rows(all.advantages), rows(all.weights),
          rows(all.routes)};
}

// The sequences with a counted token in `mask` [B, T]: its rows, or in a
// packed batch the (row, segment) pairs (rl::sequences_of).
double counted_sequences(const at::Tensor& mask, const at::Tensor& segments) {
  if (!segments.defined()) return mask.any(1).sum().item<double>();
  return static_cast<double>(rl::sequences_of(mask, segments).counted);
}

}  // namespace

struct Trainer::Impl {
  CausalLM model;
  TrainConfig cfg;
  std::unique_ptr<Optimizer> opt;
  double accumulated = 0;  ///< what the accumulated gradients are a sum over
  int64_t micro_batches = 0;
  /// The micro-batches a call was last split into, said once when it
  /// changes (a step split for memory is slow; the user learns why).
  int64_t said_slices = 1;
  int64_t summed = 0;      ///< of those, the passes of a loss with reduction sum (never divided)
  std::unique_ptr<Fsdp> fsdp;  ///< with fsdp_group: the base's shards
  bool pass_failed = false;    ///< with fsdp: a pass of this forward_backward call failed
  int64_t passes_run = 0;      ///< with fsdp: the passes of this call this rank ran its own batch in
  /// With pp, on the last stage: where accumulate puts the objective
  /// instead of running its backward (the pipeline runs it).
  at::Tensor* deferred_objective = nullptr;
  /// While pass_once runs on a model with experts: what its sparse blocks
  /// routed and the slice's real tokens, for accumulate's load-balancing
  /// loss and router metrics.
  const RouterRecord* routes = nullptr;
  at::Tensor routed_tokens;

  ParamList params() const {
    if (fsdp && fsdp->trains_base()) return fsdp->shards();
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
    // Tensor-parallel shards carry the rank in their names, so that one
    // rank's optimizer state is refused by another (same shapes).
    // Pipeline stages alike: a stage's state must not load, in part, into
    // a trainer of another cut.
    // Expert-parallel ranks too (each holds other experts).
    const std::string prefix =
        m.tp   ? "tp" + std::to_string(m.tp->pg->rank()) + "of" + std::to_string(m.tp->pg->size()) + "."
        : m.pp ? "pp" + std::to_string(m.pp->pg->rank()) + "of" + std::to_string(m.pp->pg->size()) + "."
        : m.ep ? "ep" + std::to_string(m.ep->pg->rank()) + "of" + std::to_string(m.ep->pg->size()) + "."
               : "";
    for (const auto& n : m.names) out.emplace_back(prefix + n, m.params.at(n));
    return out;
  }

  using PassResult = Result<std::pair<rl::LossOutput, double>>;
  /// `logps`: when not null, set to the slice's target log-probs (detached).
  Result<std::pair<rl::LossOutput, double>> pass_once(const Slice& s, const LossSpec& spec, const PassOptions& pass,
                                                      at::Tensor* logps = nullptr);
  Result<std::pair<rl::LossOutput, double>> pairwise_loss(const Slice& s, const LossSpec& spec, const at::Tensor& logps);
  /// `sum`: the loss is a plain sum, added as it is (its count is 0).
  Result<std::pair<rl::LossOutput, double>> accumulate(rl::LossOutput loss, double count, bool sum = false);
  /// How many rows of a [B, T] batch one pass may take: all B when they fit
  /// the budget, an error when not even one does. `keep_gradients`: a copy
  /// of the accumulated gradients is kept besides.
  /// `pairs`: a whole number of pairs (an even count, at least 2).
  Result<int64_t> rows_per_pass(int64_t B, int64_t T, int64_t elem_bytes, bool entropies, bool keep_gradients,
                                bool pairs) const;

  /// One forward (and backward) of the model as `fn` runs it: with FSDP,
  /// after the group has agreed that a pass runs, between begin_pass and
  /// end_pass (which finishes the pass's collectives if `fn` failed).
  /// `voted`: the group agreed already (a rank joining another's pass).
  template <class R>
  R as_pass(const PassOptions& pass, const std::function<R()>& fn, bool voted = false) {
    if (!collective_passes()) return fn();
    if (!voted)
      if (auto v = vote(true, false); !v) return v.error();
    ++passes_run;
    if (fsdp)
      if (auto ok = fsdp->begin_pass(pass.lora); !ok) {
        pass_failed = true;
        return ok.error();
      }
    R r = make_error(errc::internal, "no pass");
    try {
      r = fn();
    } catch (const std::exception& e) {
      r = carried_error(e).value_or(error_of_exception(e, "a forward and backward pass"));
    }
    if (fsdp)
      if (auto ok = fsdp->end_pass(); !ok) {
        pass_failed = true;
        return ok.error();
      }
    if (!r) pass_failed = true;
    return r;
  }
  /// The expert-parallel group, or null.
  ProcessGroup* ep_group() const { return model.impl().ep ? model.impl().ep->pg.get() : nullptr; }
  /// Whether each pass is collective over a group of ranks with batches of
  /// their own (fsdp's or ep's), which then agree on every pass (vote).
  bool collective_passes() const { return fsdp || ep_group(); }
  /// Before each pass: whether this rank has one (`mine`) or failed, and
  /// whether any rank has one or failed.
  struct Vote {
    bool any_pass = false, any_failed = false;
  };
  /// With fsdp and ep both, over the fsdp group and then the ep group: every
  /// rank of the block they span.
  Result<Vote> vote(bool mine, bool failed) {
    if (fsdp) {
      auto v = fsdp->vote(mine, failed);
      if (!v) return v.error();
      mine = v->any_pass;
      failed = v->any_failed;
    }
    if (auto* e = ep_group()) {
      std::vector<at::Tensor> t{at::tensor({mine ? 1.0 : 0.0, failed ? 1.0 : 0.0}, at::kDouble)};
      if (auto ok = all_reduce_sum(*e, t); !ok) return ok.error();
      mine = t[0][0].item<double>() > 0;
      failed = t[0][1].item<double>() > 0;
    }
    return Vote{mine, failed};
  }
  /// The groups a pass is collective over, for messages.
  const char* pass_groups() const { return fsdp && ep_group() ? "fsdp and ep" : fsdp ? "fsdp" : "ep"; }
  /// Whether trained parameter `name` (params()) is this ep rank's own
  /// experts (or their fsdp shard), which no other ep rank holds.
  bool expert_param(const std::string& name) const {
    return fsdp ? fsdp->holds_experts(name) : ep::expert_of(name) >= 0;
  }
  /// With FSDP: a pass of a one-token row whose loss is 0, for a rank with
  /// no pass of its own while others run one (the same collectives).
  Result<void> idle_pass(const PassOptions& pass);
  /// The group the model is cut over (fsdp, tp, pp or ep; create refuses
  /// mixes other than fsdp with ep, where this is fsdp's), or null when this
  /// rank holds it whole.
  ProcessGroup* model_parallel_group() const {
    if (fsdp) return &fsdp->group();
    for (const auto* g : {&cfg.tp_group, &cfg.pp_group})
      if (*g && (*g)->size() > 1) return g->get();
    return ep_group();
  }
  /// The data-parallel rank this process is (over dp, fsdp and ep).
  uint64_t data_rank() const {
    const uint64_t f = cfg.fsdp_group ? static_cast<uint64_t>(cfg.fsdp_group->size()) : 1;
    const uint64_t fr = cfg.fsdp_group ? static_cast<uint64_t>(cfg.fsdp_group->rank()) : 0;
    const auto* e = ep_group();
    const uint64_t es = e ? static_cast<uint64_t>(e->size()) : 1, er = e ? static_cast<uint64_t>(e->rank()) : 0;
    return ((cfg.dp_group ? static_cast<uint64_t>(cfg.dp_group->rank()) : 0) * f + fr) * es + er;
  }

  /// The adapter being trained, or an error if it went away.
  Result<PassOptions> pass() const {
    PassOptions p;
    p.train = true;
    if (fsdp) p.layer_hooks = fsdp->hooks();
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
  if (cfg.micro_batch_rows < 0)
    return make_error(errc::invalid_argument,
                      "micro_batch_rows is " + std::to_string(cfg.micro_batch_rows) + "; use 0 (as many as fit) or more");
  if (auto ok = cfg.optimizer.validate(); !ok) return ok.error();
  if (auto ok = cfg.scheduler.validate(); !ok) return ok.error();
  keep_freed_memory();  // every step allocates what the last one freed
  keep_freed_tensor_blocks();
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
  const auto size = [](const std::shared_ptr<ProcessGroup>& g) { return g ? g->size() : 1; };
  if (size(cfg.ep_group) > 1 && (!cfg.adapter.empty() || size(cfg.tp_group) > 1 || size(cfg.pp_group) > 1))
    return make_error(errc::unimplemented, "expert parallelism with an adapter, tp_group or pp_group is "
                                           "not built yet (ep combines with dp and fsdp)");
  if (cfg.tp_group && cfg.tp_group->size() > 1) {
    if (!cfg.adapter.empty() || (cfg.fsdp_group && cfg.fsdp_group->size() > 1))
      return make_error(errc::unimplemented, "tensor parallelism with an adapter or with fsdp_group is not built yet");
    if (auto ok = tp::shard_model(impl->model.impl(), cfg.tp_group); !ok)
      return with_context(ok.error(), "sharding the model over the tp group");
    for (auto& [n, p] : impl->model.impl().params) p.requires_grad_(true);
  }
  if (cfg.pp_group && cfg.pp_group->size() > 1) {
    if (!cfg.adapter.empty() || (cfg.fsdp_group && cfg.fsdp_group->size() > 1) ||
        (cfg.tp_group && cfg.tp_group->size() > 1))
      return make_error(errc::unimplemented,
                        "pipeline parallelism with an adapter, fsdp_group or tp_group is not built yet");
    if (auto ok = pp::shard_model(impl->model.impl(), cfg.pp_group); !ok)
      return with_context(ok.error(), "cutting the model into pipeline stages");
  }
  if (cfg.ep_group && cfg.ep_group->size() > 1) {
    if (auto ok = ep::shard_model(impl->model.impl(), cfg.ep_group); !ok)
      return with_context(ok.error(), "splitting the experts over the ep group");
  }
  if (cfg.fsdp_group && cfg.fsdp_group->size() > 1) {
    auto f = Fsdp::shard(impl->model.impl(), cfg.fsdp_group, cfg.adapter.empty());
    if (!f) return with_context(f.error(), "sharding the model over the fsdp group");
    impl->fsdp = std::move(*f);
  }
  Trainer t;
  t.impl_ = std::move(impl);
  return t;
}

Result<void> Trainer::Impl::idle_pass(const PassOptions& pass) {
  auto ids = Tensor::zeros(Dtype::i64, {1, 2});
  if (!ids) return ids.error();
  TokenBatch one{.input_ids = std::move(*ids)};
  auto prepared = model_detail::prepare(model.impl().cfg, one);
  if (!prepared) return prepared.error();
  auto plain = pass;
  plain.train = false;  // no dropout: the draws would be the process's generator's
  return as_pass<Result<void>>(plain, [&]() -> Result<void> {
    c10::AutoGradMode grad(true);
    auto out = model.impl().run(*prepared, false, false, plain);
    auto nothing = out.logprobs.sum() * 0;
    if (cfg.adapter.empty()) {
      nothing.backward();
      return {};
    }
    std::vector<at::Tensor> inputs;
    for (auto& [n, p] : params()) inputs.push_back(p);
    (void)torch::autograd::grad({nothing}, inputs, {}, c10::nullopt, false, /*allow_unused=*/true);
    return {};
  }, /*voted=*/true);
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


// One forward and backward pass: adds the gradient of the loss's sum over
// `s`. Returns the loss's output (its metrics, with "loss" weighted by what
// it is a mean over) and that count. Adds nothing when it fails.
Result<std::pair<rl::LossOutput, double>> Trainer::Impl::pass_once(const Slice& s, const LossSpec& spec,
                                                                  const PassOptions& pass_in, at::Tensor* logps) {
  const auto& m = model.impl();
  // A model with experts records its routes (a pipeline stage sees only
  // its own layers: no router loss or metrics there).
  RouterRecord record;
  PassOptions pass = pass_in;
  if (m.cfg.has_experts() && m.pp && m.cfg.moe.output_router_logits)
    return make_error(errc::unimplemented,
                      "config.json sets output_router_logits, whose load-balancing loss needs every sparse layer's "
                      "routes; a pipeline stage holds only its own layers, and that loss is not built across stages "
                      "yet. Set output_router_logits to false, or train without pp");
  if (s.routes.defined()) pass.replay = s.routes.reshape({-1, s.routes.size(2), s.routes.size(3)});
  if (m.cfg.has_experts() && !m.pp) {
    pass.routes = &record;
    routes = &record;
    routed_tokens = s.prepared.real;
  }
  struct Forget {
    Trainer::Impl& im;
    ~Forget() { im.routes = nullptr, im.routed_tokens = at::Tensor{}; }
  } forget{*this};
  auto out = m.run(s.prepared, spec.entropy_coef != 0, false, pass);
  if (logps) *logps = out.logprobs.detach();
  if (is_pairwise(spec.kind)) return pairwise_loss(s, spec, out.logprobs);
  const bool token_sum = spec.reduction == LossReduction::sum;
  if (token_sum || spec.kind == LossKind::importance_sampling || spec.kind == LossKind::ppo ||
      spec.kind == LossKind::dro) {
    rl::LossInputs in;
    in.logps = out.logprobs;
    in.mask = s.mask;
    in.old_logps = s.old_logps;
    in.advantages = s.advantages;
    in.weights = s.weights;
    rl::TokenLossOptions o;
    o.clip_low = 1 - spec.epsilon;
    o.clip_high = 1 + spec.epsilon_high;
    o.beta = spec.beta;
    o.sum = token_sum;
    rl::TokenLoss kind = rl::TokenLoss::cross_entropy;
    switch (spec.kind) {
      case LossKind::importance_sampling: kind = rl::TokenLoss::importance_sampling; break;
      case LossKind::ppo: kind = rl::TokenLoss::ppo; break;
      case LossKind::cispo: kind = rl::TokenLoss::cispo; break;
      case LossKind::dro: kind = rl::TokenLoss::dro; break;
      default: break;
    }
    auto loss = rl::token_loss(kind, in, o);
    if (!loss) return loss.error();
    if (token_sum) return accumulate(std::move(*loss), 0, true);
    return accumulate(std::move(*loss), s.mask.sum().item<double>());
  }
  if (spec.kind == LossKind::decoupled_ppo) {
    if (!s.old_logps.defined())
      return make_error(errc::invalid_argument,
                        "decoupled_ppo needs old_logps: the sampler's log-probs of the completion tokens "
                        "(actors::training_batch puts them in)");
    // The proximal policy is the weights at the start of this step: every
    // micro-batch of a step runs before the update, so this is exact for
    // one optimizer step per batch of samples.
    rl::LossInputs in;
    in.logps = out.logprobs;
    in.mask = s.mask;
    in.old_logps = out.logprobs.detach();
    in.behavior_logps = s.old_logps;
    in.advantages = s.advantages;
    rl::DecoupledOptions o;
    o.epsilon = spec.epsilon;
    o.epsilon_high = spec.epsilon_high;
    o.weight_cap = spec.weight_cap;
    o.cap_mode = spec.cap_mode == LossSpec::CapMode::clamp ? "clamp" : "mask";
    auto loss = rl::decoupled_ppo(in, o);
    if (!loss) return loss.error();
    return accumulate(std::move(*loss), s.mask.sum().item<double>());
  }
  rl::LossInputs in;
  in.logps = out.logprobs;
  in.mask = s.mask;
  in.old_logps = s.old_logps.defined() ? s.old_logps : out.logprobs.detach();
  in.ref_logps = s.ref_logps;
  in.advantages = s.advantages;
  in.entropies = out.entropies;
  in.sequences = s.prepared.segments;
  rl::PolicyOptions po;
  po.epsilon = spec.epsilon;
  po.epsilon_high = spec.epsilon_high;
  po.beta = spec.beta;
  po.entropy_coef = spec.entropy_coef;
  po.max_tokens = spec.max_tokens;
  Result<rl::LossOutput> loss = make_error(errc::internal, "no loss");
  // What the loss is a mean over, so that the sum can be accumulated.
  double count = 0;
  switch (spec.kind) {
    case LossKind::cross_entropy:
      loss = rl::cross_entropy(in);
      count = s.mask.sum().item<double>();
      break;
    case LossKind::grpo:
      loss = rl::grpo(in, po);
      count = counted_sequences(s.mask, s.prepared.segments);
      break;
    case LossKind::gspo:
      loss = rl::gspo(in, po);
      count = counted_sequences(s.mask, s.prepared.segments);
      break;
    case LossKind::dr_grpo:
      loss = rl::dr_grpo(in, po);
      // Every row counts in a padded batch; every sequence in a packed one.
      count = s.prepared.segments.defined() ? counted_sequences(s.mask, s.prepared.segments)
                                            : static_cast<double>(s.mask.size(0));
      break;
    case LossKind::cispo:
      loss = rl::cispo(in, po);
      count = s.mask.sum().item<double>();
      break;
    case LossKind::dpo:
    case LossKind::ipo:
    case LossKind::importance_sampling:
    case LossKind::ppo:
    case LossKind::dro:
    case LossKind::decoupled_ppo: break;  // above
  }
  if (!loss) return loss.error();
  return accumulate(std::move(*loss), count);
}

// DPO / IPO over the slice's pairs (rows 2i chosen, 2i + 1 rejected): the
// response log-probs summed per row (IPO: their mean), against the reference's.
Result<std::pair<rl::LossOutput, double>> Trainer::Impl::pairwise_loss(const Slice& s, const LossSpec& spec,
                                                                      const at::Tensor& logps) {
  // Summed in f32 (f64 for an f64 model) whatever the model's dtype.
  const auto dtype = logps.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  const auto skip = s.mask.logical_not();
  // Per response: a row's sum, or in packed rows each (row, segment)'s, in
  // order, those with a counted token (forward_backward checked that they
  // come in whole pairs per row).
  std::function<at::Tensor(const at::Tensor&)> per_response = [](const at::Tensor& x) { return x.sum(1); };
  if (s.prepared.segments.defined()) {
    per_response = [seqs = rl::sequences_of(s.mask, s.prepared.segments)](const at::Tensor& x) {
      return rl::sum_per_sequence(x, seqs).index_select(0, seqs.counted_ids);
    };
  }
  auto policy = per_response(logps.to(dtype).masked_fill(skip, 0));
  auto ref = per_response(s.ref_logps.to(dtype).masked_fill(skip, 0));
  if (spec.kind == LossKind::ipo) {
    // IPO compares mean log-probs per response token (as TRL does), so
    // that its target margin 1 / (2 beta) does not scale with length.
    auto tokens = per_response(s.mask.to(dtype));
    policy = policy / tokens;
    ref = ref / tokens;
  }
  const int64_t pairs = policy.size(0) / 2;
  auto even = [&](const at::Tensor& t) { return t.view({pairs, 2}).select(1, 0); };
  auto odd = [&](const at::Tensor& t) { return t.view({pairs, 2}).select(1, 1); };
  rl::DpoInputs in{even(policy), odd(policy), even(ref), odd(ref)};
  rl::DpoOptions o;
  o.beta = spec.beta;
  o.kind = spec.kind == LossKind::ipo ? "ipo" : "sigmoid";
  o.label_smoothing = spec.label_smoothing;
  auto loss = rl::dpo(in, o);
  if (!loss) return loss.error();
  return accumulate(std::move(*loss), static_cast<double>(pairs));
}

// Adds the gradient of `loss` times `count` (the loss's sum) to the
// trained parameters; nothing when the loss is not finite.
Result<std::pair<rl::LossOutput, double>> Trainer::Impl::accumulate(rl::LossOutput loss, double count, bool sum) {
  if (routes && !routes->layers.empty()) {
    // Mixture of experts: the router's metrics, and with
    // output_router_logits transformers' load-balancing loss added to the
    // (mean) loss with its coefficient.
    const auto& moe = model.impl().cfg.moe;
    auto st = model_detail::router_statistics(*routes, routed_tokens, moe.num_experts);
    if (moe.output_router_logits) {
      if (sum)
        return make_error(errc::invalid_argument,
                          "config.json sets output_router_logits, which adds the load-balancing loss to a mean "
                          "loss as transformers does; this loss is a plain sum (reduction sum), to which it has no "
                          "defined weight. Use a mean reduction, or set output_router_logits to false");
      loss.loss = loss.loss + moe.router_aux_loss_coef * st.aux_loss;
    }
    const double w = static_cast<double>(st.tokens);
    double worst = 0;
    auto metric = [&](const std::string& name, double v) {
      loss.metrics[name] = v;
      loss.weights[name] = w;
    };
    metric("moe_aux_loss", st.aux_loss.item<double>());
    metric("moe_router_entropy", st.entropy);
    for (const auto& [layer, share] : st.load_max_over_mean) {
      metric("moe_load_max_over_mean_layer_" + std::to_string(layer), share);
      worst = std::max(worst, share);
    }
    metric("moe_load_max_over_mean", worst);
  }
  auto value = loss.loss.item<double>();
  if (!std::isfinite(value))
    return make_error(errc::invalid_argument, "the loss is not finite (" + std::to_string(value) +
                                                  "); nothing was accumulated");
  auto objective = sum ? loss.loss : loss.loss * count;
  if (deferred_objective) {
    *deferred_objective = objective;
  } else if (cfg.adapter.empty()) {
    objective.backward();
  } else {
    // Only the adapter's tensors: a full-model trainer on the same model
    // may have made the base weights require gradients, and they must not
    // collect this tenant's.
    auto ps = params();
    std::vector<at::Tensor> inputs;
    for (auto& [n, p] : ps) inputs.push_back(p);
    auto grads = torch::autograd::grad({objective}, inputs, {}, c10::nullopt, false, /*allow_unused=*/true);
    c10::NoGradGuard no_grad;
    for (size_t i = 0; i < inputs.size(); ++i) {
      if (!grads[i].defined()) continue;
      auto& p = inputs[i];
      if (p.grad().defined()) p.mutable_grad().add_(grads[i]);
      else p.mutable_grad() = grads[i].clone();
    }
  }
  loss.metrics["loss"] = value;
  if (sum) {
    // Summed over slices (no weight), and over data-parallel ranks (loss_sum).
    loss.metrics["loss_sum"] = value;
  } else {
    loss.weights["loss"] = count;
  }
  return std::pair{std::move(loss), count};
}

Result<int64_t> Trainer::Impl::rows_per_pass(int64_t B, int64_t T, int64_t elem_bytes, bool entropies,
                                             bool keep_gradients, bool pairs) const {
  const double per_row =
      model_detail::training_bytes_per_row(model.impl().cfg, T, elem_bytes, entropies, !cfg.adapter.empty());
  // A split batch keeps a copy of the gradients accumulated before it, to
  // put them back if a later slice fails.
  double copy = 0;
  if (keep_gradients)
    for (const auto& [n, p] : params()) copy += static_cast<double>(p.numel() * p.element_size());
  const bool fixed = cfg.memory_budget_bytes > 0;
  const auto available = [] { return 0.8 * static_cast<double>(memory_available_bytes()); };
  double budget = fixed ? static_cast<double>(cfg.memory_budget_bytes) : available();
  // Where memory is short enough to split the batch, the large blocks the
  // block cache keeps go back first: they serve only requests of about
  // their own size, so they cannot be counted on as room.
  if (!fixed && budget - copy < static_cast<double>(B) * per_row && kept_tensor_block_bytes() > 0) {
    release_kept_tensor_blocks();
    budget = available();
  }
  const double room = budget - copy;
  const double least = pairs ? 2 * per_row : per_row;
  if (room < least)
    return make_error(errc::resource_exhausted,
                      "training " + (pairs ? std::string{"one pair of rows"} : std::string{"one row"}) + " of " +
                          std::to_string(T) + " tokens needs about " + format_bytes(least) +
                          " (the activations of its forward and backward pass" +
                          (copy > 0 ? ", besides " + format_bytes(copy) + " for a copy of the gradients" : "") +
                          "), more than the " + format_bytes(budget) +
                          (fixed ? " of TrainConfig::memory_budget_bytes" : " this process may use now (80% of the "
                                                                            "memory available)") +
                          ": use shorter sequences (max_length) or a smaller model, or free memory");
  auto rows = std::min<int64_t>(B, static_cast<int64_t>(room / per_row));
  if (cfg.micro_batch_rows > 0) rows = std::min(rows, cfg.micro_batch_rows);
  if (pairs) rows = std::max<int64_t>(2, rows - rows % 2);  // a pair is never split
  return rows;
}

namespace {

// Under tensor and pipeline parallelism every rank must take the same batch
// (each pass is collective, and each rank's part of it counts): the group compares
// a 64-bit hash of everything the call reads (every tensor of the batch,
// its dtype and shape, the loss spec, whether log-probs are asked) before
// anything else, so that all fail together.
Result<void> same_batch_on_ranks(ProcessGroup& tp, const char* group, const TrainBatch& b, const LossSpec& spec,
                                 bool logps) {
  Fnv1a hash;
  auto mix = [&](const void* p, size_t n) { hash.add(p, n); };
  auto mix_value = [&](auto v) { hash.add_value(v); };
  for (const Tensor* t : {&b.tokens.input_ids, &b.tokens.attention_mask, &b.tokens.segment_ids, &b.tokens.position_ids,
                          &b.tokens.target_ids, &b.loss_mask, &b.old_logps, &b.ref_logps, &b.advantages,
                          &b.loss_weights, &b.routes}) {
    mix_value(t->defined());
    if (!t->defined()) continue;
    mix_value(static_cast<int>(t->dtype()));
    for (size_t d = 0; d < t->dims(); ++d) mix_value(t->size(d));
    auto c = to_torch(*t).contiguous();
    mix(c.data_ptr(), c.nbytes());
  }
  for (double v : {spec.epsilon, spec.epsilon_high, spec.beta, spec.entropy_coef, spec.label_smoothing, spec.weight_cap})
    mix_value(v);
  mix_value(static_cast<int>(spec.kind));
  mix_value(static_cast<int>(spec.reduction));
  mix_value(static_cast<int>(spec.cap_mode));
  mix_value(spec.max_tokens);
  mix_value(logps);
  // Two 32-bit halves, each exact in a double.
  const uint64_t h = hash.value;
  auto mine = at::tensor({static_cast<double>(h >> 32), static_cast<double>(h & 0xffffffffULL)}, at::kDouble);
  auto all = at::empty({tp.size() * 2}, at::kDouble);
  auto in = from_torch(mine);
  auto out = from_torch(all);
  if (!in || !out) return make_error(errc::internal, "a batch fingerprint as glint tensors");
  if (auto ok = tp.all_gather(*in, *out); !ok) return ok;
  for (int r = 0; r < tp.size(); ++r)
    if (!at::equal(all.narrow(0, r * 2, 2), mine))
      return make_error(errc::invalid_argument,
                        std::string{"the ranks of the "} + group +
                            " group were given different batches or loss settings (rank " +
                            std::to_string(r) + "'s differ from rank " + std::to_string(tp.rank()) +
                            "'s): they share every batch; give them the same one");
  return {};
}

// The fewest rows per pass any rank of a tensor- or pipeline-parallel group
// can take (their memory may differ), so that every rank slices the batch
// alike, and whether a stop was requested on any of them (then none runs
// the call: a rank that stopped between slices would leave the others
// waiting in the next slice's collectives). Every rank joins, also one
// whose own estimate failed (`rows` an error: not even one row fits), and
// then every rank fails.
Result<int64_t> fewest_rows(ProcessGroup& g, const Result<int64_t>& rows) {
  const auto stop = check_stop("forward_backward");
  auto v = at::zeros({g.size() + 1}, at::kDouble);
  v[g.rank()] = rows ? static_cast<double>(*rows) : 0.0;
  v[g.size()] = stop ? 0.0 : 1.0;
  std::vector<at::Tensor> t{v};
  if (auto ok = all_reduce_sum(g, t); !ok) return ok.error();
  if (!rows) return rows.error();
  if (!stop) return stop.error();
  if (t[0][g.size()].item<double>() > 0)
    return make_error(errc::aborted, "forward_backward: a stop was requested on another rank of the group, so no "
                                     "rank ran the call");
  const auto fewest = static_cast<int64_t>(t[0].narrow(0, 0, g.size()).min().item<double>());
  if (fewest < 1)
    return make_error(errc::resource_exhausted, "another rank of the group has not the memory for one row of this "
                                                "batch (its error gives the estimate); shorten the sequences or free "
                                                "memory there");
  return fewest;
}

// The last pipeline stage's answer to a forward_backward, as text every
// stage can read: its error ("!" code, message) or its count and metrics
// (doubles printed exactly).
std::string encode_answer(const Result<std::pair<Metrics, double>>& a) {
  std::string out;
  char num[64];
  if (!a) return "!" + std::to_string(static_cast<int>(code_of(a.error()))) + "\t" + context_of(a.error());
  std::snprintf(num, sizeof num, "%.17g", a->second);
  out = std::string{"="} + num + "\n";
  for (const auto& [k, v] : a->first) {
    std::snprintf(num, sizeof num, "%.17g", v);
    out += k + "\t" + num + "\n";
  }
  return out;
}

Result<std::pair<Metrics, double>> decode_answer(const std::string& s) {
  if (s.empty()) return make_error(errc::internal, "an empty answer from the last pipeline stage");
  if (s[0] == '!') {
    const auto tab = s.find('\t');
    return make_error(static_cast<errc>(std::stoi(s.substr(1, tab - 1))),
                      tab == std::string::npos ? std::string{} : s.substr(tab + 1));
  }
  std::pair<Metrics, double> out;
  size_t at = s.find('\n');
  out.second = std::strtod(s.c_str() + 1, nullptr);
  while (at != std::string::npos && at + 1 < s.size()) {
    const size_t end = s.find('\n', at + 1), tab = s.find('\t', at + 1);
    out.first[s.substr(at + 1, tab - at - 1)] = std::strtod(s.c_str() + tab + 1, nullptr);
    at = end;
  }
  return out;
}

// `text` from the group's last rank to every rank.
Result<void> share_from_last(ProcessGroup& pg, std::string& text) {
  const int root = pg.size() - 1;
  auto len = at::tensor({static_cast<int64_t>(text.size())}, at::kLong);
  auto l = from_torch(len);
  if (!l) return l.error();
  std::vector<Tensor> lens{*l};
  if (auto ok = pg.broadcast(lens, root); !ok) return ok;
  auto bytes = at::zeros({len.item<int64_t>()}, at::kByte);
  if (pg.rank() == root) std::memcpy(bytes.data_ptr(), text.data(), text.size());
  auto b = from_torch(bytes);
  if (!b) return b.error();
  std::vector<Tensor> parts{*b};
  if (bytes.numel() > 0)
    if (auto ok = pg.broadcast(parts, root); !ok) return ok;
  text.assign(static_cast<const char*>(bytes.data_ptr()), static_cast<size_t>(bytes.numel()));
  return {};
}

// forward_backward of a pipeline stage: the batch (the same on every stage)
// in micro-batches of `rows` rows through the 1F1B schedule. The last stage
// computes the loss; its count, metrics and log-probs (or its error) are
// then every stage's. A failure on any stage leaves every stage's
// gradients as they were before the call.
Result<Metrics> pipeline_passes(Trainer::Impl& im, ProcessGroup& pp, const Slice& all, const LossSpec& spec,
                                const PassOptions& pass, int64_t rows, Tensor* logps_out, double tokens,
                                double sequences) {
  auto& m = im.model.impl();
  const int64_t B = all.prepared.ids.size(0), T = all.prepared.ids.size(1);
  const bool pairwise = is_pairwise(spec.kind), packed = all.prepared.segments.defined();
  // By default 2 micro-batches per stage (the bubble is (p - 1) / (m + p - 1)
  // of the step), no more rows each than fit the memory.
  int64_t per = im.cfg.micro_batch_rows > 0 ? rows : std::min(rows, (B + 2 * pp.size() - 1) / (2 * pp.size()));
  if (pairwise && !packed) per = std::max<int64_t>(2, per - per % 2);
  per = std::max<int64_t>(1, per);
  const int micro = static_cast<int>((B + per - 1) / per);
  const bool last = pp.rank() == pp.size() - 1;
  auto params = im.params();
  std::vector<at::Tensor> saved;
  for (auto& [n, p] : params) saved.push_back(p.grad().defined() ? p.grad().clone() : at::Tensor{});
  auto restore = [&] {
    c10::NoGradGuard no_grad;
    for (size_t i = 0; i < params.size(); ++i) params[i].second.mutable_grad() = saved[i];
  };
  log::debug("forward_backward: pipeline stage " + std::to_string(pp.rank()) + " of " + std::to_string(pp.size()) +
             ", " + std::to_string(B) + " rows in " + std::to_string(micro) + " micro-batches of " +
             std::to_string(per) + " rows");
  std::vector<rl::LossOutput> parts;
  std::vector<at::Tensor> lps;
  double count = 0;
  std::optional<caf::error> failed;  // the last stage's first failing micro-batch
  PipelineStage stage;
  stage.dtype = m.options().dtype().toScalarType();
  stage.activation_shape = [&](int k) {
    return std::vector<int64_t>{std::min(per, B - k * per), T, m.cfg.hidden_size};
  };
  stage.forward = [&](int k, const at::Tensor& input) -> at::Tensor {
    const int64_t begin = k * per, n = std::min(per, B - begin);
    auto slice = rows_of(all, begin, n);
    auto mine = pass;
    mine.stage_input = input;
    if (!last) return m.run(slice.prepared, false, false, mine).activations;
    // The last stage: a loss to backward, or on a failure (or a slice with
    // no counted token) zero, so that every stage still runs its backward.
    if (failed || !slice.mask.any().item<bool>()) {
      auto out = m.run(slice.prepared, false, false, mine);
      if (logps_out) lps.push_back(out.logprobs.detach());
      if (!failed && spec.kind == LossKind::dr_grpo && !packed) {  // counts rows (see forward_backward_here)
        count += static_cast<double>(n);
        rl::LossOutput none;
        none.metrics["loss"] = 0;
        none.weights["loss"] = static_cast<double>(n);
        parts.push_back(std::move(none));
      }
      return out.logprobs.sum() * 0;
    }
    at::Tensor lp, objective;
    im.deferred_objective = &objective;
    Result<std::pair<rl::LossOutput, double>> one = make_error(errc::internal, "no pass");
    try {  // an exception here would leave the other stages waiting for this one's gradients
      one = im.pass_once(slice, spec, mine, logps_out ? &lp : nullptr);
    } catch (const std::exception& e) {
      one = carried_error(e).value_or(error_of_exception(e, "the last pipeline stage's loss"));
    }
    im.deferred_objective = nullptr;
    if (lp.defined()) lps.push_back(lp);
    if (!one) {
      failed = with_context(one.error(), "rows " + std::to_string(begin) + " to " + std::to_string(begin + n - 1) +
                                             " of the batch (micro-batch " + std::to_string(k + 1) + " of " +
                                             std::to_string(micro) + "; nothing was accumulated)");
      return input.sum() * 0;
    }
    count += one->second;
    parts.push_back(std::move(one->first));
    return objective;
  };
  // Every stage hears whether any failed inside the schedule (memory, an
  // exception on one stage): then none keeps this call's gradients.
  auto ran = run_pipeline(pp, micro, stage);
  std::vector<at::Tensor> any_failed{at::tensor({ran ? 0.0 : 1.0}, at::kDouble)};
  auto agreed = all_reduce_sum(pp, any_failed);
  if (!ran || !agreed || any_failed[0].item<double>() > 0) {
    restore();
    if (!ran) return with_context(ran.error(), "the pipeline's forward and backward passes");
    if (!agreed) return with_context(agreed.error(), "the pipeline stages' agreement after their passes");
    return make_error(errc::aborted, "another pipeline stage failed in this forward_backward (its error says why); "
                                     "no stage keeps the call's gradients");
  }
  std::string answer;
  if (last) {
    if (failed) {
      answer = encode_answer(*failed);
    } else {
      Metrics metrics = rl::combine_metrics(parts);
      answer = encode_answer(std::pair{std::move(metrics), count});
    }
  }
  if (auto ok = share_from_last(pp, answer); !ok) {
    restore();
    return with_context(ok.error(), "the last pipeline stage's loss");
  }
  auto got = decode_answer(answer);
  if (!got) {
    restore();
    return last || code_of(got.error()) == errc::internal
               ? got.error()
               : with_context(got.error(), "on the last pipeline stage (rank " + std::to_string(pp.size() - 1) + ")");
  }
  if (logps_out) {
    auto lp = last ? at::cat(lps, 0).to(at::kFloat).contiguous() : at::empty({B, T}, at::kFloat);
    auto t = from_torch(lp);
    std::vector<Tensor> v;
    if (t) v.push_back(*t);
    if (auto ok = t ? pp.broadcast(v, pp.size() - 1) : Result<void>{t.error()}; !ok) {
      restore();
      return ok.error();
    }
    auto out = from_torch(at::where(all.prepared.target_mask, lp, at::zeros({}, lp.options())).contiguous());
    if (!out) {
      restore();
      return out.error();
    }
    *logps_out = std::move(*out);
  }
  im.accumulated += got->second;
  ++im.micro_batches;
  if (spec.reduction == LossReduction::sum) ++im.summed;
  Metrics metrics = std::move(got->first);
  metrics["tokens"] = tokens;
  metrics["sequences"] = sequences;
  metrics["loss_count"] = got->second;
  return metrics;
}

// forward_backward on this rank's batch (with FSDP, Trainer::forward_backward
// then joins the group's remaining passes).
Result<Metrics> forward_backward_here(const std::shared_ptr<Trainer::Impl>& impl_, const TrainBatch& b,
                                      const LossSpec& spec, Tensor* logps_out) try {
  ProcessGroup* tp = impl_->cfg.tp_group && impl_->cfg.tp_group->size() > 1 ? impl_->cfg.tp_group.get() : nullptr;
  if (tp)
    if (auto ok = same_batch_on_ranks(*tp, "tensor-parallel", b, spec, logps_out != nullptr); !ok) return ok.error();
  ProcessGroup* pp = impl_->cfg.pp_group && impl_->cfg.pp_group->size() > 1 ? impl_->cfg.pp_group.get() : nullptr;
  if (pp)
    if (auto ok = same_batch_on_ranks(*pp, "pipeline-parallel", b, spec, logps_out != nullptr); !ok) return ok.error();
  if (auto ok = spec.validate(); !ok) return ok.error();
  auto& m = impl_->model.impl();
  auto prepared = model_detail::prepare(m.cfg, b.tokens);
  if (!prepared) return prepared.error();
  int64_t B = prepared->ids.size(0), T = prepared->ids.size(1);
  auto dtype = m.options().dtype().toScalarType();
  at::Tensor mask = prepared->target_mask;
  if (b.loss_mask.defined()) {
    if (b.loss_mask.dims() != 2 || b.loss_mask.size(0) != B || b.loss_mask.size(1) != T)
      return make_error(errc::invalid_argument, "loss_mask is " + b.loss_mask.describe() + " but the batch is [" +
                                                    std::to_string(B) + ", " + std::to_string(T) + "]");
    mask = mask.logical_and(to_torch(b.loss_mask).to(at::kBool));
  }
  // The loss's inputs in f32 (f64 for an f64 model) whatever the model's
  // dtype: a bf16 model must not round the sampler's log-probs, the
  // advantages or the weights (the losses compute in f32 anyway).
  const auto input_dtype = dtype == at::kDouble ? at::kDouble : at::kFloat;
  auto old_lp = float_input(b.old_logps, "old_logps", B, T, false, input_dtype);
  auto ref_lp = float_input(b.ref_logps, "ref_logps", B, T, false, input_dtype);
  auto adv = float_input(b.advantages, "advantages", B, T, true, input_dtype);
  auto weights = float_input(b.loss_weights, "loss_weights", B, T, false, input_dtype);
  for (auto* r : {&old_lp, &ref_lp, &adv, &weights})
    if (!*r) return r->error();
  const bool token_sum = spec.reduction == LossReduction::sum;
  if (weights->defined() && !(spec.kind == LossKind::cross_entropy && token_sum))
    return make_error(errc::invalid_argument,
                      "the batch has loss_weights, which only cross_entropy with reduction sum reads (a 0/1 mask is "
                      "loss_mask); leave it out or set that loss");
  // A step's gradients are all sums or all normalised: mixing them would
  // divide the sums by the others' count.
  if (impl_->micro_batches > 0 && (impl_->summed > 0) != token_sum)
    return make_error(errc::failed_precondition,
                      std::string{"this step accumulated gradients of a loss with reduction "} +
                          (token_sum ? "mean" : "sum") + " and this one has reduction " + (token_sum ? "sum" : "mean") +
                          ": step (clip_grad_and_step) or zero_grad first");
  const bool pairwise = is_pairwise(spec.kind);
  bool policy = spec.kind != LossKind::cross_entropy && !pairwise;
  const bool packed = prepared->segments.defined();
  if (pairwise && packed) {
    // Packed: each row holds whole pairs, a pair being two consecutive
    // segments with a counted token (chosen, then rejected).
    // Each row's segments with a counted token, in order, must pair up as
    // (id, id + 1): a response without one would otherwise shift every
    // later pairing by one.
    const int64_t ids = prepared->segments.max().item<int64_t>() + 1;
    auto key = at::arange(B, at::kLong).unsqueeze(1) * ids + prepared->segments;
    auto responses = std::get<0>(at::_unique2(key.masked_select(mask)));  // sorted
    if (responses.numel() == 0)
      return make_error(errc::invalid_argument, std::string{to_string(spec.kind)} +
                                                    ": the batch has no counted token in loss_mask");
    const auto* r = responses.data_ptr<int64_t>();
    for (int64_t i = 0; i < responses.numel(); i += 2) {
      const bool whole = i + 1 < responses.numel() && r[i + 1] == r[i] + 1 && r[i] / ids == r[i + 1] / ids;
      if (!whole)
        return make_error(errc::invalid_argument,
                          std::string{to_string(spec.kind)} +
                              " reads responses in pairs (chosen, rejected); in packed rows each row must hold whole "
                              "pairs as consecutive segments, each with a counted token, but segment " +
                              std::to_string(r[i] % ids) + " of row " + std::to_string(r[i] / ids) +
                              " has no rejected response after it in its row");
    }
  }
  if (pairwise && !packed && B % 2 != 0)
    return make_error(errc::invalid_argument, std::string{to_string(spec.kind)} +
                                                  " reads rows in pairs (chosen, rejected) but the batch has " +
                                                  std::to_string(B) + " rows");
  if (pairwise) {
    // Pairs, each response with a counted token, against the reference.
    if (!ref_lp->defined())
      return make_error(errc::invalid_argument, std::string{to_string(spec.kind)} +
                                                    " needs ref_logps: the reference model's log-probs of the same rows "
                                                    "(forward_only with the adapter off, or of a frozen copy)");
    for (auto [name, t] : {std::pair{"advantages", &*adv}, {"old_logps", &*old_lp}})
      if (t->defined())
        return make_error(errc::invalid_argument, std::string{"the batch has "} + name + ", which " +
                                                      std::string{to_string(spec.kind)} + " does not read; leave it out");
    auto empty = packed ? at::zeros({0, 1}, at::kLong) : mask.any(1).logical_not().nonzero();
    if (empty.size(0) > 0) {
      auto row = empty[0][0].item<int64_t>();
      return make_error(errc::invalid_argument, "row " + std::to_string(row) + " (the " +
                                                    (row % 2 == 0 ? "chosen" : "rejected") + " response of pair " +
                                                    std::to_string(row / 2) + ") has no counted token in loss_mask");
    }
  }
  if (policy && !adv->defined())
    return make_error(errc::invalid_argument, std::string{to_string(spec.kind)} + " needs advantages");
  if (spec.beta > 0 && !ref_lp->defined() && spec.kind != LossKind::dro && !pairwise)
    return make_error(errc::invalid_argument, "beta > 0 (a KL penalty) needs ref_logps");
  // Columns the loss would not read are refused: a batch built for another
  // loss (advantages sent while the loss is still cross_entropy) must not
  // train as if they were there.
  if (spec.kind == LossKind::cross_entropy)
    for (auto [name, t] : {std::pair{"advantages", &*adv}, {"old_logps", &*old_lp}, {"ref_logps", &*ref_lp}})
      if (t->defined())
        return make_error(errc::invalid_argument, std::string{"the batch has "} + name +
                                                      ", which cross_entropy does not read; set a policy loss "
                                                      "(set_loss grpo, ...) first, or leave it out");
  if (spec.kind == LossKind::decoupled_ppo) {
    if (!old_lp->defined())
      return make_error(errc::invalid_argument,
                        "decoupled_ppo needs old_logps: the behaviour policy's (the sampler's) log-probs of the "
                        "completion tokens, which actors::training_batch puts in");
    if (ref_lp->defined())
      return make_error(errc::invalid_argument, "the batch has ref_logps, which decoupled_ppo does not read (it has "
                                                "no KL term); leave it out");
  }

  at::Tensor routes;
  if (b.routes.defined()) {
    if (pp)
      return make_error(errc::unimplemented, "routing replay (the batch's routes) is not built for pipeline "
                                             "parallelism yet; train without pp, or leave routes out");
    auto r = model_detail::replay_routes(m.cfg, b.routes, B, T);
    if (!r) return r.error();
    routes = std::move(*r);
  }

  auto pass = impl_->pass();
  if (!pass) return pass.error();
  // LoRA dropout's masks come from a generator seeded by the step, the
  // micro-batch and the data-parallel rank: a run and its resume from a
  // checkpoint draw the same masks (given the same slicing of the batch).
  auto rng = at::make_generator<at::CPUGeneratorImpl>(mix_seed(
      static_cast<uint64_t>(impl_->opt->steps()), static_cast<uint64_t>(impl_->micro_batches), impl_->data_rank()));
  pass->dropout_rng = &rng;
  const auto tokens = mask.sum().item<double>();
  const auto sequences = counted_sequences(mask, prepared->segments);
  const Slice all{std::move(*prepared), mask, *old_lp, *ref_lp, *adv, *weights, routes};
  // The target log-probs, when asked: f32 [B, T], 0 where no target.
  auto answer_logps = [&](std::vector<at::Tensor> parts) -> Result<void> {
    if (!logps_out) return {};
    auto lp = (parts.size() == 1 ? parts[0] : at::cat(parts, 0)).to(at::kFloat);
    auto t = from_torch(at::where(all.prepared.target_mask, lp, at::zeros({}, lp.options())).contiguous());
    if (!t) return t.error();
    *logps_out = std::move(*t);
    return {};
  };
  const int64_t elem = static_cast<int64_t>(c10::elementSize(dtype));
  const bool entropies = spec.entropy_coef != 0;
  // A pipeline stage keeps a copy of the gradients besides (to put back if
  // any stage fails) when it has some.
  auto rows = impl_->rows_per_pass(B, T, elem, entropies, pp && impl_->micro_batches > 0, pairwise && !packed);
  if (tp) rows = fewest_rows(*tp, rows);
  if (pp) rows = fewest_rows(*pp, rows);
  if (!rows) return rows.error();
  c10::AutoGradMode grad(true);

  if (tokens == 0 && (impl_->collective_passes() || pp))  // before any pass: only this rank's data is left out (see forward_backward)
    return make_error(errc::invalid_argument, "the batch has no counted token (loss_mask and the targets leave "
                                              "every position out): nothing to train on");
  if (pp) return pipeline_passes(*impl_, *pp, all, spec, *pass, *rows, logps_out, tokens, sequences);
  if (*rows >= B || tokens == 0) {  // one pass (a batch without a counted token: the loss says so)
    at::Tensor lp;
    auto one = impl_->as_pass<Trainer::Impl::PassResult>(*pass, [&] { return impl_->pass_once(all, spec, *pass, logps_out ? &lp : nullptr); });
    if (!one) return one.error();
    impl_->accumulated += one->second;
    ++impl_->micro_batches;
    if (token_sum) ++impl_->summed;
    if (auto ok = answer_logps({lp}); !ok) return ok.error();
    Metrics metrics = std::move(one->first.metrics);
    metrics["tokens"] = tokens;
    metrics["sequences"] = sequences;
    metrics["loss_count"] = one->second;
    return metrics;
  }

  // In slices of rows: the gradients accumulated before are kept, to put
  // back if a slice fails (with none before, zeros are put back).
  const bool had = impl_->micro_batches > 0;
  if (had) {
    rows = impl_->rows_per_pass(B, T, elem, entropies, true, pairwise && !packed);
    if (tp) rows = fewest_rows(*tp, rows);
    if (!rows) return rows.error();
  }
  auto params = impl_->params();
  std::vector<at::Tensor> saved;
  if (had)
    for (auto& [n, p] : params) saved.push_back(p.grad().defined() ? p.grad().clone() : at::Tensor{});
  auto restore = [&] {
    // Every rank's gradients are in the shards (FSDP) or in the experts
    // (ep): Trainer::forward_backward undoes the call.
    if (impl_->collective_passes()) return;
    c10::NoGradGuard no_grad;
    for (size_t i = 0; i < params.size(); ++i) {
      auto& p = params[i].second;
      if (!p.grad().defined()) continue;
      if (had && saved[i].defined()) p.mutable_grad().copy_(saved[i]);
      else p.mutable_grad().zero_();
    }
  };
  const int64_t slices = (B + *rows - 1) / *rows;
  const auto split = std::to_string(B) + " rows of " + std::to_string(T) + " tokens run in " +
                     std::to_string(slices) + " micro-batches of " + std::to_string(*rows) + " rows";
  if (slices != impl_->said_slices) {
    impl_->said_slices = slices;
    log::info("forward_backward: " + split +
              (impl_->cfg.micro_batch_rows > 0 && *rows == impl_->cfg.micro_batch_rows
                   ? " (micro_batch_rows)"
                   : ", to fit the memory at hand (" + format_bytes(static_cast<double>(memory_available_bytes())) +
                         " available): the same update, more slowly"));
  } else {
    log::debug("forward_backward: " + split);
  }
  std::vector<rl::LossOutput> parts;
  std::vector<at::Tensor> lps;
  double count = 0;
  try {
    for (int64_t begin = 0; begin < B; begin += *rows) {
      // Under tensor parallelism every slice is collective: the ranks
      // agreed on a stop before the first (fewest_rows), and one seen by a
      // rank between slices waits for the next call.
      if (auto ok = tp ? Result<void>{} : check_stop("forward_backward"); !ok) {
        restore();
        return ok.error();
      }
      const int64_t n = std::min(*rows, B - begin);
      auto slice = rows_of(all, begin, n);
      if (!slice.mask.any().item<bool>()) {
        if (logps_out) {  // answered too: a forward pass without gradients
          auto plain = *pass;
          plain.train = false;
          auto lp = impl_->as_pass<Result<at::Tensor>>(plain, [&]() -> Result<at::Tensor> {
            c10::NoGradGuard no_grad;
            return impl_->model.impl().run(slice.prepared, false, false, plain).logprobs;
          });
          if (!lp) {
            restore();
            return lp.error();
          }
          lps.push_back(*lp);
        }
        // No counted token: no gradient, but DR-GRPO's normaliser (and so
        // its mean loss) counts rows (a packed batch's sequences without a
        // counted token are not told from padding and count nothing).
        if (spec.kind == LossKind::dr_grpo && !all.prepared.segments.defined()) {
          count += static_cast<double>(n);
          rl::LossOutput none;
          none.metrics["loss"] = 0;
          none.weights["loss"] = static_cast<double>(n);
          parts.push_back(std::move(none));
        }
        continue;
      }
      at::Tensor lp;
      auto one =
          impl_->as_pass<Trainer::Impl::PassResult>(*pass, [&] { return impl_->pass_once(slice, spec, *pass, logps_out ? &lp : nullptr); });
      if (lp.defined()) lps.push_back(lp);
      if (!one) {
        restore();
        return with_context(one.error(), "rows " + std::to_string(begin) + " to " + std::to_string(begin + n - 1) +
                                             " of the batch (micro-batch " + std::to_string(begin / *rows + 1) +
                                             " of " + std::to_string(slices) + "; nothing was accumulated)");
      }
      count += one->second;
      parts.push_back(std::move(one->first));
    }
  } catch (...) {
    restore();
    throw;
  }
  impl_->accumulated += count;
  ++impl_->micro_batches;
  if (token_sum) ++impl_->summed;
  if (auto ok = answer_logps(std::move(lps)); !ok) return ok.error();
  Metrics metrics = rl::combine_metrics(parts);
  metrics["tokens"] = tokens;
  metrics["sequences"] = sequences;
  metrics["loss_count"] = count;
  return metrics;
} catch (const std::exception& e) {
  return carried_error(e).value_or(error_of_exception(e, "forward_backward"));
}

}  // namespace

Result<Metrics> Trainer::forward_backward(const TrainBatch& b, const LossSpec& spec, Tensor* logps_out) {
  auto& im = *impl_;
  if (!im.collective_passes()) return forward_backward_here(impl_, b, spec, logps_out);
  // With FSDP or ep each pass is collective: this rank runs its own passes,
  // then joins the others' (idle) until no rank has one left. A pass that
  // failed on any rank voids the call on every rank: the gradients of the
  // passes before it were already summed into every rank's shards (FSDP) or
  // experts (ep).
  const char* group = im.pass_groups();
  const auto counts = std::tuple{im.accumulated, im.micro_batches, im.summed};
  std::vector<at::Tensor> saved;
  for (auto& [n, p] : im.params()) saved.push_back(p.grad().defined() ? p.grad().clone() : at::Tensor{});
  im.pass_failed = false;
  im.passes_run = 0;
  auto here = forward_backward_here(impl_, b, spec, logps_out);
  // Failing after a pass of its own (a later slice, a stop) leaves this
  // rank's earlier gradients in every rank's shards: the call is undone
  // everywhere. Failing before any (a bad batch) leaves only its data out.
  if (!here && im.passes_run > 0) im.pass_failed = true;
  auto pass = im.pass();
  if (!pass) return pass.error();
  bool any_failed = false;
  while (true) {
    auto v = im.vote(false, im.pass_failed);
    if (!v) return with_context(v.error(), std::string{"forward_backward's passes over the "} + group + " group");
    if (!v->any_pass) {
      any_failed = v->any_failed;
      break;
    }
    (void)im.idle_pass(*pass);  // a failure marks the call failed, or the group unusable (the next vote says so)
  }
  if (!any_failed) return here;
  c10::NoGradGuard no_grad;
  auto params = im.params();
  for (size_t i = 0; i < params.size(); ++i) params[i].second.mutable_grad() = saved[i];
  std::tie(im.accumulated, im.micro_batches, im.summed) = counts;
  const std::string why = std::string{"a micro-batch of this forward_backward failed on a rank of the "} + group +
                          " group, so no rank keeps its gradients (each rank's were already summed into every " +
                          (im.fsdp ? "shard)" : "rank's experts)");
  if (!here) return with_context(here.error(), why);
  return make_error(errc::aborted, why + "; the failing rank's error says why");
}

namespace {

// The global gradient norm of parameters of which those `split` names are
// this rank's own part of the model (their squares summed over `g`) and the
// others whole on every rank (counted once), then the gradients clipped to
// max_norm. `also` are summed over `g` in the same collective, before the
// whole ones' squares are taken (tensor parallelism's partial gradients).
// `outer`: every rank of it holds other parts of both kinds (fsdp shards,
// with ep as `g`): the total is summed over it too.
Result<double> clip_split_norm(const ParamList& params, ProcessGroup& g,
                               const std::function<bool(const std::string&)>& split, std::vector<at::Tensor> also,
                               double max_norm, ProcessGroup* outer = nullptr) {
  c10::NoGradGuard no_grad;
  auto split_sq = at::zeros({1}, at::kDouble);
  for (const auto& [n, p] : params)
    if (split(n) && p.grad().defined()) split_sq += grad_squares(p.grad());
  also.push_back(split_sq);
  if (auto ok = all_reduce_sum(g, also); !ok) return ok.error();
  double whole_sq = 0;
  for (const auto& [n, p] : params)
    if (!split(n) && p.grad().defined()) whole_sq += grad_squares(p.grad());
  std::vector<at::Tensor> total{also.back() + whole_sq};
  if (outer)
    if (auto ok = all_reduce_sum(*outer, total); !ok) return ok.error();
  const double norm = std::sqrt(total[0].item<double>());
  std::vector<at::Tensor> grads;
  for (const auto& [n, p] : params) grads.push_back(p.grad());
  clip_to_norm(grads, norm, max_norm);
  return norm;
}

}  // namespace

Result<Metrics> Trainer::clip_grad_and_step() try {
  const auto& dp = impl_->cfg.dp_group;
  auto* fsdp = impl_->fsdp.get();
  // The groups whose ranks' gradients this step sums: fsdp or ep, then dp.
  // Over ep only the replicated parameters' (an expert's gradient holds
  // every rank's tokens already, through the exchanges).
  std::vector<ProcessGroup*> groups;
  if (fsdp) groups.push_back(&fsdp->group());
  ProcessGroup* epg = impl_->ep_group();
  if (epg) groups.push_back(epg);
  if (dp && dp->size() > 1) groups.push_back(dp.get());
  const bool distributed = !groups.empty();
  // Shards of the base: summed over the fsdp group by each layer's
  // reduce-scatter already; over dp (replicas of the shards) here.
  const bool sharded = fsdp && fsdp->trains_base();
  if (fsdp) fsdp->release_all();  // gathered values would be the weights before the step
  // With data parallelism every rank must join the all-reduce, even one
  // whose forward_backward failed (it adds zeros), or its peers would wait.
  if (impl_->micro_batches == 0 && !distributed)
    return make_error(errc::failed_precondition, "clip_grad_and_step without forward_backward since the last step");
  auto params = impl_->params();
  if (params.empty()) return make_error(errc::failed_precondition, "adapter '" + impl_->cfg.adapter + "' was removed");
  double total = impl_->accumulated;
  double summed = static_cast<double>(impl_->summed);
  // A gradient this step did not produce (an expert no token was routed
  // to) is zero: the parameter steps (its weight decay, its moments) as
  // every other does, in one process as over ranks, where every rank must
  // send the same tensors and FSDP's shards always have one.
  for (auto& [n, p] : params)
    if (!p.grad().defined()) p.mutable_grad() = at::zeros_like(p);
  if (distributed) {
    for (auto* g : groups) {
      std::vector<at::Tensor> parts;
      if (!(sharded && fsdp && g == &fsdp->group()))
        for (auto& [n, p] : params)
          if (g != epg || !impl_->expert_param(n)) parts.push_back(p.grad());
      parts.push_back(at::tensor({total, summed}, at::kDouble));
      if (auto ok = all_reduce_sum(*g, parts); !ok) {
        zero_grad();
        return ok.error();
      }
      total = parts.back()[0].item<double>();
      summed = parts.back()[1].item<double>();
    }
    if (total == 0 && summed == 0) {
      zero_grad();
      return make_error(errc::failed_precondition,
                        "clip_grad_and_step without forward_backward on any data-parallel rank since the last step");
    }
  }
  {
    c10::NoGradGuard no_grad;
    // Sums (reduction sum) are the gradient as they are.
    double scale = summed > 0 ? 1.0 : total > 0 ? 1.0 / total : 0.0;
    for (auto& [n, p] : params)
      if (p.grad().defined()) p.mutable_grad().mul_(scale);
  }
  double norm = 0;
  if (const auto& tpg = impl_->cfg.tp_group; tpg && tpg->size() > 1) {
    // Whole parameters applied to this rank's heads only (q_norm, k_norm)
    // have a part of their gradient here: summed over the group. The norm
    // adds every rank's shards' squares, and each whole parameter's once.
    std::vector<at::Tensor> partial;
    for (auto& [n, p] : params)
      if (tp::gradient_is_partial(n) && p.grad().defined()) partial.push_back(p.grad());
    auto n = clip_split_norm(params, *tpg, tp::is_shard, std::move(partial), impl_->cfg.optimizer.max_grad_norm);
    if (!n) {
      zero_grad();
      return n.error();
    }
    norm = *n;
  } else if (const auto& ppg = impl_->cfg.pp_group; ppg && ppg->size() > 1) {
    // Each stage steps its own layers. Tied embeddings, held by the first
    // stage and the last, take the sum of both stages' gradients (so that
    // the copies stay equal) and count once in the norm, which adds every
    // stage's squares.
    c10::NoGradGuard no_grad;
    auto& m = impl_->model.impl();
    at::Tensor shared;  // the tied embeddings, where this stage holds them
    if (auto it = m.params.find("model.embed_tokens.weight"); m.cfg.tie_word_embeddings && it != m.params.end()) {
      shared = it->second;
      if (!shared.grad().defined()) shared.mutable_grad() = at::zeros_like(shared);
    }
    if (m.cfg.tie_word_embeddings) {  // middle stages add zeros
      std::vector<at::Tensor> g{shared.defined() ? shared.grad()
                                                 : at::zeros({m.cfg.vocab_size, m.cfg.hidden_size}, m.options())};
      if (auto ok = all_reduce_sum(*ppg, g); !ok) {
        zero_grad();
        return ok.error();
      }
    }
    auto sq = at::zeros({1}, at::kDouble);
    for (auto& [n, p] : params)
      if (p.grad().defined() && !(m.pp->last() && shared.defined() && p.is_same(shared)))
        sq += grad_squares(p.grad());
    std::vector<at::Tensor> total_sq{sq};
    if (auto ok = all_reduce_sum(*ppg, total_sq); !ok) {
      zero_grad();
      return ok.error();
    }
    norm = std::sqrt(total_sq[0].item<double>());
    std::vector<at::Tensor> grads;
    for (auto& [n, p] : params) grads.push_back(p.grad());
    clip_to_norm(grads, norm, impl_->cfg.optimizer.max_grad_norm);
  } else if (sharded && epg) {
    // Each ep rank's experts' shards are its own (squares summed over ep),
    // the rest's are the same on every ep rank; both summed over fsdp.
    auto n = clip_split_norm(
        params, *epg, [&](const std::string& name) { return impl_->expert_param(name); }, {},
        impl_->cfg.optimizer.max_grad_norm, &fsdp->group());
    if (!n) {
      zero_grad();
      return n.error();
    }
    norm = *n;
  } else if (sharded) {
    // The global norm: every shard's squares, summed over the fsdp group.
    auto n = clip_grad_norm(fsdp->units(), fsdp->group(), impl_->cfg.optimizer.max_grad_norm);
    if (!n) {
      zero_grad();
      return n.error();
    }
    norm = *n;
  } else if (epg) {
    // Each rank's experts are its own; the rest is replicated.
    auto n = clip_split_norm(
        params, *epg, [&](const std::string& name) { return impl_->expert_param(name); }, {},
        impl_->cfg.optimizer.max_grad_norm);
    if (!n) {
      zero_grad();
      return n.error();
    }
    norm = *n;
  } else {
    norm = clip_grad_norm(params, impl_->cfg.optimizer.max_grad_norm);
  }
  if (!std::isfinite(norm)) {
    zero_grad();
    return make_error(errc::invalid_argument, "the gradient norm is not finite; the step was skipped");
  }
  double lr = current_lr();
  impl_->opt->step(params, lr, sharded ? &fsdp->decay_masks() : nullptr);
  zero_grad();
  return Metrics{{"grad_norm", norm}, {"lr", lr}, {"step", static_cast<double>(impl_->opt->steps())}};
} catch (const std::exception& e) {
  return carried_error(e).value_or(error_of_exception(e, "clip_grad_and_step"));
}

void Trainer::zero_grad() {
  for (auto& [n, p] : impl_->params())
    if (p.grad().defined()) p.mutable_grad().zero_();
  impl_->accumulated = 0;
  impl_->micro_batches = 0;
  impl_->summed = 0;
}

Result<void> Trainer::set_optimizer(const OptimizerConfig& cfg) {
  if (auto ok = cfg.validate(); !ok) return ok.error();
  const bool keep = cfg.keep_state && impl_->cfg.optimizer.kind == cfg.kind;
  impl_->cfg.optimizer = cfg;
  if (keep) impl_->opt->reconfigure(cfg);
  else impl_->opt = std::make_unique<Optimizer>(cfg);
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

namespace {

// forward_only on a pipeline stage: the batch through the stages in turn
// (each receives the activations, runs its layers, sends them on), the last
// stage's log-probs then broadcast to all. A stage that fails (its pass, or
// its receive) still sends zeros on and joins the stages' agreement, so that
// no stage waits out the group's timeout.
Result<Tensor> pipeline_forward(CausalLM::Impl& m, ProcessGroup& pp, const TokenBatch& batch) {
  c10::NoGradGuard no_grad;
  // Every stage checks the same batch: the same error on each, before any message.
  auto p = model_detail::prepare(m.cfg, batch);
  if (!p) return p.error();
  const int64_t B = p->ids.size(0), T = p->ids.size(1);
  const int s = pp.rank(), last = pp.size() - 1;
  const std::vector<int64_t> shape{B, T, m.cfg.hidden_size};
  constexpr int tag = 1 << 21;  // apart from the training schedule's
  Result<void> mine{};
  auto note = [&](Result<void> r, const std::string& what) {
    if (!r && mine) mine = with_context(r.error(), what);
  };
  PassOptions pass;
  if (s > 0) {
    pass.stage_input = at::zeros(shape, m.options());
    auto in = from_torch(pass.stage_input);
    note(in ? pp.recv(*in, s - 1, tag) : Result<void>{in.error()}, "forward_only: the previous stage's activations");
  }
  at::Tensor out;
  if (mine) {
    try {
      auto o = m.run(*p, false, false, pass);
      out = s == last ? o.logprobs.to(at::kFloat).contiguous() : o.activations.contiguous();
    } catch (const std::exception& e) {
      mine = carried_error(e).value_or(error_of_exception(e, "forward_only on pipeline stage " + std::to_string(s)));
    }
  }
  if (s < last) {
    if (!out.defined()) out = at::zeros(shape, m.options());
    auto t = from_torch(out);
    note(t ? pp.send(*t, s + 1, tag) : Result<void>{t.error()}, "forward_only: sending the activations on");
  }
  std::vector<at::Tensor> failed{at::tensor({mine ? 0.0 : 1.0}, at::kDouble)};
  if (auto ok = all_reduce_sum(pp, failed); !ok) return mine ? ok.error() : mine.error();
  if (!mine) return mine.error();
  if (failed[0].item<double>() > 0)
    return make_error(errc::aborted, "forward_only failed on another pipeline stage (its error says why)");
  if (s != last) out = at::empty({B, T}, at::kFloat);
  auto lp = from_torch(out);
  if (!lp) return lp.error();
  std::vector<Tensor> v{*lp};
  if (auto ok = pp.broadcast(v, last); !ok) return with_context(ok.error(), "forward_only: the last stage's answer");
  return v.front();
}

}  // namespace

Result<Tensor> Trainer::forward_only(const TokenBatch& batch, const std::string& adapter) try {
  auto& im = *impl_;
  // Tensor-parallel ranks and pipeline stages take the same batch: checked,
  // so that a mismatch is an error rather than mismatched collectives.
  for (auto [g, what] : {std::pair{&im.cfg.tp_group, "tensor-parallel"}, {&im.cfg.pp_group, "pipeline-parallel"}})
    if (*g && (*g)->size() > 1)
      if (auto ok = same_batch_on_ranks(**g, what, TrainBatch{.tokens = batch}, LossSpec{}, true); !ok) return ok.error();
  if (const auto& pp = im.cfg.pp_group; pp && pp->size() > 1) {
    if (!adapter.empty())
      return make_error(errc::unimplemented, "forward_only with adapter '" + adapter +
                                                 "' on pipeline stages: they run the full model only");
    return pipeline_forward(im.model.impl(), *pp, batch);
  }
  // Expert-parallel ranks each pass their own batch, collectively: they
  // agree first that every rank's batch and adapter can run, so that one
  // that cannot fails the call everywhere instead of leaving the others in
  // an exchange.
  if (im.ep_group()) {
    Result<void> mine{};
    if (!adapter.empty()) {
      if (auto a = im.model.impl().adapter(adapter); !a) mine = a.error();
    } else if (auto p = model_detail::prepare(im.model.impl().cfg, batch); !p) mine = p.error();
    auto v = im.vote(true, !mine);
    if (!v) return with_context(v.error(), "forward_only over the ep group");
    if (!mine) return mine.error();
    if (v->any_failed)
      return make_error(errc::aborted, "forward_only: another rank of the ep group could not run its batch (its "
                                       "error says why); no rank ran the pass");
  }
  // FSDP: the whole base for the pass, freed after whatever happens.
  if (im.fsdp)
    if (auto ok = im.fsdp->gather_all(); !ok) return ok.error();
  struct Release {
    Fsdp* f;
    ~Release() {
      if (f) f->release_all();
    }
  } release{im.fsdp.get()};
  auto out = im.model.forward(batch, {.adapter = adapter});
  if (!out) return out.error();
  return std::move(out->logprobs);
} catch (const std::exception& e) {
  return carried_error(e).value_or(error_of_exception(e, "forward_only"));
}

Result<void> Trainer::gather_parameters() {
  if (!impl_->fsdp) return {};
  return impl_->fsdp->gather_all();
}

void Trainer::release_parameters() {
  if (impl_->fsdp) impl_->fsdp->release_all();
}

int64_t Trainer::state_bytes() const {
  int64_t n = impl_->opt->state_bytes();
  auto add = [&](const at::Tensor& t) {
    if (t.defined()) n += t.numel() * static_cast<int64_t>(t.element_size());
  };
  // The trained tensors and their gradients; with FSDP and an adapter the
  // base's shards besides (without, the frozen base is not counted).
  for (const auto& [name, p] : impl_->params()) {
    add(p);
    add(p.grad());
  }
  if (impl_->fsdp && !impl_->fsdp->trains_base())
    for (const auto& [name, p] : impl_->fsdp->shards()) add(p);
  return n;
}
namespace {

using FetchWhole = std::function<Result<at::Tensor>(const std::string&)>;

// The whole model's parameters, one at a time in Hugging Face's order,
// whatever the trainer's groups: `consume(fetch)` runs on the sender (rank
// 0 of the model-parallel group, or this rank without one) and calls
// fetch(name) for each parameter in that order, which answers it whole
// (an FSDP unit gathered, a TP parameter gathered from its shards, a later
// pipeline stage's parameter sent to the first). The other ranks take their
// part in the same collectives. A consumer that stops early (its error, an
// exception) still has the sender take its part in the rest, and then every
// rank of the group answers the sender's outcome. Ranks of dp_group other
// than 0 hold a copy: they do nothing. `what` names the walk in errors.
Result<void> walk_whole(Trainer::Impl& im, const std::string& what,
                        const std::function<Result<void>(const FetchWhole&)>& consume) try {
  auto& m = im.model.impl();
  if (const auto& dp = im.cfg.dp_group; dp && dp->size() > 1 && dp->rank() != 0) return {};  // a replica of dp rank 0's
  ProcessGroup* mp = im.model_parallel_group();
  Fsdp* fsdp = im.fsdp.get();
  // With fsdp and ep: each fsdp group gathers its units, and over the ep
  // group of fsdp rank 0 the experts go to its ep rank 0, the sender.
  ProcessGroup* epg = fsdp ? im.ep_group() : nullptr;
  if (fsdp) fsdp->release_all();
  const bool sender = (!mp || mp->rank() == 0) && (!epg || epg->rank() == 0);
  const auto order = model_detail::parameter_shapes(m.cfg);  // (name, shape), in Hugging Face's order
  std::optional<size_t> held;  // the FSDP unit gathered now
  size_t done = 0;             // the parameters fetched, in order
  // Parameter `name` from rank `owner` of `g` to its rank 0 (the sender's
  // copy; nothing elsewhere).
  auto from_owner = [&](ProcessGroup& g, int owner, const std::string& name, int index) -> Result<at::Tensor> {
    const int tag = (1 << 20) + index;
    if (owner == 0) return g.rank() == 0 ? m.params.at(name).detach().clone() : at::Tensor{};
    if (g.rank() == owner) {
      auto t = from_torch(m.params.at(name).detach().contiguous());
      if (!t) return t.error();
      if (auto ok = g.send(*t, 0, tag); !ok) return ok.error();
    } else if (g.rank() == 0) {
      auto got = at::empty(order[static_cast<size_t>(index)].second, m.options());
      auto t = from_torch(got);
      if (!t) return t.error();
      if (auto ok = g.recv(*t, owner, tag); !ok) return ok.error();
      return got;
    }
    return at::Tensor{};
  };
  auto fetch_here = [&](const std::string& name) -> Result<at::Tensor> {
    if (done >= order.size() || order[done].first != name)
      return make_error(errc::internal, what + " asked for " + name + " out of Hugging Face's order");
    const int index = static_cast<int>(done++);
    if (!mp) return m.params.at(name);
    if (fsdp) {
      const auto u = fsdp->unit_of(name);
      if (held != u) {
        if (held) fsdp->release_unit(*held);
        held.reset();
        if (auto ok = fsdp->gather_unit_to_read(u); !ok) return ok.error();
        held = u;
      }
      if (epg && mp->rank() == 0) return from_owner(*epg, std::max(0, ep::owner_of(m.cfg, epg->size(), name)), name, index);
      return sender ? m.params.at(name).detach().clone() : at::Tensor{};
    }
    if (m.tp) return tp::gather_whole(name, m.params.at(name), *mp);
    // Pipeline stages, or expert-parallel ranks: the one holding it sends
    // it to the first (every ep rank holds the replicated parameters).
    const int owner = m.ep ? std::max(0, ep::owner_of(m.cfg, mp->size(), name)) : pp::stage_of(m.cfg, mp->size(), name);
    if (owner == 0) return sender ? m.params.at(name) : at::Tensor{};
    return from_owner(*mp, owner, name, index);
  };
  // No exception may skip this rank's part in a collective the others make.
  FetchWhole fetch = [&](const std::string& name) -> Result<at::Tensor> {
    try {
      return fetch_here(name);
    } catch (const std::exception& e) {
      return carried_error(e).value_or(error_of_exception(e, "gathering " + name + " for " + what));
    }
  };
  Result<void> mine{};
  if (sender) {
    try {
      mine = consume(fetch);
    } catch (const std::exception& e) {
      mine = error_of_exception(e, what);
    }
  }
  // A sender that stopped early, and every other rank, take their part in
  // the rest of the collectives.
  while (mp && done < order.size())
    if (auto got = fetch(order[done].first); !got && mine) mine = got.error();
  if (held) fsdp->release_unit(*held);
  if (!mp) return mine;
  std::vector<at::Tensor> failed{at::tensor({mine ? 0.0 : 1.0}, at::kDouble)};
  for (auto* g : {mp, epg})
    if (g)
      if (auto ok = all_reduce_sum(*g, failed); !ok) return mine ? ok : mine;
  if (!mine) return mine;
  if (failed[0].item<double>() > 0)
    return make_error(errc::unavailable, what + " failed on another rank of its group (rank 0 sends; its error "
                                                "says why)");
  return {};
} catch (const std::exception& e) {
  return carried_error(e).value_or(error_of_exception(e, what));
}

}  // namespace

Result<void> Trainer::save_model(const std::string& dir, int64_t max_shard_bytes) {
  auto& im = *impl_;
  if (!im.model_parallel_group()) {
    if (im.cfg.dp_group && im.cfg.dp_group->size() > 1 && im.cfg.dp_group->rank() != 0) return {};
    return im.model.save(dir, max_shard_bytes);
  }
  return walk_whole(im, "saving the model to " + dir, [&](const FetchWhole& fetch) {
    return model_detail::save_pretrained(im.model.impl().cfg, dir, max_shard_bytes, fetch);
  });
}

Result<void> Trainer::stream_parameters(int64_t bucket_bytes, const std::function<Result<void>(NamedTensors)>& sink) {
  if (bucket_bytes <= 0)
    return make_error(errc::invalid_argument, "bucket_bytes must be positive, not " + std::to_string(bucket_bytes));
  auto& im = *impl_;
  return walk_whole(im, "streaming the parameters", [&](const FetchWhole& fetch) -> Result<void> {
    NamedTensors bucket;
    int64_t bytes = 0;
    auto flush = [&]() -> Result<void> {
      if (bucket.empty()) return {};
      auto out = std::move(bucket);
      bucket = {};
      bytes = 0;
      return sink(std::move(out));
    };
    for (const auto& [name, shape] : model_detail::parameter_shapes(im.model.impl().cfg)) {
      auto t = fetch(name);
      if (!t) return t.error();
      const auto n = static_cast<int64_t>(t->nbytes());
      if (bytes > 0 && bytes + n > bucket_bytes)
        if (auto ok = flush(); !ok) return ok;
      // A copy where the fetch answered the live parameter (no group, the
      // first stage's own, a tensor-parallel norm): the sink may keep the
      // bucket past the next optimizer step, which updates in place.
      const auto& live = im.model.impl().params;
      const auto it = live.find(name);
      const bool aliased = it != live.end() && t->is_alias_of(it->second);
      auto g = from_torch(aliased ? t->detach().clone() : t->detach().contiguous());
      if (!g) return g.error();
      bucket.emplace_back(name, std::move(*g));
      bytes += n;
    }
    return flush();
  });
}

NamedTensors Trainer::optimizer_state() const { return impl_->opt->state(); }
Result<void> Trainer::load_optimizer_state(const std::map<std::string, Tensor>& state) {
  return impl_->opt->load_state(state, impl_->params());
}

}  // namespace glint::components
