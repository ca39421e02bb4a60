#pragma once
/// The messages transport of a weight sync: model rank 0 cuts its weights
/// into buckets of about bucket_bytes and sends each to every sampler rank
/// as an actor message (stage_weights; the last one update_weights), so no
/// message holds all the weights and none passes through the driver
/// (actors' own; the model actor's push_weights runs it).

#include "actors/model.hpp"

#include <caf/actor_system.hpp>

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

}  // namespace glint::actors::weight_sync
