#include "rpc/server.hpp"

#include "actors/checkpoint_engine.hpp"
#include "actors/model_group.hpp"
#include "actors/sampler_group.hpp"
#include "placement/service.hpp"
#include "rpc/convert.hpp"
#include "rpc/detail/kj_bridge.hpp"
#include "rpc/detail/listener.hpp"
#include "rpc/detail/scrub.hpp"
#include "rpc/fingerprint.hpp"
#include "rpc/keys.hpp"
#include "rpc/tenant_store.hpp"
#include "rpc/tinker/gateway.hpp"
#include "components/checkpoint/atomic_dir.hpp"
#include "components/data/template.hpp"
#include "components/model/config.hpp"
#include "runtime/file.hpp"
#include "runtime/log.hpp"

#include <capnp/rpc-twoparty.h>
#include <kj/async-io.h>
#include <kj/compat/http.h>
#include <kj/compat/tls.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cctype>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <future>
#include <map>
#include <set>
#include <sstream>
#include <thread>
#include <unistd.h>

namespace glint::rpc {

namespace fs = std::filesystem;
using detail::await_future;

namespace {

using Clock = std::chrono::steady_clock;

// A small file's text; empty when it cannot be read (callers refuse what
// does not parse).
std::string read_text(const std::string& path) {
  auto text = read_text_file(path);
  return text ? std::move(*text) : std::string{};
}

/// A tenant's state on the server. Touched on the I/O thread only.
struct Tenant {
  std::string name;
  std::set<std::string> adapters;          ///< its model-group adapters (its own names)
  std::set<std::string> sampler_adapters;  ///< its sampler-group adapters
  /// What each adapter holds in memory, all ranks (server-wide budget);
  /// entries count only while their name is in the sets above.
  std::map<std::string, int64_t> adapter_bytes, sampler_bytes;
  std::map<std::string, std::shared_ptr<actors::CheckpointEngine>> syncs;  ///< by adapter
  int64_t in_flight = 0;
  /// Calls wait for this before they start: a weight sync replaces it, so
  /// the calls after a sync see its result.
  kj::ForkedPromise<void> barrier = kj::Promise<void>(kj::READY_NOW).fork();
  // Counters (docs/remote.md, "Observable").
  int64_t calls = 0, errors = 0, tokens = 0;
  int64_t queue_wait_us = 0;  ///< summed time calls waited for the tenant's earlier calls
  int64_t sessions = 0;       ///< open connections
  Clock::time_point last_seen = Clock::now();  ///< its last call (a heartbeat counts)
};

/// The model group serves its calls one at a time, and tenants take turns
/// at it: round robin by call, each tenant's calls in its own order. A
/// tenant with many or big calls queued delays another's next call by at
/// most the one of its own that is running. I/O thread only.
class FairLane {
public:
  /// A call's turn: the next call's starts when it is destroyed, however
  /// the call ends (an answer, an exception, a promise dropped). A Turn of
  /// no lane is held by calls that need none (never a null Own: KJ takes a
  /// null Own in a promise for no value at all).
  class Turn {
  public:
    explicit Turn(FairLane* lane) : lane_(lane) {}
    ~Turn() {
      if (lane_) lane_->leave();
    }
    KJ_DISALLOW_COPY(Turn);

  private:
    FairLane* lane_;
  };

  /// Resolves to `tenant`'s turn at the model group.
  kj::Promise<kj::Own<Turn>> enter(const std::string& tenant) {
    if (!busy_ && turns_.empty()) {
      busy_ = true;
      last_ = tenant;
      return kj::heap<Turn>(this);
    }
    auto paf = kj::newPromiseAndFulfiller<kj::Own<Turn>>();
    auto& queue = waiting_[tenant];
    if (queue.empty()) turns_.push_back(tenant);
    queue.push_back(kj::mv(paf.fulfiller));
    return kj::mv(paf.promise);
  }
  void clear() {
    waiting_.clear();
    turns_.clear();
  }

private:
  void leave() {
    busy_ = false;
    while (!turns_.empty()) {
      // The tenant whose call just ran goes after the others waiting (its
      // next call queued while that one ran, before theirs).
      if (turns_.size() > 1 && turns_.front() == last_) {
        turns_.push_back(turns_.front());
        turns_.pop_front();
      }
      auto who = turns_.front();
      turns_.pop_front();
      auto& queue = waiting_[who];
      auto next = kj::mv(queue.front());
      queue.pop_front();
      if (queue.empty()) waiting_.erase(who);
      else turns_.push_back(who);  // its next call waits for the others' turns
      if (next->isWaiting()) {  // not a call whose connection went away
        busy_ = true;
        last_ = who;
        next->fulfill(kj::heap<Turn>(this));
        return;
      }
    }
  }

  bool busy_ = false;
  std::map<std::string, std::deque<kj::Own<kj::PromiseFulfiller<kj::Own<Turn>>>>> waiting_;
  std::deque<std::string> turns_;  ///< tenants with calls waiting, whose turn is next first
  std::string last_;               ///< whose call went last
};

}  // namespace

struct Server::Impl {
  ServeConfig config;
  Runtime* rt = nullptr;
  std::optional<actors::ModelGroup> model;
  std::optional<actors::SamplerGroup> sampler;
  std::unique_ptr<KeyStore> keys;
  std::unique_ptr<TenantStore> store;
  std::string fingerprint;
  std::string base_name;
  int64_t vocab_size = 0;
  int64_t max_positions = 0;  ///< the base's context (config.json max_position_embeddings)
  std::atomic<int> port{0};
  std::atomic<int> metrics_port{-1};
  std::atomic<int> tinker_port{-1};
  tinker::Gateway* tinker_gateway = nullptr;  ///< while the Tinker API is served; I/O thread only
  std::string model_type;  ///< config.json's model_type
  std::atomic<uint64_t> upload_counter{0};
  std::string metrics_token;      ///< [metrics] token_file's token; empty: none (loopback only)
  detail::RateLimitedLog quiet_log;  ///< per-connection events, which a flood would make many of

  std::thread io;
  const kj::Executor* executor = nullptr;  ///< the I/O thread's, while it runs
  std::mutex stop_mx;
  kj::Own<kj::CrossThreadPromiseFulfiller<void>> stop;  ///< set by the I/O thread, fulfilled by shutdown
  std::chrono::milliseconds grace{30000};
  bool stopped = false;

  std::map<std::string, std::unique_ptr<Tenant>> tenants;  ///< I/O thread only
  FairLane lane;                                           ///< the model group's turns; I/O thread only
  components::ModelConfig base_config;                     ///< the base's shape, for adapter sizes

  /// Exclusive full-parameter training (ServeConfig::exclusive_full_training).
  std::string full_holder;               ///< the tenant training the base; I/O thread only
  std::atomic<bool> restoring{false};    ///< the base is being restored after it
  std::atomic<bool> restore_failed{false};  ///< it could not be: nothing is served until a restart
  bool shutting_down = false;            ///< the accept loop ended; I/O thread only

  /// Bytes an adapter of shape `l` holds: fp32 weights, gradients and two
  /// AdamW moments on each model rank; fp32 weights on each sampler rank.
  int64_t adapter_bytes(const LoraConfig& l, bool sampler) const {
    const int64_t params = l.parameters(base_config);
    return sampler ? params * 4 * config.sampler_ranks : params * 16 * config.model_ranks;
  }
  int64_t memory_used() const {
    int64_t used = 0;
    for (const auto& [_, t] : tenants) {
      for (const auto& a : t->adapters)
        if (auto it = t->adapter_bytes.find(a); it != t->adapter_bytes.end()) used += it->second;
      for (const auto& a : t->sampler_adapters)
        if (auto it = t->sampler_bytes.find(a); it != t->sampler_bytes.end()) used += it->second;
    }
    return used;
  }

  /// Makes the adapter saved in `saved` (then removed) the tenant's
  /// checkpoint `info.name`: written whole or not at all, then indexed.
  /// Replace::allowed: one of that name is replaced in one step (the old
  /// one or the new one is there at every moment, AtomicDir::begin_replacing).
  enum class Replace : bool { refused, allowed };
  Result<CheckpointInfo> commit_checkpoint(const std::string& tenant, CheckpointInfo info, const std::string& saved,
                                           int64_t ttl_seconds = 0, Replace replace = Replace::refused) {
    auto cleanup = kj::defer([saved] {
      std::error_code ec;
      fs::remove_all(saved, ec);
    });
    auto files = read_dir_files(saved);
    if (!files) return files.error();
    auto final_dir = store->checkpoint_dir(tenant, info.name);
    std::error_code ec;
    fs::create_directories(fs::path{final_dir}.parent_path(), ec);
    auto dir = replace == Replace::allowed ? components::AtomicDir::begin_replacing(final_dir)
                                           : components::AtomicDir::begin(final_dir);
    if (!dir) return dir.error();
    for (const auto& f : *files)
      if (auto ok = dir->write_file(f.name, f.data); !ok) return ok.error();
    if (auto ok = dir->commit(); !ok) return ok.error();
    info.created_ms =
        std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
            .count();
    info.expires_ms = ttl_seconds > 0 ? info.created_ms + ttl_seconds * 1000 : 0;
    if (auto ok = store->add(tenant, info); !ok) return ok.error();
    return info;
  }

  /// At shutdown, after the calls in flight: every adapter still in the
  /// model group is saved, with its optimizer state, as its tenant's
  /// checkpoint "autosave-<adapter>" (replacing an earlier one of that
  /// name), so a restarted server gives it back (load_checkpoint). The
  /// full model of an exclusive tenant is not: its driver's checkpoints
  /// hold it.
  void autosave() {
    for (const auto& [tenant, t] : tenants)
      for (const auto& adapter : t->adapters) {
        auto name = autosave_name(adapter);
        auto tmp = upload_dir();
        Result<std::string> saved =
            model->backend().save(tenant + ":" + adapter, {.dir = tmp, .with_optimizer = true}).get();
        caf::error err;
        if (!saved) err = saved.error();
        else {
          // In one step: a server killed here keeps the earlier autosave.
          auto info = commit_checkpoint(tenant, {.name = name, .adapter = adapter, .with_optimizer = true}, tmp,
                                        /*ttl_seconds=*/0, Replace::allowed);
          if (!info) err = info.error();
        }
        if (!err)
          log::info("serve: saved tenant " + tenant + "'s adapter " + adapter + " as its checkpoint " + name);
        else
          log::warn("serve: could not save tenant " + tenant + "'s adapter " + adapter + " at shutdown: " +
                    describe(err));
      }
  }
  /// "autosave-<adapter>", within the 64 bytes a checkpoint name may have.
  static std::string autosave_name(const std::string& adapter) {
    std::string name = "autosave-" + adapter;
    if (name.size() <= 64) return name;
    char hash[17];
    std::snprintf(hash, sizeof hash, "%016llx", static_cast<unsigned long long>(std::hash<std::string>{}(adapter)));
    return name.substr(0, 64 - 17) + "-" + hash;
  }

