#include "actors/model.hpp"

#include "actors/detail/answer.hpp"
#include "actors/detail/sync_group.hpp"
#include "actors/sampler.hpp"
#include "components/comm/process_group.hpp"
#include "placement/service.hpp"
#include "runtime/process.hpp"
#include "components/model/trainer.hpp"
#include "runtime/text.hpp"

#include <nlohmann/json.hpp>

#include <caf/scoped_actor.hpp>

#include <chrono>
#include <filesystem>
#include <memory>
#include <optional>
#include <set>

namespace glint::actors {

namespace {

namespace fs = std::filesystem;
using namespace glint::components;

const std::set<std::string> batch_keys = {"input_ids",   "attention_mask", "segment_ids", "position_ids", "target_ids",
                                          "loss_mask",   "old_logps",      "ref_logps",   "advantages"};

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
  return out;
}

/// One adapter's (or the full model's, "") training state.
struct Tenant {
  LossSpec loss;
  OptimizerConfig optimizer;
  SchedulerConfig scheduler;
  std::optional<Trainer> trainer;  ///< made at the first forward_backward
  std::map<std::string, std::pair<double, int64_t>> metric_sums;
};

struct ModelState {
  RankContext ctx;
  ModelSpec spec;
  std::optional<CausalLM> model;
  caf::error load_error;  ///< why there is no model; every call answers it
  std::map<std::string, Tenant> tenants;
  std::shared_ptr<ProcessGroup> dp;
  detail::SyncGroup sync;  ///< for sync_send

  std::string where() const {
    return "rank " + std::to_string(ctx.rank) + " of model group '" + ctx.group + "'";
  }

  caf::error fail(const caf::error& e) const { return with_context(e, where()); }

  Result<CausalLM*> ready() {
    if (!model) return load_error;
    return &*model;
  }

  Result<Tenant*> tenant(const std::string& adapter) {
    auto m = ready();
    if (!m) return m.error();
    if (!adapter.empty() && !(*m)->has_adapter(adapter)) {
      auto names = (*m)->adapters();
      return make_error(errc::not_found, "no adapter '" + adapter + "' on this model (adapters: " +
                                             (names.empty() ? std::string{"none"} : join(names)) + ")");
    }
    return &tenants[adapter];
  }

  /// Weights to sync or save: the base (adapter ""), an adapter's tensors,
  /// or the base with the adapter folded in (merged).
  Result<NamedTensorList> export_weights(const std::string& adapter, bool merged, bool snapshot) {
    auto t = tenant(adapter);
    if (!t) return t.error();
    if (merged && adapter.empty())
      return make_error(errc::invalid_argument, "merge_and_sync needs the adapter to fold into the base weights");
    auto named = merged ? model->merged_parameters(adapter)
                 : adapter.empty() ? Result<NamedTensors>{model->named_parameters()}
                                   : model->adapter_parameters(adapter);
    if (!named) return named.error();
    NamedTensorList out;
    for (auto& [n, tensor] : *named) {
      out.names.push_back(n);
      // A snapshot when asked (training goes on); merged tensors are fresh already.
      out.tensors.push_back(snapshot && !merged ? tensor.clone() : tensor);
    }
    return out;
  }

  Result<std::shared_ptr<ProcessGroup>> dp_group() {
    if (ctx.dp_size <= 1) return std::shared_ptr<ProcessGroup>{};
    if (dp) return dp;
    if (spec.store_port <= 0)
      return make_error(errc::invalid_argument, "the model group has dp_size " + std::to_string(ctx.dp_size) +
                                                    " but no store_port for its process group (ModelSpec)");
    auto pg = ProcessGroup::create({.store_host = spec.store_host,
                                    .store_port = static_cast<uint16_t>(spec.store_port),
                                    .rank = ctx.dp_rank,
                                    .world_size = ctx.dp_size,
                                    .prefix = "glint/" + ctx.group});
    if (!pg) return pg.error();
    dp = *pg;
    return dp;
  }

