#pragma once
/// How a glint process runs: its mode, its place in a cluster job, and the
/// limits and timeouts every call obeys.

#include "runtime/error.hpp"

#include <chrono>
#include <cstdint>
#include <map>
#include <string>

namespace glint {

enum class Mode { local, cluster, remote };
std::string_view to_string(Mode m);
Result<Mode> parse_mode(std::string_view name);

/// This process's place in a cluster job. Process rank 0 is the driver; the
/// others are node processes that host actors for it.
struct ClusterEnv {
  int rank = 0;              ///< global process rank
  int world_size = 1;        ///< processes in the job
  int local_rank = 0;        ///< rank among the processes on this machine
  int local_world_size = 1;  ///< processes on this machine
  int node_rank = 0;         ///< machine index
  int nnodes = 1;            ///< machines in the job
  std::string master_addr = "127.0.0.1";
  uint16_t master_port = 0;  ///< where the driver listens; 0 only in local mode
  std::string source;        ///< where these values came from ("glint run", "torchrun", "slurm", ...)
  /// `glint run` only (GLINT_JOIN_REPORT): a file a node process writes
  /// "joined" to once the driver took it in, or "ended" when the job ended
  /// before it could, so the launcher tells a process that left without
  /// joining (while the driver waits for it) from one the job let go.
  std::string join_report;

  /// Reads glint's own variables (GLINT_RANK, GLINT_WORLD_SIZE, ...), else
  /// torchrun's (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK,
  /// MASTER_ADDR, MASTER_PORT), else Slurm's (SLURM_PROCID, SLURM_NTASKS,
  /// SLURM_LOCALID, SLURM_NODEID, SLURM_NNODES, with MASTER_ADDR/MASTER_PORT).
  /// Returns nullopt-like `source == ""` when none is set. Malformed values are
  /// errors naming the variable.
  static Result<ClusterEnv> from_environment(const std::map<std::string, std::string>& env);
  static Result<ClusterEnv> from_environment();

  /// The variables `glint run` sets for a process (GLINT_*).
  std::map<std::string, std::string> to_environment() const;

  Result<void> validate() const;
};

struct Options {
  Mode mode = Mode::local;
  ClusterEnv cluster;
  /// remote mode: the `glint serve` deployment to attach to: "host:port"
  /// (plain TCP, loopback only unless the server allows it) or
  /// "tls://host:port" (GLINT_REMOTE_URL).
  std::string remote_endpoint;
  /// remote mode: the API key (`glint serve keys create`; GLINT_API_KEY).
  std::string remote_api_key;
  /// remote mode with TLS: a PEM file of the certificate (or CA) to trust
  /// instead of the system's store (GLINT_REMOTE_CA).
  std::string remote_ca_file;

  /// Default timeout of every actor call; a call never waits longer.
  std::chrono::milliseconds call_timeout{std::chrono::minutes(5)};
  /// How long node processes and the driver wait for each other at start.
  std::chrono::milliseconds connect_timeout{std::chrono::seconds(60)};
  /// Timeout of one remote spawn.
  std::chrono::milliseconds spawn_timeout{std::chrono::seconds(30)};
  /// run_main: how long the driver process waits at exit for actors still
  /// busy (a long call its driver gave up on) before it leaves without them,
  /// with the driver's exit code. Embedded runtimes (Runtime::shutdown) wait.
  std::chrono::milliseconds exit_grace{std::chrono::seconds(30)};
  /// Heartbeat between processes (GLINT_HEARTBEAT_MS).
  std::chrono::milliseconds heartbeat{std::chrono::milliseconds(500)};
  /// A peer process that sends nothing for this long, not even a heartbeat
  /// (frozen, SIGSTOPped, its link cut without a reset), is declared lost
  /// (GLINT_PEER_TIMEOUT_MS). At least two heartbeats. Data counts as a
  /// sign of life, so a long transfer does not trip it; a process whose
  /// network thread is busy longer than this (deserialising one message
  /// of several GB) can, so raise it for such jobs.
  std::chrono::milliseconds peer_timeout{std::chrono::seconds(5)};
  /// Largest tensor a process accepts from the network.
  uint64_t max_message_bytes = uint64_t{2} << 30;
  /// Threads of CAF's shared scheduler, which runs the actors that are not
  /// detached (0: one per core but one, at least one).
  int threads = 0;

  /// Options from the environment: cluster mode when launched by `glint run`,
  /// torchrun or srun with a world size above 1 (GLINT_MODE overrides).
  static Result<Options> from_environment();

  Result<void> validate() const;
};

}  // namespace glint