  /// Ends a tenant's exclusive full-parameter training: every call is
  /// refused (unavailable) while the base's weights are loaded again, its
  /// loss, optimizer and schedule reset, and the samplers given the base's
  /// weights. I/O thread.
  void release_full() {
    if (full_holder.empty()) return;
    if (shutting_down) {  // the process ends: nothing to restore the base for
      full_holder.clear();
      return;
    }
    log::info("serve: tenant " + full_holder + "'s exclusive full-parameter training ended: restoring the base model");
    if (auto it = tenants.find(full_holder); it != tenants.end()) it->second->syncs.erase("");
    full_holder.clear();
    restoring = true;
    start_worker([this] {
      auto base = model->base();
      Result<void> ok = base.load({.dir = config.model_dir}).get();
      if (ok) ok = base.set_loss({}).get();
      if (ok) ok = base.set_optimizer({}).get();
      if (ok) ok = base.set_lr_scheduler({}).get();
      if (ok) {
        auto synced = actors::CheckpointEngine{base, sampler->with_adapter("")}.sync_weights({});
        if (!synced) ok = synced.error();
      }
      if (ok) {
        log::info("serve: the base model is restored");
        restoring = false;
      } else {
        // Never serve a base that may hold a tenant's weights: stay refused.
        restore_failed = true;
        log::error("serve: restoring the base model failed, the server refuses every call until restarted: " +
                   describe(ok.error()));
      }
    });
  }

  /// Blocking work off the I/O thread (a weight sync), joined at shutdown:
  /// nothing it uses is destroyed under it. Finished ones are joined as the
  /// next starts: a thread never joined keeps its stack's mappings and its
  /// libraries' thread-local blocks (about 0.12 MiB here), one per sync,
  /// for the life of the server.
  struct Worker {
    std::thread thread;
    std::shared_ptr<std::atomic<bool>> done;
  };
  std::mutex workers_mx;
  std::vector<Worker> workers;
  template <class F>
  void start_worker(F f) {
    std::lock_guard<std::mutex> guard{workers_mx};
    std::erase_if(workers, [](Worker& w) {
      if (!w.done->load()) return false;
      w.thread.join();
      return true;
    });
    auto done = std::make_shared<std::atomic<bool>>(false);
    workers.push_back({std::thread{[f = std::move(f), done]() mutable {
                         f();
                         done->store(true);
                       }},
                       done});
  }
  void join_workers() {
    std::vector<Worker> all;
    {
      std::lock_guard<std::mutex> guard{workers_mx};
      all.swap(workers);
    }
    for (auto& w : all) w.thread.join();
  }

  Tenant& tenant(const std::string& name) {
    auto& t = tenants[name];
    if (!t) {
      t = std::make_unique<Tenant>();
      t->name = name;
    }
    return *t;
  }
  std::string upload_dir() {
    return (fs::path{config.state_dir} / "tmp" / ("upload-" + std::to_string(::getpid()) + "-" +
                                                  std::to_string(upload_counter.fetch_add(1))))
        .string();
  }
  void run_io(std::promise<Result<void>>& ready);

  /// Deletes the checkpoints whose time to live is over. I/O thread.
  void remove_expired() {
    const auto now =
        std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch()).count();
    // Not under a tenant's calls (a load of the checkpoint may be queued):
    // the next sweep deletes it.
    auto removed = store->remove_expired(now, [this](const std::string& tenant) {
      auto it = tenants.find(tenant);
      return it != tenants.end() && it->second->in_flight > 0;
    });
    if (!removed) {
      log::warn("serve: could not delete expired checkpoints: " + describe(removed.error()));
      return;
    }
    for (const auto& [tenant, name] : *removed)
      log::info("serve: deleted tenant " + tenant + "'s checkpoint " + name + ": its time to live is over");
  }

  /// Frees the adapters of tenants silent for longer than idle_seconds
  /// (none of their calls in flight); their checkpoints stay. I/O thread.
  void reclaim_idle() {
    const auto now = Clock::now();
    const auto idle = std::chrono::seconds(config.limits.idle_seconds);
    for (auto& [name, t] : tenants) {
      if (t->in_flight > 0 || now - t->last_seen < idle || (t->adapters.empty() && t->sampler_adapters.empty()))
        continue;
      // The groups serve messages in order: a call of the tenant's after
      // this sees the adapters gone.
      for (const auto& a : t->adapters) (void)model->remove_adapter(name + ":" + a);
      for (const auto& a : t->sampler_adapters) (void)sampler->remove_adapter(name + ":" + a);
      log::info("serve: tenant " + name + " silent for over " + std::to_string(config.limits.idle_seconds) +
                " s: freed its " + std::to_string(t->adapters.size()) + " model and " +
                std::to_string(t->sampler_adapters.size()) + " sampler adapters (its checkpoints stay)");
      t->adapters.clear();
      t->sampler_adapters.clear();
      t->syncs.clear();
      if (tinker_gateway) tinker_gateway->forget_adapters(name);
    }
    // A full-parameter tenant gone (no connection left) or silent: the base
    // goes back to every tenant.
    if (auto it = tenants.find(full_holder); it != tenants.end()) {
      const auto& t = *it->second;
      if (t.in_flight == 0 && (t.sessions == 0 || now - t.last_seen >= idle)) release_full();
    }
  }
};

using ServerState = Server::Impl;

namespace {

// -- the tenant's session -----------------------------------------------------

class SessionImpl final : public wire::Session::Server {
public:
  SessionImpl(ServerState& s, std::string tenant, std::string key_id)
      : s_(s), tenant_(std::move(tenant)), key_id_(std::move(key_id)) {
    ++t().sessions;
  }
  ~SessionImpl() {
    auto it = s_.tenants.find(tenant_);
    if (it == s_.tenants.end()) return;
    auto& t = *it->second;
    // The last connection of a tenant training the base exclusively: the
    // base goes back to everyone (at the idle sweep if calls still run).
    if (--t.sessions == 0 && s_.full_holder == tenant_ && t.in_flight == 0) s_.release_full();
  }

  kj::Promise<void> heartbeat(HeartbeatContext ctx) override {
    return run(ctx, "heartbeat", 0, [] { return ok_now(); });
  }

  kj::Promise<void> addAdapter(AddAdapterContext ctx) override {
    auto p = ctx.getParams();
    auto name = read_name(p.getName(), "adapter name");
    if (!name) return refuse(ctx, "add_adapter", name.error());
    auto lora = read_lora(p.getLora());
    if (!lora) return refuse(ctx, "add_adapter", lora.error());
    if (auto ok = check_new_adapter(*name, *lora); !ok) return refuse(ctx, "add_adapter", ok.error());
    auto seed = p.getSeed();
    if (auto err = admission()) return refuse(ctx, "add_adapter", err);
    if (auto ok = reserve(*name, *lora, false); !ok) return refuse(ctx, "add_adapter", ok.error());
    return run(
        ctx, "add_adapter", 0,
        [this, n = *name, l = *lora, seed] { return finish_add(n, s_.model->add_adapter(inner(n), l, seed)); },
        [this, n = *name] { t().adapters.erase(n); });
  }

  kj::Promise<void> removeAdapter(RemoveAdapterContext ctx) override {
    auto name = owned(ctx.getParams().getName());
    if (!name) return refuse(ctx, "remove_adapter", name.error());
    if (auto err = admission()) return refuse(ctx, "remove_adapter", err);
    // The name is gone at once: a later call naming it (a load that would
    // bring it back behind the tenant's books) is refused as unknown. A
    // removal that fails puts it back.
    t().adapters.erase(*name);
    forget_syncs(*name);
    return run(
        ctx, "remove_adapter", 0,
        [this, n = *name] {
          return await_future(s_.model->remove_adapter(inner(n))).then([this, n](Result<void> r) {
            if (!r) t().adapters.insert(n);
            else if (!t().adapters.count(n)) t().adapter_bytes.erase(n);  // not added again meanwhile
            return r;
          });
        },
        [this, n = *name] { t().adapters.insert(n); });
  }

  kj::Promise<void> setLoss(SetLossContext ctx) override {
    auto p = ctx.getParams();
    auto name = trained(p.getAdapter(), "set_loss");
    if (!name) return refuse(ctx, "set_loss", name.error());
    auto loss = read_loss(p.getLoss());
    if (!loss) return refuse(ctx, "set_loss", loss.error());
    return run(ctx, "set_loss", 0, [this, n = *name, l = *loss] { return await_future(s_.model->backend().set_loss(inner_or_base(n), l)); });
  }

  kj::Promise<void> setOptimizer(SetOptimizerContext ctx) override {
    auto p = ctx.getParams();
    auto name = trained(p.getAdapter(), "set_optimizer");
    if (!name) return refuse(ctx, "set_optimizer", name.error());
    auto o = read_optimizer(p.getOptimizer());
    if (!o) return refuse(ctx, "set_optimizer", o.error());
    return run(ctx, "set_optimizer", 0,
               [this, n = *name, o = *o] { return await_future(s_.model->backend().set_optimizer(inner_or_base(n), o)); });
  }

  kj::Promise<void> setLrScheduler(SetLrSchedulerContext ctx) override {
    auto p = ctx.getParams();
    auto name = trained(p.getAdapter(), "set_lr_scheduler");
    if (!name) return refuse(ctx, "set_lr_scheduler", name.error());
    auto sc = read_scheduler(p.getScheduler());
    if (!sc) return refuse(ctx, "set_lr_scheduler", sc.error());
    return run(ctx, "set_lr_scheduler", 0, [this, n = *name, sc = *sc] {
      return await_future(s_.model->backend().set_lr_scheduler(inner_or_base(n), sc));
    });
  }

  kj::Promise<void> forwardBackward(ForwardBackwardContext ctx) override {
    auto p = ctx.getParams();
    auto name = trained(p.getAdapter(), "forward_backward");
    if (!name) return refuse(ctx, "forward_backward", name.error());
    auto batch = checked_batch(p.getBatch());
    if (!batch) return refuse(ctx, "forward_backward", batch.error());
    auto tokens = tokens_of(*batch);
    if (p.getWithLogps())
      return run(ctx, "forward_backward", tokens, [this, ctx, n = *name, b = std::move(*batch)]() mutable {
        return await_future(s_.model->backend().forward_backward_with_logps(b, inner_or_base(n)))
            .then([ctx](Result<actors::TrainOutput> r) mutable {
              if (r) {
                auto res = ctx.getResults();
                write_metrics(res.initMetrics(static_cast<unsigned>(r->metrics.size())), r->metrics);
                write_tensor(res.initLogps(), r->logps, nullptr);
              }
              return drop(r);
            });
      });
    return run(ctx, "forward_backward", tokens, [this, ctx, n = *name, b = std::move(*batch)]() mutable {
      return await_future(s_.model->backend().forward_backward(b, inner_or_base(n))).then([ctx](Result<Metrics> r) mutable {
        if (r) write_metrics(ctx.getResults().initMetrics(static_cast<unsigned>(r->size())), *r);
        return drop(r);
      });
    });
  }

  kj::Promise<void> forwardOnly(ForwardOnlyContext ctx) override {
    auto p = ctx.getParams();
    auto name = read_adapter_or_base(p.getAdapter());
    if (!name) return refuse(ctx, "forward_only", name.error());
    auto batch = checked_batch(p.getBatch());
    if (!batch) return refuse(ctx, "forward_only", batch.error());
    auto tokens = tokens_of(*batch);
    return run(ctx, "forward_only", tokens, [this, ctx, n = *name, b = std::move(*batch)]() mutable {
      // Answers are copied into the message: nothing tells the server
      // when the RPC system has written them.
      return await_future(s_.model->backend().forward_only(b, inner_or_base(n))).then([ctx](Result<Tensor> r) mutable {
        if (r) write_tensor(ctx.getResults().initLogps(), *r, nullptr);
        return drop(r);
      });
    });
  }

