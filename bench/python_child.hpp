#pragma once
// What the benchmarks with a Python baseline share: a scratch directory and
// the baseline script as a child process driven line by line.

#include "runtime/error.hpp"
#include "runtime/process.hpp"

#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <string>
#include <thread>
#include <utility>
#include <vector>

extern char** environ;

#ifndef GLINT_SOURCE_DIR
#error "GLINT_SOURCE_DIR must name the source tree (bench/CMakeLists.txt sets it)"
#endif

namespace glint::bench {

using namespace std::chrono_literals;

/// A baseline script of bench/python: where `cmake --install` put it
/// (PREFIX/share/glint/python beside PREFIX/bin/glint), else in the source
/// tree this binary was built from; an error naming both when neither has it.
inline Result<std::string> baseline_script(const char* file) {
  const auto installed =
      std::filesystem::path{self_executable()}.parent_path().parent_path() / "share" / "glint" / "python" / file;
  if (std::filesystem::exists(installed)) return installed.string();
  auto path = std::filesystem::path{GLINT_SOURCE_DIR} / "bench" / "python" / file;
  if (!std::filesystem::exists(path))
    return make_error(errc::not_found, "the Python baseline " + std::string{file} + " is in neither " +
                                           installed.string() + " (an installed glint) nor " + path.string() +
                                           " (the source tree it was built from)");
  return path.string();
}

// A directory under $TMPDIR removed with everything in it when this goes.
class TempDir {
public:
  static Result<TempDir> create() {
    auto pattern = (std::filesystem::temp_directory_path() / "glint-bench-XXXXXX").string();
    if (!::mkdtemp(pattern.data())) return make_error(errc::unavailable, "cannot create a directory like " + pattern);
    TempDir d;
    d.path_ = pattern;
    return d;
  }
  TempDir() = default;
  TempDir(TempDir&& o) noexcept : path_(std::exchange(o.path_, {})) {}
  TempDir& operator=(TempDir&&) = delete;
  ~TempDir() {
    std::error_code ec;
    if (!path_.empty()) std::filesystem::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }

private:
  std::string path_;
};

// The Python baseline as a child process whose stdin and stdout are one end of
// a socket pair (a socket, not pipes, so that a write to a child that died is
// an error, MSG_NOSIGNAL, rather than SIGPIPE). Its stderr is ours: a Python
// traceback reaches the user. Not thread-safe. Dropping it closes the socket
// (the script ends at end of input) and reaps the child, killing it after 10 s.
class PythonChild {
public:
  static Result<PythonChild> start(const std::vector<std::string>& argv) {
    int fds[2];
    if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) != 0)
      return make_error(errc::unavailable, std::string{"socketpair: "} + std::strerror(errno));
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    // dup2 clears close-on-exec on the copies; the originals close at exec.
    posix_spawn_file_actions_adddup2(&actions, fds[1], STDIN_FILENO);
    posix_spawn_file_actions_adddup2(&actions, fds[1], STDOUT_FILENO);
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    pid_t pid = -1;
    int rc = ::posix_spawn(&pid, args[0], &actions, nullptr, args.data(), environ);
    posix_spawn_file_actions_destroy(&actions);
    ::close(fds[1]);
    if (rc != 0) {
      ::close(fds[0]);
      return make_error(errc::not_found, "cannot run " + argv[0] + ": " + std::strerror(rc));
    }
    PythonChild c;
    c.pid_ = pid;
    c.fd_ = fds[0];
    return c;
  }

  PythonChild() = default;
  PythonChild(PythonChild&& o) noexcept
      : pid_(std::exchange(o.pid_, -1)), fd_(std::exchange(o.fd_, -1)), buffer_(std::move(o.buffer_)) {}
  PythonChild& operator=(PythonChild&&) = delete;
  ~PythonChild() {
    if (fd_ >= 0) ::close(fd_);
    if (pid_ <= 0) return;
    for (int i = 0; i < 100; ++i) {
      if (::waitpid(pid_, nullptr, WNOHANG) == pid_) return;
      std::this_thread::sleep_for(100ms);
    }
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
  }

  bool send(const std::string& text) {
    for (size_t done = 0; done < text.size();) {
      auto n = ::send(fd_, text.data() + done, text.size() - done, MSG_NOSIGNAL);
      if (n <= 0) return false;
      done += static_cast<size_t>(n);
    }
    return true;
  }

  /// The next line (without its newline), or an error on end of output or
  /// after `timeout`.
  Result<std::string> read_line(std::chrono::milliseconds timeout) {
    auto deadline = std::chrono::steady_clock::now() + timeout;
    while (true) {
      if (auto nl = buffer_.find('\n'); nl != std::string::npos) {
        auto out = buffer_.substr(0, nl);
        buffer_.erase(0, nl + 1);
        return out;
      }
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
      if (left <= 0ms) return make_error(errc::unavailable, "the Python baseline did not answer within " +
                                                                std::to_string(timeout.count() / 1000) + " s");
      pollfd p{fd_, POLLIN, 0};
      int r = ::poll(&p, 1, static_cast<int>(std::min<int64_t>(left.count(), 60'000)));
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0) continue;
      char chunk[4096];
      auto n = ::recv(fd_, chunk, sizeof(chunk), 0);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return make_error(errc::unavailable, "the Python baseline exited" + exit_status());
      buffer_.append(chunk, static_cast<size_t>(n));
    }
  }

private:
  std::string exit_status() {
    int status = 0;
    for (int i = 0; i < 50; ++i) {
      if (::waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        if (WIFEXITED(status)) return " with code " + std::to_string(WEXITSTATUS(status));
        if (WIFSIGNALED(status)) return " on signal " + std::to_string(WTERMSIG(status));
        return "";
      }
      std::this_thread::sleep_for(100ms);
    }
    return "";
  }

  pid_t pid_ = -1;
  int fd_ = -1;
  std::string buffer_;
};

}  // namespace glint::bench
