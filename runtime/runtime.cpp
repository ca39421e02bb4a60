#include "runtime/runtime.hpp"
#include "runtime/log.hpp"
#include "runtime/process.hpp"
#include "runtime/text.hpp"

#include "runtime/batch.hpp"
#include "runtime/stop.hpp"
#include "runtime/tensor.hpp"

#include <caf/all.hpp>
#include <caf/default_attachable.hpp>
#include <caf/io/all.hpp>
#include <caf/logger.hpp>

#include <unistd.h>

#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <thread>
#include <unordered_map>

namespace glint {

using namespace std::chrono_literals;

std::string NodeInfo::describe() const {
  return "node " + std::to_string(index) + " (" + hello.host + ", pid " + std::to_string(hello.pid) + ")";
}

namespace {

NodeHello self_hello(const ClusterEnv& c) {
  NodeHello h;
  h.process_rank = c.rank;
  h.node_rank = c.node_rank;
  h.local_rank = c.local_rank;
  h.local_world_size = c.local_world_size;
  char host[256] = {0};
  if (gethostname(host, sizeof(host) - 1) == 0) h.host = host;
  h.pid = static_cast<int32_t>(getpid());
  h.cores = static_cast<int>(std::thread::hardware_concurrency());
  if (auto a = local_address_towards(c.master_addr, c.master_port)) h.address = *a;
  return h;
}

std::unique_ptr<caf::actor_system_config> make_config(const Options& opts) {
  auto cfg = std::make_unique<caf::actor_system_config>();
  if (opts.mode == Mode::cluster) {
    cfg->load<caf::io::middleman>();
    cfg->set("middleman.heartbeat-interval", caf::timespan{opts.heartbeat});
    // Deserialise incoming messages on the middleman's own thread instead of
    // handing each to a scheduler worker first: one thread wake less per
    // message. Measured (glint bench actors, 2 processes on the 2-core VM):
    // round trip 400 us instead of 1.2-1.7 ms, 1 MiB tensors 1.0 GB/s
    // instead of 0.55.
    cfg->set("middleman.workers", size_t{0});
    // CAF closes a connection that received nothing (data or heartbeat) for
    // this long; the peer's actors go down with it and the node is lost.
    cfg->set("middleman.connection-timeout", caf::timespan{opts.peer_timeout});
  }
  // Shared scheduler threads: one per core but one, so the thread that
  // drives the job (and waits on futures) keeps a core. Compute-heavy ranks
  // run on threads of their own (detached), not on these.
  unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  size_t threads = opts.threads > 0 ? static_cast<size_t>(opts.threads) : std::max(1u, cores - 1);
  cfg->set("scheduler.max-threads", threads);
  // CAF's work-stealing workers poll for work in three phases: spinning
  // (aggressive), then short sleeps (moderate), then long sleeps (relaxed).
  // CAF's defaults spin for ~100 polls (a few microseconds), so a call that
  // comes a moment after the last one often finds its worker asleep and
  // waits 50 us to 10 ms. glint spins for ~30k polls (about a millisecond
  // after the last piece of work), then sleeps 0.5 ms twenty times, then
  // 5 ms. Measured on the 2-core VM (glint bench actors and an idle
  // runtime): round trip 4-6 us instead of 100-350 us; an idle runtime uses
  // ~2.5% of one core, one call every 10 ms ~12% (CAF's defaults: ~1.5%
  // and ~9%; the earlier 20 us / 200 us sleeps: 23% and 51%).
  cfg->set("work-stealing.aggressive-poll-attempts", size_t{30000});
  cfg->set("work-stealing.moderate-poll-attempts", size_t{20});
  cfg->set("work-stealing.moderate-sleep-duration", caf::timespan{std::chrono::microseconds(500)});
  cfg->set("work-stealing.relaxed-sleep-duration", caf::timespan{std::chrono::milliseconds(5)});
  cfg->set("logger.verbosity", caf::atom("quiet"));
  cfg->set("logger.console", caf::atom("none"));
  cfg->add_message_type<Tensor>("glint.tensor");
  cfg->add_message_type<Batch>("glint.batch");
  cfg->add_message_type<RankContext>("glint.rank_context");
  cfg->add_message_type<NodeHello>("glint.node_hello");
  cfg->add_message_type<RankSlot>("glint.rank_slot");
  cfg->add_message_type<std::vector<double>>("std::vector<double>");
  cfg->add_message_type<std::vector<int64_t>>("std::vector<int64_t>");
  cfg->add_message_type<std::vector<std::string>>("std::vector<std::string>");
  cfg->add_message_type<std::map<std::string, double>>("glint.metrics");
  cfg->add_error_category(error_category, [](uint8_t code, caf::atom_value, const caf::message& ctx) {
    std::string c = ctx.size() == 1 && ctx.match_element<std::string>(0) ? ctx.get_as<std::string>(0) : "";
    return describe(make_error(static_cast<errc>(code), c));
  });
  ActorTypes::global().install(*cfg);
  return cfg;
}

void stop_local_actors() {
  for (auto& a : detail::local_actors()) caf::anon_send_exit(a, caf::exit_reason::user_shutdown);
}

}  // namespace

// -- response sink ----------------------------------------------------------

namespace detail {

/// Where the answers to every request of this runtime go. Not a scheduled
/// actor: CAF calls `enqueue` on the thread that delivers an answer (the
/// answering actor's, or the middleman's for another process), and the sink
/// hands it to the waiting call right there. It monitors each target it has
/// sent to, so the death of a target fails its calls at once, and a sweeper
/// thread fails the calls whose deadline has passed.
class ResponseSink final : public caf::monitorable_actor {
public:
  using clock = std::chrono::steady_clock;