  kj::Promise<void> clipGradAndStep(ClipGradAndStepContext ctx) override {
    auto name = trained(ctx.getParams().getAdapter(), "clip_grad_and_step");
    if (!name) return refuse(ctx, "clip_grad_and_step", name.error());
    return run(ctx, "clip_grad_and_step", 0, [this, ctx, n = *name]() mutable {
      return await_future(s_.model->backend().clip_grad_and_step(inner_or_base(n))).then([ctx](Result<Metrics> r) mutable {
        if (r) write_metrics(ctx.getResults().initMetrics(static_cast<unsigned>(r->size())), *r);
        return drop(r);
      });
    });
  }

  kj::Promise<void> calculateMetric(CalculateMetricContext ctx) override {
    auto name = trained(ctx.getParams().getAdapter(), "calculate_metric");
    if (!name) return refuse(ctx, "calculate_metric", name.error());
    return run(ctx, "calculate_metric", 0, [this, ctx, n = *name]() mutable {
      return await_future(s_.model->backend().calculate_metric(inner_or_base(n))).then([ctx](Result<Metrics> r) mutable {
        if (r) write_metrics(ctx.getResults().initMetrics(static_cast<unsigned>(r->size())), *r);
        return drop(r);
      });
    });
  }

  kj::Promise<void> trainConfigs(TrainConfigsContext ctx) override {
    auto name = trained(ctx.getParams().getAdapter(), "train_configs");
    if (!name) return refuse(ctx, "train_configs", name.error());
    return run(ctx, "train_configs", 0, [this, ctx, n = *name]() mutable {
      return await_future(s_.model->backend().train_configs(inner_or_base(n))).then([this, ctx](Result<std::string> r) mutable {
        if (r) ctx.getResults().setJson(clean(*r));
        return drop(r);
      });
    });
  }

  kj::Promise<void> exportWeights(ExportWeightsContext ctx) override {
    auto name = trained(ctx.getParams().getAdapter(), "export_weights");
    if (!name) return refuse(ctx, "export_weights", name.error());
    return run(ctx, "export_weights", 0, [this, ctx, n = *name]() mutable {
      return await_future(s_.model->backend().export_weights(inner_or_base(n))).then([ctx](Result<NamedTensors> r) mutable {
        // Copied into the message now: the model's tensors change with its
        // next step, before the answer may be written.
        if (r) write_named(ctx.getResults().initTensors(static_cast<unsigned>(r->size())), *r, nullptr);
        return drop(r);
      });
    });
  }

  kj::Promise<void> saveAdapter(SaveAdapterContext ctx) override {
    auto p = ctx.getParams();
    auto name = trained(p.getAdapter(), "save");
    if (!name) return refuse(ctx, "save_adapter", name.error());
    bool with_optimizer = p.getWithOptimizer();
    return run(ctx, "save_adapter", 0, [this, ctx, n = *name, with_optimizer]() mutable {
      auto dir = s_.upload_dir();
      return await_future(s_.model->backend().save(inner_or_base(n), actors::SaveRequest{.dir = dir, .with_optimizer = with_optimizer}))
          .then([this, ctx, dir](Result<std::string> r) mutable -> Result<void> {
            auto cleanup = kj::defer([dir] {
              std::error_code ec;
              fs::remove_all(dir, ec);
            });
            if (!r) return r.error();
            auto files = read_dir_files(dir);
            if (!files) return files.error();
            write_files(ctx.getResults().initFiles(static_cast<unsigned>(files->size())), *files);
            return {};
          });
    });
  }

  kj::Promise<void> loadAdapter(LoadAdapterContext ctx) override {
    auto p = ctx.getParams();
    bool create = p.getCreate(), with_optimizer = p.getWithOptimizer();
    auto name = create ? read_name(p.getAdapter(), "adapter name") : trained(p.getAdapter(), "load");
    if (!name) return refuse(ctx, "load_adapter", name.error());
    if (create)
      if (auto ok = check_new_name(*name, false); !ok) return refuse(ctx, "load_adapter", ok.error());
    auto files = read_files(p.getFiles());
    if (!files) return refuse(ctx, "load_adapter", files.error());
    if (auto err = admission()) return refuse(ctx, "load_adapter", err);
    auto dir = s_.upload_dir();
    auto uploaded = upload(dir, *files, [&]() -> Result<void> {
      if (name->empty()) return check_uploaded_base(dir);
      auto l = uploaded_lora(dir);
      if (!l) return l.error();
      return reserve(*name, *l, false);
    });
    if (!uploaded) return refuse(ctx, "load_adapter", uploaded.error());
    auto undo = [this, n = *name, dir, create] {
      std::error_code ec;
      fs::remove_all(dir, ec);
      if (create) t().adapters.erase(n);
    };
    return run(ctx, "load_adapter", 0, [this, n = *name, dir, create, with_optimizer] {
      auto f = create ? s_.model->load_adapter(inner(n), dir)
                      : s_.model->with_adapter(inner_or_base(n)).load({.dir = dir, .with_optimizer = with_optimizer});
      return await_future(f).then([this, n, dir, create](Result<void> r) {
        std::error_code ec;
        fs::remove_all(dir, ec);
        if (!r && create) t().adapters.erase(n);
        return r;
      });
    }, undo);
  }

  kj::Promise<void> sample(SampleContext ctx) override {
    auto p = ctx.getParams();
    auto name = read_adapter_or_base(p.getAdapter(), /*sampler=*/true);
    if (!name) return refuse(ctx, "sample", name.error());
    auto params = read_sampling(p.getParams());
    if (!params) return refuse(ctx, "sample", params.error());
    auto requests = read_requests(p.getRequests(), s_.vocab_size);
    if (!requests) return refuse(ctx, "sample", requests.error());
    if (auto ok = check_sampling(*params); !ok) return refuse(ctx, "sample", ok.error());
    // Counted wide: num_samples and max_tokens are bounded above, and so is
    // the number of requests (by the message size), so this cannot overflow.
    __int128 wide = 0;
    for (const auto& r : *requests)
      wide += static_cast<__int128>(r.prompt.size()) +
              static_cast<__int128>(params->num_samples) * std::max<int64_t>(params->max_tokens, 1);
    const int64_t tokens = wide > INT64_MAX ? INT64_MAX : static_cast<int64_t>(wide);
    if (tokens > s_.config.limits.tokens_per_call)
      return refuse(ctx, "sample", tokens_limit(tokens));
    return run(ctx, "sample", tokens, [this, ctx, n = *name, rs = std::move(*requests), pr = *params]() mutable {
      return await_future(s_.sampler->backend().sample(rs, pr, inner_or_base(n)))
          .then([this, ctx](Result<std::vector<SampledSequence>> r) mutable {
            if (r) {
              for (auto& s : *r) s.error = clean(s.error);
              write_sequences(ctx.getResults().initSequences(static_cast<unsigned>(r->size())), *r);
            }
            return drop(r);
          });
    });
  }

  kj::Promise<void> syncWeights(SyncWeightsContext ctx) override {
    auto name = trained(ctx.getParams().getAdapter(), "sync_weights");
    if (!name) return refuse(ctx, "sync_weights", name.error());
    std::string target = *name;
    if (ctx.getParams().getSamplerAdapter().size() > 0) {
      if (name->empty())
        return refuse(ctx, "sync_weights",
                      make_error(errc::invalid_argument, "the full model syncs into the sampler's base model only: "
                                                         "leave samplerAdapter empty"));
      auto t2 = read_name(ctx.getParams().getSamplerAdapter(), "sampler adapter name");
      if (!t2) return refuse(ctx, "sync_weights", t2.error());
      target = *t2;
    }
    if (!target.empty() && !t().sampler_adapters.count(target))
      return refuse(ctx, "sync_weights",
                    make_error(errc::failed_precondition, "the sampler has no adapter '" + target +
                                                              "': add it to the sampler group first (add_adapter)"));
    // One engine per (adapter, sampler adapter) pair.
    auto& engine = t().syncs[target == *name ? *name : *name + ">" + target];
    if (!engine)
      engine = std::make_shared<actors::CheckpointEngine>(s_.model->with_adapter(inner_or_base(*name)),
                                                          s_.sampler->with_adapter(inner_or_base(target)));
    auto e = engine;  // the thread's own reference: it outlives a removal
    // The sync blocks (it waits on the model's push): a thread of its own,
    // and the tenant's next calls wait for it.
    auto run_sync = [this, ctx, e]() mutable {
      auto paf = kj::newPromiseAndCrossThreadFulfiller<void>();
      auto out = std::make_shared<Result<actors::SyncReport>>(make_error(errc::internal, "sync did not run"));
      auto fulfiller = std::make_shared<kj::Own<kj::CrossThreadPromiseFulfiller<void>>>(kj::mv(paf.fulfiller));
      s_.start_worker([e, out, fulfiller] {
        *out = e->sync_weights({});
        (*fulfiller)->fulfill();
      });
      return paf.promise.then([ctx, out]() mutable -> Result<void> {
        if (!*out) return out->error();
        ctx.getResults().setVersion((*out)->version);
        return {};
      });
    };
    auto done = run(ctx, "sync_weights", 0, kj::mv(run_sync)).fork();
    t().barrier = done.addBranch().fork();
    return done.addBranch();
  }

  kj::Promise<void> samplerStats(SamplerStatsContext ctx) override {
    return run(ctx, "sampler_stats", 0, [this, ctx]() mutable {
      return await_future(s_.sampler->stats()).then([ctx](Result<std::vector<Metrics>> r) mutable {
        if (r) {
          auto ranks = ctx.getResults().initRanks(static_cast<unsigned>(r->size()));
          for (size_t i = 0; i < r->size(); ++i)
            write_metrics(ranks[static_cast<unsigned>(i)].initMetrics(static_cast<unsigned>((*r)[i].size())), (*r)[i]);
        }
        return drop(r);
      });
    });
  }

  kj::Promise<void> listAdapters(ListAdaptersContext ctx) override {
    return run(ctx, "list_adapters", 0, [this, ctx]() mutable {
      auto names = ctx.getResults().initNames(static_cast<unsigned>(t().adapters.size()));
      unsigned i = 0;
      for (const auto& n : t().adapters) names.set(i++, n);
      return ok_now();
    });
  }

  kj::Promise<void> samplerAddAdapter(SamplerAddAdapterContext ctx) override {
    auto p = ctx.getParams();
    auto name = read_name(p.getName(), "adapter name");
    if (!name) return refuse(ctx, "sampler_add_adapter", name.error());
    auto lora = read_lora(p.getLora());
    if (!lora) return refuse(ctx, "sampler_add_adapter", lora.error());
    if (auto ok = check_new_sampler_adapter(*name, *lora); !ok) return refuse(ctx, "sampler_add_adapter", ok.error());
    if (auto err = admission()) return refuse(ctx, "sampler_add_adapter", err);
    if (auto ok = reserve(*name, *lora, true); !ok) return refuse(ctx, "sampler_add_adapter", ok.error());
    return run(
        ctx, "sampler_add_adapter", 0,
        [this, n = *name, l = *lora] {
          return await_future(s_.sampler->add_adapter(inner(n), l)).then([this, n](Result<void> r) {
            if (!r) t().sampler_adapters.erase(n);
            return r;
          });
        },
        [this, n = *name] { t().sampler_adapters.erase(n); });
  }

