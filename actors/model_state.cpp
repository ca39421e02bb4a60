#include "actors/model_state.hpp"

#include "actors/weight_sync/buckets.hpp"
#include "actors/weight_sync/collective.hpp"
#include "actors/weight_sync/stream.hpp"
#include "components/checkpoint/safetensors.hpp"
#include "components/comm/process_group.hpp"
#include "components/comm/store_host.hpp"
#include "components/model/transformer.hpp"
#include "runtime/text.hpp"

#include <nlohmann/json.hpp>

#include <filesystem>
#include <set>

namespace glint::actors {

namespace {

namespace fs = std::filesystem;
using namespace glint::components;

const std::set<std::string> batch_keys = {"input_ids",   "attention_mask", "segment_ids", "position_ids", "target_ids",
                                          "loss_mask",   "old_logps",      "ref_logps",   "advantages",
                                          "loss_weights", "routes"};

Result<TrainBatch> to_train_batch(const Batch& b) {
  std::vector<std::string> unknown;
  for (const auto& [k, t] : b.tensors)
    if (!batch_keys.count(k)) unknown.push_back(k);
  if (!unknown.empty())
    return make_error(errc::invalid_argument, "the batch has tensors the model does not read: " + join(unknown) +
                                                  " (it reads " + join(batch_keys) + ")");
  auto get = [&](const char* k) {
    auto it = b.tensors.find(k);
    return it == b.tensors.end() ? Tensor{} : it->second;
  };
  TrainBatch out;
  out.tokens.input_ids = get("input_ids");
  if (!out.tokens.input_ids.defined()) return make_error(errc::invalid_argument, "the batch has no input_ids");
  out.tokens.attention_mask = get("attention_mask");
  out.tokens.segment_ids = get("segment_ids");
  out.tokens.position_ids = get("position_ids");
  out.tokens.target_ids = get("target_ids");
  out.loss_mask = get("loss_mask");
  out.old_logps = get("old_logps");
  out.ref_logps = get("ref_logps");
  out.advantages = get("advantages");
  out.loss_weights = get("loss_weights");
  out.routes = get("routes");
  return out;
}

// "the full model" or "adapter 'a'": what a tenant is called in errors.
std::string tenant_label(const std::string& adapter) {
  return adapter.empty() ? std::string{"the full model"} : "adapter '" + adapter + "'";
}

}  // namespace

struct ModelState::Sync {
  weight_sync::SyncGroup group;
  std::optional<weight_sync::Listener> listener;  ///< of the stream transport, between listen and send
  int32_t receivers = 0;
};

ModelState::ModelState(RankContext ctx, ModelSpec spec)
    : ctx_(std::move(ctx)), spec_(std::move(spec)), sync_(std::make_unique<Sync>()) {
  if (!ctx_.mesh.empty()) {
    auto m = placement::DeviceMesh::from_dims(ctx_.mesh);
    if (m && m->world_size() != ctx_.world_size)
      m = make_error(errc::invalid_argument, "the mesh " + m->describe() + " does not fit a group of " +
                                                 std::to_string(ctx_.world_size) + " ranks");
    if (m)
      if (auto ok = check_model_mesh(*m, "a model group"); !ok) m = ok.error();
    if (m) mesh_ = std::move(*m);
    else mesh_error_ = fail(m.error());
  }
  load_initial();
}
ModelState::~ModelState() = default;
ModelState::ModelState(ModelState&&) noexcept = default;
ModelState& ModelState::operator=(ModelState&&) noexcept = default;

void ModelState::load_initial() {
  auto lm = [&]() -> Result<CausalLM> {
    if (!spec_.model_dir.empty()) return CausalLM::load(spec_.model_dir);
    auto cfg = ModelConfig::parse(spec_.config_json, "ModelSpec::config_json");
    if (!cfg) return cfg.error();
    return CausalLM::init_random(*cfg, spec_.seed);
  }();
  if (lm) model_ = std::move(*lm);
  else load_error_ = lm.error();
}

std::string ModelState::where() const {
  return "rank " + std::to_string(ctx_.rank) + " of model group '" + ctx_.group + "'";
}

Result<CausalLM*> ModelState::ready() {
  if (mesh_error_) return mesh_error_;
  if (!model_) return load_error_;
  return &*model_;
}

Result<ModelState::Tenant*> ModelState::tenant(const std::string& adapter) {
  auto m = ready();
  if (!m) return m.error();
  if (!adapter.empty() && !(*m)->has_adapter(adapter)) {
    auto names = (*m)->adapters();
    return make_error(errc::not_found, "no adapter '" + adapter + "' on this model (adapters: " +
                                           (names.empty() ? std::string{"none"} : join(names)) + ")");
  }
  return &tenants_[adapter];
}

bool ModelState::model_parallel() const { return !mesh_error_ && actors::model_parallel(ctx_); }

Result<const ModelState::Groups*> ModelState::groups() {
  if (groups_) return &*groups_;
  Groups g;
  if (!model_parallel()) {
    // Data parallel only: one group, its store hosted by dp rank 0.
    if (ctx_.dp_size > 1) {
      if (spec_.store_port <= 0)
        return make_error(errc::invalid_argument, "the model group has dp_size " + std::to_string(ctx_.dp_size) +
                                                      " but no store_port for its process group (ModelSpec)");
      auto pg = ProcessGroup::create({.store_host = spec_.store_host,
                                      .store_port = static_cast<uint16_t>(spec_.store_port),
                                      .rank = ctx_.dp_rank,
                                      .world_size = ctx_.dp_size,
                                      .prefix = "glint/" + ctx_.group});
      if (!pg) return pg.error();
      g.dp = *pg;
    }
    groups_ = std::move(g);
    return &*groups_;
  }
  // A group per dimension and slice, all meeting in one store that rank 0
  // hosts. Every rank joins its groups in the same order of dimensions, so
  // no two ranks wait for each other in different groups.
  if (spec_.store_port <= 0)
    return make_error(errc::invalid_argument, "the model group's mesh " + mesh_.describe() +
                                                  " needs a store_port for its process groups (ModelSpec)");
  const auto port = static_cast<uint16_t>(spec_.store_port);
  if (first() && !store_host_) {
    auto h = StoreHost::open(spec_.store_host, port);
    if (!h) return h.error();
    store_host_ = std::move(*h);
  }
  using placement::Dim;
  const std::pair<Dim, std::shared_ptr<ProcessGroup> Groups::*> dims[] = {
      {Dim::dp, &Groups::dp}, {Dim::fsdp, &Groups::fsdp}, {Dim::ep, &Groups::ep}, {Dim::tp, &Groups::tp},
      {Dim::pp, &Groups::pp}};
  for (const auto& [dim, member] : dims) {
    if (mesh_.size(dim) <= 1) continue;
    const auto ranks = mesh_.group_of(ctx_.rank, dim);
    const auto me = static_cast<int>(std::find(ranks.begin(), ranks.end(), ctx_.rank) - ranks.begin());
    const std::string name{to_string(dim)};
    auto pg = join_hosted_group({.store_host = spec_.store_host,
                                 .store_port = port,
                                 .rank = me,
                                 .world_size = static_cast<int>(ranks.size()),
                                 .prefix = "glint/" + ctx_.group + "/" + name + "/" + std::to_string(ranks.front())});
    if (!pg) return with_context(pg.error(), "joining the " + name + " group of ranks " + join(ranks, ","));
    g.*member = *pg;
  }
  groups_ = std::move(g);
  return &*groups_;
}

Trainer* ModelState::cutter() {
  if (!cut_for_) return nullptr;
  auto it = tenants_.find(*cut_for_);
  return it != tenants_.end() && it->second.trainer ? &*it->second.trainer : nullptr;
}

Trainer* ModelState::gatherer(const std::string& adapter, bool merged) {
  return adapter.empty() || merged ? cutter() : nullptr;
}

caf::error ModelState::refused_when_cut(const std::string& what) const {
  return make_error(errc::failed_precondition,
                    what + " is not built for a model cut over its ranks (model group '" + ctx_.group + "', mesh " +
                        mesh_.describe() + ", cut at the first training call of " + tenant_label(*cut_for_) + ")");
}

std::string ModelState::optimizer_file() const {
  if (!model_parallel()) return "optimizer.safetensors";
  // Named by the coordinates the model is cut along (fsdp with ep: both):
  // the dp replicas of a part hold the same state, so a run may resume
  // with another dp size.
  using placement::Dim;
  std::string name = "optimizer";
  for (Dim d : {Dim::fsdp, Dim::ep, Dim::tp, Dim::pp})
    if (mesh_.size(d) > 1)
      name += "-" + std::string{to_string(d)} + std::to_string(mesh_.coord(ctx_.rank, d)) + "-of-" +
              std::to_string(mesh_.size(d));
  return name + ".safetensors";
}

Result<Trainer*> ModelState::trainer(const std::string& adapter) {
  auto t = tenant(adapter);
  if (!t) return t.error();
  auto& ten = **t;
  if (ten.trainer) return &*ten.trainer;
  // The first trainer of a model-parallel group cuts the model in place
  // (FSDP's shards, TP's, a pipeline stage): it is that trainer's alone.
  if (cut_for_)
    return make_error(errc::failed_precondition,
                      "model group '" + ctx_.group + "' is cut over its ranks (" + mesh_.describe() + ") to train " +
                          tenant_label(*cut_for_) + "; it trains only that (train " + tenant_label(adapter) +
                          " on a model group of its own)");
  auto g = groups();
  if (!g) return g.error();
  auto tr = Trainer::create(*model_, {.optimizer = ten.optimizer,
                                      .scheduler = ten.scheduler,
                                      .adapter = adapter,
                                      .dp_group = (*g)->dp,
                                      .fsdp_group = (*g)->fsdp,
                                      .tp_group = (*g)->tp,
                                      .pp_group = (*g)->pp,
                                      .ep_group = (*g)->ep});
  if (!tr) return tr.error();
  ten.trainer = std::move(*tr);
  if (model_parallel()) cut_for_ = adapter;
  return &*ten.trainer;
}

Result<Metrics> ModelState::forward_backward(const Batch& batch, const std::string& adapter, Tensor* logps) {
  auto tb = to_train_batch(batch);
  if (!tb) return tb.error();
  auto tr = trainer(adapter);
  if (!tr) return tr.error();
  auto& ten = tenants_[adapter];
  auto m = (*tr)->forward_backward(*tb, ten.loss, logps);
  if (!m) return m.error();
  for (const auto& [k, v] : *m) {
    if (k == "loss_count") continue;
    auto& [sum, n] = ten.metric_sums[k];
    sum += v;
    ++n;
  }
  // With the count, the group weighs each rank's mean loss by what it is
  // a mean over (ModelGroup::forward_backward).
  // A pairwise loss's metrics are all means over its pairs (loss_count):
  // they are weighed the same way.
  if (m->count("loss_count")) {
    const double count = m->at("loss_count");
    std::vector<std::string> weighed{"loss"};
    if (components::is_pairwise(ten.loss.kind))
      for (const auto& [k, v] : *m)
        if (k.rfind("reward_", 0) == 0) weighed.push_back(k);
    for (const auto& k : weighed)
      if (m->count(k)) (*m)[k + "_weighted"] = m->at(k) * count;
  }
  return m;
}

Result<Tensor> ModelState::forward_only(const Batch& batch, const std::string& adapter) {
  auto tb = to_train_batch(batch);
  if (!tb) return tb.error();
  auto t = tenant(adapter);
  if (!t) return t.error();
  // A cut model: a collective of the group's ranks (every one is called,
  // each with its part of the batch: Trainer::forward_only).
  if (auto* cut = cutter()) return cut->forward_only(tb->tokens, adapter);
  auto out = model_->forward(tb->tokens, {.adapter = adapter});
  if (!out) return out.error();
  return out->logprobs;
}

Result<Metrics> ModelState::clip_grad_and_step(const std::string& adapter) {
  auto tr = trainer(adapter);
  if (!tr) return tr.error();
  return (*tr)->clip_grad_and_step();
}

Result<void> ModelState::set_loss(const std::string& adapter, const LossSpec& s) {
  if (auto ok = s.validate(); !ok) return ok.error();
  auto t = tenant(adapter);
  if (!t) return t.error();
  (*t)->loss = s;
  return {};
}

Result<void> ModelState::set_optimizer(const std::string& adapter, const OptimizerConfig& s) {
  if (auto ok = s.validate(); !ok) return ok.error();
  auto t = tenant(adapter);
  if (!t) return t.error();
  if ((*t)->trainer) {
    if (auto ok = (*t)->trainer->set_optimizer(s); !ok) return ok.error();
  }
  (*t)->optimizer = s;
  return {};
}

Result<void> ModelState::set_lr_scheduler(const std::string& adapter, const SchedulerConfig& s) {
  if (auto ok = s.validate(); !ok) return ok.error();
  auto t = tenant(adapter);
  if (!t) return t.error();
  if ((*t)->trainer) {
    if (auto ok = (*t)->trainer->set_lr_scheduler(s); !ok) return ok.error();
  }
  (*t)->scheduler = s;
  return {};
}

Result<void> ModelState::add_adapter(const std::string& name, const LoraConfig& c, uint64_t seed) {
  auto m = ready();
  if (!m) return m.error();
  if (cut_for_) return refused_when_cut("adding an adapter (add it before the first training call)");
  return (*m)->add_adapter(name, c, seed);
}

Result<void> ModelState::remove_adapter(const std::string& name) {
  auto m = ready();
  if (!m) return m.error();
  if (name.empty()) return make_error(errc::invalid_argument, "the full model is not an adapter to remove");
  if (cut_for_ == name) return refused_when_cut("removing the adapter it was cut for");
  if (auto ok = (*m)->remove_adapter(name); !ok) return ok.error();
  tenants_.erase(name);
  return {};
}

Result<Metrics> ModelState::calculate_metric(const std::string& adapter) {
  auto t = tenant(adapter);
  if (!t) return t.error();
  Metrics out;
  for (const auto& [k, sn] : (*t)->metric_sums) out[k] = sn.first / static_cast<double>(sn.second);
  (*t)->metric_sums.clear();
  if ((*t)->trainer) {
    out["step"] = static_cast<double>((*t)->trainer->step());
    out["lr"] = (*t)->trainer->current_lr();
  }
  return out;
}

Result<std::string> ModelState::train_configs(const std::string& adapter) {
  auto tp = tenant(adapter);
  if (!tp) return tp.error();
  const auto& t = **tp;
  nlohmann::json j;
  j["model"] = nlohmann::json::parse(model_->config().to_json());
  j["adapters"] = model_->adapters();
  j["adapter"] = adapter;
  if (const auto* lc = adapter.empty() ? nullptr : model_->adapter_config(adapter))
    j["lora"] = {{"r", lc->r}, {"alpha", lc->alpha}, {"dropout", lc->dropout}, {"target_modules", lc->target_modules},
                 {"rslora", lc->rslora}, {"adapter_config", nlohmann::json::parse(lc->to_json())}};
  j["loss"] = {{"kind", to_string(t.loss.kind)}, {"epsilon", t.loss.epsilon}, {"epsilon_high", t.loss.epsilon_high},
               {"beta", t.loss.beta}, {"entropy_coef", t.loss.entropy_coef}, {"max_tokens", t.loss.max_tokens}};
  j["optimizer"] = {{"kind", to_string(t.optimizer.kind)}, {"lr", t.optimizer.lr}, {"weight_decay", t.optimizer.weight_decay},
                    {"betas", {t.optimizer.beta1, t.optimizer.beta2}}, {"eps", t.optimizer.eps},
                    {"max_grad_norm", t.optimizer.max_grad_norm}};
  j["lr_scheduler"] = {{"kind", to_string(t.scheduler.kind)}, {"warmup_steps", t.scheduler.warmup_steps},
                       {"total_steps", t.scheduler.total_steps}, {"min_lr_ratio", t.scheduler.min_lr_ratio}};
  j["step"] = t.trainer ? t.trainer->step() : 0;
  j["data_parallel"] = {{"rank", ctx_.dp_rank}, {"size", ctx_.dp_size}};
  if (!ctx_.mesh.empty()) j["mesh"] = mesh_.describe();
  return j.dump(2);
}

Result<std::string> ModelState::save(const std::string& adapter, const std::string& dir, bool with_optimizer,
                                     int64_t max_shard_bytes) {
  auto t = tenant(adapter);
  if (!t) return t.error();
  // A model cut over its ranks is gathered a piece at a time and written by
  // rank 0 (every rank calls this); else rank 0 writes what it holds.
  auto* cut = cutter();
  if (adapter.empty() && cut) {
    if (auto ok = cut->save_model(dir, max_shard_bytes); !ok) return ok.error();
  } else if (first() || !model_parallel()) {
    auto ok = adapter.empty() ? model_->save(dir, max_shard_bytes) : model_->save_adapter(adapter, dir);
    if (!ok) return ok.error();
  }
  // Model parallel: each part's optimizer state is its own (its shards, its
  // stage), in a file of its own, written by the part's first dp replica;
  // else the called rank's stands for all.
  if (with_optimizer && (!model_parallel() || mesh_.coord(ctx_.rank, placement::Dim::dp) == 0)) {
    // Before the first step there is no state: an empty file says so, and
    // a load then starts the optimizer afresh.
    std::error_code ec;
    fs::create_directories(dir, ec);
    auto path = (fs::path{dir} / optimizer_file()).string();
    auto state = (*t)->trainer ? (*t)->trainer->optimizer_state() : NamedTensors{};
    if (auto w = write_safetensors(path, state); !w) return w.error();
  }
  return dir;
}

Result<void> ModelState::load(const std::string& adapter, const std::string& dir, bool with_optimizer) {
  // Read everything first; change nothing until all of it is good.
  std::optional<std::map<std::string, Tensor>> state;
  if (with_optimizer) {
    const auto path = fs::path{dir} / optimizer_file();
    std::error_code ec;
    if (model_parallel() && !fs::exists(path, ec))
      return make_error(errc::not_found, dir + " has no " + optimizer_file() + ": its optimizer state was saved "
                                         "from another mesh, or without it (the state does not move between meshes: "
                                         "load the weights alone, with_optimizer false)");
    auto s = load_safetensors(path.string());
    if (!s) return s.error();
    state = std::move(*s);
  }
  if (adapter.empty()) {
    auto lm = CausalLM::load(dir);
    if (!lm) return lm.error();
    model_ = std::move(*lm);
    load_error_ = caf::none;
    // Adapters go with the old model; the full model's settings stay (its
    // trainer is made again, on the new weights).
    std::optional<Tenant> base;
    if (auto it = tenants_.find(""); it != tenants_.end()) base = std::move(it->second);
    tenants_.clear();
    if (base) tenants_[""] = Tenant{base->loss, base->optimizer, base->scheduler, std::nullopt, {}};
    cut_for_.reset();  // the new model is whole until its first trainer
  } else {
    auto m = ready();
    if (!m) return m.error();
    if (cut_for_) return refused_when_cut("loading an adapter (load it before the first training call)");
    auto staging = "\x01loading " + adapter;
    if (auto ok = (*m)->load_adapter(staging, dir); !ok) return ok.error();
    if ((*m)->has_adapter(adapter)) {
      if (auto ok = (*m)->remove_adapter(adapter); !ok) {
        (void)(*m)->remove_adapter(staging);
        return ok.error();
      }
    }
    // Its settings stay; its trainer is made again, on the new tensors.
    if (auto it = tenants_.find(adapter); it != tenants_.end()) {
      it->second.trainer.reset();
      it->second.metric_sums.clear();
    }
    if (auto ok = (*m)->rename_adapter(staging, adapter); !ok) return ok.error();
  }
  if (state && !state->empty()) {
    auto tr = trainer(adapter);
    if (!tr) return tr.error();
    if (auto ok = (*tr)->load_optimizer_state(*state); !ok)
      return with_context(ok.error(), "the weights of " + dir + " are loaded, its optimizer state is not");
  }
  return {};
}

Result<void> ModelState::load_adapter(const std::string& name, const std::string& dir) {
  auto m = ready();
  if (!m) return m.error();
  if (name.empty()) return make_error(errc::invalid_argument, "load_adapter needs a name for the adapter");
  if (cut_for_) return refused_when_cut("loading an adapter (load it before the first training call)");
  if (auto ok = (*m)->load_adapter(name, dir); !ok) return ok.error();
  // A fresh tenant: no trainer or metrics of an adapter of the same name before.
  tenants_.erase(name);
  return {};
}

Result<NamedTensors> ModelState::export_weights(const std::string& adapter, bool merged, bool snapshot) {
  auto t = tenant(adapter);
  if (!t) return t.error();
  if (merged && adapter.empty())
    return make_error(errc::invalid_argument, "merge_and_sync needs the adapter to fold into the base weights");
  if (auto* cut = gatherer(adapter, merged)) {
    // The whole base, gathered a piece at a time; rank 0 keeps it (the
    // others take part and answer nothing). A sync streams it instead.
    if (merged) return refused_when_cut("merging an adapter into the weights");
    NamedTensors all;
    auto ok = cut->stream_parameters(int64_t{64} << 20, [&](NamedTensors bucket) -> Result<void> {
      for (auto& nt : bucket) all.push_back(std::move(nt));
      return {};
    });
    if (!ok) return ok.error();
    return all;
  }
  if (!first() && model_parallel()) return NamedTensors{};  // rank 0 answers for the group
  auto named = merged ? model_->merged_parameters(adapter)
               : adapter.empty() ? model_->named_parameters()
                                 : model_->adapter_parameters(adapter);
  if (!named) return named.error();
  // A snapshot when asked (training goes on); merged tensors are fresh already.
  if (snapshot && !merged)
    for (auto& [n, tensor] : *named) tensor = tensor.clone();
  return named;
}

Result<SyncManifest> ModelState::sync_manifest(const std::string& adapter, bool merged) {
  if (gatherer(adapter, merged)) {
    auto t = tenant(adapter);
    if (!t) return t.error();
    if (merged) return refused_when_cut("merging an adapter into the weights");
    // The whole model's, as stream_parameters sends them.
    SyncManifest m;
    const auto& cfg = model_->config();
    for (auto& [name, shape] : components::model_detail::parameter_shapes(cfg))
      m.tensors.push_back({name, shape, cfg.dtype});
    return m;
  }
  auto w = export_weights(adapter, merged, false);
  if (!w) return w.error();
  SyncManifest m;
  for (const auto& [name, t] : *w) m.tensors.push_back({name, t.shape(), t.dtype()});
  return m;
}

Result<int64_t> ModelState::sync_send(const std::string& adapter, bool merged, const SyncGroupAddress& at) {
  if (gatherer(adapter, merged))
    return refused_when_cut("the collective weight sync (sync by messages: SyncTransport::messages)");
  auto w = export_weights(adapter, merged, false);
  if (!w) return w.error();
  auto pg = sync_->group.join(at.host, at.port, 0, at.world);
  if (!pg) return pg.error();
  std::vector<Tensor> tensors;
  tensors.reserve(w->size());
  for (auto& [name, t] : *w) tensors.push_back(std::move(t));
  return (*pg)->broadcast_buckets(tensors, 0, at.bucket_bytes);
}

Result<Metrics> ModelState::push_weights(caf::actor_system& sys, const WeightPush& push) {
  if (auto ok = weight_sync::Pusher::check(push); !ok) return ok.error();
  auto* cut = gatherer(push.adapter, push.merged);
  if (!cut) {
    if (!first() && model_parallel()) return Metrics{};  // rank 0 pushes for the group
    auto w = export_weights(push.adapter, push.merged, /*snapshot=*/false);
    if (!w) return w.error();
    return weight_sync::push(sys, push, std::move(*w));
  }
  if (push.merged) return refused_when_cut("merging an adapter into the weights");
  // Gathered a piece at a time and pushed as the buckets fill: one bucket is
  // held back, so that the last goes as update_weights.
  weight_sync::Pusher pusher{sys, push};
  std::optional<NamedTensors> held;
  auto ok = cut->stream_parameters(push.bucket_bytes, [&](NamedTensors bucket) -> Result<void> {
    if (held)
      if (auto sent = pusher.send(*held, false); !sent) return sent;
    held = std::move(bucket);
    return {};
  });
  if (!ok) return ok.error();
  if (!first()) return Metrics{};
  if (!held) return make_error(errc::internal, "push_weights: the model streamed no parameters");
  if (auto sent = pusher.send(*held, true); !sent) return sent.error();
  return pusher.report();
}

Result<int32_t> ModelState::stream_listen(int32_t receivers, const std::string& host) {
  if (receivers < 1) return make_error(errc::invalid_argument, "stream_listen needs at least one receiver");
  auto m = ready();
  if (!m) return m.error();
  auto l = weight_sync::Listener::open(host);
  if (!l) return l.error();
  sync_->listener.emplace(std::move(*l));
  sync_->receivers = receivers;
  return sync_->listener->port();
}

Result<int64_t> ModelState::stream_send(const std::string& adapter, bool merged, int64_t timeout_ms) {
  if (!sync_->listener) return make_error(errc::failed_precondition, "stream_send without stream_listen");
  // The listener serves this one sync, whatever happens.
  auto listener = std::move(*sync_->listener);
  sync_->listener.reset();
  if (timeout_ms < 1) return make_error(errc::invalid_argument, "stream_send needs a timeout >= 1 ms");
  if (gatherer(adapter, merged))
    return refused_when_cut("the stream weight sync (sync by messages: SyncTransport::messages)");
  auto w = export_weights(adapter, merged, false);
  if (!w) return w.error();
  std::vector<Tensor> tensors;
  tensors.reserve(w->size());
  for (auto& [name, t] : *w) tensors.push_back(std::move(t));
  return weight_sync::send_weights(listener, sync_->receivers, tensors,
                                   std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms));
}

}  // namespace glint::actors
