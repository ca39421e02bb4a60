#include "actors/probe.hpp"

#include "runtime/affinity.hpp"

#include <caf/stateful_actor.hpp>
#include <caf/typed_event_based_actor.hpp>

#include <unistd.h>

#include <numeric>
#include <thread>

namespace glint::actors {

probe_actor::behavior_type probe(probe_actor::stateful_pointer<Tensor> self, RankContext ctx) {
  return {
      [](echo_atom, int64_t x) { return x; },
      [](echo_atom, Tensor& t) { return t; },
      [](echo_atom, Batch& b) { return b; },
      [self](accumulate_atom, const Tensor& t) -> caf::result<Tensor> {
        if (t.dtype() != Dtype::f32)
          return make_error(errc::invalid_argument, "accumulate takes f32 tensors, got " + t.describe());
        auto& sum = self->state;
        if (!sum.defined()) {
          sum = t.clone();
          return sum.clone();
        }
        if (sum.shape() != t.shape())
          return make_error(errc::invalid_argument,
                            "accumulate got " + t.describe() + " but the running sum is " + sum.describe());
        auto dst = sum.mutable_values<float>();
        auto src = t.values<float>();
        if (!dst) return dst.error();
        if (!src) return src.error();
        for (size_t i = 0; i < dst->size(); ++i) (*dst)[i] += (*src)[i];
        // Answer a copy: the caller must not see later additions.
        return sum.clone();
      },
      [](sum_atom, const std::vector<int64_t>& xs) { return std::accumulate(xs.begin(), xs.end(), int64_t{0}); },
      [](sleep_atom, int64_t ms) -> caf::result<int64_t> {
        if (ms < 0 || ms > 600'000)
          return make_error(errc::invalid_argument, "sleep takes 0 to 600000 ms, got " + std::to_string(ms));
        std::this_thread::sleep_for(std::chrono::milliseconds(ms));
        return ms;
      },
      [ctx](where_atom) {
        ProbeInfo info;
        info.ctx = ctx;
        info.pid = static_cast<int32_t>(getpid());
        char host[256] = {0};
        gethostname(host, sizeof(host) - 1);
        info.host = host;
        info.bound_cpus = current_thread_cpus();
        return info;
      },
      [](fail_atom, const std::string& why) -> caf::result<int64_t> { return make_error(errc::aborted, why); },
  };
}

GLINT_DEFINE_REGISTRATIONS(probe, types) {
  types.add_message_type<ProbeInfo>("glint.probe_info");
  types.add(probe_type, probe);
  types.add(probe_scheduled_type, probe, ActorOptions{.detached = false});
}

}  // namespace glint::actors