  kj::Promise<void> samplerLoadAdapter(SamplerLoadAdapterContext ctx) override {
    auto p = ctx.getParams();
    auto name = read_name(p.getName(), "adapter name");
    if (!name) return refuse(ctx, "sampler_load_adapter", name.error());
    if (auto ok = check_new_name(*name, true); !ok) return refuse(ctx, "sampler_load_adapter", ok.error());
    auto files = read_files(p.getFiles());
    if (!files) return refuse(ctx, "sampler_load_adapter", files.error());
    if (auto err = admission()) return refuse(ctx, "sampler_load_adapter", err);
    auto dir = s_.upload_dir();
    auto uploaded = upload(dir, *files, [&]() -> Result<void> {
      auto l = uploaded_lora(dir);
      if (!l) return l.error();
      return reserve(*name, *l, true);
    });
    if (!uploaded) return refuse(ctx, "sampler_load_adapter", uploaded.error());
    auto undo = [this, n = *name, dir] {
      std::error_code ec;
      fs::remove_all(dir, ec);
      t().sampler_adapters.erase(n);
    };
    return run(ctx, "sampler_load_adapter", 0, [this, n = *name, dir] {
      return await_future(s_.sampler->load_adapter(inner(n), dir)).then([this, n, dir](Result<void> r) {
        std::error_code ec;
        fs::remove_all(dir, ec);
        if (!r) t().sampler_adapters.erase(n);
        return r;
      });
    }, undo);
  }

  kj::Promise<void> samplerLoadCheckpoint(SamplerLoadCheckpointContext ctx) override {
    auto p = ctx.getParams();
    auto name = read_name(p.getName(), "checkpoint name");
    if (!name) return refuse(ctx, "sampler_load_checkpoint", name.error());
    auto found = s_.store->find(tenant_, *name);
    if (!found) return refuse(ctx, "sampler_load_checkpoint", found.error());
    auto adapter = read_name(p.getAdapter(), "adapter name");
    if (!adapter) return refuse(ctx, "sampler_load_checkpoint", adapter.error());
    if (auto ok = check_new_name(*adapter, true); !ok) return refuse(ctx, "sampler_load_checkpoint", ok.error());
    auto dir = s_.store->checkpoint_dir(tenant_, *name);
    auto lora = uploaded_lora(dir);
    if (!lora) return refuse(ctx, "sampler_load_checkpoint", lora.error());
    if (auto err = admission()) return refuse(ctx, "sampler_load_checkpoint", err);
    if (auto ok = reserve(*adapter, *lora, true); !ok) return refuse(ctx, "sampler_load_checkpoint", ok.error());
    return run(
        ctx, "sampler_load_checkpoint", 0,
        [this, a = *adapter, dir] {
          return await_future(s_.sampler->load_adapter(inner(a), dir)).then([this, a](Result<void> r) {
            if (!r) t().sampler_adapters.erase(a);
            return r;
          });
        },
        [this, a = *adapter] { t().sampler_adapters.erase(a); });
  }

  kj::Promise<void> samplerRemoveAdapter(SamplerRemoveAdapterContext ctx) override {
    auto name = read_name(ctx.getParams().getName(), "adapter name");
    if (!name) return refuse(ctx, "sampler_remove_adapter", name.error());
    if (!t().sampler_adapters.count(*name)) return refuse(ctx, "sampler_remove_adapter", unknown(*name));
    return run(ctx, "sampler_remove_adapter", 0, [this, n = *name] {
      return await_future(s_.sampler->remove_adapter(inner(n))).then([this, n](Result<void> r) {
        if (r) {
          t().sampler_adapters.erase(n);
          forget_syncs(n);
        }
        return r;
      });
    });
  }

  kj::Promise<void> saveCheckpoint(SaveCheckpointContext ctx) override {
    auto p = ctx.getParams();
    auto adapter = owned(p.getAdapter());
    if (!adapter) return refuse(ctx, "save_checkpoint", adapter.error());
    auto name = read_name(p.getName(), "checkpoint name");
    if (!name) return refuse(ctx, "save_checkpoint", name.error());
    if (s_.store->find(tenant_, *name))
      return refuse(ctx, "save_checkpoint",
                    make_error(errc::invalid_argument, "checkpoint '" + *name + "' exists already; pick a new name"));
    bool with_optimizer = p.getWithOptimizer();
    const int64_t ttl = p.getTtlSeconds();
    if (ttl < 0 || ttl > int64_t{100} * 365 * 86400)
      return refuse(ctx, "save_checkpoint",
                    make_error(errc::invalid_argument, "ttl_seconds must be 0 (never expires) up to 100 years, not " +
                                                           std::to_string(ttl)));
    return run(ctx, "save_checkpoint", 0, [this, ctx, a = *adapter, n = *name, with_optimizer, ttl]() mutable {
      auto tmp = s_.upload_dir();
      return await_future(s_.model->backend().save(inner(a), actors::SaveRequest{.dir = tmp, .with_optimizer = with_optimizer}))
          .then([this, ctx, a, n, with_optimizer, ttl, tmp](Result<std::string> r) mutable -> Result<void> {
            if (!r) {
              std::error_code ec;
              fs::remove_all(tmp, ec);
              return r.error();
            }
            auto info = s_.commit_checkpoint(tenant_, {.name = n, .adapter = a, .with_optimizer = with_optimizer}, tmp,
                                             ttl);
            if (!info) return info.error();
            write_checkpoint(ctx.getResults().initCheckpoint(), *info);
            return {};
          });
    });
  }

  kj::Promise<void> listCheckpoints(ListCheckpointsContext ctx) override {
    return run(ctx, "list_checkpoints", 0, [this, ctx]() mutable -> kj::Promise<Result<void>> {
      auto all = s_.store->list(tenant_);
      if (!all) return Result<void>{all.error()};
      auto list = ctx.getResults().initCheckpoints(static_cast<unsigned>(all->size()));
      for (size_t i = 0; i < all->size(); ++i) write_checkpoint(list[static_cast<unsigned>(i)], (*all)[i]);
      return Result<void>{};
    });
  }

  kj::Promise<void> loadCheckpoint(LoadCheckpointContext ctx) override {
    auto p = ctx.getParams();
    auto name = read_name(p.getName(), "checkpoint name");
    if (!name) return refuse(ctx, "load_checkpoint", name.error());
    auto found = s_.store->find(tenant_, *name);
    if (!found) return refuse(ctx, "load_checkpoint", found.error());
    bool create = p.getCreate(), with_optimizer = p.getWithOptimizer();
    if (with_optimizer && !found->with_optimizer)
      return refuse(ctx, "load_checkpoint", make_error(errc::invalid_argument, "checkpoint '" + *name +
                                                                                   "' was saved without its optimizer state"));
    auto adapter = create ? read_name(p.getAdapter(), "adapter name") : owned(p.getAdapter());
    if (!adapter) return refuse(ctx, "load_checkpoint", adapter.error());
    if (create)
      if (auto ok = check_new_name(*adapter, false); !ok) return refuse(ctx, "load_checkpoint", ok.error());
    auto dir = s_.store->checkpoint_dir(tenant_, *name);
    auto lora = uploaded_lora(dir);
    if (!lora) return refuse(ctx, "load_checkpoint", lora.error());
    if (auto err = admission()) return refuse(ctx, "load_checkpoint", err);
    if (auto ok = reserve(*adapter, *lora, false); !ok) return refuse(ctx, "load_checkpoint", ok.error());
    return run(
        ctx, "load_checkpoint", 0,
        [this, a = *adapter, dir, create, with_optimizer] {
          auto f = create ? s_.model->load_adapter(inner(a), dir)
                          : s_.model->with_adapter(inner(a)).load({.dir = dir, .with_optimizer = with_optimizer});
          return await_future(f).then([this, a, create](Result<void> r) {
            if (!r && create) t().adapters.erase(a);
            return r;
          });
        },
        [this, a = *adapter, create] {
          if (create) t().adapters.erase(a);
        });
  }

  kj::Promise<void> deleteCheckpoint(DeleteCheckpointContext ctx) override {
    auto name = read_name(ctx.getParams().getName(), "checkpoint name");
    if (!name) return refuse(ctx, "delete_checkpoint", name.error());
    return run(ctx, "delete_checkpoint", 0, [this, n = *name]() -> kj::Promise<Result<void>> {
      return s_.store->remove(tenant_, n);
    });
  }

private:
  static void write_checkpoint(wire::CheckpointInfo::Builder b, const CheckpointInfo& c) {
    b.setName(c.name);
    b.setAdapter(c.adapter);
    b.setCreatedMs(c.created_ms);
    b.setWithOptimizer(c.with_optimizer);
    b.setExpiresMs(c.expires_ms);
  }

  Tenant& t() { return s_.tenant(tenant_); }
  /// Drops the weight-sync engines that read or write adapter `name`.
  void forget_syncs(const std::string& name) {
    auto& syncs = t().syncs;
    for (auto it = syncs.begin(); it != syncs.end();) {
      const auto& k = it->first;
      const bool pair = k.rfind(name + ">", 0) == 0 ||
                        (k.size() > name.size() && k.compare(k.size() - name.size() - 1, std::string::npos, ">" + name) == 0);
      if (k == name || pair) it = syncs.erase(it);
      else ++it;
    }
  }
  std::string inner(const std::string& name) const { return tenant_ + ":" + name; }
  std::string inner_or_base(const std::string& name) const { return name.empty() ? std::string{} : inner(name); }

  static kj::Promise<Result<void>> ok_now() { return Result<void>{}; }
  template <class T>
  static Result<void> drop(const Result<T>& r) {
    if (!r) return r.error();
    return {};
  }

  /// Writes uploaded files to `dir` and runs `check` on them; on any error
  /// nothing is left on disk.
  template <class Check>
  Result<void> upload(const std::string& dir, const std::vector<FileBytes>& files, Check check) const {
    auto ok = write_dir_files(dir, files);
    if (ok) ok = check();
    if (!ok) {
      std::error_code ec;
      fs::remove_all(dir, ec);
    }
    return ok;
  }

  /// The adapters' internal names, other adapters' names and the server's
  /// paths never reach a tenant: errors and texts are cleaned of them. (An
  /// actor's "no adapter 'x' (adapters: ...)" lists every tenant's.)
  std::string clean(std::string text) const {
    for (size_t at = text.find(" (adapters:"); at != std::string::npos; at = text.find(" (adapters:", at)) {
      auto close = text.find(')', at);
      text.erase(at, close == std::string::npos ? std::string::npos : close - at + 1);
    }
    const std::string upload_root = (fs::path{s_.config.state_dir} / "tmp").string() + "/";
    const std::string checkpoint_root = (fs::path{s_.config.state_dir} / "checkpoints" / tenant_).string() + "/";
    for (const auto& [needle, with] : {std::pair<std::string, std::string>{tenant_ + ":", ""},
                                       {upload_root, "<upload>/"},
                                       {checkpoint_root, "<checkpoint>/"},
                                       {s_.config.state_dir + "/", "<server>/"}}) {
      if (needle.empty() || needle == "/") continue;
      for (size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + with.size()))
        text.replace(at, needle.size(), with);
    }
    return detail::without_process_labels(std::move(text), host_name());
  }

  static const std::string& host_name() {
    static const std::string name = [] {
      char host[256] = {};
      return ::gethostname(host, sizeof host - 1) == 0 ? std::string{host} : std::string{};
    }();
    return name;
  }

