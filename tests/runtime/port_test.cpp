// pick_free_port: the ports that process groups' stores and clusters' masters
// listen on.
#include "runtime/process.hpp"

#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sched.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <set>
#include <vector>

namespace glint {
namespace {

int ephemeral_low() {
  std::ifstream in{"/proc/sys/net/ipv4/ip_local_port_range"};
  int lo = 32768, hi = 60999;
  in >> lo >> hi;
  return lo;
}

// Binds a listener on every IPv4 address at `port`; -1 if it cannot.
int listen_on(uint16_t port) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_ANY);
  addr.sin_port = htons(port);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 || ::listen(fd, 1) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

TEST(PickFreePort, GivesDistinctBindablePortsBelowTheEphemeralRange) {
  // Picked ports not yet bound must not repeat (the Fsdp grid test picks
  // several before binding any), and must lie where outgoing connections
  // take no port: a store's port taken by another test's connection failed
  // that test with "Address already in use".
  const int low = ephemeral_low();
  ASSERT_GT(low, 2024) << "this machine's ephemeral range starts at " << low << ": the picks fall back to bind(0)";
  std::set<uint16_t> seen;
  for (int i = 0; i < 300; ++i) {
    auto port = pick_free_port();
    ASSERT_TRUE(port) << describe(port.error());
    EXPECT_LT(*port, low);
    EXPECT_GE(*port, 1024);
    EXPECT_TRUE(seen.insert(*port).second) << "port " << *port << " picked twice";
  }
  // Each is free to listen on.
  int bound = 0;
  for (auto port : seen) {
    const int fd = listen_on(port);
    if (fd >= 0) {
      ++bound;
      ::close(fd);
    }
  }
  EXPECT_GE(bound, 295) << "of 300 picked ports, only " << bound << " could be listened on";
}

TEST(PickFreePort, SkipsAPortSomeoneListensOn) {
  // Hold many of the range's ports: none of them may be picked.
  const int low = ephemeral_low();
  ASSERT_GT(low, 2024);
  const int first = std::max(1024, low - 1 - 12000);
  std::set<uint16_t> held;
  std::vector<int> fds;
  for (int p = first; p < first + 2000; ++p) {
    const int fd = listen_on(static_cast<uint16_t>(p));
    if (fd >= 0) {
      held.insert(static_cast<uint16_t>(p));
      fds.push_back(fd);
    }
  }
  for (int i = 0; i < 200; ++i) {
    auto port = pick_free_port();
    ASSERT_TRUE(port);
    EXPECT_EQ(held.count(*port), 0u) << "picked " << *port << ", which this test listens on";
  }
  for (int fd : fds) ::close(fd);
}

TEST(PickFreePort, FallsBackToTheKernelsChoiceWhereTheRangeStartsLowAndStillNeverRepeats) {
  // In a network namespace of its own (the port range is per namespace), a
  // child sets the ephemeral range to start at 1024, so that no range lies
  // below it: every pick takes the kernel's bind(0) fallback.
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    if (::unshare(CLONE_NEWNET) != 0) ::_exit(77);  // not root: nothing to test here
    {
      std::ofstream range{"/proc/sys/net/ipv4/ip_local_port_range"};
      range << "1024 65535\n";
      if (!range.flush()) ::_exit(77);
    }
    if (ephemeral_low() != 1024) ::_exit(3);
    // 1000 picks, none bound in between: the kernel's own choices would
    // repeat some (about 8 expected among 1000 of 64,000 ports).
    std::set<uint16_t> seen;
    for (int i = 0; i < 1000; ++i) {
      auto port = pick_free_port();
      if (!port) ::_exit(4);
      if (!seen.insert(*port).second) ::_exit(5);  // the fallback handed a port out twice
    }
    // Each free on every IPv4 address.
    for (auto port : seen) {
      const int fd = listen_on(port);
      if (fd < 0) ::_exit(6);
      ::close(fd);
    }
    ::_exit(0);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  if (WEXITSTATUS(status) == 77) GTEST_SKIP() << "needs root to make a network namespace";
  EXPECT_EQ(WEXITSTATUS(status), 0) << "3: the range did not change; 4: a pick failed; 5: a port twice; 6: a picked "
                                       "port could not be listened on";
}

}  // namespace
}  // namespace glint
