#pragma once
/// The messages transport of a weight sync: model rank 0 cuts its weights
/// into buckets of about bucket_bytes and sends each to every sampler rank
/// as an actor message (stage_weights; the last one update_weights), so no
/// message holds all the weights and none passes through the driver
/// (actors' own; the model actor's push_weights runs it).

#include "actors/model.hpp"

#include <caf/actor_system.hpp>
#include <caf/scoped_actor.hpp>

#include <memory>

#include <vector>

namespace glint::actors::weight_sync {

/// `weights` in buckets of about `bucket_bytes`, in order; a tensor larger
/// than a bucket is a bucket of its own. An error for bucket_bytes < 1.
Result<std::vector<NamedTensors>> buckets_of(NamedTensors weights, int64_t bucket_bytes);

/// Sends `weights` to the sampler ranks of `push` in buckets: bucket k to
/// all of them, then, once all answered, bucket k + 1. Blocks the calling
/// thread (a detached model rank's), so the live weights local-mode buckets
/// share cannot change meanwhile. Answers tensors, buckets and bytes (per
/// sampler). Errors: bad options; a bucket_bytes or a weight above the
/// message limit (Options::max_message_bytes: a bucket is one message); the
/// first sampler that refuses, named with its bucket.
Result<Metrics> push(caf::actor_system& sys, const WeightPush& push, NamedTensors weights);

/// The same a bucket at a time, for weights that come so (a model cut over
/// its ranks gathers them piece by piece: Trainer::stream_parameters).
class Pusher {
public:
  /// The options' errors, before anything is gathered.
  static Result<void> check(const WeightPush& push);
  Pusher(caf::actor_system& sys, WeightPush push);
  ~Pusher();
  /// `bucket` to every sampler (stage_weights; the last as update_weights),
  /// returning once all answered; the first refusal, named with its bucket.
  Result<void> send(const NamedTensors& bucket, bool last);
  /// Tensors, buckets and bytes sent (per sampler).
  Metrics report() const;

private:
  std::unique_ptr<caf::scoped_actor> me_;
  WeightPush push_;
  int64_t tensors_ = 0, buckets_ = 0, bytes_ = 0;
};

}  // namespace glint::actors::weight_sync
