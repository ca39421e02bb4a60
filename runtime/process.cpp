#include "runtime/process.hpp"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <fcntl.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <mutex>
#include <random>
#include <set>
#include <string>
#include <thread>

extern char** environ;

namespace glint {

ChildProcess::ChildProcess(ChildProcess&& other) noexcept
    : pid_(other.pid_), exit_code_(other.exit_code_), term_signal_(other.term_signal_) {
  other.pid_ = -1;
}

ChildProcess& ChildProcess::operator=(ChildProcess&& other) noexcept {
  if (this != &other) {
    this->~ChildProcess();
    pid_ = other.pid_;
    exit_code_ = other.exit_code_;
    term_signal_ = other.term_signal_;
    other.pid_ = -1;
  }
  return *this;
}

ChildProcess::~ChildProcess() {
  if (pid_ > 0 && !exit_code_) {
    ::kill(pid_, SIGKILL);
    poll(true);
  }
}

Result<ChildProcess> ChildProcess::start(const std::vector<std::string>& argv,
                                         const std::map<std::string, std::string>& env) {
  return start(argv, env, Options{});
}

Result<ChildProcess> ChildProcess::start(const std::vector<std::string>& argv,
                                         const std::map<std::string, std::string>& env, Options options) {
  if (argv.empty()) return make_error(errc::invalid_argument, "no program to start");
  std::map<std::string, std::string> merged;
  for (char** e = environ; e && *e; ++e) {
    std::string_view kv{*e};
    auto eq = kv.find('=');
    if (eq != std::string_view::npos) merged[std::string{kv.substr(0, eq)}] = std::string{kv.substr(eq + 1)};
  }
  for (const auto& [k, v] : env) merged[k] = v;
  std::vector<std::string> env_strings;
  for (const auto& [k, v] : merged) env_strings.push_back(k + "=" + v);
  std::vector<char*> cargv, cenv;
  for (const auto& a : argv) cargv.push_back(const_cast<char*>(a.c_str()));
  cargv.push_back(nullptr);
  for (const auto& e : env_strings) cenv.push_back(const_cast<char*>(e.c_str()));
  cenv.push_back(nullptr);
  pid_t pid = -1;
  if (!options.die_with_parent) {
    int rc = posix_spawnp(&pid, argv[0].c_str(), nullptr, nullptr, cargv.data(), cenv.data());
    if (rc != 0) return make_error(errc::not_found, "cannot start '" + argv[0] + "': " + std::strerror(rc));
    return ChildProcess{pid};
  }
  // posix_spawn cannot set the parent-death signal: fork, set it, exec. The
  // places to try are listed before the fork, as execvp would search PATH
  // (an empty entry is the current directory), and the child makes only
  // async-signal-safe calls. A pipe closed on exec tells the parent whether
  // exec worked.
  std::vector<std::string> candidates;
  if (argv[0].find('/') != std::string::npos) {
    candidates.push_back(argv[0]);
  } else {
    const char* path = std::getenv("PATH");
    std::string_view dirs = path ? path : "/usr/local/bin:/usr/bin:/bin";
    for (size_t at = 0; at <= dirs.size();) {
      auto end = dirs.find(':', at);
      if (end == std::string_view::npos) end = dirs.size();
      auto dir = dirs.substr(at, end - at);
      candidates.push_back((dir.empty() ? std::string{"."} : std::string{dir}) + "/" + argv[0]);
      at = end + 1;
    }
  }
  int status_pipe[2];
  if (::pipe2(status_pipe, O_CLOEXEC) != 0)
    return make_error(errc::unavailable, std::string{"cannot start '"} + argv[0] + "': " + std::strerror(errno));
  const pid_t parent = ::getpid();
  pid = ::fork();
  if (pid < 0) {
    int err = errno;
    ::close(status_pipe[0]);
    ::close(status_pipe[1]);
    return make_error(errc::unavailable, "cannot start '" + argv[0] + "': " + std::strerror(err));
  }
  if (pid == 0) {
    ::close(status_pipe[0]);
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(127);  // the parent died before the signal was set
    int err = ENOENT;
    bool denied = false;
    for (const auto& c : candidates) {
      ::execve(c.c_str(), cargv.data(), cenv.data());
      err = errno;
      if (err == EACCES) denied = true;
      else if (err != ENOENT && err != ENOTDIR) break;  // found, but it cannot run
    }
    if ((err == ENOENT || err == ENOTDIR) && denied) err = EACCES;
    (void)!::write(status_pipe[1], &err, sizeof err);
    ::_exit(127);
  }
  ::close(status_pipe[1]);
  int err = 0;
  ssize_t n;
  do {
    n = ::read(status_pipe[0], &err, sizeof err);
  } while (n < 0 && errno == EINTR);
  ::close(status_pipe[0]);
  if (n == sizeof err) {
    int status = 0;
    ::waitpid(pid, &status, 0);
    return make_error(errc::not_found, "cannot start '" + argv[0] + "': " + std::strerror(err));
  }
  return ChildProcess{pid};
}

std::optional<int> ChildProcess::poll(bool block) {
  if (exit_code_ || pid_ <= 0) return exit_code_;
  int status = 0;
  pid_t r;
  do {
    r = ::waitpid(pid_, &status, block ? 0 : WNOHANG);
  } while (r < 0 && errno == EINTR);
  if (r == pid_) {
    if (WIFEXITED(status)) exit_code_ = WEXITSTATUS(status);
    else if (WIFSIGNALED(status)) exit_code_ = 128 + WTERMSIG(status), term_signal_ = WTERMSIG(status);
    else exit_code_ = -1;
  } else if (r < 0) {
    exit_code_ = -1;
  }
  return exit_code_;
}

bool ChildProcess::running() { return pid_ > 0 && !poll(false); }

void ChildProcess::signal(int sig) {
  if (pid_ > 0 && !exit_code_) ::kill(pid_, sig);
}

std::optional<int> ChildProcess::wait_for(std::chrono::milliseconds timeout) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    if (auto c = poll(false)) return c;
    if (std::chrono::steady_clock::now() >= deadline) return std::nullopt;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

int ChildProcess::wait() {
  auto c = poll(true);
  return c ? *c : -1;
}

std::string signal_name(int sig) {
  const char* abbrev = ::sigabbrev_np(sig);
  return (abbrev ? "SIG" + std::string{abbrev} : std::string{"signal"}) + " (" + std::to_string(sig) + ")";
}

std::string self_executable() {
  char buf[PATH_MAX];
  auto n = ::readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n <= 0) return {};
  return std::string(buf, static_cast<size_t>(n));
}

