#pragma once
/// `glint::Runtime`: the actor system of one driver process, in local or
/// cluster mode, and the entry points that start it.
///
/// Local mode: every actor lives in this process. Cluster mode: this process
/// (process rank 0) is the driver and node 0; the other processes of the job,
/// started by `glint run`, torchrun or srun from the same binary, call
/// `serve_node` (through `run_main`), register with the driver over CAF's
/// middleman and host the actors the driver spawns on them with
/// `remote_spawn`. Handles to actors are the same type in both modes, so the
/// same driver code runs in either.
///
/// Ownership: the Runtime owns the CAF actor system and every actor spawned
/// through it. `shutdown()` (also run by the destructor) stops all of them and
/// releases the node processes; CAF waits for every actor at exit, so nothing
/// spawned through glint can make the process hang. Thread-safe: calls may come
/// from any thread.

#include "runtime/error.hpp"
#include "runtime/future.hpp"
#include "runtime/options.hpp"
#include "runtime/registry.hpp"
#include "runtime/remote.hpp"
#include "runtime/types.hpp"

#include <caf/actor.hpp>
#include <caf/actor_cast.hpp>
#include <caf/actor_system.hpp>
#include <caf/io/middleman.hpp>
#include <caf/message.hpp>
#include <caf/node_id.hpp>

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace glint {

/// One process of the job as the driver sees it.
struct NodeInfo {
  int index = 0;  ///< process rank; 0 is the driver
  NodeHello hello;
  caf::node_id id;
  caf::actor agent;        ///< the node's agent (invalid for node 0)
  bool lost = false;       ///< the process exited or its connection broke
  std::string lost_reason;
  int restarts = 0;        ///< times a restarted process took this rank's place
  /// "node 1 (host, pid 4242)".
  std::string describe() const;
};

namespace detail {
/// Receives the answers to a set of requests (one per slot).
class Replies {
public:
  virtual ~Replies() = default;
  /// The answer to the request of `slot`: the reply message, or why there is
  /// none. Called once per slot, on whichever thread completed the request.
  virtual void answer(size_t slot, caf::expected<caf::message>&& answer) = 0;
};

/// Where the answer to one request goes.
struct Reply {
  std::shared_ptr<Replies> to;
  size_t slot = 0;
  void operator()(caf::expected<caf::message>&& answer) const { to->answer(slot, std::move(answer)); }
};
/// Undoes, at scope end, what CAF leaves on a thread that is not its own
/// when that thread spawns or makes a scoped actor: CAF 0.17 keeps a
/// reference to its logger in a thread-local of every such thread, and
/// ~actor_system waits for the logger to be destroyed, so a runtime shut
/// down on another thread than one that spawned waited, forever, for that
/// thread to end. A CAF thread (a scheduler worker, an actor's own) keeps its
/// reference. Every such entry of glint's on a caller's thread holds one.
class CallerThreadScope {
public:
  CallerThreadScope();
  ~CallerThreadScope();
  CallerThreadScope(const CallerThreadScope&) = delete;
  CallerThreadScope& operator=(const CallerThreadScope&) = delete;

private:
  bool caf_thread_;
};
}  // namespace detail

class Runtime {
public:
  ~Runtime();
  Runtime(const Runtime&) = delete;
  Runtime& operator=(const Runtime&) = delete;

  Mode mode() const { return opts_.mode; }
  const Options& options() const { return opts_; }
  caf::actor_system& system() { return *sys_; }
  /// Remote mode: the connection to the server (runtime/remote.hpp); null
  /// in local and cluster mode, and after shutdown.
  RemoteAttachment* remote() const { return remote_.get(); }

  /// Processes in the job (1 in local mode).
  int num_nodes() const;
  NodeInfo node(int index) const;
  std::vector<NodeInfo> nodes() const;
  /// The node index of a CAF node id, or -1.
  int node_of(const caf::node_id& id) const;

  /// Spawns an actor of registered type `type` on node `node` (locally, or
  /// with CAF's remote_spawn). `args` are the arguments after the actor's
  /// `self` (a RankContext first, for glint actors). The interface of the
  /// registered type must match `Handle`.
  template <class Handle>
  Result<Handle> spawn(int node, const std::string& type, caf::message args) {
    auto target = prepare_spawn(node, type);
    if (!target) return target.error();
    caf::expected<Handle> res{Handle{}};
    detail::CallerThreadScope on_caller;
    if (node == 0)
      res = sys_->spawn<Handle>(type, std::move(args));
    else
      res = sys_->middleman().remote_spawn<Handle>(target->id, type, std::move(args),
                                                   caf::duration{opts_.spawn_timeout});
    if (!res) return spawn_failed(*target, type, res.error());
    remember(caf::actor_cast<caf::actor>(*res));
    return res;
  }

  /// Sends `msg` to `target` as a request. `reply` is answered exactly once: with
  /// the answer; with the error the target answered; with `deadline_exceeded`
  /// once `timeout` has passed; with `unavailable` as soon as the target is
  /// known dead. The answer is handed over on the thread that delivered it (no
  /// hop through another actor) and a timeout costs no timer per call, so a
  /// call costs about as much as CAF's raw message delivery. Thread-safe.
  void request(const caf::strong_actor_ptr& target, caf::message msg, std::chrono::milliseconds timeout,
               detail::Reply reply);

  /// Named service actors of upper layers (e.g. "placement"), so they live
  /// and die with this runtime. A null `a` stops and forgets the service:
  /// the next use starts it afresh.
  caf::actor service(const std::string& name) const;
  void set_service(const std::string& name, caf::actor a);

  /// How many actors this runtime has spawned so far: a mark for
  /// `stop_spawned_since`.
  size_t spawned_mark() const;
  /// Stops every actor spawned since `mark` and forgets them: one stretch
  /// of a driver (a try of a run that starts again) ends without the
  /// runtime. Their groups' calls fail as for a stopped actor; a lost
  /// node's actors are gone already.
  void stop_spawned_since(size_t mark);

  /// Stops every actor, releases node processes, waits for them. Idempotent.
  void shutdown();

  struct Impl;

private:
  Result<NodeInfo> prepare_spawn(int node, const std::string& type);
  caf::error spawn_failed(const NodeInfo& node, const std::string& type, const caf::error& err);
  void remember(caf::actor a);

  friend Result<std::unique_ptr<Runtime>> initialize(Options opts);
  explicit Runtime(Options opts);
  Options opts_;
  std::unique_ptr<caf::actor_system_config> cfg_;
  std::unique_ptr<caf::actor_system> sys_;
  std::shared_ptr<Impl> impl_;
  std::shared_ptr<RemoteAttachment> remote_;
};

/// Starts the driver's runtime. In cluster mode (process rank 0) it listens on
/// the master port and waits, up to `connect_timeout`, for every node process
/// to register; the error lists the ones that did not. In remote mode it
/// starts a local runtime (for client-side actors such as dataloaders) and
/// connects to the server at `remote_endpoint` with `remote_api_key`
/// (GLINT_REMOTE_URL, GLINT_API_KEY), through the rpc layer: a program not
/// linked with glint::rpc gets `unimplemented`. In a node process
/// (rank > 0) this is `failed_precondition`: use `run_main` or `serve_node`.
Result<std::unique_ptr<Runtime>> initialize(Options opts = {});

/// Runs a node process: registers with the driver and hosts the actors it
/// spawns here until the driver shuts down (exit code 0) or is lost (1).
int serve_node(const Options& opts);

/// The usual `main` of a glint driver: reads Options from the environment
/// (cluster mode when started by `glint run`), serves as a node process when
/// this process is not rank 0, else starts the runtime and calls `driver`.
/// `configure` may adjust the options first. Returns the exit code.
int run_main(std::function<int(Runtime&)> driver, std::function<void(Options&)> configure = {});

}  // namespace glint