  Result<Trainer*> trainer(const std::string& adapter) {
    auto t = tenant(adapter);
    if (!t) return t.error();
    auto& ten = **t;
    if (ten.trainer) return &*ten.trainer;
    auto group = dp_group();
    if (!group) return group.error();
    auto tr = Trainer::create(*model, {ten.optimizer, ten.scheduler, adapter, *group});
    if (!tr) return tr.error();
    ten.trainer = std::move(*tr);
    return &*ten.trainer;
  }
};

void load_model(ModelState& st) {
  if (!st.spec.model_dir.empty()) {
    auto lm = CausalLM::load(st.spec.model_dir);
    if (lm) st.model = std::move(*lm);
    else st.load_error = lm.error();
    return;
  }
  auto cfg = ModelConfig::parse(st.spec.config_json, "ModelSpec::config_json");
  if (!cfg) {
    st.load_error = cfg.error();
    return;
  }
  auto lm = CausalLM::init_random(*cfg, st.spec.seed);
  if (lm) st.model = std::move(*lm);
  else st.load_error = lm.error();
}

nlohmann::json configs_json(ModelState& st, const std::string& adapter, const Tenant& t) {
  nlohmann::json j;
  j["model"] = nlohmann::json::parse(st.model->config().to_json());
  j["adapters"] = st.model->adapters();
  j["adapter"] = adapter;
  if (const auto* lc = adapter.empty() ? nullptr : st.model->adapter_config(adapter))
    j["lora"] = {{"r", lc->r}, {"alpha", lc->alpha}, {"dropout", lc->dropout}, {"target_modules", lc->target_modules},
                 {"rslora", lc->rslora}};
  j["loss"] = {{"kind", to_string(t.loss.kind)}, {"epsilon", t.loss.epsilon}, {"epsilon_high", t.loss.epsilon_high},
               {"beta", t.loss.beta}, {"entropy_coef", t.loss.entropy_coef}, {"max_tokens", t.loss.max_tokens}};
  j["optimizer"] = {{"kind", to_string(t.optimizer.kind)}, {"lr", t.optimizer.lr}, {"weight_decay", t.optimizer.weight_decay},
                    {"betas", {t.optimizer.beta1, t.optimizer.beta2}}, {"eps", t.optimizer.eps},
                    {"max_grad_norm", t.optimizer.max_grad_norm}};
  j["lr_scheduler"] = {{"kind", to_string(t.scheduler.kind)}, {"warmup_steps", t.scheduler.warmup_steps},
                       {"total_steps", t.scheduler.total_steps}, {"min_lr_ratio", t.scheduler.min_lr_ratio}};
  j["step"] = t.trainer ? t.trainer->step() : 0;
  j["data_parallel"] = {{"rank", st.ctx.dp_rank}, {"size", st.ctx.dp_size}};
  return j;
}

}  // namespace

// Sends `buckets` to every sampler of `push`: bucket k to all of them, then,
// once all answered, bucket k + 1 (the last as update_weights). It blocks
// this rank's own thread (model ranks are detached), so the rank serves
// nothing else meanwhile and the live weights that local-mode buckets share
// cannot change under them. The requests go from a scoped actor: an awaited
// request's timeout would hold the rank itself in CAF's clock until it fired,
// and its thread could not end at shutdown.
Result<void> push_buckets(caf::actor_system& sys, const WeightPush& push, const std::vector<NamedTensorList>& buckets) {
  caf::scoped_actor me{sys};
  const auto timeout = std::chrono::milliseconds{push.timeout_ms};
  for (size_t k = 0; k < buckets.size(); ++k) {
    const bool last = k + 1 == buckets.size();
    caf::error failed;
    size_t failed_at = 0;
    // Fan out to every sampler first, then collect: the samplers stage in parallel.
    auto fan_out = [&](auto send) {
      using Handle = decltype(send(std::declval<const sampler_actor&>()));
      std::vector<Handle> handles;
      for (const auto& a : push.samplers) handles.push_back(send(caf::actor_cast<sampler_actor>(a)));
      for (size_t s = 0; s < handles.size(); ++s)
        handles[s].receive([](bool) {},
                           [&](caf::error& e) {
                             if (!failed) failed = std::move(e), failed_at = s;
                           });
    };
    if (last)
      fan_out([&](const sampler_actor& to) {
        return me->request(to, timeout, update_weights_atom::value, buckets[k], push.update);
      });
    else
      fan_out([&](const sampler_actor& to) {
        return me->request(to, timeout, stage_weights_atom::value, buckets[k], push.update.version);
      });
    if (failed)
      return with_context(failed, "push_weights: sampler " + std::to_string(failed_at) + " of " +
                                      std::to_string(push.samplers.size()) + ", bucket " + std::to_string(k + 1) +
                                      " of " + std::to_string(buckets.size()));
  }
  return {};
}