  /// The message a tenant reads for `err`: cleaned (clean), and for the
  /// server's own failures (internal) an incident number instead, the
  /// whole message going to the operator's log under it.
  /// The status written for `err`, its message made the tenant's (whole:
  /// a NUL inside it is kept).
  void scrub_status(wire::Status::Builder b, const caf::error& err) const {
    auto m = b.getMessage();
    b.setMessage(as_text(tenant_message(err, std::string{m.begin(), m.size()})));
  }
  std::string tenant_message(const caf::error& err, const std::string& text) const {
    if (code_of(err) != errc::internal) return clean(text);
    static std::atomic<uint64_t> incidents{0};
    const auto id = std::to_string(::getpid()) + "-" + std::to_string(++incidents);
    log::warn("serve: incident " + id + " (tenant " + tenant_ + "): " + text);
    return "the server failed this call (incident " + id + "; the operator's log has the details)";
  }

  caf::error unknown(const std::string& name) const {
    return make_error(errc::not_found, "you have no adapter '" + name + "'");
  }
  caf::error adapters_limit() const {
    return make_error(errc::resource_exhausted, "limit adapters: a tenant holds at most " +
                                                    std::to_string(s_.config.limits.adapters) +
                                                    " adapters; remove one first");
  }
  caf::error tokens_limit(int64_t tokens) const {
    return make_error(errc::resource_exhausted, "limit tokens_per_call: this call has " + std::to_string(tokens) +
                                                    " tokens, at most " +
                                                    std::to_string(s_.config.limits.tokens_per_call) +
                                                    " are allowed; split it");
  }

  /// The adapter a training call names: one of the tenant's, or empty for
  /// the base model itself, which only exclusive mode allows (claim_base).
  Result<std::string> trained(capnp::Text::Reader r, const char* method) {
    if (r.size() > 0) return owned(r);
    if (auto ok = claim_base(method); !ok) return ok.error();
    return std::string{};
  }
  /// The base model for this tenant's full-parameter training: refused on
  /// a shared server; in exclusive mode, the server becomes the tenant's
  /// alone when no other tenant uses it (no adapters, no calls).
  Result<void> claim_base(const char* method) {
    if (!s_.config.exclusive_full_training)
      return make_error(errc::permission_denied,
                        std::string{method} +
                            " with no adapter works on the shared base model itself, which every tenant of this server "
                            "reads and nobody trains: train a LoRA adapter (add_adapter, then with_adapter(name)); "
                            "the server's operator can offer full-parameter training one tenant at a time "
                            "(full_training = \"exclusive\")");
    if (s_.full_holder == tenant_) return {};
    if (auto err = admission()) return err;  // a revoked key, or calls at the limit, claims nothing
    if (!t().adapters.empty() || !t().sampler_adapters.empty())
      return make_error(errc::failed_precondition,
                        "training the full model needs the server to yourself: remove your adapters first (loading "
                        "full weights would drop them)");
    for (const auto& [name, other] : s_.tenants)
      if (name != tenant_ && (other->in_flight > 0 || !other->adapters.empty() || !other->sampler_adapters.empty()))
        return make_error(errc::unavailable,
                          "training the full model needs the server to yourself, and other tenants are using it: "
                          "retry later");
    s_.full_holder = tenant_;
    log::info("serve: tenant " + tenant_ + " trains the full model: the server is its alone until it disconnects");
    return {};
  }
  /// Why no call of this tenant's may start while another trains the full
  /// model, or while the base is being restored after that; or none.
  caf::error exclusive_gate() const {
    if (s_.restore_failed)
      return make_error(errc::unavailable, "the server could not restore its base model after a tenant's "
                                           "full-parameter training and serves nothing until its operator restarts it");
    if (s_.restoring)
      return make_error(errc::unavailable, "the server is restoring its base model after a tenant's full-parameter "
                                           "training: retry in a few seconds");
    if (!s_.full_holder.empty() && s_.full_holder != tenant_)
      return make_error(errc::unavailable, "another tenant is training the full model on this server (exclusive "
                                           "mode): calls are refused until it disconnects; retry later");
    return caf::none;
  }

  /// One of the tenant's model-group adapters.
  Result<std::string> owned(capnp::Text::Reader r) {
    auto name = read_name(r, "adapter name");
    if (!name) return name.error();
    if (!t().adapters.count(*name)) return unknown(*name);
    return name;
  }
  /// Empty (the base model, read-only) or one of the tenant's adapters.
  Result<std::string> read_adapter_or_base(capnp::Text::Reader r, bool sampler = false) {
    if (r.size() == 0) return std::string{};
    auto name = read_name(r, "adapter name");
    if (!name) return name.error();
    if (!(sampler ? t().sampler_adapters : t().adapters).count(*name)) return unknown(*name);
    return name;
  }

  Result<void> check_rank(const LoraConfig& l) const {
    int64_t r = l.r;
    for (const auto& [_, pr] : l.rank_pattern) r = std::max(r, pr);
    if (r > s_.config.limits.max_rank)
      return make_error(errc::resource_exhausted, "limit max_rank: rank " + std::to_string(r) + " is above the " +
                                                      std::to_string(s_.config.limits.max_rank) +
                                                      " this server allows");
    return {};
  }
  /// A new adapter name of the tenant's, in the model group or the sampler
  /// group, within its adapter limit.
  Result<void> check_new_name(const std::string& name, bool sampler) {
    const auto& names = sampler ? t().sampler_adapters : t().adapters;
    if (names.count(name))
      return make_error(errc::invalid_argument,
                        std::string{sampler ? "the sampler has an adapter '" : "adapter '"} + name +
                            "' already; remove it first or pick another name");
    if (static_cast<int64_t>(names.size()) >= s_.config.limits.adapters) return adapters_limit();
    if (s_.full_holder == tenant_)
      return make_error(errc::failed_precondition,
                        "you are training the full model (exclusive mode): adapters are refused until you "
                        "disconnect, since loading full weights drops them");
    return {};
  }
  Result<void> check_new_adapter(const std::string& name, const LoraConfig& l) {
    if (auto ok = check_new_name(name, false); !ok) return ok;
    return check_rank(l);
  }
  Result<void> check_new_sampler_adapter(const std::string& name, const LoraConfig& l) {
    if (auto ok = check_new_name(name, true); !ok) return ok;
    return check_rank(l);
  }
  /// An uploaded PEFT directory's adapter shape, within the rank limit,
  /// read before any actor loads it.
  Result<LoraConfig> uploaded_lora(const std::string& dir) const {
    auto l = LoraConfig::load(dir + "/adapter_config.json");
    if (!l) return make_error(errc::invalid_argument, "the files hold no valid adapter: " + describe(l.error()));
    if (auto ok = check_rank(*l); !ok) return ok.error();
    return l;
  }
  /// Uploaded full weights are a checkpoint of this server's base: the
  /// same shape (so a tenant cannot make the server hold a bigger model).
  Result<void> check_uploaded_base(const std::string& dir) const {
    auto c = components::ModelConfig::load(dir + "/config.json");
    if (!c) return make_error(errc::invalid_argument, "a full-model load needs a checkpoint of the server's base model "
                                                      "(config.json and weights): " + describe(c.error()));
    const auto& b = s_.base_config;
    if (c->architecture != b.architecture || c->vocab_size != b.vocab_size || c->hidden_size != b.hidden_size ||
        c->intermediate_size != b.intermediate_size || c->num_hidden_layers != b.num_hidden_layers ||
        c->num_attention_heads != b.num_attention_heads || c->num_key_value_heads != b.num_key_value_heads ||
        c->head_dim != b.head_dim || c->num_parameters() != b.num_parameters())
      return make_error(errc::invalid_argument,
                        "the files are not a checkpoint of the server's base model: their config.json has another "
                        "shape");
    return {};
  }
  /// Checks the server's memory budget for a new adapter of shape `l` and
  /// reserves its name (a second add of it in flight is refused).
  Result<void> reserve(const std::string& name, const LoraConfig& l, bool sampler) {
    auto& tn = t();
    auto& names = sampler ? tn.sampler_adapters : tn.adapters;
    auto& bytes = sampler ? tn.sampler_bytes : tn.adapter_bytes;
    // The charges of sampler adapters since removed (a name per ephemeral
    // save otherwise, for the tenant's life). A sampler adapter's name
    // leaves `names` only once its removal succeeded; a model adapter's
    // leaves at once and may come back (removeAdapter forgets its charge).
    if (sampler) std::erase_if(bytes, [&](const auto& kv) { return !names.count(kv.first); });
    const int64_t held = names.count(name) && bytes.count(name) ? bytes[name] : 0;
    const int64_t need = s_.adapter_bytes(l, sampler), used = s_.memory_used() - held,
                  budget = s_.config.limits.memory_bytes;
    if (need > budget - used) {
      auto mib = [](int64_t b) {
        char text[32];
        std::snprintf(text, sizeof text, "%.1f MiB", static_cast<double>(b) / (1 << 20));
        return std::string{text};
      };
      return make_error(errc::resource_exhausted,
                        "limit memory_mib: this adapter needs " + mib(need) +
                            (sampler ? " (its weights on each sampler rank)"
                                     : " (weights, gradients and AdamW state on each model rank)") +
                            ", more than the server's adapter memory has free now ([limits] memory_mib): remove "
                            "one of your adapters, or use a lower rank or fewer target modules");
    }
    // A load into an existing adapter may still fail and leave the old
    // one: it is charged the larger of the two (never less than it holds).
    bytes[name] = names.count(name) ? std::max(held, need) : need;
    names.insert(name);
    return {};
  }

  /// Sampling parameters within what the server can answer: counts below
  /// the model's context, top-k and log-probs below the vocabulary, stop
  /// tokens in it.
  Result<void> check_sampling(const SamplingParams& p) const {
    auto bad = [](const std::string& what) { return make_error(errc::invalid_argument, "sampling params: " + what); };
    if (p.num_samples > 1024) return bad("num_samples must be at most 1024, not " + std::to_string(p.num_samples));
    if (p.max_tokens > s_.max_positions)
      return bad("max_tokens must be at most the model's context, " + std::to_string(s_.max_positions) + ", not " +
                 std::to_string(p.max_tokens));
    for (auto [name, v] : {std::pair{"top_k", p.top_k}, {"logprobs", p.logprobs}, {"prompt_logprobs", p.prompt_logprobs}})
      if (v > s_.vocab_size) return bad(std::string{name} + " must be at most the vocabulary size, " + std::to_string(s_.vocab_size));
    for (auto id : p.stop_token_ids)
      if (id < 0 || id >= s_.vocab_size) return bad("stop token " + std::to_string(id) + " is outside the vocabulary");
    if (p.stop_token_ids.size() > 256 || p.stop.size() > 64) return bad("at most 256 stop tokens and 64 stop strings");
    for (const auto& s : p.stop)
      if (s.size() > 1024) return bad("a stop string is longer than 1024 bytes");
    return {};
  }

