#include "rpc/client.hpp"

#include "actors/remote.hpp"
#include "rpc/convert.hpp"
#include "rpc/detail/kj_bridge.hpp"
#include "rpc/fingerprint.hpp"
#include "runtime/file.hpp"

#include <capnp/rpc-twoparty.h>
#include <kj/async-io.h>
#include <kj/compat/tls.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <future>
#include <map>
#include <optional>
#include <thread>
#include <unistd.h>

namespace glint::rpc {

namespace fs = std::filesystem;

namespace {

using actors::ModelGroup;
using actors::SamplerGroup;

/// The client's own receive limit: answers (exported weights, sequences)
/// may be big; the server bounds what it sends.
constexpr uint64_t kClientMaxMessageBytes = uint64_t{4} << 30;

struct Endpoint {
  bool tls = false;
  std::string host;
  unsigned port = 0;
};

Result<Endpoint> parse_endpoint(const std::string& url) {
  Endpoint e;
  std::string rest = url;
  for (const char* scheme : {"tcp://", "glint://"})
    if (rest.starts_with(scheme)) rest = rest.substr(std::strlen(scheme));
  if (rest.starts_with("tls://")) {
    e.tls = true;
    rest = rest.substr(6);
  }
  auto colon = rest.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == rest.size())
    return make_error(errc::invalid_argument,
                      "the server address '" + url + "' is not host:port or tls://host:port (GLINT_REMOTE_URL)");
  e.host = rest.substr(0, colon);
  if (e.host.size() > 2 && e.host.front() == '[' && e.host.back() == ']') e.host = e.host.substr(1, e.host.size() - 2);
  try {
    size_t used = 0;
    auto p = std::stoul(rest.substr(colon + 1), &used);
    if (used != rest.size() - colon - 1 || p == 0 || p > 65535) throw std::out_of_range("port");
    e.port = static_cast<unsigned>(p);
  } catch (const std::exception&) {
    return make_error(errc::invalid_argument, "the server address '" + url + "' has no valid port");
  }
  return e;
}

template <class Response>
caf::error status_of(Response& r) {
  return read_status(r.getStatus());
}

class RemoteSamplerBackend;

// -- the connection -------------------------------------------------------------

class Connection final : public actors::RemoteGroups, public std::enable_shared_from_this<Connection> {
public:
  struct Base {
    std::string name, fingerprint, tenant;
    int model_ranks = 1, sampler_ranks = 1;
    int64_t vocab_size = 0;
    /// The largest message the server reads ([limits] message_mib): a
    /// bigger one would end the connection, so the client refuses it.
    uint64_t max_message_bytes = uint64_t{256} << 20;
  };

  ~Connection() noexcept override {
    request_stop();
    if (io_.joinable()) io_.join();  // never this thread: see Release
  }

  /// How the last handle lets go of a connection. On any thread but the
  /// I/O thread: the connection stops, its thread is joined, it is freed.
  /// On the I/O thread itself (a future's continuation held the last
  /// handle, and the answer ran it there): that thread is still inside its
  /// loop, which reads the connection's members after the continuation
  /// returns, so it is only told to stop, and frees the connection as the
  /// last thing it does.
  struct Release {
    void operator()(Connection* c) const {
      if (c->io_.joinable() && c->io_.get_id() == std::this_thread::get_id()) {
        c->free_on_exit_ = true;
        c->request_stop();
        return;
      }
      delete c;
    }
  };

  static Result<std::shared_ptr<Connection>> open(const Options& opts) {
    auto ep = parse_endpoint(opts.remote_endpoint);
    if (!ep) return ep.error();
    if (opts.remote_api_key.empty())
      return make_error(errc::invalid_argument,
                        "remote mode needs an API key: set GLINT_API_KEY (the server's operator makes one with "
                        "`glint serve keys create --tenant NAME`) or Options::remote_api_key");
    auto c = std::shared_ptr<Connection>(new Connection(), Release{});
    c->endpoint_ = *ep;
    c->url_ = opts.remote_endpoint;
    std::promise<Result<void>> ready;
    auto started = ready.get_future();
    c->io_ = std::thread([raw = c.get(), &ready, opts] {
      raw->run_io(opts, ready);
      if (raw->free_on_exit_) {  // set by Release, on this thread
        raw->io_.detach();
        delete raw;
      }
    });
    auto ok = started.get();
    if (!ok) {
      c->io_.join();
      return ok.error();
    }
    return c;
  }