model_actor::behavior_type model_shard(model_actor::pointer self, RankContext ctx, ModelSpec spec) {
  auto st = std::make_shared<ModelState>();
  st->ctx = std::move(ctx);
  st->spec = std::move(spec);
  load_model(*st);
  // Every handler answers through `answer`: a result, or the error with the
  // rank named; an exception becomes an error too, so the rank and its
  // training state survive it.
  auto answer = [st](auto&& run) { return detail::answer(*st, run); };
  return {
      [st, answer](forward_backward_atom, const Batch& b, const std::string& adapter) -> caf::result<Metrics> {
        auto run = [&]() -> Result<Metrics> {
          auto tb = to_train_batch(b);
          if (!tb) return tb.error();
          auto tr = st->trainer(adapter);
          if (!tr) return tr.error();
          auto m = (*tr)->forward_backward(*tb, st->tenants[adapter].loss);
          if (!m) return m.error();
          for (const auto& [k, v] : *m) {
            auto& [sum, n] = st->tenants[adapter].metric_sums[k];
            sum += v;
            ++n;
          }
          return m;
        };
        return answer(run);
      },
      [st, answer](forward_only_atom, const Batch& b, const std::string& adapter) -> caf::result<Tensor> {
        auto run = [&]() -> Result<Tensor> {
          auto tb = to_train_batch(b);
          if (!tb) return tb.error();
          auto t = st->tenant(adapter);
          if (!t) return t.error();
          auto out = st->model->forward(tb->tokens, {.adapter = adapter});
          if (!out) return out.error();
          return out->logprobs;
        };
        return answer(run);
      },
      [st, answer](clip_grad_and_step_atom, const std::string& adapter) -> caf::result<Metrics> {
        auto run = [&]() -> Result<Metrics> {
          auto tr = st->trainer(adapter);
          if (!tr) return tr.error();
          return (*tr)->clip_grad_and_step();
        };
        return answer(run);
      },
      [st, answer](set_loss_atom, const std::string& adapter, const LossSpec& s) -> caf::result<bool> {
        auto run = [&]() -> Result<bool> {
          if (auto ok = s.validate(); !ok) return ok.error();
          auto t = st->tenant(adapter);
          if (!t) return t.error();
          (*t)->loss = s;
          return true;
        };
        return answer(run);
      },
      [st, answer](set_optimizer_atom, const std::string& adapter, const OptimizerConfig& s) -> caf::result<bool> {
        auto run = [&]() -> Result<bool> {
          if (auto ok = s.validate(); !ok) return ok.error();
          auto t = st->tenant(adapter);
          if (!t) return t.error();
          (*t)->optimizer = s;
          if ((*t)->trainer) {
            if (auto ok = (*t)->trainer->set_optimizer(s); !ok) return ok.error();
          }
          return true;
        };
        return answer(run);
      },
      [st, answer](set_lr_scheduler_atom, const std::string& adapter, const SchedulerConfig& s) -> caf::result<bool> {
        auto run = [&]() -> Result<bool> {
          if (auto ok = s.validate(); !ok) return ok.error();
          auto t = st->tenant(adapter);
          if (!t) return t.error();
          (*t)->scheduler = s;
          if ((*t)->trainer) {
            if (auto ok = (*t)->trainer->set_lr_scheduler(s); !ok) return ok.error();
          }
          return true;
        };
        return answer(run);
      },
      [st, answer](add_adapter_atom, const std::string& name, const LoraConfig& c, uint64_t seed) -> caf::result<bool> {
        auto run = [&]() -> Result<bool> {
          auto m = st->ready();
          if (!m) return m.error();
          if (auto ok = (*m)->add_adapter(name, c, seed); !ok) return ok.error();
          return true;
        };
        return answer(run);
      },
      [st, answer](remove_adapter_atom, const std::string& name) -> caf::result<bool> {
        auto run = [&]() -> Result<bool> {
          auto m = st->ready();
          if (!m) return m.error();
          if (name.empty()) return make_error(errc::invalid_argument, "the full model is not an adapter to remove");
          if (auto ok = (*m)->remove_adapter(name); !ok) return ok.error();
          st->tenants.erase(name);
          return true;
        };
        return answer(run);
      },
      [st, answer](calculate_metric_atom, const std::string& adapter) -> caf::result<Metrics> {
        auto run = [&]() -> Result<Metrics> {
          auto t = st->tenant(adapter);
          if (!t) return t.error();
          Metrics out;
          for (const auto& [k, sn] : (*t)->metric_sums) out[k] = sn.first / static_cast<double>(sn.second);
          (*t)->metric_sums.clear();
          if ((*t)->trainer) {
            out["step"] = static_cast<double>((*t)->trainer->step());
            out["lr"] = (*t)->trainer->current_lr();
          }
          return out;
        };
        return answer(run);
      },
      [st, answer](get_train_configs_atom, const std::string& adapter) -> caf::result<std::string> {
        auto run = [&]() -> Result<std::string> {
          auto t = st->tenant(adapter);
          if (!t) return t.error();
          return configs_json(*st, adapter, **t).dump(2);
        };
        return answer(run);
      },
      [st, answer](save_atom, const std::string& adapter, const std::string& dir,
                   bool with_optimizer) -> caf::result<std::string> {
        auto run = [&]() -> Result<std::string> {
          auto t = st->tenant(adapter);
          if (!t) return t.error();
          auto ok = adapter.empty() ? st->model->save(dir) : st->model->save_adapter(adapter, dir);
          if (!ok) return ok.error();
          if (with_optimizer && (*t)->trainer) {
            auto path = (fs::path{dir} / "optimizer.safetensors").string();
            if (auto w = write_safetensors(path, (*t)->trainer->optimizer_state()); !w) return w.error();
          }
          return dir;
        };
        return answer(run);
      },
      [st, answer](load_atom, const std::string& adapter, const std::string& dir, bool with_optimizer) -> caf::result<bool> {
        auto run = [&]() -> Result<bool> {
          // Read everything first; change nothing until all of it is good.
          std::optional<std::map<std::string, Tensor>> state;
          if (with_optimizer) {
            auto s = load_safetensors((fs::path{dir} / "optimizer.safetensors").string());
            if (!s) return s.error();
            state = std::move(*s);
          }
          if (adapter.empty()) {
            // A new model: its adapters and trainers go with the old one.
            auto lm = CausalLM::load(dir);
            if (!lm) return lm.error();
            st->model = std::move(*lm);
            st->load_error = caf::none;
            // Adapters go with the old model; the full model's settings stay
            // (its trainer is made again, on the new weights).
            std::optional<Tenant> base;
            if (auto it = st->tenants.find(""); it != st->tenants.end()) base = std::move(it->second);
            st->tenants.clear();
            if (base) st->tenants[""] = Tenant{base->loss, base->optimizer, base->scheduler, std::nullopt, {}};
          } else {
            auto m = st->ready();
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
            if (auto it = st->tenants.find(adapter); it != st->tenants.end()) {
              it->second.trainer.reset();
              it->second.metric_sums.clear();
            }
            if (auto ok = (*m)->rename_adapter(staging, adapter); !ok) return ok.error();
          }
          if (state) {
            auto tr = st->trainer(adapter);
            if (!tr) return tr.error();
            if (auto ok = (*tr)->load_optimizer_state(*state); !ok)
              return with_context(ok.error(), "the weights of " + dir + " are loaded, its optimizer state is not");
          }
          return true;
        };
        return answer(run);
      },
      [st, answer](export_weights_atom, const std::string& adapter) -> caf::result<NamedTensorList> {
        return answer([&] { return st->export_weights(adapter, false, /*snapshot=*/true); });
      },
      [st, answer](sync_manifest_atom, const std::string& adapter, bool merged) -> caf::result<SyncManifest> {
        return answer([&]() -> Result<SyncManifest> {
          auto w = st->export_weights(adapter, merged, false);
          if (!w) return w.error();
          SyncManifest m;
          m.names = w->names;
          for (const auto& t : w->tensors) {
            m.shapes.push_back(t.shape());
            m.dtypes.emplace_back(to_string(t.dtype()));
          }
          return m;
        });
      },
      [st, self, answer](push_weights_atom, const WeightPush& push) -> caf::result<Metrics> {
        return answer([&]() -> Result<Metrics> {
          if (push.samplers.empty() || push.bucket_bytes < 1 || push.timeout_ms < 1)
            return make_error(errc::invalid_argument,
                              "push_weights needs samplers, bucket_bytes >= 1 and a timeout >= 1 ms");
          auto w = st->export_weights(push.adapter, push.merged, /*snapshot=*/false);
          if (!w) return w.error();
          // Buckets in export order; a tensor larger than a bucket is a bucket of its own.
          std::vector<NamedTensorList> buckets(1);
          int64_t filled = 0, bytes_total = 0;
          for (size_t i = 0; i < w->names.size(); ++i) {
            const auto bytes = static_cast<int64_t>(w->tensors[i].nbytes());
            if (filled > 0 && filled + bytes > push.bucket_bytes) {
              buckets.emplace_back();
              filled = 0;
            }
            buckets.back().names.push_back(std::move(w->names[i]));
            buckets.back().tensors.push_back(std::move(w->tensors[i]));
            filled += bytes;
            bytes_total += bytes;
          }
          if (auto ok = push_buckets(self->system(), push, buckets); !ok) return ok.error();
          return Metrics{{"tensors", static_cast<double>(w->names.size())},
                         {"buckets", static_cast<double>(buckets.size())},
                         {"bytes", static_cast<double>(bytes_total)}};
        });
      },
      [st, answer](sync_send_atom, const std::string& adapter, bool merged,
                   const SyncGroupAddress& at) -> caf::result<int64_t> {
        return answer([&]() -> Result<int64_t> {
          auto w = st->export_weights(adapter, merged, false);
          if (!w) return w.error();
          auto pg = st->sync.join(at.host, at.port, 0, at.world);
          if (!pg) return pg.error();
          return (*pg)->broadcast_buckets(w->tensors, 0, at.bucket_bytes);
        });
      },
  };
}

Result<Group<model_actor>> spawn_model_group(Runtime& rt, const placement::DeviceGroup& group,
                                             const placement::DeviceMesh& mesh, ModelSpec spec) {
  auto slots = placement::place(rt, group, mesh);
  if (!slots) return slots.error();
  if (spec.store_port == 0) {
    int host_node = 0;
    for (const auto& s : *slots)
      if (s.dp_rank == 0) {
        host_node = s.node;
        break;
      }
    // Node 0 is this process: the address the node processes reach it by.
    spec.store_host = host_node == 0 ? rt.options().cluster.master_addr : rt.node(host_node).hello.host;
    if (rt.mode() == Mode::local) spec.store_host = "127.0.0.1";
    auto port = pick_free_port();
    if (!port) return with_context(port.error(), "choosing a port for the process group of '" + group.name + "'");
    spec.store_port = *port;
  }
  return Group<model_actor>::spawn(rt, group.name, model_type, std::move(*slots), spec);
}

}  // namespace glint::actors
