#pragma once
// Timing helpers shared by the benchmarks.

#include <arpa/inet.h>
#include <malloc.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <vector>

namespace glint::bench {

/// Wall-clock seconds `f` takes.
inline double seconds_of(const std::function<void()>& f) {
  auto t0 = std::chrono::steady_clock::now();
  f();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

/// The median (the upper one of an even count); `v` must not be empty.
/// What `f` adds to this process's peak resident memory: the high-water
/// mark (VmHWM) after it, reset just before (clear_refs 5), minus the
/// resident bytes (VmRSS) before it, after malloc_trim has handed freed
/// memory back (else a step could reuse what an earlier one left resident
/// and look free). 0 where /proc does not tell.
inline double peak_bytes_added(const std::function<void()>& f) {
  auto field = [](const char* name) -> double {
    std::FILE* st = std::fopen("/proc/self/status", "r");
    if (!st) return 0;
    char line[256];
    double kb = 0;
    const size_t n = std::strlen(name);
    while (std::fgets(line, sizeof line, st))
      if (std::strncmp(line, name, n) == 0) kb = std::atof(line + n);
    std::fclose(st);
    return kb * 1024;
  };
  ::malloc_trim(0);
  if (std::FILE* c = std::fopen("/proc/self/clear_refs", "w")) {
    std::fputs("5", c);
    std::fclose(c);
  }
  const double before = field("VmRSS:");
  f();
  return std::max(0.0, field("VmHWM:") - before);
}

inline double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

/// One machine-readable result line, `name: value`.
inline void print_metric(const char* name, double v, int decimals) {
  std::printf("%s: %.*f\n", name, decimals, v);
  std::fflush(stdout);
}

/// A TCP socket listening on a free loopback port, its address in `addr`;
/// -1 if a socket call failed. The baselines of the transport benchmarks.
inline int listen_on_loopback(sockaddr_in& addr) {
  int server = ::socket(AF_INET, SOCK_STREAM, 0);
  addr = {};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  if (server < 0 || ::bind(server, reinterpret_cast<sockaddr*>(&addr), len) != 0 || ::listen(server, 1) != 0 ||
      ::getsockname(server, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    if (server >= 0) ::close(server);
    return -1;
  }
  return server;
}

}  // namespace glint::bench
