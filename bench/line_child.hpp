#pragma once
// A child process driven line by line, for baselines run beside glint (the
// Python scripts of bench/python, llama.cpp through Node) and the tests
// that compare against them.

#include "runtime/error.hpp"

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
#include <string>
#include <thread>
#include <utility>
#include <vector>

extern char** environ;

namespace glint::bench {

using namespace std::chrono_literals;

/// A baseline (a Python script, llama.cpp under Node) as a child process
/// driven line by line: its stdin and stdout are one end of a socket pair (a socket, not pipes, so that a write to a child that died is
// an error, MSG_NOSIGNAL, rather than SIGPIPE). Its stderr is ours: a Python
// traceback reaches the user. Not thread-safe. Dropping it closes the socket
// (the script ends at end of input) and reaps the child, killing it after 10 s.
class LineChild {
public:
  /// `what` names the child in errors ("the Python baseline", "llama.cpp").
  static Result<LineChild> start(const std::vector<std::string>& argv, std::string what = "the Python baseline") {
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
    // posix_spawnp: a program without a '/' is looked up on PATH ("node").
    int rc = ::posix_spawnp(&pid, args[0], &actions, nullptr, args.data(), environ);
    posix_spawn_file_actions_destroy(&actions);
    ::close(fds[1]);
    if (rc != 0) {
      ::close(fds[0]);
      return make_error(errc::not_found, "cannot run " + argv[0] + ": " + std::strerror(rc));
    }
    LineChild c;
    c.pid_ = pid;
    c.fd_ = fds[0];
    c.what_ = std::move(what);
    return c;
  }

  LineChild() = default;
  LineChild(LineChild&& o) noexcept
      : pid_(std::exchange(o.pid_, -1)), fd_(std::exchange(o.fd_, -1)), buffer_(std::move(o.buffer_)),
        what_(std::move(o.what_)) {}
  LineChild& operator=(LineChild&&) = delete;
  ~LineChild() {
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
      if (left <= 0ms) return make_error(errc::unavailable, what_ + " did not answer within " +
                                                                std::to_string(timeout.count() / 1000) + " s");
      pollfd p{fd_, POLLIN, 0};
      int r = ::poll(&p, 1, static_cast<int>(std::min<int64_t>(left.count(), 60'000)));
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0) continue;
      char chunk[4096];
      auto n = ::recv(fd_, chunk, sizeof(chunk), 0);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return make_error(errc::unavailable, what_ + " exited" + exit_status());
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
  std::string what_ = "the child";
};

}  // namespace glint::bench
