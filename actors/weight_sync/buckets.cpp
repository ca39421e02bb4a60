#include "actors/weight_sync/buckets.hpp"

#include "actors/sampler.hpp"
#include "runtime/dispatch.hpp"

#include <caf/scoped_actor.hpp>

#include <chrono>

namespace glint::actors::weight_sync {

namespace {

// Sends `buckets` to every sampler of `push`: bucket k to all of them, then,
// once all answered, bucket k + 1 (the last as update_weights). It blocks
// this rank's own thread (model ranks are detached), so the rank serves
// nothing else meanwhile and the live weights that local-mode buckets share
// cannot change under them. The requests go from a scoped actor: an awaited
// request's timeout would hold the rank itself in CAF's clock until it fired,
// and its thread could not end at shutdown.
Result<void> push_buckets(caf::actor_system& sys, const WeightPush& push, const std::vector<NamedTensors>& buckets) {
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


}  // namespace

Result<std::vector<NamedTensors>> buckets_of(NamedTensors weights, int64_t bucket_bytes) {
  if (bucket_bytes < 1) return make_error(errc::invalid_argument, "bucket_bytes must be >= 1");
  std::vector<NamedTensors> buckets(1);
  int64_t filled = 0;
  for (auto& w : weights) {
    const auto bytes = static_cast<int64_t>(w.second.nbytes());
    if (filled > 0 && filled + bytes > bucket_bytes) {
      buckets.emplace_back();
      filled = 0;
    }
    buckets.back().push_back(std::move(w));
    filled += bytes;
  }
  return buckets;
}

Result<Metrics> push(caf::actor_system& sys, const WeightPush& push, NamedTensors weights) {
  if (push.samplers.empty() || push.bucket_bytes < 1 || push.timeout_ms < 1)
    return make_error(errc::invalid_argument, "push_weights needs samplers, bucket_bytes >= 1 and a timeout >= 1 ms");
  // A bucket is one message: it must fit what the samplers' processes accept.
  const auto limit = max_message_bytes();
  if (static_cast<uint64_t>(push.bucket_bytes) > limit)
    return make_error(errc::invalid_argument, "bucket_bytes " + std::to_string(push.bucket_bytes) +
                                                  " exceeds the message limit of " + std::to_string(limit) +
                                                  " bytes (Options::max_message_bytes); lower it");
  for (const auto& [name, t] : weights)
    if (t.nbytes() > limit)
      return make_error(errc::resource_exhausted, "weight " + name + " (" + std::to_string(t.nbytes()) +
                                                      " bytes) exceeds the message limit of " + std::to_string(limit) +
                                                      " bytes (Options::max_message_bytes); raise it, or sync with "
                                                      "the stream transport");
  const auto tensors = weights.size();
  const auto bytes = glint::detail::payload_bytes(weights);
  auto buckets = buckets_of(std::move(weights), push.bucket_bytes);
  if (!buckets) return buckets.error();
  if (auto ok = push_buckets(sys, push, *buckets); !ok) return ok.error();
  return Metrics{{"tensors", static_cast<double>(tensors)},
                 {"buckets", static_cast<double>(buckets->size())},
                 {"bytes", static_cast<double>(bytes)}};
}

}  // namespace glint::actors::weight_sync
