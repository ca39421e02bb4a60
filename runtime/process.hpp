#pragma once
/// Starting and watching child processes: how `glint run` starts the
/// processes of a cluster job, and how tests start node processes.

#include "runtime/error.hpp"

#include <sys/types.h>

#include <chrono>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace glint {

class ChildProcess {
public:
  ChildProcess() = default;
  ChildProcess(ChildProcess&& other) noexcept;
  ChildProcess& operator=(ChildProcess&& other) noexcept;
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;
  /// Kills the child (SIGKILL) if it still runs, and reaps it.
  ~ChildProcess();

  struct Options {
    /// The child gets SIGKILL when this process dies, however it dies
    /// (Linux's parent-death signal): a job's processes never outlive
    /// their launcher. Linux sends it when the thread that started the
    /// child ends, so start such children from a thread that lives as
    /// long as the process (the launcher's main thread).
    bool die_with_parent = false;
  };
  /// Starts `argv[0]` (searched in PATH) with `argv`, this process's
  /// environment plus `env` (which overrides).
  static Result<ChildProcess> start(const std::vector<std::string>& argv,
                                    const std::map<std::string, std::string>& env = {});
  static Result<ChildProcess> start(const std::vector<std::string>& argv,
                                    const std::map<std::string, std::string>& env, Options options);

  pid_t pid() const { return pid_; }
  bool running();
  /// Sends a signal; no-op once the child is reaped.
  void signal(int sig);
  /// Waits up to `timeout` for the child to exit; its exit code (128 + signal
  /// when killed by one), or nullopt if still running.
  std::optional<int> wait_for(std::chrono::milliseconds timeout);
  /// Waits without limit.
  int wait();
  /// The signal that ended the child, once reaped and if one did (an exit
  /// code of 128 + n from a program is not a signal).
  std::optional<int> term_signal() const { return term_signal_; }

private:
  explicit ChildProcess(pid_t pid) : pid_(pid) {}
  std::optional<int> poll(bool block);
  pid_t pid_ = -1;
  std::optional<int> exit_code_;
  std::optional<int> term_signal_;
};

/// The exit code of a node process that lost its driver: the driver dropped
/// it (frozen or cut off past the peer timeout, then back) or went away.
/// EX_TEMPFAIL: `glint run --max-restarts` starts such a process again while
/// the job's driver runs, as it does one a signal killed, so a node thawed
/// after a freeze rejoins the job.
inline constexpr int kExitLostDriver = 75;

/// "SIGSEGV (11)": a signal's name and number, for messages.
std::string signal_name(int sig);

/// The path of the running executable (/proc/self/exe).
std::string self_executable();

/// A TCP port free on every IPv4 address a moment ago: below the kernel's
/// ephemeral range (which outgoing connections draw from), and never one this
/// process returned before.
Result<uint16_t> pick_free_port();

/// The address of this machine's interface that packets to host:port leave
/// by: the address processes there can reach this one by. Sends nothing.
Result<std::string> local_address_towards(const std::string& host, uint16_t port);

}  // namespace glint