  explicit ResponseSink(caf::actor_config& cfg) : caf::monitorable_actor(cfg) {}

  const char* name() const override { return "glint.responses"; }

  /// Starts the deadline sweeper; `self` is this actor's own handle.
  void start(caf::strong_actor_ptr self) {
    self_ = std::move(self);
    sweeper_ = std::thread([this] { sweep(); });
  }

  void request(const caf::strong_actor_ptr& target, caf::message msg, std::chrono::milliseconds timeout, Reply reply) {
    auto addr = target->address();
    // A year at most: `now + milliseconds::max()` would overflow.
    auto deadline = clock::now() + std::min<std::chrono::milliseconds>(timeout, std::chrono::hours(24 * 365));
    uint64_t id = 0;
    bool monitor = false;
    caf::strong_actor_ptr self;
    {
      std::unique_lock<std::mutex> lock{mx_};
      if (stopped_) {
        lock.unlock();
        deliver(reply, make_error(errc::failed_precondition, "the runtime is shut down"));
        return;
      }
      self = self_;
      if (auto d = down_.find(addr); d != down_.end()) {
        auto why = d->second;
        lock.unlock();
        deliver(reply, std::move(why));
        return;
      }
      monitor = monitored_.insert(addr).second;
      id = ++next_id_;
      pending_.emplace(id, Pending{std::move(reply), addr, deadline, timeout});
      // Wake the sweeper only if this deadline comes before its next round;
      // with equal timeouts that is the first call after an idle spell.
      if (deadline < wake_at_) {
        wake_at_ = deadline;
        cv_.notify_one();
      }
    }
    // Outside the lock: attaching to an actor that is already gone delivers
    // its down message to us at once.
    if (monitor) target->get()->attach(caf::default_attachable::make_monitor(addr, self->get()->address()));
    auto mid = caf::make_message_id(id);
    target->enqueue(caf::make_mailbox_element(std::move(self), mid, {}, std::move(msg)), nullptr);
  }

  void enqueue(caf::mailbox_element_ptr what, caf::execution_unit*) override {
    if (what->mid.is_response()) {
      auto reply = take(what->mid.request_id().integer_value());
      if (!reply) return;  // timed out, or failed by its target's death
      auto answer = what->move_content_to_message();
      if (answer.match_elements<caf::error>()) deliver(*reply, caf::error{answer.get_as<caf::error>(0)});
      else deliver(*reply, std::move(answer));
      return;
    }
    auto& content = what->content();
    if (content.match_elements<caf::down_msg>()) {
      const auto& dm = content.get_as<caf::down_msg>(0);
      auto reason = dm.reason ? dm.reason : caf::make_error(caf::exit_reason::normal);
      std::vector<Reply> failed;
      {
        std::lock_guard<std::mutex> guard{mx_};
        monitored_.erase(dm.source);
        down_[dm.source] = reason;
        for (auto i = pending_.begin(); i != pending_.end();) {
          if (i->second.target != dm.source) {
            ++i;
            continue;
          }
          failed.push_back(std::move(i->second.reply));
          i = pending_.erase(i);
        }
      }
      for (auto& r : failed) deliver(r, caf::error{reason});
    }
  }

