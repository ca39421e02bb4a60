#pragma once
/// `glint serve`'s core: one base model (a model group and a sampler group,
/// placed as in any job) served to many tenants over Cap'n Proto RPC
/// (glint.capnp). Each tenant, authenticated by an API key (rpc/keys.hpp),
/// owns LoRA adapters on the shared base, with their optimizers, schedules
/// and losses; its names are its own (the groups hold them as
/// "<tenant>:<name>"), so no call can name, read or change another
/// tenant's. Every field of every message is validated here before it
/// reaches an actor.
///
///   auto server = rpc::Server::start(rt, config);   // listening when it returns
///   std::printf("port %d\n", (*server)->port());
///   (*server)->shutdown();                          // calls in flight finish first
///
/// Threads: one I/O thread runs KJ's event loop (the listener, every
/// connection, every call's bookkeeping); the groups' actors run on CAF's
/// threads and answer through cross-thread fulfillers. A tenant's calls run
/// in the order they arrive; a weight sync is a barrier for the calls after
/// it. The base model is never trained: a call that would change it
/// (training with no adapter) is refused with permission_denied.

#include "actors/model_group.hpp"
#include "actors/sampler_group.hpp"
#include "rpc/serve_config.hpp"
#include "runtime/runtime.hpp"

#include <cstdint>
#include <memory>
#include <string>

namespace glint::rpc {

class Server {
public:
  /// Validates the config, spawns the groups, opens the key store and
  /// listens. Errors: a bad config, a base model that does not load, a
  /// port in use, unreadable TLS files.
  static Result<std::unique_ptr<Server>> start(Runtime& rt, ServeConfig config);
  ~Server();

  /// The port it listens on (the configured one, or the one picked for 0).
  int port() const;
  /// The port of the Prometheus endpoint, or -1 without one.
  int metrics_port() const;
  /// The port of the Tinker-compatible HTTP API, or -1 without one.
  int tinker_port() const;
  /// The shared model group itself, called without the gateway: what
  /// benchmarks and tests compare remote calls with (the same actors on
  /// the same cores). Adapter names without a ':' are nobody's tenant's.
  const actors::ModelGroup& model_group() const;
  const actors::SamplerGroup& sampler_group() const;
  /// The base model's fingerprint (rpc/fingerprint.hpp).
  const std::string& fingerprint() const;
  /// Stops accepting, lets calls in flight finish (up to `grace`; the rest
  /// fail with unavailable), closes every connection. Idempotent.
  void shutdown(std::chrono::milliseconds grace = std::chrono::seconds(30));

  struct Impl;

private:
  explicit Server(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace glint::rpc