  /// Runs `start(session)` on the I/O thread (it builds and sends a request
  /// and returns a promise of the answer); the future gets its value, or
  /// `unavailable` when the connection is gone.
  template <class T, class Start>
  Future<T> call(Start start) {
    auto state = std::make_shared<glint::detail::FutureState<T>>();
    Future<T> out{state};
    bool posted = false;
    // KJ 0.9's executeSync never returns once the target loop has exited
    // (the event it refuses stays UNUSED and its destructor waits for DONE;
    // fixed upstream after 0.9.2). So the loop stays alive while a call is
    // inside: a call enters only while the connection is open, and the I/O
    // thread, once it closes, runs its loop until the calls inside have left.
    {
      std::lock_guard<std::mutex> guard{gate_mx_};
      if (closed_) {
        state->set(make_error(errc::unavailable, "the connection to the server " + url_ + " is closed"));
        return out;
      }
      ++inside_;
    }
    struct Leave {
      Connection& c;
      ~Leave() {
        std::lock_guard<std::mutex> guard{c.gate_mx_};
        --c.inside_;
      }
    } leave{*this};
    try {
      executor_->executeSync([&] {
        if (!session_) return;
        auto id = next_call_++;
        pending_[id] = [state](caf::error e) { state->set(std::move(e)); };
        tasks_->add(start(*session_).then(
            [this, id, state](Result<T> r) {
              pending_.erase(id);
              state->set(std::move(r));
            },
            [this, id, state](kj::Exception&& e) {
              pending_.erase(id);
              state->set(detail::error_of(e, "the call to the server failed"));
            }));
        posted = true;
      });
    } catch (const kj::Exception&) {
      // The I/O loop has ended: the connection is closed.
    }
    if (!posted)
      state->set(make_error(errc::unavailable, "the connection to the server " + url_ + " is closed"));
    return out;
  }

  const Base& base() const { return base_; }
  const std::string& url() const { return url_; }

  Result<ModelGroup> open_model(const actors::ModelSpec& spec) override;
  Result<SamplerGroup> open_sampler(const actors::SamplerSpec& spec) override;

private:
  Connection() = default;
  Result<void> check_base(const std::string& model_dir, const std::string& config_json, const char* what);
  void run_io(const Options& opts, std::promise<Result<void>>& ready);

