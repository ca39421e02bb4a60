#pragma once
/// The probe actor: a small diagnostic component that every glint program
/// can spawn on any node. `glint bench actors` measures the transport with
/// it, `glint info --probe` uses it to see where ranks landed, and tests use
/// it as the accumulate/echo component that must behave the same in local
/// and cluster mode.
///
/// State: a running f32 sum (`accumulate`). Handlers never throw; bad input
/// gets an error and the actor keeps serving.

#include "runtime/batch.hpp"
#include "runtime/registry.hpp"
#include "runtime/tensor.hpp"
#include "runtime/types.hpp"

#include <caf/replies_to.hpp>
#include <caf/stateful_actor.hpp>
#include <caf/typed_actor.hpp>
#include <caf/typed_event_based_actor.hpp>

#include <cstdint>
#include <vector>

namespace glint::actors {

using echo_atom = caf::atom_constant<caf::atom("echo")>;
using accumulate_atom = caf::atom_constant<caf::atom("accumulate")>;
using sum_atom = caf::atom_constant<caf::atom("sum")>;
using sleep_atom = caf::atom_constant<caf::atom("sleep")>;
using where_atom = caf::atom_constant<caf::atom("where")>;
using fail_atom = caf::atom_constant<caf::atom("fail")>;

/// Where a probe runs.
struct ProbeInfo {
  RankContext ctx;
  int32_t pid = 0;
  std::string host;
  std::vector<int> bound_cpus;  ///< cpus the actor's thread may run on
  friend bool operator==(const ProbeInfo&, const ProbeInfo&) = default;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, ProbeInfo& x) {
  return f(caf::meta::type_name("glint.probe_info"), x.ctx, x.pid, x.host, x.bound_cpus);
}

using probe_actor = caf::typed_actor<
    /// Answers the number it was given.
    caf::replies_to<echo_atom, int64_t>::with<int64_t>,
    /// Answers the tensor it was given (a transport round trip of its bytes).
    caf::replies_to<echo_atom, Tensor>::with<Tensor>,
    /// Answers the batch it was given.
    caf::replies_to<echo_atom, Batch>::with<Batch>,
    /// Adds an f32 tensor into the running sum and answers the sum so far.
    caf::replies_to<accumulate_atom, Tensor>::with<Tensor>,
    /// Answers the sum of the values.
    caf::replies_to<sum_atom, std::vector<int64_t>>::with<int64_t>,
    /// Sleeps for the given milliseconds (blocking its own thread), then answers them.
    caf::replies_to<sleep_atom, int64_t>::with<int64_t>,
    /// Answers where this rank runs.
    caf::replies_to<where_atom>::with<ProbeInfo>,
    /// Always answers with an `aborted` error carrying the given text.
    caf::replies_to<fail_atom, std::string>::with<int64_t>>;

/// The registered type name: a probe on a thread of its own, bound to its
/// rank's cpus (as compute components run).
inline constexpr const char* probe_type = "glint.probe";
/// The same probe on CAF's shared scheduler (as cheap, message-bound
/// components run): the lowest call latency, no cpu binding.
inline constexpr const char* probe_scheduled_type = "glint.probe.scheduled";

probe_actor::behavior_type probe(probe_actor::stateful_pointer<Tensor> self, RankContext ctx);

GLINT_REGISTRATIONS(probe);

}  // namespace glint::actors
