#pragma once
/// The actor types and message types a glint program can spawn and send,
/// by name. Every process of a job registers the same ones (cluster mode runs
/// the same binary everywhere), so a driver can spawn a rank by type name on
/// any node. Register before `initialize()`: with GLINT_REGISTER_ACTOR in the
/// actor's header, or, for a library's actors, with GLINT_REGISTRATIONS in the
/// header and GLINT_DEFINE_REGISTRATIONS in its .cpp (see below).
///
/// A glint actor is a function `behavior (Self self, RankContext ctx, Args...)`.
/// By default each rank runs on a thread of its own (CAF's detached actors),
/// bound to the cpus its placement chose, so a long compute step blocks
/// nothing else; `ActorOptions::detached = false` runs it on the shared
/// scheduler instead (for cheap, message-bound actors).

#include "runtime/affinity.hpp"
#include "runtime/types.hpp"

#include <caf/actor_factory.hpp>
#include <caf/actor_system_config.hpp>

#include <algorithm>
#include <functional>
#include <chrono>
#include <mutex>
#include <string>
#include <vector>

namespace glint {

struct ActorOptions {
  bool detached = true;
};

namespace detail {
/// Remembers every actor spawned through the registry in this process, so a
/// node can stop them all on shutdown.
void remember_local_actor(const caf::strong_actor_ptr& p);
/// Waits up to `limit` until no actor spawned through glint in this process
/// is referenced any more; whether none is.
bool await_local_actors_released(std::chrono::milliseconds limit);
std::vector<caf::actor_addr> local_actors();
}  // namespace detail

class ActorTypes {
public:
  /// The process-wide registry.
  static ActorTypes& global();

  template <class R, class Self, class... Args>
  void add(std::string name, R (*fn)(Self, RankContext, Args...), ActorOptions opts = {}) {
    auto wrapped = [fn, opts](Self self, RankContext ctx, Args... xs) -> R {
      // Runs on the actor's own thread before its first message. A scheduled
      // actor shares CAF's worker threads, so only a detached one is bound.
      if (opts.detached) (void)bind_current_thread(ctx.cpus);
      return fn(self, std::move(ctx), std::move(xs)...);
    };
    std::lock_guard<std::mutex> guard{mx_};
    if (std::find(names_.begin(), names_.end(), name) != names_.end()) return;
    names_.push_back(name);
    installers_.push_back([name, wrapped, opts](caf::actor_system_config& cfg) {
      using handle = typename caf::infer_handle_from_fun<decltype(wrapped)>::type;
      if constexpr (!std::is_same_v<handle, caf::actor>) cfg.add_message_type<handle>(name);
      auto inner = caf::make_actor_factory(wrapped);
      cfg.add_actor_factory(name, [inner, opts](caf::actor_config& ac, caf::message& msg) {
        if (opts.detached) ac.flags |= caf::abstract_actor::is_detached_flag;
        auto res = inner(ac, msg);
        if (res.first) detail::remember_local_actor(res.first);
        return res;
      });
    });
  }

  template <class T>
  void add_message_type(std::string name) {
    std::lock_guard<std::mutex> guard{mx_};
    if (std::find(type_names_.begin(), type_names_.end(), name) != type_names_.end()) return;
    type_names_.push_back(name);
    installers_.push_back([name](caf::actor_system_config& cfg) { cfg.add_message_type<T>(name); });
  }

  /// Installs everything registered into a CAF config.
  void install(caf::actor_system_config& cfg) const;

  bool contains(const std::string& name) const;
  std::vector<std::string> names() const;

private:
  mutable std::mutex mx_;
  std::vector<std::string> names_;
  std::vector<std::string> type_names_;
  std::vector<std::function<void(caf::actor_system_config&)>> installers_;
};

}  // namespace glint

#define GLINT_CONCAT_INNER(a, b) a##b
#define GLINT_CONCAT(a, b) GLINT_CONCAT_INNER(a, b)

/// Registers actor function `fn` under `name`. Use it in the header that
/// declares the actor, with a unique `id`: every program that includes the
/// header registers the type, before main, in every one of its processes.
#define GLINT_REGISTER_ACTOR(id, name, fn, ...)                                  \
  inline const bool glint_registered_actor_##id = [] {                           \
    ::glint::ActorTypes::global().add(name, fn __VA_OPT__(, ) __VA_ARGS__);      \
    return true;                                                                 \
  }()

/// Registers message type `T` under `name`, likewise from a header.
#define GLINT_REGISTER_MESSAGE_TYPE(id, T, name)                                 \
  inline const bool glint_registered_type_##id = [] {                            \
    ::glint::ActorTypes::global().add_message_type<T>(name);                     \
    return true;                                                                 \
  }()

/// The same guarantee with the registering code compiled once. The two macros
/// above instantiate CAF's spawning and serialisation machinery for each actor
/// and type in every file that includes the header; for the library's actors
/// that was most of the build's compile time (a driver that included them took
/// 57 s to compile, 23 s without). So a library header says only
///
///     GLINT_REGISTRATIONS(model);
///
/// and its .cpp, in the same namespace, registers:
///
///     GLINT_DEFINE_REGISTRATIONS(model, types) {
///       types.add_message_type<ModelSpec>("glint.model_spec");
///       types.add(model_type, model_shard);
///     }
///
/// Every program that includes the header still runs the registrations before
/// main: the header's inline variable calls the function, so the linker keeps
/// the .cpp's object even from a static library.
#define GLINT_REGISTRATIONS(id)                                                  \
  void glint_register_##id(::glint::ActorTypes& types);                          \
  inline const bool glint_registered_##id = (glint_register_##id(::glint::ActorTypes::global()), true)

/// Defines the function GLINT_REGISTRATIONS(id) declared; `types` names the
/// registry in its body.
#define GLINT_DEFINE_REGISTRATIONS(id, types) void glint_register_##id(::glint::ActorTypes& types)