  /// Fails every outstanding call and stops the sweeper. Idempotent.
  void stop() {
    std::vector<Reply> failed;
    {
      std::lock_guard<std::mutex> guard{mx_};
      if (stopped_) return;
      stopped_ = true;
      for (auto& [id, p] : pending_) failed.push_back(std::move(p.reply));
      pending_.clear();
      cv_.notify_one();
    }
    if (sweeper_.joinable()) sweeper_.join();
    for (auto& r : failed) deliver(r, make_error(errc::aborted, "the runtime shut down before the answer came"));
    cleanup(caf::make_error(caf::exit_reason::user_shutdown), nullptr);
    self_ = nullptr;
  }

private:
  // Hands an answer to its call. It runs on whatever thread delivered the
  // answer (an actor's, the middleman's, the sweeper), so nothing may escape.
  static void deliver(const Reply& reply, caf::expected<caf::message>&& answer) {
    try {
      reply(std::move(answer));
    } catch (const std::exception& e) {
      try {
        reply(make_error(errc::internal, std::string{"handling an answer failed: "} + e.what()));
      } catch (...) {
      }
    } catch (...) {
    }
  }

  struct Pending {
    Reply reply;
    caf::actor_addr target;
    clock::time_point deadline;
    std::chrono::milliseconds timeout;
  };

  std::optional<Reply> take(uint64_t id) {
    std::lock_guard<std::mutex> guard{mx_};
    auto i = pending_.find(id);
    if (i == pending_.end()) return std::nullopt;
    auto r = std::move(i->second.reply);
    pending_.erase(i);
    return r;
  }

  // Fails the calls whose deadline passed. It sleeps until the earliest
  // deadline it knows of (a new call with an earlier one wakes it) or 1 s,
  // and then scans the outstanding calls: with equal timeouts that is one
  // scan per timeout period, and a call costs no timer of its own.
  void sweep() {
    std::unique_lock<std::mutex> lock{mx_};
    while (!stopped_) {
      auto now = clock::now();
      auto next = now + 1s;
      std::vector<Pending> expired;
      for (auto i = pending_.begin(); i != pending_.end();) {
        if (i->second.deadline > now) {
          next = std::min(next, i->second.deadline);
          ++i;
          continue;
        }
        expired.push_back(std::move(i->second));
        i = pending_.erase(i);
      }
      wake_at_ = next;
      if (!expired.empty()) {
        lock.unlock();
        for (auto& p : expired)
          deliver(p.reply, make_error(errc::deadline_exceeded,
                             "no answer within " + std::to_string(p.timeout.count()) +
                                 " ms (raise it with Group::with_timeout or Options::call_timeout)"));
        lock.lock();
        continue;
      }
      cv_.wait_until(lock, wake_at_);
    }
  }

  std::mutex mx_;
  std::condition_variable cv_;
  bool stopped_ = false;
  uint64_t next_id_ = 0;
  std::unordered_map<uint64_t, Pending> pending_;
  clock::time_point wake_at_ = clock::now();
  std::set<caf::actor_addr> monitored_;
  std::map<caf::actor_addr, caf::error> down_;
  caf::strong_actor_ptr self_;
  std::thread sweeper_;
};

ResponseSink* sink(const caf::strong_actor_ptr& handle) {
  return static_cast<ResponseSink*>(caf::actor_cast<caf::abstract_actor*>(handle));
}

}  // namespace detail

// -- runtime state ----------------------------------------------------------

struct Runtime::Impl {
  mutable std::mutex mx;
  std::condition_variable cv;
  std::vector<NodeInfo> nodes;
  int registered = 0;
  caf::strong_actor_ptr responses_handle;  ///< the ResponseSink (see sink())
  caf::actor rendezvous;
  std::vector<caf::actor> spawned;
  std::map<std::string, caf::actor> services;
  bool shut = false;