  Result<Batch> checked_batch(wire::Batch::Reader r) {
    auto b = read_batch(r);
    if (!b) return b;
    auto ids = b->tensors.find("input_ids");
    if (ids == b->tensors.end()) return make_error(errc::invalid_argument, "batch: input_ids is required");
    if (ids->second.dtype() != Dtype::i64 || ids->second.dims() != 2)
      return make_error(errc::invalid_argument, "batch: input_ids must be i64 [B, T], not " + ids->second.describe());
    const int64_t rows = ids->second.size(0), len = ids->second.size(1);
    if (len > s_.max_positions)
      return make_error(errc::invalid_argument, "batch: rows of " + std::to_string(len) +
                                                    " tokens are longer than the model's context, " +
                                                    std::to_string(s_.max_positions));
    // Every tensor is one the trainer reads, of its shape: nothing the
    // trainer would ignore, nothing it would size from a wrong dimension.
    static const std::set<std::string> per_token = {"attention_mask", "position_ids", "segment_ids", "target_ids",
                                                    "loss_mask",      "old_logps",    "ref_logps",   "loss_weights"};
    for (const auto& [name, t] : b->tensors) {
      if (name == "input_ids") continue;
      const bool known = per_token.count(name) || name == "advantages" || name == "routes";
      const bool token_shaped = t.dims() == 2 && t.size(0) == rows && t.size(1) == len;
      // routes [B, T, S, k]: the trainer checks S and k against the model.
      const bool fits = per_token.count(name) ? token_shaped
                        : name == "advantages" ? token_shaped || (t.dims() == 1 && t.size(0) == rows)
                        : name == "routes"     ? t.dims() == 4 && t.size(0) == rows && t.size(1) == len
                                               : false;
      if (fits) continue;
      if (!known)
        return make_error(errc::invalid_argument,
                          "batch: unknown tensor '" + name.substr(0, 64) +
                              "' (the trainer reads input_ids, attention_mask, position_ids, segment_ids, target_ids, "
                              "loss_mask, old_logps, ref_logps, advantages, loss_weights, routes)");
      return make_error(errc::invalid_argument, "batch: '" + name + "' must be [B, T" +
                                                    (name == "routes" ? ", S, k" : "") + "] = [" +
                                                    std::to_string(rows) + ", " + std::to_string(len) +
                                                    (name == "routes" ? ", ..." : "") + "]" +
                                                    (name == "advantages" ? " or [B]" : "") + ", not " + t.describe());
    }
    for (const char* key : {"input_ids", "target_ids"}) {
      auto it = b->tensors.find(key);
      if (it == b->tensors.end()) continue;
      auto v = it->second.values<int64_t>();
      if (!v) return make_error(errc::invalid_argument, std::string{"batch: "} + key + " must be i64");
      for (size_t i = 0; i < v->size(); ++i)
        // target_ids may hold -100 (ignored positions), as Hugging Face's labels.
        if ((*v)[i] >= s_.vocab_size || ((*v)[i] < 0 && !(std::string_view{key} == "target_ids" && (*v)[i] == -100)))
          return make_error(errc::invalid_argument, std::string{"batch: "} + key + "[" + std::to_string(i) + "] is " +
                                                        std::to_string((*v)[i]) + ", outside the vocabulary [0, " +
                                                        std::to_string(s_.vocab_size) + ")");
    }
    if (auto tokens = tokens_of(*b); tokens > s_.config.limits.tokens_per_call) return tokens_limit(tokens);
    return b;
  }
  static int64_t tokens_of(const Batch& b) {
    auto it = b.tensors.find("input_ids");
    return it == b.tensors.end() ? 0 : it->second.numel();
  }

  template <class Context>
  kj::Promise<void> refuse(Context& ctx, const char* method, const caf::error& err) {
    auto& tn = t();
    ++tn.calls;
    ++tn.errors;
    log_call(method, 0, std::chrono::microseconds{0}, err);
    auto res = ctx.getResults();
    write_status(res.initStatus(), err);
    scrub_status(res.getStatus(), err);
    return kj::READY_NOW;
  }

  void log_call(const char* method, int64_t tokens, std::chrono::microseconds latency, const caf::error& err) const {
    log::info("serve: tenant=" + tenant_ + " method=" + method + " tokens=" + std::to_string(tokens) +
              " latency_us=" + std::to_string(latency.count()) +
              " outcome=" + std::string{to_string(code_of(err))});
  }

  /// Why this session may not start a call now (its key was revoked, its
  /// calls in flight are at the limit), or none. Methods that reserve a
  /// name or write an upload ask first, so a refusal leaves nothing behind.
  caf::error admission(bool heartbeat = false) {
    // The grace period is for the calls in flight when the stop came: a
    // driver calling in a loop would otherwise hold the server to its end.
    if (s_.shutting_down)
      return make_error(errc::unavailable, "the server is shutting down: it finishes the calls in flight and takes "
                                           "no new ones; attach again when it is back");
    if (auto valid = s_.keys->check(key_id_); !valid) return valid.error();
    if (!heartbeat)
      if (auto err = exclusive_gate()) return err;
    if (t().in_flight >= s_.config.limits.calls_in_flight)
      return make_error(errc::resource_exhausted, "limit calls_in_flight: " + std::to_string(t().in_flight) +
                                                      " calls of yours are in flight; wait for one");
    return caf::none;
  }

  /// The calls the model group serves: they take turns at it (FairLane).
  static bool uses_model(std::string_view method) {
    static const std::set<std::string_view> model_calls = {
        "add_adapter",    "remove_adapter", "set_loss",       "set_optimizer",   "set_lr_scheduler",
        "forward_backward", "forward_only", "clip_grad_and_step", "calculate_metric", "train_configs",
        "export_weights", "save_adapter",   "load_adapter",   "save_checkpoint", "load_checkpoint",
        // Not served by the model group, but they must follow the tenant's
        // earlier model calls: a sync pushes the model's weights as they are
        // when it starts, a deletion must not overtake a load of the same
        // checkpoint.
        "sync_weights", "delete_checkpoint", "sampler_load_checkpoint"};
    return model_calls.count(method) > 0;
  }

  /// Runs `start` (which returns a promise of the call's outcome) after the
  /// tenant's barrier and its turn at the model group (for calls it serves),
  /// within its in-flight limit, and answers the status.
  /// `undo` runs if the call ends in an exception instead of an outcome (the
  /// outcome's own continuation undoes a failed call's reservations).
  template <class Context, class Start>
  kj::Promise<void> run(Context& ctx, const char* method, int64_t tokens, Start start,
                        std::function<void()> undo = nullptr) {
    if (auto err = admission(std::string_view{method} == "heartbeat")) {
      if (undo) undo();
      return refuse(ctx, method, err);
    }
    auto& tn = t();
    tn.last_seen = Clock::now();
    ++tn.in_flight;
    ++tn.calls;
    tn.tokens += tokens;
    auto t0 = Clock::now();
    auto ctx_copy = ctx;
    return tn.barrier.addBranch()
        .then([this, method]() -> kj::Promise<kj::Own<FairLane::Turn>> {
          if (!uses_model(method)) return kj::heap<FairLane::Turn>(nullptr);  // no turn needed
          return s_.lane.enter(tenant_);
        })
        .then([this, t0, start = kj::mv(start)](kj::Own<FairLane::Turn> turn) mutable {
          t().queue_wait_us += std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - t0).count();
          return start().attach(kj::mv(turn));  // the turn ends with the call
        })
        .then(
            [this, ctx_copy, method, tokens, t0](Result<void> r) mutable {
              finish(ctx_copy, method, tokens, t0, r ? caf::error{} : r.error());
            },
            [this, ctx_copy, method, tokens, t0, undo](kj::Exception&& e) mutable {
              if (undo) undo();
              finish(ctx_copy, method, tokens, t0, detail::error_of(e, method));
            });
  }

  template <class Context>
  void finish(Context& ctx, const char* method, int64_t tokens, Clock::time_point t0, const caf::error& err) {
    auto& tn = t();
    --tn.in_flight;
    if (err) ++tn.errors;
    log_call(method, tokens, std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - t0), err);
    auto res = ctx.getResults();
    write_status(res.initStatus(), err);
    if (err) scrub_status(res.getStatus(), err);
  }

  template <class Fut>
  kj::Promise<Result<void>> finish_add(const std::string& name, Fut f) {
    return await_future(f).then([this, name](Result<void> r) {
      if (!r) t().adapters.erase(name);
      return r;
    });
  }

  ServerState& s_;
  std::string tenant_;
  std::string key_id_;
};

// -- the Tinker-compatible HTTP API's way in -------------------------------------

class TinkerHost final : public tinker::Host {
public:
  explicit TinkerHost(ServerState& s) : s_(s) {}
  Result<std::pair<std::string, std::string>> authenticate(const std::string& key) override {
    auto tenant = s_.keys->authenticate(key);
    if (!tenant) return tenant.error();
    return std::pair{*tenant, KeyStore::id_of(key)};
  }
  wire::Session::Client session(const std::string& tenant, const std::string& key_id) override {
    return kj::heap<SessionImpl>(s_, tenant, key_id);
  }
  const TenantStore& store() const override { return *s_.store; }

private:
  ServerState& s_;
};

// -- the gateway --------------------------------------------------------------

class GatewayImpl final : public wire::Gateway::Server {
public:
  /// `authenticated` is set when a key is accepted on this connection.
  GatewayImpl(ServerState& s, std::shared_ptr<bool> authenticated) : s_(s), authenticated_(std::move(authenticated)) {}

  kj::Promise<void> connect(ConnectContext ctx) override {
    auto p = ctx.getParams();
    auto res = ctx.getResults();
    res.setServerVersion(wire::PROTOCOL_VERSION);
    if (p.getProtocolVersion() != wire::PROTOCOL_VERSION) {
      write_status(res.initStatus(),
                   make_error(errc::failed_precondition,
                              "this server speaks glint protocol version " + std::to_string(wire::PROTOCOL_VERSION) +
                                  ", the client " + std::to_string(p.getProtocolVersion()) +
                                  ": use a glint build of the server's version"));
      return kj::READY_NOW;
    }
    std::string key{p.getApiKey().cStr(), p.getApiKey().size()};
    auto tenant = s_.keys->authenticate(key);
    if (!tenant) {
      s_.quiet_log.write("refused key", "serve: refused a connection: " + describe(tenant.error()), false);
      write_status(res.initStatus(), tenant.error());
      return kj::READY_NOW;
    }
    if (auto& tn = s_.tenant(*tenant); tn.sessions >= s_.config.limits.connections_per_tenant) {
      write_status(res.initStatus(),
                   make_error(errc::resource_exhausted,
                              "limit connections_per_tenant: " + std::to_string(tn.sessions) +
                                  " connections of yours are open, at most " +
                                  std::to_string(s_.config.limits.connections_per_tenant) + " are allowed; close one"));
      return kj::READY_NOW;
    }
    *authenticated_ = true;
    res.setSession(kj::heap<SessionImpl>(s_, *tenant, KeyStore::id_of(key)));
    res.setTenant(*tenant);
    auto base = res.initBase();
    base.setName(s_.base_name);
    base.setFingerprint(s_.fingerprint);
    base.setModelRanks(s_.model->info().size());
    base.setSamplerRanks(s_.sampler->info().size());
    base.setVocabSize(s_.vocab_size);
    auto l = res.initLimits();
    l.setMaxAdapters(s_.config.limits.adapters);
    l.setMaxRank(s_.config.limits.max_rank);
    l.setMaxTokensPerCall(s_.config.limits.tokens_per_call);
    l.setMaxCallsInFlight(s_.config.limits.calls_in_flight);
    l.setMaxMessageBytes(s_.config.max_message_bytes);
    l.setIdleSeconds(s_.config.limits.idle_seconds);
    write_status(res.initStatus(), caf::none);
    log::info("serve: tenant " + *tenant + " connected (" + std::string{p.getClient().cStr()}.substr(0, 256) + ")");
    return kj::READY_NOW;
  }

private:
  ServerState& s_;
  std::shared_ptr<bool> authenticated_;
};