/// The address of this machine's interface that packets to host:port leave
/// by (a UDP socket's connect sends nothing; it only picks the route).
Result<std::string> local_address_towards(const std::string& host, uint16_t port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* found = nullptr;
  if (int rc = ::getaddrinfo(host.c_str(), std::to_string(port == 0 ? 9 : port).c_str(), &hints, &found); rc != 0 || !found)
    return make_error(errc::unavailable, "cannot resolve the store's host " + host + ": " + ::gai_strerror(rc));
  std::unique_ptr<addrinfo, void (*)(addrinfo*)> guard{found, ::freeaddrinfo};
  int fd = ::socket(found->ai_family, SOCK_DGRAM, 0);
  if (fd < 0) return make_error(errc::unavailable, std::string{"a socket to find this host's address: "} + std::strerror(errno));
  sockaddr_storage local{};
  socklen_t len = sizeof(local);
  const bool ok = ::connect(fd, found->ai_addr, found->ai_addrlen) == 0 &&
                  ::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) == 0;
  const int err = errno;
  ::close(fd);
  if (!ok) return make_error(errc::unavailable, "no route from this host to the store's host " + host + ": " + std::strerror(err));
  char text[INET6_ADDRSTRLEN] = {0};
  const void* a = local.ss_family == AF_INET6 ? static_cast<const void*>(&reinterpret_cast<sockaddr_in6*>(&local)->sin6_addr)
                                              : static_cast<const void*>(&reinterpret_cast<sockaddr_in*>(&local)->sin_addr);
  if (!::inet_ntop(local.ss_family, a, text, sizeof(text)))
    return make_error(errc::internal, "formatting this host's address");
  return std::string{text};
}

namespace {

// Whether a TCP listener could bind `port` on every IPv4 address now.
// Binds a socket to `port` (0: one the kernel chooses) on every IPv4
// address and closes it; the port it was bound to, or -1 with errno set.
int bind_any(uint16_t port) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_ANY);
  addr.sin_port = htons(port);
  socklen_t len = sizeof(addr);
  int bound = -1;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0)
    bound = ntohs(addr.sin_port);
  const int err = errno;
  ::close(fd);
  errno = err;
  return bound;
}

bool bindable(uint16_t port) { return bind_any(port) >= 0; }

// The first port of the kernel's ephemeral range (32768 unless configured).
int ephemeral_low() {
  std::ifstream in{"/proc/sys/net/ipv4/ip_local_port_range"};
  int lo = 0, hi = 0;
  if (in >> lo >> hi && lo > 0) return lo;
  return 32768;
}

}  // namespace

Result<uint16_t> pick_free_port() {
  // From the 12,000 ports below the ephemeral range: the kernel gives those
  // above to outgoing connections and to bind(0), so a connection another
  // test or process opens between this pick and the listener's bind cannot
  // take the port (a flake seen in the test suite with bind(0)'s ports). A
  // port this process picked before is never picked again, so two picks
  // before either is bound differ.
  static std::mutex mx;
  static std::set<uint16_t> picked;
  static std::mt19937 rng{static_cast<uint32_t>(::getpid()) ^
                          static_cast<uint32_t>(std::chrono::steady_clock::now().time_since_epoch().count())};
  const int hi = ephemeral_low() - 1, lo = std::max(1024, hi - 12000);
  std::lock_guard<std::mutex> guard{mx};
  if (picked.size() > 4096) picked.clear();  // a long-lived process: the first picks are long bound or gone
  if (hi - lo >= 1000) {
    std::uniform_int_distribution<int> any{lo, hi};
    for (int attempt = 0; attempt < 256; ++attempt) {
      const auto port = static_cast<uint16_t>(any(rng));
      if (picked.count(port) || !bindable(port)) continue;
      picked.insert(port);
      return port;
    }
  }
  // A machine whose ephemeral range starts low, or whose low ports are all
  // taken: one the kernel chooses, on every IPv4 address, and again not one
  // this process returned before.
  for (int attempt = 0; attempt < 64; ++attempt) {
    const int port = bind_any(0);
    if (port < 0) return make_error(errc::unavailable, std::string{"cannot find a free port: "} + std::strerror(errno));
    if (picked.insert(static_cast<uint16_t>(port)).second) return static_cast<uint16_t>(port);
  }
  return make_error(errc::unavailable, "cannot find a free port this process has not handed out already");
}

}  // namespace glint
