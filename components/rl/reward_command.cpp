#include "components/rl/reward_command.hpp"

#include "components/rl/detail/process_status.hpp"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <thread>

extern char** environ;

namespace glint::components::rl {

namespace {

namespace fs = std::filesystem;

/// A temporary directory, removed with everything in it.
struct TempDir {
  std::string path;
  ~TempDir() {
    std::error_code ec;
    if (!path.empty()) fs::remove_all(path, ec);
  }
};


}  // namespace

Result<std::vector<double>> run_reward_command(const RewardCommand& command, std::span<const RewardInput> inputs) {
  if (command.command.empty()) return make_error(errc::invalid_argument, "the reward command is empty");
  if (!(command.timeout_seconds > 0)) return make_error(errc::invalid_argument, "the reward command's timeout must be > 0");
  const std::string what = "reward command '" + command.command + "'";
  char tmpl[] = "/tmp/glint-reward-XXXXXX";
  if (!::mkdtemp(tmpl)) return make_error(errc::unavailable, "cannot make a temporary directory for the " + what);
  TempDir dir{tmpl};
  const auto in_path = dir.path + "/in.jsonl", out_path = dir.path + "/out.txt";
  {
    std::ofstream in{in_path};
    for (size_t i = 0; i < inputs.size(); ++i) {
      nlohmann::json j = nlohmann::json::object();
      for (const auto& [k, v] : inputs[i].fields) j[k] = v;
      j["index"] = i;
      j["prompt"] = inputs[i].prompt;
      j["completion"] = inputs[i].completion;
      // Completions are model output: bytes that are not UTF-8 are replaced.
      in << j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << '\n';
    }
    if (!in.flush()) return make_error(errc::unavailable, "cannot write the " + what + "'s input");
  }

  posix_spawn_file_actions_t files;
  posix_spawnattr_t attr;
  posix_spawn_file_actions_init(&files);
  posix_spawnattr_init(&attr);
  posix_spawn_file_actions_addopen(&files, 0, in_path.c_str(), O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&files, 1, out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  posix_spawn_file_actions_addclosefrom_np(&files, 3);  // none of glint's sockets and files
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP);
  posix_spawnattr_setpgroup(&attr, 0);  // its own group, so a timeout kills what it started too
  const char* argv[] = {"sh", "-c", command.command.c_str(), nullptr};
  pid_t pid = -1;
  const int rc = ::posix_spawn(&pid, "/bin/sh", &files, &attr, const_cast<char* const*>(argv), environ);
  posix_spawn_file_actions_destroy(&files);
  posix_spawnattr_destroy(&attr);
  if (rc != 0) return make_error(errc::unavailable, "cannot start the " + what + ": " + std::strerror(rc));

  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(command.timeout_seconds);
  int status = 0;
  for (auto pause = std::chrono::milliseconds(1);; pause = std::min(pause * 2, std::chrono::milliseconds(50))) {
    const pid_t done = ::waitpid(pid, &status, WNOHANG);
    const int why = errno;
    if (done == pid) break;
    const bool lost = done < 0 && why != EINTR;
    if (lost || std::chrono::steady_clock::now() > deadline) {
      ::kill(-pid, SIGKILL);
      while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
      }
      if (lost) return make_error(errc::unavailable, "waiting for the " + what + ": " + std::strerror(why));
      char limit[32];
      std::snprintf(limit, sizeof limit, "%g", command.timeout_seconds);
      return make_error(errc::deadline_exceeded, what + " ran past its timeout of " + limit + " s and was killed");
    }
    std::this_thread::sleep_for(pause);
  }
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) return make_error(errc::failed_precondition, what + " " + detail::status_text(status));

  std::ifstream out{out_path};
  std::vector<double> scores;
  std::string line;
  for (size_t n = 1; std::getline(out, line); ++n) {
    while (!line.empty() && (line.back() == '\r' || line.back() == ' ' || line.back() == '\t')) line.pop_back();
    if (line.empty() && out.peek() == EOF) break;  // a last newline
    char* end = nullptr;
    const double v = std::strtod(line.c_str(), &end);
    if (line.empty() || end == line.c_str() || *end != '\0' || !std::isfinite(v))
      return make_error(errc::invalid_argument, what + " wrote '" + line.substr(0, 80) + "' on output line " +
                                                    std::to_string(n) + ": each line must be one finite number");
    scores.push_back(v);
  }
  if (scores.size() != inputs.size())
    return make_error(errc::invalid_argument, what + " wrote " + std::to_string(scores.size()) + " scores for " +
                                                  std::to_string(inputs.size()) + " completions (one line each, in order)");
  return scores;
}

}  // namespace glint::components::rl