// One accepted connection: its stream, its vat network and its RPC system.
struct Connection {
  kj::Own<kj::AsyncIoStream> stream;
  capnp::TwoPartyVatNetwork network;
  capnp::RpcSystem<capnp::rpc::twoparty::VatId> rpc;
  Connection(kj::Own<kj::AsyncIoStream> s, capnp::Capability::Client bootstrap, uint64_t max_bytes)
      : stream(kj::mv(s)),
        network(*stream, capnp::rpc::twoparty::Side::SERVER, detail::reader_options(max_bytes)),
        rpc(capnp::makeRpcServer(network, kj::mv(bootstrap))) {}
};

int64_t resident_bytes() {
  std::ifstream in{"/proc/self/statm"};
  int64_t pages = 0, resident = 0;
  in >> pages >> resident;
  return resident * static_cast<int64_t>(::sysconf(_SC_PAGESIZE));
}

// Prometheus' text format: per-tenant counters, server gauges.
std::string metrics_text(const ServerState& s) {
  std::ostringstream out;
  auto family = [&](const char* name, const char* type, const char* help, auto value) {
    out << "# HELP " << name << " " << help << "\n# TYPE " << name << " " << type << "\n";
    for (const auto& [tenant, t] : s.tenants) out << name << "{tenant=\"" << tenant << "\"} " << value(*t) << "\n";
  };
  family("glint_serve_calls_total", "counter", "Calls a tenant made.", [](const Tenant& t) { return t.calls; });
  family("glint_serve_errors_total", "counter", "Calls that failed.", [](const Tenant& t) { return t.errors; });
  family("glint_serve_tokens_total", "counter", "Tokens trained on and sampled (prompt + new).",
         [](const Tenant& t) { return t.tokens; });
  family("glint_serve_queue_wait_seconds_total", "counter",
         "Time calls waited before they started: for the tenant's earlier calls, and for their turn at the model group.",
         [](const Tenant& t) { return static_cast<double>(t.queue_wait_us) / 1e6; });
  family("glint_serve_calls_in_flight", "gauge", "Calls the server holds now.", [](const Tenant& t) { return t.in_flight; });
  family("glint_serve_sessions", "gauge", "Open connections.", [](const Tenant& t) { return t.sessions; });
  family("glint_serve_adapters", "gauge", "Adapters resident (model and sampler groups).",
         [](const Tenant& t) { return static_cast<int64_t>(t.adapters.size() + t.sampler_adapters.size()); });
  int64_t adapters = 0;
  for (const auto& [_, t] : s.tenants) adapters += static_cast<int64_t>(t->adapters.size() + t->sampler_adapters.size());
  out << "# HELP glint_serve_adapters_resident Adapters resident, all tenants.\n"
      << "# TYPE glint_serve_adapters_resident gauge\nglint_serve_adapters_resident " << adapters << "\n"
      << "# HELP glint_serve_adapter_memory_bytes What the adapters hold (weights, gradients, optimizer state), all ranks.\n"
      << "# TYPE glint_serve_adapter_memory_bytes gauge\nglint_serve_adapter_memory_bytes " << s.memory_used() << "\n"
      << "# HELP glint_serve_adapter_memory_budget_bytes The server's budget for them ([limits] memory_mib).\n"
      << "# TYPE glint_serve_adapter_memory_budget_bytes gauge\nglint_serve_adapter_memory_budget_bytes "
      << s.config.limits.memory_bytes << "\n"
      << "# HELP glint_serve_exclusive 1 while a tenant trains the full model (exclusive mode) or it is being restored.\n"
      << "# TYPE glint_serve_exclusive gauge\nglint_serve_exclusive " << (!s.full_holder.empty() || s.restoring ? 1 : 0)
      << "\n"
      << "# HELP glint_serve_resident_memory_bytes The server's resident memory.\n"
      << "# TYPE glint_serve_resident_memory_bytes gauge\nglint_serve_resident_memory_bytes " << resident_bytes()
      << "\n";
  return out.str();
}

// What one port may take: the metrics endpoint's connections (a scraper
// needs one or two), descriptors kept for files (checkpoints, RocksDB,
// logs) beyond every port's connections, and the bytes a Cap'n Proto peer
// may send before its key is checked (an authenticate call is well under 1
// KiB).
constexpr int64_t kMetricsConnections = 16;
constexpr int64_t kSpareDescriptors = 256;
constexpr uint64_t kPreAuthBytes = 64 << 10;

// Constant-time comparison of a presented secret with the expected one.
bool same_secret(std::string_view a, std::string_view b) {
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ (i < b.size() ? b[i] : 0));
  return diff == 0;
}

// A connection's view of an HTTP service: the connection counts as busy
// while one of its requests runs (the port sheds only idle ones).
class BusyMarking final : public kj::HttpService {
public:
  BusyMarking(kj::HttpService& inner, std::shared_ptr<detail::ConnectionState> state)
      : inner_(inner), state_(std::move(state)) {}
  kj::Promise<void> request(kj::HttpMethod method, kj::StringPtr url, const kj::HttpHeaders& headers,
                            kj::AsyncInputStream& body, Response& response) override {
    ++state_->busy;
    auto idle = kj::defer([state = state_] { --state->busy; });
    return kj::evalNow([&] { return inner_.request(method, url, headers, body, response); }).attach(kj::mv(idle));
  }

private:
  kj::HttpService& inner_;
  std::shared_ptr<detail::ConnectionState> state_;
};

class MetricsService final : public kj::HttpService {
public:
  MetricsService(const ServerState& s, const kj::HttpHeaderTable& table, kj::HttpHeaderId authorization,
                 const std::string& token)
      : s_(s), table_(table), authorization_(authorization), token_(token) {}
  kj::Promise<void> request(kj::HttpMethod method, kj::StringPtr url, const kj::HttpHeaders& in, kj::AsyncInputStream&,
                            Response& response) override {
    kj::HttpHeaders headers(table_);
    // With a token, every request presents it ("Authorization: Bearer
    // <token>", as Prometheus' authorization.credentials_file sends it);
    // without one the endpoint binds to loopback only (ServeConfig::validate).
    if (!token_.empty()) {
      std::string presented;
      KJ_IF_MAYBE(v, in.get(authorization_)) { presented = v->cStr(); }
      if (!same_secret(presented, "Bearer " + token_)) {
        headers.set(kj::HttpHeaderId::CONTENT_TYPE, "text/plain");
        headers.add("WWW-Authenticate", "Bearer");
        static constexpr std::string_view refusal = "the metrics endpoint needs Authorization: Bearer <token>\n";
        auto stream = response.send(401, "Unauthorized", headers, refusal.size());
        auto write = stream->write(refusal.data(), refusal.size());
        return write.attach(kj::mv(stream));
      }
    }
    if (method != kj::HttpMethod::GET || (url != "/metrics" && url != "/"))
      return response.sendError(404, "Not Found", headers);
    auto body = metrics_text(s_);
    headers.set(kj::HttpHeaderId::CONTENT_TYPE, "text/plain; version=0.0.4");
    auto stream = response.send(200, "OK", headers, body.size());
    auto text = kj::heapString(body.data(), body.size());
    auto write = stream->write(text.begin(), text.size());
    return write.attach(kj::mv(stream), kj::mv(text));
  }

private:
  const ServerState& s_;
  const kj::HttpHeaderTable& table_;
  kj::HttpHeaderId authorization_;
  const std::string& token_;
};

}  // namespace

