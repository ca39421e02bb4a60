#pragma once
/// `glint bench faults`: how fast a cluster job finds and gets over a lost
/// process (docs/faults.md). Two-process jobs on this machine: this process
/// drives, a child running this binary is node 1.
///
/// Prints `name: value` lines, medians of --repeats runs:
/// - kill_detect_s: SIGKILL to node 1 until a call in flight there fails
///   (the socket closes: no timeout involved);
/// - freeze_detect_s: SIGSTOP to node 1 until the call fails, with the
///   default peer timeout, printed beside it as peer_timeout_s (the bound);
/// - sampler_spawn_s: opening a one-rank sampler group until it answers (the
///   baseline of the next line; a ~5M-parameter Qwen3), and sampler_respawn_s: SIGKILL to the node of rank 1 of a
///   supervised 2-rank sampler group until a sample call is answered by
///   both ranks again, the new one at the group's current weight version;
/// - with --chaos N > 0, scripts/chaos.sh N from the source tree:
///   chaos_runs, chaos_hangs, chaos_mismatches, chaos_failures.

namespace glint::bench {

struct FaultsBenchArgs {
  int repeats = 3;  ///< runs per measurement (the median is printed)
  int chaos = 3;    ///< GRPO runs with a killed sampler process (0: none)
};

int faults(const FaultsBenchArgs& args);

}  // namespace glint::bench