  void mark_lost(const caf::actor_addr& agent, const caf::error& reason) {
    {
      std::lock_guard<std::mutex> guard{mx};
      for (auto& n : nodes)
        if (n.agent && n.agent.address() == agent && !n.lost) {
          n.lost = true;
          n.lost_reason = reason ? describe(reason) : "shut down";
        }
    }
    cv.notify_all();
  }
};

namespace {

caf::behavior rendezvous_fn(caf::event_based_actor* self, std::shared_ptr<Runtime::Impl> impl, int world) {
  self->set_down_handler([=](caf::down_msg& dm) { impl->mark_lost(dm.source, dm.reason); });
  return {
      [=](join_atom, NodeHello hello, caf::actor agent) -> caf::result<int> {
        std::lock_guard<std::mutex> guard{impl->mx};
        int r = hello.process_rank;
        if (r < 1 || r >= world)
          return make_error(errc::invalid_argument, "process rank " + std::to_string(r) + " is outside this job of " +
                                                        std::to_string(world) + " processes");
        // The job is ending: a process started again late (a kill near the
        // end) has nothing to join, and is told so, not failed.
        if (impl->shut) return make_error(errc::aborted, "the driver is shutting down: the job is ending");
        auto& slot = impl->nodes[static_cast<size_t>(r)];
        // A process of a lost node's rank (`glint run --max-restarts`
        // started it again) takes the node's place; the ranks that lived
        // there stay lost until a group spawns them again. While the old one
        // still counts as alive (its loss not seen yet), the new one is told
        // to retry.
        if (slot.agent && !slot.lost)
          return make_error(errc::unavailable, "process rank " + std::to_string(r) + " is registered already (" +
                                                   slot.describe() + "); a restarted process is admitted once the "
                                                   "old one is seen to end");
        const bool rejoin = static_cast<bool>(slot.agent);
        self->monitor(agent);
        slot.index = r;
        slot.hello = std::move(hello);
        slot.agent = agent;
        slot.id = agent.node();
        if (rejoin) {
          slot.lost = false;
          slot.lost_reason.clear();
          ++slot.restarts;
          log::info("node " + std::to_string(r) + " rejoined the job (" + slot.describe() + ", restart " +
                    std::to_string(slot.restarts) + ")");
        } else {
          ++impl->registered;
        }
        impl->cv.notify_all();
        return r;
      },
  };
}

caf::behavior agent_fn(caf::event_based_actor* self, caf::actor driver, std::shared_ptr<std::atomic<int>> exit_code,
                       NodeHello hello) {
  self->monitor(driver);
  self->set_down_handler([=](caf::down_msg&) {
    std::fprintf(stderr, "glint: node %d lost its driver; stopping its actors\n", hello.process_rank);
    *exit_code = kExitLostDriver;
    stop_local_actors();
    self->quit();
  });
  return {
      [=](shutdown_atom) {
        stop_local_actors();
        self->quit();
      },
      [=](hello_atom) { return hello; },
  };
}

}  // namespace

Runtime::Runtime(Options opts) : opts_(std::move(opts)) {}

Runtime::~Runtime() { shutdown(); }

int Runtime::num_nodes() const {
  std::lock_guard<std::mutex> guard{impl_->mx};
  return static_cast<int>(impl_->nodes.size());
}

NodeInfo Runtime::node(int index) const {
  std::lock_guard<std::mutex> guard{impl_->mx};
  return impl_->nodes.at(static_cast<size_t>(index));
}

std::vector<NodeInfo> Runtime::nodes() const {
  std::lock_guard<std::mutex> guard{impl_->mx};
  return impl_->nodes;
}

int Runtime::node_of(const caf::node_id& id) const {
  std::lock_guard<std::mutex> guard{impl_->mx};
  for (const auto& n : impl_->nodes)
    if (n.id == id) return n.index;
  return -1;
}

Result<NodeInfo> Runtime::prepare_spawn(int node, const std::string& type) {
  NodeInfo target;
  {
    std::lock_guard<std::mutex> guard{impl_->mx};
    if (impl_->shut) return make_error(errc::failed_precondition, "the runtime is shut down");
    if (node < 0 || node >= static_cast<int>(impl_->nodes.size()))
      return make_error(errc::invalid_argument, "node " + std::to_string(node) + " does not exist; the job has " +
                                                    std::to_string(impl_->nodes.size()) + " processes");
    target = impl_->nodes[static_cast<size_t>(node)];
  }
  if (target.lost)
    return make_error(errc::unavailable, target.describe() + " was lost (" + target.lost_reason + ")");
  if (!ActorTypes::global().contains(type)) {
    auto names = join(ActorTypes::global().names());
    return make_error(errc::not_found, "no actor type '" + type + "' is registered in this program (registered: " +
                                           (names.empty() ? std::string{"none"} : names) + ")");
  }
  return target;
}

caf::error Runtime::spawn_failed(const NodeInfo& node, const std::string& type, const caf::error& err) {
  auto where = "spawning '" + type + "' on " + node.describe();
  if (err == caf::sec::cannot_spawn_actor_from_arguments)
    return make_error(errc::invalid_argument, where + ": the actor does not take these arguments");
  if (err == caf::sec::unexpected_actor_messaging_interface)
    return make_error(errc::invalid_argument, where + ": the registered actor has another interface than the handle");
  if (node.index > 0 && (err == caf::sec::request_receiver_down || err == caf::exit_reason::remote_link_unreachable)) {
    // The node's connection dropped. The rendezvous actor learns it from its
    // own down message, which may come after this reply: do not wait for it.
    std::string reason;
    {
      std::lock_guard<std::mutex> guard{impl_->mx};
      auto& n = impl_->nodes[static_cast<size_t>(node.index)];
      if (!n.lost) {
        n.lost = true;
        n.lost_reason = "its node process exited or lost its connection";
      }
      reason = n.lost_reason;
    }
    impl_->cv.notify_all();
    return make_error(errc::unavailable, node.describe() + " was lost (" + reason + ")");
  }
  return with_context(err, where);
}

detail::CallerThreadScope::CallerThreadScope() : caf_thread_(caf::logger::current_logger() != nullptr) {}

detail::CallerThreadScope::~CallerThreadScope() {
  if (!caf_thread_) caf::logger::set_current_actor_system(nullptr);
}

void Runtime::remember(caf::actor a) {
  std::lock_guard<std::mutex> guard{impl_->mx};
  impl_->spawned.push_back(std::move(a));
}

void Runtime::request(const caf::strong_actor_ptr& target, caf::message msg, std::chrono::milliseconds timeout,
                      detail::Reply reply) {
  caf::strong_actor_ptr sink;  // keeps the sink alive through a concurrent shutdown
  {
    std::lock_guard<std::mutex> guard{impl_->mx};
    sink = impl_->responses_handle;
  }
  if (!sink) {
    reply(make_error(errc::failed_precondition, "the runtime is shut down"));
    return;
  }
  detail::sink(sink)->request(target, std::move(msg), timeout, std::move(reply));
}

caf::actor Runtime::service(const std::string& name) const {
  std::lock_guard<std::mutex> guard{impl_->mx};
  auto i = impl_->services.find(name);
  return i == impl_->services.end() ? caf::actor{} : i->second;
}

void Runtime::set_service(const std::string& name, caf::actor a) {
  caf::actor old;
  {
    std::lock_guard<std::mutex> guard{impl_->mx};
    auto& slot = impl_->services[name];
    if (!a) old = slot;
    slot = std::move(a);
    if (!slot) impl_->services.erase(name);
  }
  if (old) caf::anon_send_exit(old, caf::exit_reason::user_shutdown);
}

size_t Runtime::spawned_mark() const {
  std::lock_guard<std::mutex> guard{impl_->mx};
  return impl_->spawned.size();
}

void Runtime::stop_spawned_since(size_t mark) {
  std::vector<caf::actor> stopping;
  {
    std::lock_guard<std::mutex> guard{impl_->mx};
    auto& all = impl_->spawned;
    if (mark >= all.size()) return;
    stopping.assign(std::make_move_iterator(all.begin() + static_cast<std::ptrdiff_t>(mark)),
                    std::make_move_iterator(all.end()));
    all.resize(mark);
  }
  // An actor ends once the call it is in returns: wait for that, bounded, so
  // what comes next (a new try placed on the same devices) does not start
  // beside it. A lost node's actors are down at once.
  detail::CallerThreadScope on_caller;
  caf::scoped_actor self{*sys_};
  for (auto& a : stopping) self->monitor(a);
  for (auto& a : stopping) caf::anon_send_exit(a, caf::exit_reason::user_shutdown);
  const auto until = std::chrono::steady_clock::now() + std::min<std::chrono::milliseconds>(opts_.exit_grace, 10s);
  size_t down = 0;
  bool late = false;
  while (down < stopping.size() && !late) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - std::chrono::steady_clock::now());
    if (left.count() <= 0) break;
    self->receive([&](const caf::down_msg&) { ++down; }, caf::after(left) >> [&] { late = true; });
  }
  if (down < stopping.size())
    log::warn(std::to_string(stopping.size() - down) + " of " + std::to_string(stopping.size()) +
              " stopped actors are still busy in a call; going on beside them");
}

