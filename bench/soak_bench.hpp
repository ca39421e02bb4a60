#pragma once
/// `glint bench serve-soak`: one `glint serve` core (in this process, its
/// Tinker API on loopback) and N tenants running what the Tinker SDK runs,
/// for a bounded time (10 minutes by default): each tenant's loop is a
/// training step (forward_backward as protobuf, optim_step, both futures
/// polled to their results), and every fourth step (--sample-every) save_weights_for_sampler
/// and a sample call of 4 completions. It prints:
///
///   soak_calls, soak_errors (goal 0), soak_p50_ms and soak_p99_ms (per SDK
///   call, future included), soak_rss_start_mib (after the warm-up: the
///   first tenth of the time, at least one loop of each tenant),
///   soak_rss_end_mib, soak_rss_growth (end over start, less 1; goal < 0.05),
///   soak_fds_start, soak_fds_end and soak_fds_leaked (descriptors open with
///   no client connected, before and after; goal 0).
///
/// Exit 1 when a goal is missed, so a script can run it as a check.

namespace glint::bench {

struct SoakBenchArgs {
  double minutes = 10;
  int tenants = 4;
  int sample_every = 4;  ///< training steps between a tenant's sampler saves and sample calls; 0: none
};

int serve_soak(const SoakBenchArgs& args);

}  // namespace glint::bench
