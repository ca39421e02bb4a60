#pragma once
/// `glint run`: starts the processes of a cluster job on this machine, like
/// torchrun. Each process runs the same command with GLINT_* variables that
/// tell it its rank; process rank 0 (node 0, local rank 0) is the driver, the
/// others host actors for it (glint::run_main does this).

#include "runtime/error.hpp"

#include <cstdint>
#include <string>
#include <vector>

namespace glint::launcher {

struct LaunchSpec {
  int nproc = 1;        ///< processes on this machine
  int nnodes = 1;       ///< machines in the job
  int node_rank = 0;    ///< this machine's index
  std::string master_addr = "127.0.0.1";
  uint16_t master_port = 0;  ///< 0: pick a free one (single machine only)
  std::vector<std::string> command;
  /// How long processes may run on after the driver exits before they are killed.
  int grace_seconds = 15;
  /// Node processes (not the driver) that a signal kills are started again,
  /// this many times in all on this machine, torchrun-elastic style; 0: a
  /// death ends the job. One that exits with a code (it lost the driver, it
  /// could not join) is not restarted.
  int max_restarts = 0;
  /// Seconds of silence (no data, no heartbeat) after which a process
  /// declares a peer lost: GLINT_PEER_TIMEOUT_MS in every process; 0 keeps
  /// the runtime's default (Options::peer_timeout, 5 s) or the caller's
  /// environment.
  double peer_timeout_seconds = 0;

  /// Fills unset values from Slurm's and torchrun's variables and checks them.
  Result<void> resolve();
};

/// Runs the job; returns the exit code to use (the driver's, or the first
/// failure on a machine without the driver).
Result<int> launch(LaunchSpec spec);

}  // namespace glint::launcher