void Runtime::shutdown() {
  remote_.reset();  // closes the connection to the server (remote mode)
  if (!impl_ || !sys_) return;
  {
    // Every strong handle taken here must be released before the actor system
    // goes: CAF waits for each detached actor until its last handle is gone.
    std::vector<caf::actor> actors;
    std::vector<caf::actor> agents;
    {
      std::lock_guard<std::mutex> guard{impl_->mx};
      if (impl_->shut) return;
      impl_->shut = true;
      actors = std::move(impl_->spawned);
      impl_->spawned.clear();
      for (auto& [name, a] : impl_->services) actors.push_back(a);
      impl_->services.clear();
      for (auto& n : impl_->nodes)
        if (n.index > 0 && n.agent && !n.lost) agents.push_back(n.agent);
    }
    for (auto& a : actors) caf::anon_send_exit(a, caf::exit_reason::user_shutdown);
    for (auto& a : agents) caf::anon_send(a, shutdown_atom::value);
    if (!agents.empty()) {
      // Wait until every node process has let go, so none outlives the driver.
      std::unique_lock<std::mutex> lock{impl_->mx};
      impl_->cv.wait_for(lock, 10s, [&] {
        for (auto& n : impl_->nodes)
          if (n.index > 0 && n.agent && !n.lost) return false;
        return true;
      });
    }
    detail::sink(impl_->responses_handle)->stop();
    if (impl_->rendezvous) caf::anon_send_exit(impl_->rendezvous, caf::exit_reason::user_shutdown);
    std::lock_guard<std::mutex> guard{impl_->mx};
    impl_->responses_handle = nullptr;
    impl_->rendezvous = nullptr;
    for (auto& n : impl_->nodes) n.agent = nullptr;
  }
  // The same race as at a node's exit (serve_node): a rank a node process
  // monitors must be released while the middleman still runs. Bounded, and
  // short, because a caller may still hold a handle it was told not to keep.
  if (opts_.mode == Mode::cluster)
    detail::await_local_actors_released(std::min<std::chrono::milliseconds>(opts_.exit_grace, 3s));
  sys_.reset();  // waits for every actor of this process
}

