#pragma once
/// `glint bench sync`: how fast the checkpoint engine moves weights from a
/// model group to a sampler group (actors::CheckpointEngine::sync_weights,
/// full weights in 256 MiB buckets), for Qwen3 models of about 30M and 300M
/// parameters, against the ceiling of one memcpy of the same bytes measured
/// in the same run.
///
/// Prints `name: value` lines: memcpy_gbps, then per model size
/// weight_sync_gbps_<size> and weight_sync_vs_memcpy_<size> (local mode,
/// one model rank and one sampler rank in this process), and with --mode
/// cluster or all, the sampler in a second process, the model rank sending
/// to it directly: weight_sync_cluster_messages_gbps_<size> (buckets as
/// actor messages), weight_sync_cluster_c10d_gbps_<size> (a Gloo broadcast),
/// weight_sync_cluster_gbps_<size> (the faster), then tcp_loopback_gbps (the
/// biggest model's bytes over a bare socket between two processes, the
/// baseline) and weight_sync_cluster_vs_tcp_<size>. GB/s counts the weight
/// bytes once (f32) over the seconds from export to the last apply.

#include <string>

namespace glint::bench {

struct SyncBenchArgs {
  int repeats = 5;              ///< timed syncs per size (the median is printed)
  std::string mode = "local";   ///< local, cluster or all
  bool small = false;           ///< ~1M and ~5M parameters instead, for a quick smoke run
};

int sync(const SyncBenchArgs& args);

}  // namespace glint::bench
