#pragma once
// Timing helpers shared by the benchmarks.

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
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