// -- entry points -----------------------------------------------------------

Result<std::unique_ptr<Runtime>> initialize(Options opts) {
  if (auto ok = opts.validate(); !ok) return with_context(ok.error(), "invalid options");
  const RemoteConnector* connect = nullptr;
  if (opts.mode == Mode::remote) {
    connect = remote_connector();
    if (!connect)
      return make_error(errc::unimplemented,
                        "remote mode needs the remote transport, and this program was not linked with glint::rpc; "
                        "link it, or use local or cluster mode");
    if (opts.remote_endpoint.empty())
      return make_error(errc::invalid_argument,
                        "remote mode needs the server's address: set GLINT_REMOTE_URL (host:port, or "
                        "tls://host:port) or Options::remote_endpoint");
  }
  if (opts.mode == Mode::cluster && opts.cluster.rank != 0)
    return make_error(errc::failed_precondition,
                      "this is process " + std::to_string(opts.cluster.rank) +
                          " of a cluster job, a node process: call glint::run_main (or glint::serve_node) so it "
                          "hosts actors for the driver");
  set_max_message_bytes(opts.max_message_bytes);
  std::unique_ptr<Runtime> rt{new Runtime(opts)};
  auto impl = std::make_shared<Runtime::Impl>();
  rt->impl_ = impl;
  rt->cfg_ = make_config(opts);
  detail::CallerThreadScope on_caller;  // the system's constructor and the spawns below
  rt->sys_ = std::make_unique<caf::actor_system>(*rt->cfg_);
  int world = opts.mode == Mode::cluster ? opts.cluster.world_size : 1;
  impl->nodes.resize(static_cast<size_t>(world));
  for (int i = 0; i < world; ++i) impl->nodes[static_cast<size_t>(i)].index = i;
  impl->nodes[0].hello = self_hello(opts.cluster);
  impl->nodes[0].id = rt->sys_->node();
  impl->registered = 1;
  caf::actor_config sink_cfg;
  impl->responses_handle = caf::make_actor<detail::ResponseSink, caf::strong_actor_ptr>(
      rt->sys_->next_actor_id(), rt->sys_->node(), rt->sys_.get(), sink_cfg);
  detail::sink(impl->responses_handle)->start(impl->responses_handle);
  if (connect) {
    auto attached = (*connect)(opts);
    if (!attached) return attached.error();
    rt->remote_ = std::move(*attached);
  }
  if (opts.mode != Mode::cluster) return rt;

  impl->rendezvous = rt->sys_->spawn(rendezvous_fn, impl, world);
  const auto& c = opts.cluster;
  bool loopback = c.master_addr == "127.0.0.1" || c.master_addr == "localhost";
  auto port = rt->sys_->middleman().publish(impl->rendezvous, c.master_port, loopback ? "127.0.0.1" : nullptr, true);
  if (!port)
    return with_context(port.error(), "the driver cannot listen on port " + std::to_string(c.master_port) +
                                          " (is another job using it? pick another with --master-port)");
  std::unique_lock<std::mutex> lock{impl->mx};
  bool all = impl->cv.wait_for(lock, opts.connect_timeout, [&] { return impl->registered == world; });
  if (!all) {
    std::vector<int> unregistered;
    for (auto& n : impl->nodes)
      if (n.index > 0 && !n.agent) unregistered.push_back(n.index);
    auto missing = join(unregistered);
    lock.unlock();
    return make_error(errc::unavailable,
                      "node processes " + missing + " did not register within " +
                          std::to_string(opts.connect_timeout.count()) + " ms; check that they run, with master " +
                          c.master_addr + ":" + std::to_string(c.master_port) + " reachable from them");
  }
  return rt;
}

