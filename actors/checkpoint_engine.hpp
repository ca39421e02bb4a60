#pragma once
/// The checkpoint engine: moves the weights a model group trains to the
/// sampler group that generates with them, as Twinkle's
/// CheckpointEngineManager does between steps of an RL loop:
///
///   actors::CheckpointEngine ckpt{model.with_adapter("default"), sampler};
///   auto report = ckpt.sync_weights({.merge_and_sync = true});
///   // report->version, bytes, buckets, seconds; every sampled sequence then
///   // reports weight_version == report->version
///
/// What goes is what the ModelGroup handle trains: every base weight (the
/// full model), one adapter's LoRA tensors (model.with_adapter(name); the
/// samplers must have that adapter: add_adapter), or with
/// merge_and_sync the base with the adapter folded in, for samplers without
/// LoRA. Model rank 0 exports (ranks of a data-parallel group hold the same
/// weights); the tensors travel in buckets of about bucket_bytes, each
/// staged on every sampler rank, and the last applies them all at once
/// under one version, so no sequence ever sees half an update.
///
/// Transport: in one process nothing is serialised: the model exports its
/// live weights (no copy) and each sampler copies them once into its own.
/// Across processes the buckets are actor messages, or, with the
/// collective transport, model rank 0 and the sampler ranks form a c10d
/// group (Gloo on CPU; made at the first sync, kept after) and the weights
/// are broadcast in flat buckets, each sampler applying them at the end as
/// one version.
///
/// Not thread-safe: one driver calls it. A failed sync leaves the samplers
/// on their previous weights and version (what it staged is never applied:
/// staged buckets carry their version).

#include "actors/model_group.hpp"
#include "actors/sampler_group.hpp"
#include "components/sampler/params.hpp"

#include <chrono>
#include <cstdint>
#include <string>

namespace glint::actors {

/// How the weights travel.
enum class SyncTransport : uint8_t {
  /// Messages within one process (no copy); across processes the
  /// collective between GPU ranks (where NCCL wins), else the stream, which
  /// on CPU measured 2.3x the messages and 2.8x Gloo (docs/rl.md).
  automatic,
  /// Buckets as actor messages (no copy in one process; CAF's serialisation
  /// across processes).
  messages,
  /// A c10d broadcast from model rank 0 to the sampler ranks.
  collective,
  /// Raw bytes down a TCP socket from model rank 0 to each sampler rank,
  /// into tensors allocated from the manifest (actors/weight_sync/stream.hpp).
  stream,
};
std::string_view to_string(SyncTransport t);
/// "auto", "messages", "collective" or "stream".
Result<SyncTransport> parse_sync_transport(std::string_view name);

struct SyncOptions {
  bool merge_and_sync = false;  ///< with an adapter: send the base with it folded in
  int64_t bucket_bytes = int64_t{256} << 20;
  /// What happens to requests in flight: finish on the old weights, or stop now.
  components::UpdatePolicy policy = components::UpdatePolicy::finish_old;
  SyncTransport transport = SyncTransport::automatic;
  /// The collective's store, hosted by model rank 0. Empty: the address of
  /// model rank 0's node as the runtime knows it (its route to the driver;
  /// loopback on one machine). The port is picked on the driver's machine
  /// at the first sync: a job on several machines sets a port free on the
  /// model's.
  std::string store_host{};
  int32_t store_port = 0;
};

struct SyncReport {
  int64_t version = 0;
  int64_t tensors = 0;
  int64_t buckets = 0;
  int64_t bytes = 0;      ///< of the weights sent (per sampler rank)
  SyncTransport transport = SyncTransport::messages;  ///< the one used (never automatic)
  double seconds = 0;     ///< export to last apply
  double gbps() const { return seconds > 0 ? static_cast<double>(bytes) / seconds / 1e9 : 0; }
};

class CheckpointEngine {
public:
  /// Syncs what `model` trains (its adapter, or the full model) to `sampler`:
  /// an adapter goes into the sampler's adapter of the same name, or into
  /// the one `sampler` names (with_adapter), of the same shape.
  CheckpointEngine(ModelGroup model, SamplerGroup sampler) : model_(std::move(model)), sampler_(std::move(sampler)) {}

  /// Errors: bad options (bucket_bytes < 1, merge without an adapter), an
  /// unknown adapter, a sampler that refuses the weights (names, shapes; it
  /// names them), a rank that is gone. Groups of a remote server: the server
  /// syncs its own groups (default options only); other groups that are
  /// not actor groups of this runtime are `unimplemented`.
  Result<SyncReport> sync_weights(const SyncOptions& options = {});
  /// The version the last successful sync gave the samplers (0: none yet).
  /// Versions grow by one per sync; a failed sync's number is skipped.
  int64_t version() const { return version_; }

private:
  /// Where the other processes reach model rank 0 (loopback without a runtime).
  std::string model_node_address(const Group<model_actor>& model) const;
  /// One sync to the ranks of `sampler` (the live ones).
  Result<SyncReport> sync_to(const Group<model_actor>& model, const Group<sampler_actor>& sampler, const SyncOptions& o);
  Result<SyncReport> by_messages(const Group<model_actor>& model, const Group<sampler_actor>& sampler,
                                 const SyncOptions& options, SyncReport r);
  Result<SyncReport> by_collective(const Group<model_actor>& model, const Group<sampler_actor>& sampler,
                                   const SyncOptions& options, SyncReport r);
  Result<SyncReport> by_stream(const Group<model_actor>& model, const Group<sampler_actor>& sampler,
                               const SyncOptions& options, SyncReport r);

  /// The sampler adapter an adapter's weights go into.
  std::string target() const { return sampler_.adapter().empty() ? model_.adapter() : sampler_.adapter(); }

  ModelGroup model_;
  SamplerGroup sampler_;
  int64_t version_ = 0;
  int64_t attempts_ = 0;  ///< versions handed out, failed syncs included
  int32_t store_port_ = 0;  ///< of the collective, once made
};

}  // namespace glint::actors