void Server::Impl::run_io(std::promise<Result<void>>& ready) {
  bool reported = false;
  try {
    auto io = kj::setupAsyncIo();
    // The tenants' KJ objects (their barriers) go on this thread, after the
    // connections (declared below) and before the loop.
    auto clear_tenants = kj::defer([this] {
      lane.clear();
      tenants.clear();
    });
    executor = &kj::getCurrentThreadExecutor();
    kj::Own<kj::TlsContext> tls;
    if (config.tls()) {
      kj::TlsKeypair keypair{kj::TlsPrivateKey(read_text(config.tls_key)), kj::TlsCertificate(read_text(config.tls_cert))};
      kj::TlsContext::Options o;
      o.useSystemTrustStore = false;
      o.defaultKeypair = keypair;
      o.timer = io.provider->getTimer();
      o.acceptTimeout = 10 * kj::SECONDS;
      tls = kj::heap<kj::TlsContext>(kj::mv(o));
    }
    auto addr = io.provider->getNetwork().parseAddress(config.host, static_cast<unsigned>(config.port)).wait(io.waitScope);
    kj::Own<kj::ConnectionReceiver> listener = addr->listen();
    port = static_cast<int>(listener->getPort());

    auto& timer = io.provider->getTimer();
    // Descriptors for every connection the ports take, and room for files.
    const int64_t wanted = config.limits.connections + (config.tinker_port >= 0 ? config.tinker_connections : 0) +
                           (config.metrics_port >= 0 ? kMetricsConnections : 0) + kSpareDescriptors;
    if (auto have = detail::Listener::raise_descriptor_limit(wanted); have < wanted)
      log::warn("serve: the open-file limit is " + std::to_string(have) + ", below the " + std::to_string(wanted) +
                " the configured connections need ([limits] connections, [tinker] connections and " +
                std::to_string(kSpareDescriptors) +
                " for files): when descriptors run out the server closes idle connections to go on (raise `ulimit -n`)");

    // The Prometheus endpoint, on the same loop.
    kj::HttpHeaderTable::Builder metrics_headers;
    const auto authorization = metrics_headers.add("Authorization");
    auto header_table = metrics_headers.build();
    MetricsService metrics_service(*this, *header_table, authorization, metrics_token);
    kj::HttpServer http(timer, *header_table, metrics_service);
    kj::Own<detail::Listener> metrics_door;
    kj::Promise<void> metrics_loop = kj::READY_NOW;
    if (config.metrics_port >= 0) {
      auto maddr = io.provider->getNetwork()
                       .parseAddress(config.metrics_host, static_cast<unsigned>(config.metrics_port))
                       .wait(io.waitScope);
      auto metrics_listener = maddr->listen();
      metrics_port = static_cast<int>(metrics_listener->getPort());
      metrics_door = kj::heap<detail::Listener>(
          timer, kj::mv(metrics_listener),
          detail::Listener::Options{.name = "the metrics endpoint", .max_connections = kMetricsConnections},
          [&](kj::Own<kj::AsyncIoStream> s, std::shared_ptr<detail::ConnectionState>) { return http.listenHttp(kj::mv(s)); });
      metrics_loop = metrics_door->run().eagerlyEvaluate(nullptr);
      log::info(std::string{"serve: metrics on "} + config.metrics_host + ":" + std::to_string(metrics_port.load()) +
                (metrics_token.empty() ? " (no [metrics] token_file: loopback only)" : " (a bearer token is required)"));
    }
    // The Tinker-compatible HTTP API, on the same loop (and the same TLS).
    TinkerHost tinker_host(*this);
    kj::Own<tinker::Gateway> gateway;
    auto unhook = kj::defer([this] { tinker_gateway = nullptr; });  // before the gateway goes
    kj::Own<kj::HttpServer> tinker_http;
    std::map<kj::AsyncIoStream*, std::shared_ptr<detail::ConnectionState>> http_states;
    kj::Own<detail::Listener> tinker_door;
    kj::Promise<void> tinker_loop = kj::READY_NOW;
    if (config.tinker_port >= 0) {
      tinker::BaseModel base;
      base.name = config.tinker_base_model.empty() ? base_name : config.tinker_base_model;
      base.tokenizer_id = config.tinker_tokenizer_id.empty() ? base.name : config.tinker_tokenizer_id;
      base.arch = model_type;
      base.vocab_size = vocab_size;
      base.max_context = max_positions;
      // The OpenAI-compatible /v1 door encodes with the model's tokenizer and
      // renders chats with its own template.
      if (auto tok = components::Tokenizer::load(config.model_dir)) {
        base.tokenizer = std::make_shared<const components::Tokenizer>(std::move(*tok));
        if (auto chat = components::Template::make(base.tokenizer, {}))
          base.chat = std::make_shared<const components::Template>(std::move(*chat));
        else
          log::info("serve: /v1/chat/completions is off: " + describe(chat.error()));
      } else {
        log::warn("serve: the OpenAI-compatible /v1 door cannot encode: " + describe(tok.error()));
      }
      tinker::GatewayOptions options;
      options.max_body_bytes = config.max_message_bytes;
      options.max_samples_in_flight = config.tinker_samples_in_flight;
      options.poll = std::chrono::seconds(config.tinker_poll_seconds);
      options.tokens_per_call = config.limits.tokens_per_call;
      options.seq_gap = std::chrono::seconds(config.tinker_seq_gap_seconds);
      options.body_timeout = std::chrono::seconds(config.tinker_body_seconds);
      options.request_bytes = config.limits.request_bytes;
      gateway = kj::heap<tinker::Gateway>(tinker_host, base, options, timer);
      tinker_gateway = gateway.get();
      // Each connection's service marks it busy while a request runs, so
      // that running out of descriptors sheds idle connections only.
      tinker_http = kj::heap<kj::HttpServer>(
          timer, gateway->headers(),
          [&](kj::AsyncIoStream& s) -> kj::Own<kj::HttpService> {
            auto it = http_states.find(&s);
            return kj::heap<BusyMarking>(*gateway, it == http_states.end() ? std::make_shared<detail::ConnectionState>()
                                                                           : it->second);
          });
      auto taddr = io.provider->getNetwork()
                       .parseAddress(config.tinker_host, static_cast<unsigned>(config.tinker_port))
                       .wait(io.waitScope);
      auto tinker_listener = taddr->listen();
      tinker_port = static_cast<int>(tinker_listener->getPort());
      tinker_door = kj::heap<detail::Listener>(
          timer, kj::mv(tinker_listener),
          detail::Listener::Options{.name = "the Tinker API", .max_connections = config.tinker_connections, .tls = tls.get()},
          [&](kj::Own<kj::AsyncIoStream> s, std::shared_ptr<detail::ConnectionState> state) {
            auto* raw = s.get();
            http_states[raw] = std::move(state);
            return tinker_http->listenHttp(kj::mv(s)).attach(kj::defer([&http_states, raw] { http_states.erase(raw); }));
          });
      tinker_loop = tinker_door->run().eagerlyEvaluate(nullptr);
      log::info("serve: the Tinker-compatible API listens on " + config.tinker_host + ":" +
                std::to_string(tinker_port.load()) + " (base_model \"" + base.name + "\")");
    }
    auto paf = kj::newPromiseAndCrossThreadFulfiller<void>();
    {
      std::lock_guard<std::mutex> guard{stop_mx};
      stop = kj::mv(paf.fulfiller);
    }
    // The native port. Past [limits] connections a new one is closed at
    // once; one that has not authenticated within auth_seconds is closed,
    // and until it has it may send kPreAuthBytes at most.
    detail::Listener native_door(
        timer, kj::mv(listener),
        detail::Listener::Options{.name = "the native API", .max_connections = config.limits.connections, .tls = tls.get()},
        [&](kj::Own<kj::AsyncIoStream> stream, std::shared_ptr<detail::ConnectionState> state) -> kj::Promise<void> {
          auto authenticated = std::make_shared<bool>(false);
          state->kept = [authenticated] { return *authenticated; };
          auto guarded = kj::heap<detail::PreAuthLimit>(kj::mv(stream), authenticated, kPreAuthBytes);
          auto c = kj::heap<Connection>(kj::mv(guarded), kj::heap<GatewayImpl>(*this, authenticated),
                                        static_cast<uint64_t>(config.max_message_bytes));
          auto done = c->network.onDisconnect();
          auto unauthenticated =
              timer.afterDelay(static_cast<uint64_t>(config.limits.auth_seconds) * kj::SECONDS)
                  .then([this, authenticated]() -> kj::Promise<void> {
                    if (*authenticated) return kj::NEVER_DONE;
                    quiet_log.write("unauthenticated", "serve: closed a connection that did not authenticate in time",
                                    false);
                    return kj::READY_NOW;
                  });
          return done.exclusiveJoin(kj::mv(unauthenticated)).attach(kj::mv(c));
        });
    // Idle tenants are looked for at a quarter of the idle time (at most
    // every 5 s).
    const auto sweep_ms = std::clamp<int64_t>(config.limits.idle_seconds * 250, 100, 5000);
    std::function<kj::Promise<void>()> sweep = [&]() -> kj::Promise<void> {
      return io.provider->getTimer().afterDelay(static_cast<uint64_t>(sweep_ms) * kj::MILLISECONDS).then([&]() {
        reclaim_idle();
        remove_expired();
        if (gateway) gateway->sweep();
        return sweep();
      });
    };
    auto sweeping = sweep().eagerlyEvaluate([](kj::Exception&& e) {
      log::warn(std::string{"serve: the idle sweep stopped: "} + e.getDescription().cStr());
    });
    ready.set_value(Result<void>{});
    reported = true;
    // Serve until shutdown; then stop accepting, and give the calls in
    // flight the grace period before the connections close.
    paf.promise.exclusiveJoin(native_door.run()).wait(io.waitScope);
    shutting_down = true;
    auto all_idle = [&] {
      for (auto& [_, t] : tenants)
        if (t->in_flight > 0) return false;
      return true;
    };
    auto deadline = Clock::now() + grace;
    while (!all_idle() && Clock::now() < deadline) io.provider->getTimer().afterDelay(20 * kj::MILLISECONDS).wait(io.waitScope);
    autosave();
    {
      std::lock_guard<std::mutex> guard{stop_mx};
      executor = nullptr;
    }
  } catch (const kj::Exception& e) {
    auto err = make_error(errc::unavailable, std::string{"the server cannot listen on "} + config.host + ":" +
                                                 std::to_string(config.port) + ": " + e.getDescription().cStr());
    if (!reported) ready.set_value(err);
    else log::info("serve: the I/O loop failed: " + describe(err));
  }
}

Server::Server(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Server::~Server() { shutdown(); }

int Server::port() const { return impl_->port.load(); }
int Server::metrics_port() const { return impl_->metrics_port.load(); }
int Server::tinker_port() const { return impl_->tinker_port.load(); }
const actors::ModelGroup& Server::model_group() const { return *impl_->model; }
const actors::SamplerGroup& Server::sampler_group() const { return *impl_->sampler; }
const std::string& Server::fingerprint() const { return impl_->fingerprint; }

void Server::shutdown(std::chrono::milliseconds grace) {
  {
    std::lock_guard<std::mutex> guard{impl_->stop_mx};
    if (impl_->stopped) return;
    impl_->stopped = true;
    impl_->grace = grace;
    if (impl_->stop) impl_->stop->fulfill();
  }
  if (impl_->io.joinable()) impl_->io.join();
  impl_->join_workers();  // a sync still running ends within its own timeouts
}

Result<std::unique_ptr<Server>> Server::start(Runtime& rt, ServeConfig config) {
  if (auto ok = config.validate(); !ok) return ok.error();
  auto impl = std::make_unique<Impl>();
  impl->rt = &rt;
  impl->config = config;
  auto fp = model_fingerprint(config.model_dir);
  if (!fp) return with_context(fp.error(), "fingerprinting the base model");
  impl->fingerprint = *fp;
  impl->base_name = fs::path{config.model_dir}.lexically_normal().filename().string();
  if (impl->base_name.empty()) impl->base_name = fs::path{config.model_dir}.parent_path().filename().string();
  auto cfg = nlohmann::json::parse(read_text(config.model_dir + "/config.json"), nullptr, false);
  if (!cfg.is_object() || !cfg.contains("vocab_size") || !cfg["vocab_size"].is_number_integer())
    return make_error(errc::invalid_argument, config.model_dir + "/config.json has no integer vocab_size");
  impl->vocab_size = cfg["vocab_size"].get<int64_t>();
  if (cfg.contains("model_type") && cfg["model_type"].is_string()) impl->model_type = cfg["model_type"].get<std::string>();
  auto base_config = components::ModelConfig::load(config.model_dir + "/config.json");
  if (!base_config) return with_context(base_config.error(), "reading the base model's config.json");
  impl->base_config = *base_config;
  impl->max_positions = cfg.contains("max_position_embeddings") && cfg["max_position_embeddings"].is_number_integer()
                            ? cfg["max_position_embeddings"].get<int64_t>()
                            : int64_t{1} << 20;
  auto keys = KeyStore::open_reader(config.state_dir);
  if (!keys) return keys.error();
  impl->keys = std::move(*keys);
  auto store = TenantStore::open(config.state_dir);
  if (!store) return store.error();
  impl->store = std::move(*store);
  if (!config.metrics_token_file.empty()) {
    auto token = read_text_file(config.metrics_token_file);
    if (!token) return with_context(token.error(), "reading [metrics] token_file");
    while (!token->empty() && std::isspace(static_cast<unsigned char>(token->back()))) token->pop_back();
    if (token->size() < 16)
      return make_error(errc::invalid_argument, "[metrics] token_file " + config.metrics_token_file +
                                                    " holds " + std::to_string(token->size()) +
                                                    " characters: a token needs at least 16 (e.g. `openssl rand -hex 32`)");
    impl->metrics_token = std::move(*token);
  }
  std::error_code ec;
  fs::remove_all(fs::path{config.state_dir} / "tmp", ec);  // uploads a killed server left behind

  if (auto svc = placement::service(rt, {.strategy = placement::Strategy::spread}); !svc)
    return with_context(svc.error(), "placement");
  auto model_mesh = placement::DeviceMesh::from_sizes({.dp = config.model_ranks});
  if (!model_mesh) return model_mesh.error();
  auto model = actors::open_model_group(rt, placement::DeviceGroup::of("model", config.model_ranks), *model_mesh,
                                        {.model_dir = config.model_dir});
  if (!model) return with_context(model.error(), "loading the base model into the model group");
  impl->model = *model;
  auto sampler_mesh = placement::DeviceMesh::from_sizes({.dp = config.sampler_ranks});
  if (!sampler_mesh) return sampler_mesh.error();
  auto sampler = actors::open_sampler_group(
      rt, placement::DeviceGroup::of("sampler", config.sampler_ranks), *sampler_mesh,
      {.model_dir = config.model_dir, .sampling_seed = config.sampling_seed, .cache_bytes = config.sampler_cache_bytes});
  if (!sampler) return with_context(sampler.error(), "loading the base model into the sampler group");
  impl->sampler = *sampler;

  std::promise<Result<void>> ready;
  auto started = ready.get_future();
  auto* raw = impl.get();
  impl->io = std::thread([raw, &ready] { raw->run_io(ready); });
  auto ok = started.get();
  if (!ok) {
    impl->io.join();
    return ok.error();
  }
  return std::unique_ptr<Server>(new Server(std::move(impl)));
}

}  // namespace glint::rpc
