#include "launcher/launch.hpp"

#include "runtime/options.hpp"
#include "runtime/process.hpp"

#include <signal.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <thread>

namespace glint::launcher {

namespace {

std::atomic<int> g_signal{0};

void on_signal(int sig) { g_signal.store(sig); }

int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  if (!v || !*v) return fallback;
  char* end = nullptr;
  long x = std::strtol(v, &end, 10);
  return end && *end == 0 ? static_cast<int>(x) : fallback;
}

}  // namespace

Result<void> LaunchSpec::resolve() {
  if (command.empty())
    return make_error(errc::invalid_argument, "no command to run; usage: glint run --nproc N -- PROGRAM [ARGS...]");
  // Slurm and torchrun-style variables fill what the flags left unset.
  if (nnodes == 1) nnodes = env_int("SLURM_NNODES", env_int("NNODES", 1));
  if (node_rank == 0) node_rank = env_int("SLURM_NODEID", env_int("NODE_RANK", env_int("GROUP_RANK", 0)));
  if (const char* a = std::getenv("MASTER_ADDR"); a && *a && master_addr == "127.0.0.1") master_addr = a;
  if (master_port == 0) master_port = static_cast<uint16_t>(env_int("MASTER_PORT", 0));
  if (nproc < 1) return make_error(errc::invalid_argument, "--nproc must be at least 1, got " + std::to_string(nproc));
  if (nnodes < 1) return make_error(errc::invalid_argument, "--nnodes must be at least 1, got " + std::to_string(nnodes));
  if (node_rank < 0 || node_rank >= nnodes)
    return make_error(errc::invalid_argument, "--node-rank " + std::to_string(node_rank) + " is outside 0.." +
                                                  std::to_string(nnodes - 1));
  if (master_port == 0) {
    if (nnodes > 1)
      return make_error(errc::invalid_argument,
                        "a job on several machines needs --master-port (the same on every machine)");
    auto p = pick_free_port();
    if (!p) return p.error();
    master_port = *p;
  }
  return {};
}

