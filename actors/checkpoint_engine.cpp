#include "actors/checkpoint_engine.hpp"

namespace glint::actors {

Result<SyncReport> CheckpointEngine::sync_weights(const SyncOptions& o) {
  if (o.bucket_bytes < 1)
    return make_error(errc::invalid_argument, "bucket_bytes must be at least 1, not " + std::to_string(o.bucket_bytes));
  if (o.merge_and_sync && o.adapter.empty())
    return make_error(errc::invalid_argument, "merge_and_sync needs the adapter to fold into the base weights");
  if (o.policy != "finish_old" && o.policy != "abort")
    return make_error(errc::invalid_argument, "update policy '" + o.policy + "' is neither finish_old nor abort");
  const auto start = std::chrono::steady_clock::now();
  auto weights = model_.call<Collect::first>(Dispatch::first, export_for_sync_atom::value, o.adapter, o.merge_and_sync).get();
  if (!weights) return with_context(weights.error(), "sync_weights: exporting from the model group");
  SyncReport r;
  r.version = ++attempts_;  // never reused: a failed sync's staged buckets keep their version
  r.tensors = static_cast<int64_t>(weights->names.size());
  const std::string target = o.merge_and_sync ? std::string{} : o.adapter;
  // Buckets in export order; a tensor larger than a bucket is a bucket of its own.
  NamedTensorList bucket;
  int64_t bucket_bytes = 0;
  auto send = [&](bool last) -> Result<void> {
    ++r.buckets;
    auto done = last ? sampler_.call<Collect::first>(Dispatch::all, update_weights_atom::value, bucket, target,
                                                     r.version, o.policy)
                           .get()
                     : sampler_.call<Collect::first>(Dispatch::all, stage_weights_atom::value, bucket, r.version)
                           .get();
    bucket = {};
    bucket_bytes = 0;
    if (!done) return with_context(done.error(), "sync_weights: bucket " + std::to_string(r.buckets) + " of version " +
                                                     std::to_string(r.version));
    return {};
  };
  for (size_t i = 0; i < weights->names.size(); ++i) {
    const auto bytes = static_cast<int64_t>(weights->tensors[i].nbytes());
    if (bucket_bytes > 0 && bucket_bytes + bytes > o.bucket_bytes)
      if (auto ok = send(false); !ok) return ok.error();
    bucket.names.push_back(std::move(weights->names[i]));
    bucket.tensors.push_back(std::move(weights->tensors[i]));
    bucket_bytes += bytes;
    r.bytes += bytes;
  }
  if (auto ok = send(true); !ok) return ok.error();
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  version_ = r.version;
  return r;
}

}  // namespace glint::actors
