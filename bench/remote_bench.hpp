#pragma once
/// `glint bench remote`: what remote mode costs and what sharing a server
/// gains, all measured in one run on one machine (a `glint serve` core and
/// its drivers in this process, over loopback TCP):
///
/// - remote_noop_rtt_us against local_noop_rtt_us: the median round trip of
///   the cheapest model call (calculate_metric on an adapter) through the
///   RPC gateway, and straight to the same server's model group (the same
///   actors on the same cores); the two alternate call by call;
/// - remote_forward_backward_vs_local: the median time of forward_backward +
///   clip_grad_and_step on the tiny model, remote over local (goal <= 1.2);
/// - tinker_step_ms against native_step_ms: the same training step
///   (forward_backward + the optimizer step, 8 rows of 64 tokens) through
///   the Tinker-compatible HTTP API as SDK 0.25 sends it (a protobuf
///   forward_backward and a JSON optim_step, both futures polled to their
///   results) and through glint's own Cap'n Proto API; medians of steps
///   taken in turn; tinker_vs_native_step is their ratio;
/// - train_rows32_vs_4x_rows8: one training step over 32 rows against four
///   steps over 8 (local, one adapter): what a model step shared by four
///   tenants could save (nothing while it is >= 1, as on a CPU, where the
///   step is compute-bound);
/// - tenants4_vs_1_tokens_per_s: tokens trained and sampled per second by 4
///   tenants at once (each its own adapter, key and connection, each
///   alternating a training step and a sample call) over one tenant alone
///   doing the same (goal >= 1.5: the model and the sampler work at once,
///   and the sampler batches tenants' requests in the same engine steps).
///   Also printed: tenants1_tokens_per_s and tenants4_tokens_per_s (medians
///   of five rounds, one tenant then four, in turn), and
///   tenants4_vs_1_no_overlap, the ratio the same rounds predict from
///   shared engine steps alone: 4 (T_train + T_sample) / (4 T_train +
///   T_sample4), with T_sample4 the time of the 4 tenants' sample calls
///   sent at once.

namespace glint::bench {

struct RemoteBenchArgs {
  int repeats = 200;  ///< noop calls per mode (the median is printed)
  int steps = 12;     ///< training steps per timing and per tenant
};

int remote(const RemoteBenchArgs& args);

}  // namespace glint::bench