int serve_node(const Options& opts) {
  auto fail = [&](const std::string& what) {
    std::fprintf(stderr, "glint: node %d: %s\n", opts.cluster.rank, what.c_str());
    return 1;
  };
  if (auto ok = opts.validate(); !ok) return fail(describe(ok.error()));
  if (opts.mode != Mode::cluster || opts.cluster.rank == 0)
    return fail("serve_node is for node processes of a cluster job (rank > 0)");
  set_max_message_bytes(opts.max_message_bytes);
  auto cfg = make_config(opts);
  auto exit_code = std::make_shared<std::atomic<int>>(0);
  {
    caf::actor_system sys{*cfg};
    const auto& c = opts.cluster;
    auto deadline = std::chrono::steady_clock::now() + opts.connect_timeout;
    caf::expected<caf::actor> driver{caf::actor{}};
    for (;;) {
      driver = sys.middleman().remote_actor(c.master_addr, c.master_port);
      if (driver) break;
      if (std::chrono::steady_clock::now() > deadline)
        return fail("cannot reach the driver at " + c.master_addr + ":" + std::to_string(c.master_port) + " within " +
                    std::to_string(opts.connect_timeout.count()) + " ms: " + describe(driver.error()));
      std::this_thread::sleep_for(50ms);
    }
    auto hello = self_hello(c);
    auto agent = sys.spawn(agent_fn, *driver, exit_code, hello);
    caf::scoped_actor self{sys};
    self->monitor(agent);
    std::string err;
    bool ended = false;
    // A restarted process may come before the driver saw its predecessor
    // end: the driver answers `unavailable` until then.
    for (;;) {
      bool again = false;
      err.clear();
      self->request(*driver, opts.connect_timeout, join_atom::value, hello, agent)
          .receive([](int) {},
                   [&](caf::error& e) {
                     err = describe(e);
                     ended = code_of(e) == errc::aborted;
                     again = code_of(e) == errc::unavailable && std::chrono::steady_clock::now() < deadline;
                   });
      if (!again) break;
      std::this_thread::sleep_for(50ms);
    }
    // Told to `glint run` (ClusterEnv::join_report): joined, or let go.
    auto report = [&](std::string_view what) {
      if (c.join_report.empty()) return;
      std::ofstream out{c.join_report, std::ios::trunc};
      out << what << '\n';
    };
    if (!err.empty()) {
      caf::anon_send_exit(agent, caf::exit_reason::user_shutdown);
      if (ended) {
        report("ended");
        // Not a failure: failing here would make `glint run` stop a driver
        // that finished its work and is only shutting down.
        std::fprintf(stderr, "glint: node %d: the job ended before this process could join (%s); nothing to do\n",
                     opts.cluster.rank, err.c_str());
        return 0;
      }
      return fail("the driver refused this node: " + err);
    }
    report("joined");
    // Serve until the agent stops: the driver said so, or the driver is gone.
    self->receive([](const caf::down_msg&) {});
    // Let the ranks finish exiting while the middleman still runs. A rank
    // the driver monitors is monitored here by CAF's BASP broker; its exit
    // sends the broker a down message whose sender is a strong reference to
    // the rank, and CAF runs the monitors after it counts the actor as done.
    // If ~actor_system stops the middleman in between, that message stays in
    // the broker's mailbox for good (CAF 0.17's abstract_broker::cleanup never
    // closes it), the rank is never destroyed, and ~actor_system waits on its
    // thread forever: the hang behind this process's old 5 s watchdog
    // (docs/architecture.md). Waiting here until every rank is released lets
    // the broker consume those messages.
    // The last resort: a rank still busy in a long compute step past the
    // grace holds its thread, and a node process must not outlive its job.
    if (!detail::await_local_actors_released(opts.exit_grace)) {
      std::fprintf(stderr, "glint: node %d: actors still busy %lld ms after shutdown; exiting without them\n",
                   opts.cluster.rank, static_cast<long long>(opts.exit_grace.count()));
      std::fflush(stderr);
      std::_Exit(*exit_code);
    }
  }
  return *exit_code;
}

