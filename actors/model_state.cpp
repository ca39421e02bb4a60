#include "actors/model_state.hpp"

#include "actors/weight_sync/collective.hpp"
#include "actors/weight_sync/stream.hpp"
#include "components/checkpoint/safetensors.hpp"
#include "components/comm/process_group.hpp"
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
                                          "loss_weights"};

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
  return out;
}

}  // namespace

struct ModelState::Sync {
  weight_sync::SyncGroup group;
  std::optional<weight_sync::Listener> listener;  ///< of the stream transport, between listen and send
  int32_t receivers = 0;
};

ModelState::ModelState(RankContext ctx, ModelSpec spec)
    : ctx_(std::move(ctx)), spec_(std::move(spec)), sync_(std::make_unique<Sync>()) {
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

Result<std::shared_ptr<ProcessGroup>> ModelState::dp_group() {
  if (ctx_.dp_size <= 1) return std::shared_ptr<ProcessGroup>{};
  if (dp_) return dp_;
  if (spec_.store_port <= 0)
    return make_error(errc::invalid_argument, "the model group has dp_size " + std::to_string(ctx_.dp_size) +
                                                  " but no store_port for its process group (ModelSpec)");
  auto pg = ProcessGroup::create({.store_host = spec_.store_host,
                                  .store_port = static_cast<uint16_t>(spec_.store_port),
                                  .rank = ctx_.dp_rank,
                                  .world_size = ctx_.dp_size,
                                  .prefix = "glint/" + ctx_.group});
  if (!pg) return pg.error();
  dp_ = *pg;
  return dp_;
}

Result<Trainer*> ModelState::trainer(const std::string& adapter) {
  auto t = tenant(adapter);
  if (!t) return t.error();
  auto& ten = **t;
  if (ten.trainer) return &*ten.trainer;
  auto group = dp_group();
  if (!group) return group.error();
  auto tr = Trainer::create(*model_, {ten.optimizer, ten.scheduler, adapter, *group});
  if (!tr) return tr.error();
  ten.trainer = std::move(*tr);
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
  return (*m)->add_adapter(name, c, seed);
}

Result<void> ModelState::remove_adapter(const std::string& name) {
  auto m = ready();
  if (!m) return m.error();
  if (name.empty()) return make_error(errc::invalid_argument, "the full model is not an adapter to remove");
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
  return j.dump(2);
}

Result<std::string> ModelState::save(const std::string& adapter, const std::string& dir, bool with_optimizer,
                                     int64_t max_shard_bytes) {
  auto t = tenant(adapter);
  if (!t) return t.error();
  auto ok = adapter.empty() ? model_->save(dir, max_shard_bytes) : model_->save_adapter(adapter, dir);
  if (!ok) return ok.error();
  if (with_optimizer) {
    // Before the first step there is no state: an empty file says so, and
    // a load then starts the optimizer afresh.
    auto path = (fs::path{dir} / "optimizer.safetensors").string();
    auto state = (*t)->trainer ? (*t)->trainer->optimizer_state() : NamedTensors{};
    if (auto w = write_safetensors(path, state); !w) return w.error();
  }
  return dir;
}

Result<void> ModelState::load(const std::string& adapter, const std::string& dir, bool with_optimizer) {
  // Read everything first; change nothing until all of it is good.
  std::optional<std::map<std::string, Tensor>> state;
  if (with_optimizer) {
    auto s = load_safetensors((fs::path{dir} / "optimizer.safetensors").string());
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
  } else {
    auto m = ready();
    if (!m) return m.error();
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
  auto w = export_weights(adapter, merged, false);
  if (!w) return w.error();
  SyncManifest m;
  for (const auto& [name, t] : *w) m.tensors.push_back({name, t.shape(), t.dtype()});
  return m;
}

Result<int64_t> ModelState::sync_send(const std::string& adapter, bool merged, const SyncGroupAddress& at) {
  auto w = export_weights(adapter, merged, false);
  if (!w) return w.error();
  auto pg = sync_->group.join(at.host, at.port, 0, at.world);
  if (!pg) return pg.error();
  std::vector<Tensor> tensors;
  tensors.reserve(w->size());
  for (auto& [name, t] : *w) tensors.push_back(std::move(t));
  return (*pg)->broadcast_buckets(tensors, 0, at.bucket_bytes);
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
  auto w = export_weights(adapter, merged, false);
  if (!w) return w.error();
  std::vector<Tensor> tensors;
  tensors.reserve(w->size());
  for (auto& [name, t] : *w) tensors.push_back(std::move(t));
  return weight_sync::send_weights(listener, sync_->receivers, tensors,
                                   std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms));
}

}  // namespace glint::actors
