#include "components/parallel/fsdp.hpp"

#include "components/comm/process_group_impl.hpp"
#include "components/parallel/expert_parallel.hpp"

#include <c10/core/GradMode.h>

#include <stdexcept>

namespace glint::components {

namespace {

// The decoder layer a parameter or module path belongs to ("model.layers.3.
// ..." -> 3), or -1 (the embeddings, the final norm, the LM head).
int64_t layer_of(const std::string& name) {
  static const std::string prefix = "model.layers.";
  if (name.rfind(prefix, 0) != 0) return -1;
  return std::stoll(name.substr(prefix.size()));
}

}  // namespace

Result<std::unique_ptr<Fsdp>> Fsdp::shard(CausalLM::Impl& model, std::shared_ptr<ProcessGroup> pg, bool train) {
  if (!pg) return make_error(errc::invalid_argument, "FSDP needs a process group");
  if (!model.sharded_by.empty())
    return make_error(errc::failed_precondition, "the model is sharded already (by " + model.sharded_by + ")");
  const int64_t L = model.cfg.num_hidden_layers;
  std::unique_ptr<Fsdp> f{new Fsdp};
  f->model_ = &model;
  f->pg_ = std::move(pg);
  f->train_ = train;
  f->layers_ = L;
  // Parameters per unit, in the model's (Hugging Face's) order: layers
  // 0..L-1, the rest, then (expert-parallel) each sparse layer's experts.
  // An expert-parallel rank holds experts of its own: they are a unit of
  // their own, whose gradient is complete after the fsdp reduce, while the
  // replicated units' are summed over ep besides (the trainer).
  std::vector<std::vector<std::string>> names(static_cast<size_t>(L + 1)), experts(static_cast<size_t>(L));
  for (const auto& n : model.names) {
    const auto l = layer_of(n);
    if (model.ep && l >= 0 && ep::expert_of(n) >= 0) experts[static_cast<size_t>(l)].push_back(n);
    else names[static_cast<size_t>(l < 0 ? L : l)].push_back(n);
  }
  f->expert_unit_.assign(static_cast<size_t>(L), 0);
  for (int64_t l = 0; l < L; ++l)
    if (!experts[static_cast<size_t>(l)].empty()) {
      f->expert_unit_[static_cast<size_t>(l)] = names.size();
      names.push_back(std::move(experts[static_cast<size_t>(l)]));
    }
  const int shards = f->pg_->size(), rank = f->pg_->rank();
  // Refused from the first unit on: a failure part of the way leaves
  // earlier units' bytes freed.
  model.sharded_by = "FSDP over " + std::to_string(shards) + " ranks";
  // The rank in the name: one rank's optimizer state is refused by another
  // (and an expert-parallel rank's experts by another's).
  const auto prefix = "fsdp" + std::to_string(rank) + "of" + std::to_string(shards);
  const auto expert_prefix =
      model.ep ? prefix + ".ep" + std::to_string(model.ep->pg->rank()) + "of" + std::to_string(model.ep->pg->size()) : "";
  for (size_t u = 0; u < names.size(); ++u) {
    std::vector<at::Tensor> params;
    std::vector<bool> routed;
    for (const auto& n : names[u]) {
      auto& p = model.params.at(n);
      p.requires_grad_(train);
      params.push_back(p);
      routed.push_back(ep::expert_of(n) >= 0);  // an expert no token reached has no gradient
    }
    f->routed_.push_back(std::move(routed));
    auto flat = FlatParam::shard(params, shards, rank);
    const auto layer = u < static_cast<size_t>(L) ? std::to_string(u)
                       : u > static_cast<size_t>(L) ? std::to_string(layer_of(names[u].front()))
                                                    : std::string{};
    if (!flat)
      return with_context(flat.error(), u < static_cast<size_t>(L)   ? "decoder layer " + layer
                                        : u > static_cast<size_t>(L) ? "the experts of decoder layer " + layer
                                                                     : "the embeddings");
    const auto name = u < static_cast<size_t>(L)   ? prefix + ".layers." + layer
                      : u > static_cast<size_t>(L) ? expert_prefix + ".layers." + layer + ".experts"
                                                   : prefix + ".rest";
    // Which elements decay: the parameters' rule, element by element.
    std::vector<at::Tensor> parts;
    for (const auto& n : names[u]) parts.push_back(at::full({model.params.at(n).numel()}, decays(n), at::kBool));
    auto mask = at::cat(parts);
    mask = at::cat({mask, at::zeros({flat->padded_numel() - flat->numel()}, at::kBool)});
    f->decay_[name] = mask.narrow(0, rank * flat->shard_numel(), flat->shard_numel()).clone();
    flat->local().requires_grad_(train);
    flat->free_full();
    f->units_.push_back(std::move(*flat));
    f->unit_names_.push_back(name);
  }
  f->hooks_.enter = [p = f.get()](int64_t l) {
    p->gather_unit(static_cast<size_t>(l));
    p->forward_done_ = l + 1;
  };
  f->hooks_.exit = [p = f.get()](int64_t l, at::Tensor out) {
    p->free_unit(static_cast<size_t>(l));
    // A forward without gradients (log-probs only) needs no backward:
    // end_pass runs its collectives with zeros.
    if (!at::GradMode::is_enabled()) return out;
    if (out.requires_grad() != p->backward_needed_[static_cast<size_t>(l)])
      throw_error(make_error(errc::internal, "decoder layer " + std::to_string(l) + "'s output " +
                                          (out.requires_grad() ? "requires" : "does not require") +
                                          " gradients, against what FSDP planned for the pass"));
    if (out.requires_grad())
      out.register_hook([p, l](const at::Tensor& g) {
        p->backward_reached(l, true);
        return g;
      });
    return out;
  };
  return f;
}

Fsdp::~Fsdp() = default;

// A collective that failed leaves this rank out of step with the others
// (which issued it or not): the group is unusable from then on.
void Fsdp::gather_unit(size_t u) {
  for (auto i : unit_parts(u))
    if (auto ok = units_[i].gather(*pg_); !ok) throw_error(broken_by(ok.error()));
}

std::vector<size_t> Fsdp::unit_parts(size_t u) const {
  if (u < expert_unit_.size() && expert_unit_[u] > 0) return {u, expert_unit_[u]};
  return {u};
}

void Fsdp::free_unit(size_t u) {
  for (auto i : unit_parts(u)) units_[i].free_full();
}

bool Fsdp::holds_experts(const std::string& shard) const {
  for (size_t u = static_cast<size_t>(layers_) + 1; u < unit_names_.size(); ++u)
    if (unit_names_[u] == shard) return true;
  return false;
}

// Layer (or the rest) `u`'s gradients of this pass, summed over the group
// into its shard's; `check`: every parameter must have one (the backward
// ran through the unit; a routed expert no token reached has none), else
// autograd did not finish it where planned.
void Fsdp::reduce_unit(size_t u, bool check) {
  for (auto i : unit_parts(u)) {
    auto& unit = units_[i];
    if (check)
      for (size_t p = 0; p < unit.params().size(); ++p)
        if (!unit.params()[p].grad().defined() && !routed_[i][p])
          throw_error(make_error(errc::internal, "FSDP: a parameter of " + unit_names_[i] +
                                              " has no gradient when its reduce is due"));
    if (auto ok = unit.reduce_grads(*pg_, /*average=*/false); !ok) throw_error(broken_by(ok.error()));
    unit.free_full();
  }
}

// Autograd reached layer `l`'s output (or end_pass stands in for it): the
// layer above is done, and is reduced (or, frozen, freed); `l` is gathered.
// `check`: the layer above must have every gradient (see reduce_unit).
void Fsdp::backward_reached(int64_t l, bool check) {
  finish_pending(check);
  next_backward_ = l - 1;
  gather_unit(static_cast<size_t>(l));
  pending_ = l;
}

// The layer gathered for the backward and not yet reduced (or freed).
void Fsdp::finish_pending(bool check) {
  if (pending_ < 0) return;
  const auto above = static_cast<size_t>(pending_);
  pending_ = -1;
  if (train_) reduce_unit(above, check);
  else free_unit(above);
}

const caf::error& Fsdp::broken_by(const caf::error& e) {
  if (!broken_) broken_ = e;
  return *broken_;
}

Result<void> Fsdp::usable() const {
  if (broken_)
    return with_context(*broken_, "this FSDP group's ranks are out of step since an earlier collective failed "
                                  "(start the model group again, from a checkpoint)");
  return {};
}

Result<void> Fsdp::begin_pass(const LoraAdapter* lora) {
  if (auto ok = usable(); !ok) return ok;
  if (in_pass_) return make_error(errc::failed_precondition, "FSDP: a pass began inside another");
  if (gathered_all_) release_all();
  const auto L = layers_;
  // Which layers the backward reaches: all when the base trains, else those
  // at or above the lowest layer an adapter adapts.
  int64_t lowest = train_ ? 0 : L;
  if (!train_ && lora)
    for (const auto& m : lora->modules)
      if (auto l = layer_of(m); l >= 0) lowest = std::min(lowest, l);
  backward_needed_.assign(static_cast<size_t>(L), false);
  for (int64_t l = lowest; l < L; ++l) backward_needed_[static_cast<size_t>(l)] = true;
  forward_done_ = 0;
  next_backward_ = L - 1;
  pending_ = -1;
  in_pass_ = true;
  try {
    gather_unit(static_cast<size_t>(L));
  } catch (const std::exception& e) {
    in_pass_ = false;
    return carried_error(e).value_or(make_error(errc::internal, e.what()));
  }
  return {};
}

Result<void> Fsdp::end_pass() try {
  if (!in_pass_) return {};
  in_pass_ = false;
  const auto L = layers_;
  c10::NoGradGuard no_grad;
  // A forward stopped part of the way: its remaining gathers.
  for (int64_t l = forward_done_; l < L; ++l) {
    gather_unit(static_cast<size_t>(l));
    free_unit(static_cast<size_t>(l));
  }
  // The backward's remaining steps, with whatever gradients there are
  // (none: zeros): unchecked, as the backward may not have run.
  for (int64_t l = next_backward_; l >= 0; --l)
    if (backward_needed_[static_cast<size_t>(l)]) backward_reached(l, false);
  finish_pending(false);
  if (train_) reduce_unit(static_cast<size_t>(L), false);
  units_[static_cast<size_t>(L)].free_full();
  // Every gradient of the pass was reduced: one that lands after its
  // layer's reduce would be lost (or leak into the next pass).
  if (train_)
    for (size_t u = 0; u < units_.size(); ++u)
      for (const auto& p : units_[u].params())
        if (p.grad().defined())
          return make_error(errc::internal, "FSDP: a gradient of " + unit_names_[u] + " arrived after its reduce");
  return {};
} catch (const std::exception& e) {
  for (auto& u : units_) u.free_full();
  return with_context(carried_error(e).value_or(make_error(errc::internal, e.what())), "FSDP: finishing a pass");
}

Result<Fsdp::Vote> Fsdp::vote(bool mine, bool failed) {
  if (auto ok = usable(); !ok) return ok.error();
  std::vector<at::Tensor> t{at::tensor({mine ? 1.0 : 0.0, failed ? 1.0 : 0.0}, at::kDouble)};
  if (auto ok = all_reduce_sum(*pg_, t); !ok) return broken_by(ok.error());
  return Vote{t[0][0].item<double>() > 0, t[0][1].item<double>() > 0};
}

Result<void> Fsdp::gather_all() {
  if (auto ok = usable(); !ok) return ok;
  if (in_pass_) return make_error(errc::failed_precondition, "FSDP: gather_all inside a pass");
  for (auto& u : units_)
    if (auto ok = u.gather(*pg_); !ok) {
      // Other ranks may have gathered more units: out of step, as a failed
      // read of one unit leaves them (gather_unit_to_read).
      for (auto& v : units_) v.free_full();
      return broken_by(ok.error());
    }
  gathered_all_ = true;
  model_->gathered = true;
  return {};
}

size_t Fsdp::unit_of(const std::string& name) const {
  const auto l = layer_of(name);
  return static_cast<size_t>(l < 0 ? layers_ : l);
}

Result<void> Fsdp::gather_unit_to_read(size_t unit) {
  if (auto ok = usable(); !ok) return ok;
  if (in_pass_) return make_error(errc::failed_precondition, "FSDP: a unit gathered to read inside a pass");
  for (auto i : unit_parts(unit))
    if (auto ok = units_[i].gather(*pg_); !ok) {
      free_unit(unit);
      return broken_by(ok.error());
    }
  return {};
}

void Fsdp::release_unit(size_t unit) { free_unit(unit); }

void Fsdp::release_all() {
  for (auto& u : units_) u.free_full();
  gathered_all_ = false;
  model_->gathered = false;
}

ParamList Fsdp::shards() const {
  ParamList out;
  for (size_t u = 0; u < units_.size(); ++u)
    out.emplace_back(unit_names_[u], units_[u].local());
  return out;
}

std::vector<FlatParam*> Fsdp::units() {
  std::vector<FlatParam*> out;
  for (auto& u : units_) out.push_back(&u);
  return out;
}

int64_t Fsdp::shard_bytes() const {
  int64_t n = 0;
  for (const auto& [name, t] : shards()) {
    n += t.numel() * static_cast<int64_t>(t.element_size());
    if (t.grad().defined()) n += t.grad().numel() * static_cast<int64_t>(t.grad().element_size());
  }
  return n;
}

}  // namespace glint::components
