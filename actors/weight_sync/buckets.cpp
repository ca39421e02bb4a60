#include "actors/weight_sync/buckets.hpp"

#include "actors/sampler.hpp"
#include "runtime/dispatch.hpp"

#include <caf/scoped_actor.hpp>

#include <chrono>

namespace glint::actors::weight_sync {

// The requests go from a scoped actor: an awaited request's timeout would
// hold the rank itself in CAF's clock until it fired, and its thread could
// not end at shutdown. It blocks this rank's own thread (model ranks are
// detached), so the rank serves nothing else meanwhile and the live weights
// that local-mode buckets share cannot change under them.
Pusher::Pusher(caf::actor_system& sys, WeightPush push)
    : me_(std::make_unique<caf::scoped_actor>(sys)), push_(std::move(push)) {}
Pusher::~Pusher() = default;

Result<void> Pusher::check(const WeightPush& push) {
  if (push.samplers.empty() || push.bucket_bytes < 1 || push.timeout_ms < 1)
    return make_error(errc::invalid_argument, "push_weights needs samplers, bucket_bytes >= 1 and a timeout >= 1 ms");
  // A bucket is one message: it must fit what the samplers' processes accept.
  const auto limit = max_message_bytes();
  if (static_cast<uint64_t>(push.bucket_bytes) > limit)
    return make_error(errc::invalid_argument, "bucket_bytes " + std::to_string(push.bucket_bytes) +
                                                  " exceeds the message limit of " + std::to_string(limit) +
                                                  " bytes (Options::max_message_bytes); lower it");
  return {};
}

namespace {

// Every weight fits a message (a bucket of its own at most).
Result<void> check_sizes(const NamedTensors& weights) {
  const auto limit = max_message_bytes();
  for (const auto& [name, t] : weights)
    if (t.nbytes() > limit)
      return make_error(errc::resource_exhausted, "weight " + name + " (" + std::to_string(t.nbytes()) +
                                                      " bytes) exceeds the message limit of " + std::to_string(limit) +
                                                      " bytes (Options::max_message_bytes); raise it, or sync with "
                                                      "the stream transport");
  return {};
}

}  // namespace

Result<void> Pusher::send(const NamedTensors& bucket, bool last) {
  if (auto ok = check_sizes(bucket); !ok) return ok;
  auto& me = *me_;
  const auto timeout = std::chrono::milliseconds{push_.timeout_ms};
  caf::error failed;
  size_t failed_at = 0;
  // Fan out to every sampler first, then collect: the samplers stage in parallel.
  auto fan_out = [&](auto send) {
    using Handle = decltype(send(std::declval<const sampler_actor&>()));
    std::vector<Handle> handles;
    for (const auto& a : push_.samplers) handles.push_back(send(caf::actor_cast<sampler_actor>(a)));
    for (size_t s = 0; s < handles.size(); ++s)
      handles[s].receive([](bool) {},
                         [&](caf::error& e) {
                           if (!failed) failed = std::move(e), failed_at = s;
                         });
  };
  if (last)
    fan_out([&](const sampler_actor& to) {
      return me->request(to, timeout, update_weights_atom::value, bucket, push_.update);
    });
  else
    fan_out([&](const sampler_actor& to) {
      return me->request(to, timeout, stage_weights_atom::value, bucket, push_.update.version);
    });
  ++buckets_;
  if (failed)
    return with_context(failed, "push_weights: sampler " + std::to_string(failed_at) + " of " +
                                    std::to_string(push_.samplers.size()) + ", bucket " + std::to_string(buckets_) +
                                    (last ? " (the last)" : ""));
  tensors_ += static_cast<int64_t>(bucket.size());
  bytes_ += static_cast<int64_t>(glint::detail::payload_bytes(bucket));
  return {};
}

Metrics Pusher::report() const {
  return Metrics{{"tensors", static_cast<double>(tensors_)},
                 {"buckets", static_cast<double>(buckets_)},
                 {"bytes", static_cast<double>(bytes_)}};
}

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
  if (auto ok = Pusher::check(push); !ok) return ok.error();
  if (auto ok = check_sizes(weights); !ok) return ok.error();  // before any bucket goes
  auto buckets = buckets_of(std::move(weights), push.bucket_bytes);
  if (!buckets) return buckets.error();
  Pusher p{sys, push};
  for (size_t k = 0; k < buckets->size(); ++k)
    if (auto ok = p.send((*buckets)[k], k + 1 == buckets->size()); !ok) return ok.error();
  return p.report();
}

}  // namespace glint::actors::weight_sync