  Endpoint endpoint_;
  std::string url_;
  Base base_;
  std::thread io_;
  bool free_on_exit_ = false;  ///< I/O thread only: the last handle went there (Release)
  void request_stop() {
    std::lock_guard<std::mutex> guard{stop_mx_};
    if (stop_) stop_->fulfill();
    stop_ = nullptr;
  }
  kj::Own<const kj::Executor> executor_;
  std::mutex stop_mx_;
  kj::Own<kj::CrossThreadPromiseFulfiller<void>> stop_;
  /// Whether calls may still enter the I/O loop, and how many are inside it.
  std::mutex gate_mx_;
  bool closed_ = false;
  int inside_ = 0;
  /// Ends the connection on the I/O thread, its loop still alive: no call
  /// enters any more, the calls inside leave, and those sent and not
  /// answered fail.
  void close(kj::WaitScope& ws);
  // I/O thread only:
  /// Fingerprints of local model directories already checked (a driver
  /// opens the model and the sampler of one directory: hashed once).
  std::mutex fingerprints_mx_;
  std::map<std::string, std::string> fingerprints_;
  std::optional<wire::Session::Client> session_;
  kj::TaskSet* tasks_ = nullptr;
  uint64_t next_call_ = 0;
  /// Calls sent and not answered, failed with `unavailable` if the
  /// connection ends first.
  std::map<uint64_t, std::function<void(caf::error)>> pending_;
  void fail_pending() {
    auto pending = std::move(pending_);
    pending_.clear();
    // A call's continuation may release the last handle on this connection:
    // nothing of `this` is read once the first one runs.
    const auto why = make_error(errc::unavailable, "the connection to the server " + url_ + " was lost before it answered");
    for (auto& [_, fail] : pending) fail(why);
  }
};

void Connection::run_io(const Options& opts, std::promise<Result<void>>& ready) {
  bool reported = false;
  auto report = [&](Result<void> r) {
    if (!reported) ready.set_value(std::move(r));
    reported = true;
  };
  try {
    auto io = kj::setupAsyncIo();
    executor_ = kj::getCurrentThreadExecutor().addRef();
    // Runs last in this scope (after the connection's objects, before the loop goes).
    KJ_DEFER(close(io.waitScope));
    auto addr = io.provider->getNetwork().parseAddress(endpoint_.host, endpoint_.port).wait(io.waitScope);
    kj::Own<kj::AsyncIoStream> stream;
    kj::Own<kj::TlsContext> tls;
    std::optional<kj::TlsCertificate> ca;
    auto connected = addr->connect().exclusiveJoin(
        io.provider->getTimer().afterDelay(static_cast<uint64_t>(opts.connect_timeout.count()) * kj::MILLISECONDS).then([&]()
            -> kj::Own<kj::AsyncIoStream> {
          KJ_FAIL_REQUIRE("no answer within the connect timeout");
        }));
    stream = connected.wait(io.waitScope);
    if (endpoint_.tls) {
      kj::TlsContext::Options o;
      if (!opts.remote_ca_file.empty()) {
        auto pem = read_text_file(opts.remote_ca_file);
        if (!pem || pem->empty()) {
          report(make_error(errc::not_found, "cannot read the CA file " + opts.remote_ca_file + " (GLINT_REMOTE_CA)"));
          return;
        }
        ca.emplace(*pem);
        o.useSystemTrustStore = false;
        o.trustedCertificates = kj::arrayPtr(&*ca, 1);
      }
      tls = kj::heap<kj::TlsContext>(kj::mv(o));
      stream = tls->wrapClient(kj::mv(stream), endpoint_.host).wait(io.waitScope);
    }
    capnp::TwoPartyVatNetwork network(*stream, capnp::rpc::twoparty::Side::CLIENT,
                                      detail::reader_options(kClientMaxMessageBytes));
    auto rpc = capnp::makeRpcClient(network);
    KJ_DEFER(session_.reset());  // the session's capability goes before the RPC system
    capnp::MallocMessageBuilder vat;
    auto vat_id = vat.initRoot<capnp::rpc::twoparty::VatId>();
    vat_id.setSide(capnp::rpc::twoparty::Side::SERVER);
    auto gateway = rpc.bootstrap(vat_id).castAs<wire::Gateway>();
    auto req = gateway.connectRequest();
    req.setProtocolVersion(wire::PROTOCOL_VERSION);
    req.setApiKey(as_text(opts.remote_api_key));
    char host[256] = {};
    ::gethostname(host, sizeof host - 1);
    req.setClient(as_text("glint driver pid " + std::to_string(::getpid()) + " on " + host));
    auto answer = req.send().wait(io.waitScope);
    if (auto err = status_of(answer)) {
      report(with_context(err, "the server at " + url_ + " refused the connection"));
      return;
    }
    session_ = answer.getSession();
    base_.name = answer.getBase().getName().cStr();
    base_.fingerprint = answer.getBase().getFingerprint().cStr();
    base_.model_ranks = std::max(1, answer.getBase().getModelRanks());
    base_.sampler_ranks = std::max(1, answer.getBase().getSamplerRanks());
    base_.vocab_size = answer.getBase().getVocabSize();
    base_.tenant = answer.getTenant().cStr();
    if (answer.getLimits().getMaxMessageBytes() > 0)
      base_.max_message_bytes = static_cast<uint64_t>(answer.getLimits().getMaxMessageBytes());
    // A heartbeat at a third of the server's idle limit (at most every 10 s)
    // keeps the tenant's adapters resident while the driver is busy elsewhere.
    const int64_t beat_ms = std::clamp<int64_t>(answer.getLimits().getIdleSeconds() * 1000 / 3, 100, 10000);

    struct Ignore final : kj::TaskSet::ErrorHandler {
      void taskFailed(kj::Exception&&) override {}  // each task answers its own future
    } ignore;
    kj::TaskSet tasks{ignore};
    tasks_ = &tasks;
    KJ_DEFER(tasks_ = nullptr);
    auto paf = kj::newPromiseAndCrossThreadFulfiller<void>();
    {
      std::lock_guard<std::mutex> guard{stop_mx_};
      stop_ = kj::mv(paf.fulfiller);
    }
    // However the loop below ends (a stop, a lost connection, an error), the
    // fulfiller goes here, on this thread: a request_stop after that finds
    // none. Fulfilling one whose promise this thread has already dropped
    // would have the other thread free KJ's shared state with no ordering
    // against this thread's last read of it (KJ 0.9.2 cancels with an
    // acquire-only exchange; TSan's report, RemoteCheckpoints).
    KJ_DEFER({
      std::lock_guard<std::mutex> guard{stop_mx_};
      stop_ = nullptr;
    });
    std::function<kj::Promise<void>()> beat = [&]() -> kj::Promise<void> {
      return io.provider->getTimer().afterDelay(static_cast<uint64_t>(beat_ms) * kj::MILLISECONDS).then([&]() {
        return session_->heartbeatRequest().send().ignoreResult().then([&]() { return beat(); });
      });
    };
    report(Result<void>{});
    // Until the connection is dropped (the runtime shuts down) or lost.
    paf.promise.exclusiveJoin(network.onDisconnect()).exclusiveJoin(beat().catch_([](kj::Exception&&) -> kj::Promise<void> {
      return kj::NEVER_DONE;
    })).wait(io.waitScope);
  } catch (const kj::Exception& e) {
    report(make_error(errc::unavailable, "cannot reach the glint server at " + url_ + ": " +
                                             std::string{e.getDescription().cStr()} +
                                             " (is `glint serve` running there?)"));
  }
}

void Connection::close(kj::WaitScope& ws) {
  {
    std::lock_guard<std::mutex> guard{gate_mx_};
    closed_ = true;
  }
  // session_ is already reset (before the RPC system went): a queued call finds none and posts nothing.
  for (;;) {
    {
      std::lock_guard<std::mutex> guard{gate_mx_};
      if (inside_ == 0) break;
    }
    try {
      ws.poll();  // runs the calls' queued events
    } catch (const kj::Exception&) {
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  fail_pending();
}

Result<void> Connection::check_base(const std::string& model_dir, const std::string& config_json,
                                    const char* what) {
  if (!config_json.empty())
    return make_error(errc::invalid_argument, std::string{what} +
                                                  ": a spec with config_json (random weights) cannot attach to a "
                                                  "server; remote mode trains on the server's base model");
  if (model_dir.empty() || model_dir == base_.name) return {};
  if (fs::is_directory(model_dir)) {
    const auto key = fs::weakly_canonical(model_dir).string();
    std::lock_guard<std::mutex> guard{fingerprints_mx_};
    auto known = fingerprints_.find(key);
    if (known == fingerprints_.end()) {
      auto fp = model_fingerprint(model_dir);
      if (!fp) return with_context(fp.error(), what);
      known = fingerprints_.emplace(key, *fp).first;
    }
    if (known->second != base_.fingerprint)
      return make_error(errc::failed_precondition,
                        std::string{what} + ": the model in " + model_dir + " is not the server's base model '" +
                            base_.name + "' (their fingerprints differ); point the driver at the server's model, or "
                            "leave model_dir empty to use whatever the server hosts");
    return {};
  }
  return make_error(errc::not_found, std::string{what} + ": '" + model_dir +
                                         "' is neither a local model directory nor the server's base model '" +
                                         base_.name + "'");
}

GroupInfo remote_info(const std::string& group, int ranks, const std::string& url) {
  GroupInfo info;
  info.name = group;
  for (int r = 0; r < ranks; ++r) {
    info.ranks.push_back(RankContext{.group = group, .rank = r, .world_size = ranks, .dp_rank = r, .dp_size = ranks});
    info.labels.push_back("rank " + std::to_string(r) + " of the server's group '" + group + "' at " + url);
  }
  return info;
}

template <class T>
Future<T> refused(errc code, std::string what) {
  return Future<T>::ready_with(make_error(code, std::move(what)));
}

/// Why `req` may not be sent: it is larger than the server reads (which
/// would end the whole connection); or none.
template <class Request>
caf::error too_big(Request& req, uint64_t limit, const char* what) {
  const uint64_t bytes = req.totalSize().wordCount * 8;
  if (bytes <= limit) return caf::none;
  auto mib = [](uint64_t b) { return std::to_string((b + (1 << 20) - 1) >> 20); };
  return make_error(errc::invalid_argument, std::string{what} + ": the call's message is " + mib(bytes) +
                                                " MiB, above the " + mib(limit) +
                                                " MiB the server reads (its [limits] message_mib): split it into "
                                                "smaller calls");
}

/// Sends `req` unless it is too big for the server, answering the call's
/// outcome as `read` makes it of the answer.
template <class T, class Request, class Read>
kj::Promise<Result<T>> send_checked(Request& req, uint64_t limit, const char* what, Read read) {
  if (auto err = too_big(req, limit, what)) return Result<T>{err};
  return req.send().then([read = kj::mv(read)](auto&& r) mutable -> Result<T> {
    if (auto err = status_of(r)) return err;
    return read(r);
  });
}

template <class Request>
kj::Promise<Result<void>> send_status(Request&& req) {
  return req.send().then([](auto&& r) -> Result<void> {
    if (auto err = status_of(r)) return err;
    return {};
  });
}

// -- the model group ---------------------------------------------------------

class RemoteModelBackend final : public actors::ModelBackend, public actors::RemoteWeightSync {
public:
  explicit RemoteModelBackend(std::shared_ptr<Connection> c)
      : c_(std::move(c)), info_(remote_info("model", c_->base().model_ranks, c_->url())) {}

  const GroupInfo& info() const override { return info_; }

  Future<Metrics> forward_backward(const Batch& batch, const std::string& adapter) override {
    return c_->call<Metrics>([batch, adapter, limit = limit()](wire::Session::Client& s) {
      auto req = s.forwardBackwardRequest();
      req.setAdapter(as_text(adapter));
      auto keep = std::make_shared<KeepAlive>();
      write_batch(req.initBatch(), batch, keep.get());
      return send_checked<Metrics>(req, limit, "forward_backward",
                                   [keep](auto& r) -> Result<Metrics> { return read_metrics(r.getMetrics()); });
    });
  }
  Future<actors::TrainOutput> forward_backward_with_logps(const Batch& batch, const std::string& adapter) override {
    return c_->call<actors::TrainOutput>([batch, adapter, limit = limit()](wire::Session::Client& s) {
      auto req = s.forwardBackwardRequest();
      req.setAdapter(as_text(adapter));
      req.setWithLogps(true);
      auto keep = std::make_shared<KeepAlive>();
      write_batch(req.initBatch(), batch, keep.get());
      return send_checked<actors::TrainOutput>(
          req, limit, "forward_backward", [keep](auto& r) -> Result<actors::TrainOutput> {
            auto m = read_metrics(r.getMetrics());
            if (!m) return m.error();
            auto lp = read_tensor(r.getLogps(), "forward_backward's log-probs");
            if (!lp) return lp.error();
            return actors::TrainOutput{std::move(*m), std::move(*lp)};
          });
    });
  }
  Future<Tensor> forward_only(const Batch& batch, const std::string& adapter) override {
    return c_->call<Tensor>([batch, adapter, limit = limit()](wire::Session::Client& s) {
      auto req = s.forwardOnlyRequest();
      req.setAdapter(as_text(adapter));
      auto keep = std::make_shared<KeepAlive>();
      write_batch(req.initBatch(), batch, keep.get());
      return send_checked<Tensor>(req, limit, "forward_only", [keep](auto& r) -> Result<Tensor> {
        return read_tensor(r.getLogps(), "forward_only's answer");
      });
    });
  }
  Future<Metrics> clip_grad_and_step(const std::string& adapter) override {
    return c_->call<Metrics>([adapter](wire::Session::Client& s) {
      auto req = s.clipGradAndStepRequest();
      req.setAdapter(as_text(adapter));
      return req.send().then([](auto&& r) -> Result<Metrics> {
        if (auto err = status_of(r)) return err;
        return read_metrics(r.getMetrics());
      });
    });
  }
  Future<void> set_loss(const std::string& adapter, const LossSpec& loss) override {
    return c_->call<void>([adapter, loss](wire::Session::Client& s) {
      auto req = s.setLossRequest();
      req.setAdapter(as_text(adapter));
      write_loss(req.initLoss(), loss);
      return send_status(req);
    });
  }
  Future<void> set_optimizer(const std::string& adapter, const OptimizerConfig& o) override {
    return c_->call<void>([adapter, o](wire::Session::Client& s) {
      auto req = s.setOptimizerRequest();
      req.setAdapter(as_text(adapter));
      write_optimizer(req.initOptimizer(), o);
      return send_status(req);
    });
  }
  Future<void> set_lr_scheduler(const std::string& adapter, const SchedulerConfig& sc) override {
    return c_->call<void>([adapter, sc](wire::Session::Client& s) {
      auto req = s.setLrSchedulerRequest();
      req.setAdapter(as_text(adapter));
      write_scheduler(req.initScheduler(), sc);
      return send_status(req);
    });
  }
  Future<void> add_adapter(const std::string& name, const LoraConfig& lora, uint64_t seed) override {
    return c_->call<void>([name, lora, seed](wire::Session::Client& s) {
      auto req = s.addAdapterRequest();
      req.setName(as_text(name));
      write_lora(req.initLora(), lora);
      req.setSeed(seed);
      return send_status(req);
    });
  }
  Future<void> remove_adapter(const std::string& name) override {
    return c_->call<void>([name](wire::Session::Client& s) {
      auto req = s.removeAdapterRequest();
      req.setName(as_text(name));
      return send_status(req);
    });
  }
  Future<void> load_adapter(const std::string& name, const std::string& dir) override {
    return upload(name, dir, /*with_optimizer=*/false, /*create=*/true);
  }
  Future<Metrics> calculate_metric(const std::string& adapter) override {
    return c_->call<Metrics>([adapter](wire::Session::Client& s) {
      auto req = s.calculateMetricRequest();
      req.setAdapter(as_text(adapter));
      return req.send().then([](auto&& r) -> Result<Metrics> {
        if (auto err = status_of(r)) return err;
        return read_metrics(r.getMetrics());
      });
    });
  }
  Future<std::string> train_configs(const std::string& adapter) override {
    return c_->call<std::string>([adapter](wire::Session::Client& s) {
      auto req = s.trainConfigsRequest();
      req.setAdapter(as_text(adapter));
      return req.send().then([](auto&& r) -> Result<std::string> {
        if (auto err = status_of(r)) return err;
        return std::string{r.getJson().cStr()};
      });
    });
  }
  Future<std::string> save(const std::string& adapter, const actors::SaveRequest& request) override {
    // adapter empty: the full model, which a server in exclusive mode lets
    // one tenant train (else it refuses, saying why).
    // The server answers the files; they are written here, where the driver asked.
    return c_->call<std::string>([adapter, request](wire::Session::Client& s) {
      auto req = s.saveAdapterRequest();
      req.setAdapter(as_text(adapter));
      req.setWithOptimizer(request.with_optimizer);
      return req.send().then([dir = request.dir](auto&& r) -> Result<std::string> {
        if (auto err = status_of(r)) return err;
        auto files = read_files(r.getFiles());
        if (!files) return with_context(files.error(), "the server's answer to save");
        if (auto ok = write_dir_files(dir, *files); !ok) return ok.error();
        return dir;
      });
    });
  }
  Future<void> load(const std::string& adapter, const actors::LoadRequest& request) override {
    return upload(adapter, request.dir, request.with_optimizer, /*create=*/false);
  }
  Future<NamedTensors> export_weights(const std::string& adapter) override {
    return c_->call<NamedTensors>([adapter](wire::Session::Client& s) {
      auto req = s.exportWeightsRequest();
      req.setAdapter(as_text(adapter));
      return req.send().then([](auto&& r) -> Result<NamedTensors> {
        if (auto err = status_of(r)) return err;
        return read_named(r.getTensors(), "export_weights' answer");
      });
    });
  }

  Result<actors::SyncReport> sync_to(actors::SamplerBackend& sampler, const std::string& adapter,
                                     const std::string& target, const actors::SyncOptions& o) override;

  Connection& connection() const { return *c_; }

private:
  Future<void> upload(const std::string& name, const std::string& dir, bool with_optimizer, bool create) {
    auto files = read_dir_files(dir);
    if (!files) return Future<void>::ready_with(files.error());
    return c_->call<void>([name, files = std::move(*files), with_optimizer, create,
                           limit = limit()](wire::Session::Client& s) {
      auto req = s.loadAdapterRequest();
      req.setAdapter(as_text(name));
      write_files(req.initFiles(static_cast<unsigned>(files.size())), files);
      req.setWithOptimizer(with_optimizer);
      req.setCreate(create);
      return send_checked<void>(req, limit, "load", [](auto&) -> Result<void> { return {}; });
    });
  }

  uint64_t limit() const { return c_->base().max_message_bytes; }

  std::shared_ptr<Connection> c_;
  GroupInfo info_;
};

// -- the sampler group ---------------------------------------------------------

class RemoteSamplerBackend final : public actors::SamplerBackend {
public:
  explicit RemoteSamplerBackend(std::shared_ptr<Connection> c)
      : c_(std::move(c)), info_(remote_info("sampler", c_->base().sampler_ranks, c_->url())) {}

  const GroupInfo& info() const override { return info_; }

  Future<std::vector<SampledSequence>> sample(const std::vector<SampleRequest>& requests, const SamplingParams& params,
                                              const std::string& adapter) override {
    return c_->call<std::vector<SampledSequence>>([requests, params, adapter,
                                                   limit = c_->base().max_message_bytes](wire::Session::Client& s) {
      auto req = s.sampleRequest();
      req.setAdapter(as_text(adapter));
      write_requests(req.initRequests(static_cast<unsigned>(requests.size())), requests);
      write_sampling(req.initParams(), params);
      return send_checked<std::vector<SampledSequence>>(
          req, limit, "sample", [](auto& r) -> Result<std::vector<SampledSequence>> { return read_sequences(r.getSequences()); });
    });
  }
  Result<std::vector<SampledSequence>> sample_streaming(const std::vector<SampleRequest>&, const SamplingParams&,
                                                        const std::string&,
                                                        std::function<void(const actors::SampleChunk&)>) override {
    return make_error(errc::unimplemented,
                      "sample_streaming in remote mode: the protocol does not stream chunks yet; use sample");
  }
  Future<void> update_weights(const NamedTensors&, const std::string&, int64_t, components::UpdatePolicy) override {
    return refused<void>(errc::unimplemented,
                         "update_weights from the driver in remote mode: sync a trained adapter with the weight-sync "
                         "engine (CheckpointEngine), which copies it inside the server");
  }
  Future<void> add_adapter(const std::string& name, const LoraConfig& lora) override {
    return c_->call<void>([name, lora](wire::Session::Client& s) {
      auto req = s.samplerAddAdapterRequest();
      req.setName(as_text(name));
      write_lora(req.initLora(), lora);
      return send_status(req);
    });
  }
  Future<void> load_adapter(const std::string& name, const std::string& dir) override {
    auto files = read_dir_files(dir);
    if (!files) return Future<void>::ready_with(files.error());
    return c_->call<void>([name, files = std::move(*files), limit = c_->base().max_message_bytes](wire::Session::Client& s) {
      auto req = s.samplerLoadAdapterRequest();
      req.setName(as_text(name));
      write_files(req.initFiles(static_cast<unsigned>(files.size())), files);
      return send_checked<void>(req, limit, "load_adapter", [](auto&) -> Result<void> { return {}; });
    });
  }
  Future<void> remove_adapter(const std::string& name) override {
    return c_->call<void>([name](wire::Session::Client& s) {
      auto req = s.samplerRemoveAdapterRequest();
      req.setName(as_text(name));
      return send_status(req);
    });
  }
  Future<void> reset_prefix_cache() override { return refused<void>(errc::permission_denied, shared("reset_prefix_cache")); }
  Future<void> sleep() override { return refused<void>(errc::permission_denied, shared("sleep")); }
  Future<void> wake() override { return refused<void>(errc::permission_denied, shared("wake")); }
  Future<int64_t> abort() override { return refused<int64_t>(errc::permission_denied, shared("abort")); }
  Future<std::vector<Metrics>> stats() override {
    return c_->call<std::vector<Metrics>>([](wire::Session::Client& s) {
      return s.samplerStatsRequest().send().then([](auto&& r) -> Result<std::vector<Metrics>> {
        if (auto err = status_of(r)) return err;
        std::vector<Metrics> out;
        for (auto rank : r.getRanks()) {
          auto m = read_metrics(rank.getMetrics());
          if (!m) return m.error();
          out.push_back(std::move(*m));
        }
        return out;
      });
    });
  }

  const Connection* connection() const { return c_.get(); }

private:
  static std::string shared(const char* what) {
    return std::string{what} + " in remote mode: the server's samplers are shared by every tenant, so only its "
                               "operator may do this";
  }
  std::shared_ptr<Connection> c_;
  GroupInfo info_;
};

Result<actors::SyncReport> RemoteModelBackend::sync_to(actors::SamplerBackend& sampler, const std::string& adapter,
                                                        const std::string& target, const actors::SyncOptions& o) {
  auto* remote = dynamic_cast<RemoteSamplerBackend*>(&sampler);
  if (!remote || remote->connection() != c_.get())
    return make_error(errc::invalid_argument,
                      "sync_weights: the sampler group is not served by the same server as the model group");
  const actors::SyncOptions defaults;
  if (o.merge_and_sync || o.policy != defaults.policy ||
      (o.transport != actors::SyncTransport::automatic && o.transport != actors::SyncTransport::messages) ||
      o.bucket_bytes != defaults.bucket_bytes)
    return make_error(errc::invalid_argument,
                      "sync_weights in remote mode syncs the adapter inside the server with the default options "
                      "(no merge, finish_old, its own transport and buckets); leave SyncOptions at their defaults");
  auto start = std::chrono::steady_clock::now();
  auto version = c_->call<int64_t>([adapter, target](wire::Session::Client& s) {
                      auto req = s.syncWeightsRequest();
                      req.setAdapter(as_text(adapter));
                      if (target != adapter) req.setSamplerAdapter(as_text(target));
                      return req.send().then([](auto&& r) -> Result<int64_t> {
                        if (auto err = status_of(r)) return err;
                        return r.getVersion();
                      });
                    })
                     .take();
  if (!version) return with_context(version.error(), "sync_weights");
  actors::SyncReport report;
  report.version = *version;
  report.transport = actors::SyncTransport::messages;
  report.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return report;
}

Result<ModelGroup> Connection::open_model(const actors::ModelSpec& spec) {
  if (auto ok = check_base(spec.model_dir, spec.config_json, "open_model_group"); !ok) return ok.error();
  return ModelGroup{std::make_shared<RemoteModelBackend>(shared_from_this())};
}

Result<SamplerGroup> Connection::open_sampler(const actors::SamplerSpec& spec) {
  if (auto ok = check_base(spec.model_dir, spec.config_json, "open_sampler_group"); !ok) return ok.error();
  actors::SamplerSpec defaults;
  defaults.model_dir = spec.model_dir;
  if (!(spec == defaults))
    std::fprintf(stderr,
                 "glint: remote mode: the server's samplers keep their own engine settings (cache, batching, "
                 "sampling seed); the SamplerSpec's are not applied. Set SamplingParams::seed for reproducible draws.\n");
  return SamplerGroup{std::make_shared<RemoteSamplerBackend>(shared_from_this())};
}

CheckpointInfo checkpoint_of(wire::CheckpointInfo::Reader r) {
  return {.name = r.getName().cStr(), .adapter = r.getAdapter().cStr(), .created_ms = r.getCreatedMs(),
          .with_optimizer = r.getWithOptimizer()};
}

}  // namespace

Result<ServerCheckpoints> ServerCheckpoints::of(Runtime& rt) {
  auto* c = dynamic_cast<Connection*>(rt.remote());
  if (!c)
    return make_error(errc::failed_precondition,
                      "server checkpoints exist in remote mode only (GLINT_REMOTE_URL); locally, use the Checkpointer");
  ServerCheckpoints out;
  out.connection_ = c->shared_from_this();
  return out;
}

Result<CheckpointInfo> ServerCheckpoints::save(const actors::ModelGroup& adapter, const std::string& name,
                                               bool with_optimizer) {
  auto& c = static_cast<Connection&>(*connection_);
  return c.call<CheckpointInfo>([a = adapter.adapter(), name, with_optimizer](wire::Session::Client& s) {
            auto req = s.saveCheckpointRequest();
            req.setAdapter(as_text(a));
            req.setName(as_text(name));
            req.setWithOptimizer(with_optimizer);
            return req.send().then([](auto&& r) -> Result<CheckpointInfo> {
              if (auto err = status_of(r)) return err;
              return checkpoint_of(r.getCheckpoint());
            });
          })
      .take();
}

Result<std::vector<CheckpointInfo>> ServerCheckpoints::list() {
  auto& c = static_cast<Connection&>(*connection_);
  return c.call<std::vector<CheckpointInfo>>([](wire::Session::Client& s) {
            return s.listCheckpointsRequest().send().then([](auto&& r) -> Result<std::vector<CheckpointInfo>> {
              if (auto err = status_of(r)) return err;
              std::vector<CheckpointInfo> out;
              for (auto e : r.getCheckpoints()) out.push_back(checkpoint_of(e));
              return out;
            });
          })
      .take();
}

Result<void> ServerCheckpoints::load(const std::string& name, const actors::ModelGroup& target, bool create,
                                     bool with_optimizer) {
  auto& c = static_cast<Connection&>(*connection_);
  return c.call<void>([name, a = target.adapter(), create, with_optimizer](wire::Session::Client& s) {
            auto req = s.loadCheckpointRequest();
            req.setName(as_text(name));
            req.setAdapter(as_text(a));
            req.setCreate(create);
            req.setWithOptimizer(with_optimizer);
            return send_status(req);
          })
      .take();
}

Result<void> ServerCheckpoints::remove(const std::string& name) {
  auto& c = static_cast<Connection&>(*connection_);
  return c.call<void>([name](wire::Session::Client& s) {
            auto req = s.deleteCheckpointRequest();
            req.setName(as_text(name));
            return send_status(req);
          })
      .take();
}

Result<std::shared_ptr<RemoteAttachment>> connect(const Options& opts) {
  auto c = Connection::open(opts);
  if (!c) return c.error();
  return std::shared_ptr<RemoteAttachment>(std::move(*c));
}

}  // namespace glint::rpc
