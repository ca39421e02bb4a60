#include "runtime/runtime.hpp"
#include "runtime/text.hpp"

#include "runtime/batch.hpp"
#include "runtime/tensor.hpp"

#include <caf/all.hpp>
#include <caf/io/all.hpp>

#include <unistd.h>

#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <thread>

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
  return h;
}

std::unique_ptr<caf::actor_system_config> make_config(const Options& opts) {
  auto cfg = std::make_unique<caf::actor_system_config>();
  if (opts.mode == Mode::cluster) {
    cfg->load<caf::io::middleman>();
    cfg->set("middleman.heartbeat-interval", caf::timespan{opts.heartbeat});
    cfg->set("middleman.connection-timeout", caf::timespan{std::max<std::chrono::milliseconds>(4 * opts.heartbeat, 2s)});
  }
  if (opts.threads > 0) cfg->set("scheduler.max-threads", static_cast<size_t>(opts.threads));
  // CAF's work-stealing workers back off to 10 ms sleeps when idle, which
  // caps a call-and-wait loop at ~100 calls/s per idle period. Back off to
  // short sleeps instead: idle workers cost little, and a call that arrives
  // at an idle runtime is picked up within tens of microseconds.
  cfg->set("work-stealing.moderate-sleep-duration", caf::timespan{std::chrono::microseconds(20)});
  cfg->set("work-stealing.relaxed-sleep-duration", caf::timespan{std::chrono::microseconds(200)});
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

// -- caller -----------------------------------------------------------------

namespace detail {

uint64_t CallerState::track(caller_actor* self, const caf::actor_addr& target,
                            std::function<void(const caf::error&)> fail) {
  if (auto d = down.find(target); d != down.end()) {
    fail(d->second);
    return 0;
  }
  if (monitored.insert(target).second) self->monitor(target);
  auto id = ++next_id;
  pending[target].emplace(id, std::move(fail));
  return id;
}

void CallerState::untrack(const caf::actor_addr& target, uint64_t id) {
  auto i = pending.find(target);
  if (i == pending.end()) return;
  i->second.erase(id);
}

}  // namespace detail

namespace {

caf::behavior caller_fn(detail::caller_actor* self) {
  self->set_down_handler([=](caf::down_msg& dm) {
    auto& st = self->state;
    st.monitored.erase(dm.source);
    auto reason = dm.reason ? dm.reason : caf::make_error(caf::exit_reason::normal);
    st.down[dm.source] = reason;
    auto i = st.pending.find(dm.source);
    if (i == st.pending.end()) return;
    auto calls = std::move(i->second);
    st.pending.erase(i);
    for (auto& [id, fail] : calls) fail(reason);
  });
  return {[=](detail::CallThunk& t) { t.fn(self); }};
}

}  // namespace

// -- runtime state ----------------------------------------------------------

struct Runtime::Impl {
  mutable std::mutex mx;
  std::condition_variable cv;
  std::vector<NodeInfo> nodes;
  int registered = 0;
  caf::actor caller;
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
        auto& slot = impl->nodes[static_cast<size_t>(r)];
        if (slot.agent)
          return make_error(errc::failed_precondition,
                            "process rank " + std::to_string(r) + " registered twice (already " + slot.describe() + ")");
        self->monitor(agent);
        slot.index = r;
        slot.hello = std::move(hello);
        slot.agent = agent;
        slot.id = agent.node();
        ++impl->registered;
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
    *exit_code = 1;
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
  return with_context(err, where);
}

void Runtime::remember(caf::actor a) {
  std::lock_guard<std::mutex> guard{impl_->mx};
  impl_->spawned.push_back(std::move(a));
}

void Runtime::post(detail::CallThunk thunk) { caf::anon_send(impl_->caller, std::move(thunk)); }

caf::actor Runtime::service(const std::string& name) const {
  std::lock_guard<std::mutex> guard{impl_->mx};
  auto i = impl_->services.find(name);
  return i == impl_->services.end() ? caf::actor{} : i->second;
}

void Runtime::set_service(const std::string& name, caf::actor a) {
  std::lock_guard<std::mutex> guard{impl_->mx};
  impl_->services[name] = std::move(a);
}

void Runtime::shutdown() {
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
    caf::anon_send_exit(impl_->caller, caf::exit_reason::user_shutdown);
    if (impl_->rendezvous) caf::anon_send_exit(impl_->rendezvous, caf::exit_reason::user_shutdown);
    std::lock_guard<std::mutex> guard{impl_->mx};
    impl_->caller = nullptr;
    impl_->rendezvous = nullptr;
    for (auto& n : impl_->nodes) n.agent = nullptr;
  }
  sys_.reset();  // waits for every actor of this process
}

// -- entry points -----------------------------------------------------------

Result<std::unique_ptr<Runtime>> initialize(Options opts) {
  if (auto ok = opts.validate(); !ok) return with_context(ok.error(), "invalid options");
  if (opts.mode == Mode::remote)
    return make_error(errc::unimplemented,
                      "remote mode (attaching to a running `glint serve` deployment) is not built yet; "
                      "use local or cluster mode");
  if (opts.mode == Mode::cluster && opts.cluster.rank != 0)
    return make_error(errc::failed_precondition,
                      "this is process " + std::to_string(opts.cluster.rank) +
                          " of a cluster job, a node process: call glint::run_main (or glint::serve_node) so it "
                          "hosts actors for the driver");
  set_max_tensor_bytes(opts.max_message_bytes);
  std::unique_ptr<Runtime> rt{new Runtime(opts)};
  auto impl = std::make_shared<Runtime::Impl>();
  rt->impl_ = impl;
  rt->cfg_ = make_config(opts);
  rt->sys_ = std::make_unique<caf::actor_system>(*rt->cfg_);
  int world = opts.mode == Mode::cluster ? opts.cluster.world_size : 1;
  impl->nodes.resize(static_cast<size_t>(world));
  for (int i = 0; i < world; ++i) impl->nodes[static_cast<size_t>(i)].index = i;
  impl->nodes[0].hello = self_hello(opts.cluster);
  impl->nodes[0].id = rt->sys_->node();
  impl->registered = 1;
  impl->caller = rt->sys_->spawn(caller_fn);
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
  set_max_tensor_bytes(opts.max_message_bytes);
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
    self->request(*driver, opts.connect_timeout, join_atom::value, hello, agent)
        .receive([](int) {}, [&](caf::error& e) { err = describe(e); });
    if (!err.empty()) {
      caf::anon_send_exit(agent, caf::exit_reason::user_shutdown);
      return fail("the driver refused this node: " + err);
    }
    // Serve until the agent stops: the driver said so, or the driver is gone.
    self->receive([](const caf::down_msg&) {});
    // CAF's actor_system waits at exit until every detached actor is released.
    // Now and then (about 1 run in 20 under load) a remote-spawned actor stays
    // referenced inside CAF after its connection closed, and the wait never
    // ends. A node process must not outlive its job: give the actors a few
    // seconds, then leave with the code we would have returned anyway.
    std::thread([exit_code, rank = opts.cluster.rank] {
      std::this_thread::sleep_for(5s);
      std::fprintf(stderr, "glint: node %d: actors still held 5 s after shutdown; exiting without waiting for them\n",
                   rank);
      std::_Exit(*exit_code);
    }).detach();
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
  (*rt)->shutdown();
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