int run_main(std::function<int(Runtime&)> driver, std::function<void(Options&)> configure) {
  auto opts = Options::from_environment();
  if (!opts) {
    std::fprintf(stderr, "glint: %s\n", describe(opts.error()).c_str());
    return 2;
  }
  if (configure) configure(*opts);
  if (opts->mode == Mode::cluster && opts->cluster.rank != 0) return serve_node(*opts);
  auto rt = initialize(*opts);
  if (!rt) {
    std::fprintf(stderr, "glint: %s\n", describe(rt.error()).c_str());
    return 1;
  }
  int code = driver(**rt);
  // Long work in actors (micro-batches, sampling steps) stops at its next
  // step now that nothing waits for it.
  request_stop();
  // An actor still busy in a call the driver gave up on (a timeout) would
  // hold the process at exit until it finishes, minutes or never: give the
  // actors exit_grace, then leave with the driver's code.
  std::thread([code, grace = opts->exit_grace] {
    std::this_thread::sleep_for(grace);
    std::fprintf(stderr,
                 "glint: actors still busy %.0f s after the driver returned; exiting without waiting for them\n",
                 std::chrono::duration<double>(grace).count());
    std::fflush(stderr);
    std::_Exit(code);
  }).detach();
  (*rt)->shutdown();
  rt->reset();
  return code;
}

}  // namespace glint

namespace glint::detail {

caf::error rank_down_error(const std::string& label, const caf::error& reason) {
  std::string why;
  if (reason == caf::exit_reason::remote_link_unreachable)
    why = "its node process exited or lost its connection";
  else if (reason == caf::sec::request_receiver_down)
    why = "its actor is down";
  else if (reason == caf::exit_reason::user_shutdown)
    why = "it was shut down";
  else
    why = "its actor stopped (" + describe(reason) + ")";
  return make_error(errc::unavailable, label + " is unreachable: " + why);
}

}  // namespace glint::detail