Result<int> launch(LaunchSpec spec) {
  if (auto ok = spec.resolve(); !ok) return ok.error();
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);

  // Where each node process says it joined (ClusterEnv::join_report).
  char reports_template[] = "/tmp/glint-run-XXXXXX";
  const char* made = ::mkdtemp(reports_template);
  const std::string reports = made ? made : "";
  struct RemoveAtEnd {
    std::string dir;
    ~RemoveAtEnd() {
      std::error_code ec;
      if (!dir.empty()) std::filesystem::remove_all(dir, ec);
    }
  } remove_reports{reports};
  std::vector<ChildProcess> children;
  std::vector<std::map<std::string, std::string>> environments;
  for (int local = 0; local < spec.nproc; ++local) {
    ClusterEnv c;
    c.rank = spec.node_rank * spec.nproc + local;
    c.world_size = spec.nnodes * spec.nproc;
    c.local_rank = local;
    c.local_world_size = spec.nproc;
    c.node_rank = spec.node_rank;
    c.nnodes = spec.nnodes;
    c.master_addr = spec.master_addr;
    c.master_port = spec.master_port;
    if (!reports.empty()) c.join_report = reports + "/" + std::to_string(c.rank);
    environments.push_back(c.to_environment());
    if (spec.peer_timeout_seconds > 0)
      environments.back()["GLINT_PEER_TIMEOUT_MS"] = std::to_string(static_cast<int64_t>(spec.peer_timeout_seconds * 1000));
    auto child = ChildProcess::start(spec.command, environments.back(), {.die_with_parent = true});
    if (!child) return with_context(child.error(), "starting process " + std::to_string(c.rank));
    children.push_back(std::move(*child));
  }
  int restarts = 0;
  std::vector<char> restarted(children.size(), 0);
  const bool has_driver = spec.node_rank == 0;
  std::vector<std::optional<int>> codes(children.size());
  std::optional<std::chrono::steady_clock::time_point> stopping;  // since the driver exited or a process failed
  int forwarded = 0;
  std::optional<int> first_failure;  // the rank of the first process that failed while the job ran
  bool killed = false;
  auto rank_of = [&](size_t i) { return spec.node_rank * spec.nproc + static_cast<int>(i); };
  // A node process that exited 0 without joining the job nor being let go
  // by it (a program that returned early on that rank, say): the driver
  // would wait its connect timeout for it. Reported if the driver is still
  // running 2 s later (it is not when a job of plain programs ends together).
  std::vector<std::optional<std::chrono::steady_clock::time_point>> left_unjoined(children.size());
  auto joined_or_let_go = [&](size_t i) {
    if (reports.empty()) return true;  // no report to read: assume so, as before
    auto it = environments[i].find("GLINT_JOIN_REPORT");
    if (it == environments[i].end()) return true;
    std::ifstream in{it->second};
    std::string what;
    in >> what;
    return what == "joined" || what == "ended";
  };
  auto what_ended = [&](size_t i) {
    if (auto sig = children[i].term_signal()) return "was killed by " + signal_name(*sig);
    if (*codes[i] == kExitLostDriver) return "lost its driver (exit code " + std::to_string(*codes[i]) + ")";
    return "exited with code " + std::to_string(*codes[i]);
  };
  for (;;) {
    if (int sig = g_signal.exchange(0)) {
      forwarded = sig;
      for (auto& c : children) c.signal(sig);
    }
    bool all_done = true;
    for (size_t i = 0; i < children.size(); ++i) {
      if (!codes[i]) {
        codes[i] = children[i].wait_for(std::chrono::milliseconds(0));
        // A process that fails while the job runs (one that dies before it
        // registers, say) is reported at once and ends the job, instead of
        // leaving the others to wait out their connect timeout.
        const bool is_driver = has_driver && i == 0;
        // Restarted: a node process that a signal killed (a crash, the OOM
        // killer, a kill), or one that lost its driver while the driver
        // runs (the driver dropped it: frozen or cut off past the peer
        // timeout, then back). One that exits with another code decided
        // to (it could not join), which starting it again would not mend.
        const bool lost_driver = codes[i] && !children[i].term_signal() && *codes[i] == kExitLostDriver;
        if (codes[i] && (children[i].term_signal() || lost_driver) && !forwarded && !g_signal.load() && !stopping &&
            !is_driver && restarts < spec.max_restarts) {
          ++restarts;
          std::fprintf(stderr, "glint run: process %d (pid %d) %s; starting it again (restart %d of %d)\n", rank_of(i),
                       static_cast<int>(children[i].pid()), what_ended(i).c_str(), restarts, spec.max_restarts);
          if (auto it = environments[i].find("GLINT_JOIN_REPORT"); it != environments[i].end()) {
            std::error_code ec;
            std::filesystem::remove(it->second, ec);  // the new process reports afresh
          }
          auto again = ChildProcess::start(spec.command, environments[i], {.die_with_parent = true});
          if (again) {
            children[i] = std::move(*again);
            restarted[i] = 1;
            codes[i].reset();
            all_done = false;
            continue;
          }
          std::fprintf(stderr, "glint run: cannot start process %d again: %s\n", rank_of(i),
                       describe(again.error()).c_str());
        }
        // A node the running driver dropped (frozen or cut off, then back)
        // with no restarts left: the driver already carries on without it.
        if (lost_driver && has_driver && !is_driver && !forwarded && !stopping && !codes[0]) {
          std::fprintf(stderr, "glint run: process %d (pid %d) %s and has no restarts left (--max-restarts %d); the job "
                               "goes on without it\n",
                       rank_of(i), static_cast<int>(children[i].pid()), what_ended(i).c_str(), spec.max_restarts);
          continue;
        }
        if (codes[i] && *codes[i] == 0 && !is_driver && !forwarded && !stopping && !joined_or_let_go(i))
          left_unjoined[i] = std::chrono::steady_clock::now();
        if (codes[i] && *codes[i] != 0 && !forwarded && !stopping) {
          std::fprintf(stderr, "glint run: %s %d (pid %d) %s; stopping the job\n", is_driver ? "the driver, process" : "process",
                       rank_of(i), static_cast<int>(children[i].pid()), what_ended(i).c_str());
          first_failure = rank_of(i);
          stopping = std::chrono::steady_clock::now();
          for (auto& c : children) c.signal(SIGTERM);
        } else if (codes[i] && is_driver && !stopping) {
          stopping = std::chrono::steady_clock::now();
          // A process started again may still be waiting to join a driver
          // that is gone: it has nothing to finish.
          for (size_t k = 0; k < children.size(); ++k)
            if (restarted[k] && !codes[k]) children[k].signal(SIGTERM);
        }
      }
      all_done = all_done && codes[i].has_value();
    }
    if (all_done) break;
    for (size_t i = 0; i < children.size(); ++i) {
      if (!left_unjoined[i] || stopping || forwarded) continue;
      if (has_driver && codes[0]) continue;  // the driver ended: nothing waits for it
      if (std::chrono::steady_clock::now() - *left_unjoined[i] < std::chrono::seconds(2)) continue;
      left_unjoined[i].reset();
      std::fprintf(stderr,
                   "glint run: process %d (pid %d) exited with code 0 without joining the job, and the driver %s; "
                   "a node process must call glint::run_main (or glint::serve_node) on every rank; %s\n",
                   rank_of(i), static_cast<int>(children[i].pid()),
                   has_driver ? "is still waiting for it" : "(on another machine) waits for it until its connect timeout",
                   has_driver ? "stopping the job" : "stopping this machine's processes");
      first_failure = rank_of(i);
      stopping = std::chrono::steady_clock::now();
      for (auto& c : children) c.signal(SIGTERM);
    }
    if (!killed && stopping && std::chrono::steady_clock::now() - *stopping > std::chrono::seconds(spec.grace_seconds)) {
      std::fprintf(stderr, "glint run: processes still running %d s after the %s; killing them\n", spec.grace_seconds,
                   first_failure ? "job failed" : "driver exited");
      for (auto& c : children) c.signal(SIGKILL);
      killed = true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  if (has_driver) {
    if (*codes[0] == 0 && first_failure) return 1;  // the driver finished, but a process failed under it
    return *codes[0];
  }
  for (auto& c : codes)
    if (*c != 0) return *c;
  return forwarded ? 128 + forwarded : 0;
}

}  // namespace glint::launcher
