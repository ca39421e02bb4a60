#include "components/comm/peer_watch.hpp"

#include "runtime/log.hpp"

#include <arpa/inet.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <sstream>

namespace glint::components {

namespace {

using Clock = std::chrono::steady_clock;

constexpr uint32_t kMagic = 0x57504c47;  // "GLPW"

struct Datagram {
  uint32_t magic;
  uint32_t rank;
  uint64_t id;
};

Result<sockaddr_storage> resolve(const std::string& host, uint16_t port, socklen_t& len) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_DGRAM;
  hints.ai_flags = AI_NUMERICHOST;
  addrinfo* found = nullptr;
  if (int rc = ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found); rc != 0 || !found)
    return make_error(errc::invalid_argument, "'" + host + "' is not an address: " + ::gai_strerror(rc));
  sockaddr_storage out{};
  std::memcpy(&out, found->ai_addr, found->ai_addrlen);
  len = found->ai_addrlen;
  ::freeaddrinfo(found);
  return out;
}

std::string seconds(Clock::duration d) {
  std::ostringstream s;
  s.precision(1);
  s << std::fixed << std::chrono::duration<double>(d).count() << " s";
  return s.str();
}

}  // namespace

struct PeerWatch::Peer {
  sockaddr_storage addr{};
  socklen_t len = 0;
  uint64_t id = 0;
  Clock::time_point heard{};  // under mu_
  bool ever = false;          // under mu_
  bool warned = false;        // the watch's thread only
};

Result<std::unique_ptr<PeerWatch>> PeerWatch::open(int rank, const std::string& host, std::chrono::milliseconds timeout) {
  if (timeout < std::chrono::milliseconds(100))
    return make_error(errc::invalid_argument, "a peer timeout of " + std::to_string(timeout.count()) +
                                                  " ms is too short to tell a busy rank from a lost one (at least 100 ms)");
  socklen_t len = 0;
  auto addr = resolve(host, 0, len);
  if (!addr) return with_context(addr.error(), "the heartbeat socket's address");
  const int fd = ::socket(addr->ss_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return make_error(errc::unavailable, std::string{"a heartbeat socket: "} + std::strerror(errno));
  if (::bind(fd, reinterpret_cast<sockaddr*>(&*addr), len) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&*addr), &len) != 0) {
    const int err = errno;
    ::close(fd);
    return make_error(errc::unavailable, "binding the heartbeat socket on " + host + ": " + std::strerror(err));
  }
  const uint16_t port = ntohs(addr->ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&*addr)->sin6_port
                                                          : reinterpret_cast<sockaddr_in*>(&*addr)->sin_port);
  const uint64_t id = std::random_device{}() * uint64_t{0x100000000} + std::random_device{}();
  return std::unique_ptr<PeerWatch>{new PeerWatch(rank, fd, host, port, id, timeout)};
}

PeerWatch::PeerWatch(int rank, int fd, std::string host, uint16_t port, uint64_t id, std::chrono::milliseconds timeout)
    : rank_(rank), fd_(fd), host_(std::move(host)), port_(port), id_(id), timeout_(timeout) {}

PeerWatch::~PeerWatch() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  if (thread_.joinable()) thread_.join();
  ::close(fd_);
}

std::string PeerWatch::address() const {
  return host_ + " " + std::to_string(port_) + " " + std::to_string(id_) + " " + std::to_string(timeout_.count());
}

Result<void> PeerWatch::start(const std::vector<std::string>& addresses) {
  if (thread_.joinable()) return make_error(errc::failed_precondition, "the peer watch is already started");
  if (rank_ < 0 || static_cast<size_t>(rank_) >= addresses.size())
    return make_error(errc::invalid_argument, "rank " + std::to_string(rank_) + " has no address among " +
                                                  std::to_string(addresses.size()));
  std::vector<Peer> peers(addresses.size());
  auto timeout = timeout_;
  for (size_t r = 0; r < addresses.size(); ++r) {
    if (static_cast<int>(r) == rank_ || addresses[r] == kNoWatch) continue;
    std::istringstream in(addresses[r]);
    std::string host;
    unsigned port = 0;
    uint64_t id = 0;
    int64_t ms = 0;
    if (!(in >> host >> port >> id >> ms) || port == 0 || port > 65535 || ms < 1)
      return make_error(errc::invalid_argument, "rank " + std::to_string(r) + "'s heartbeat address '" + addresses[r] +
                                                    "' is not 'host port id timeout_ms'");
    timeout = std::max(timeout, std::chrono::milliseconds(ms));
    auto addr = resolve(host, static_cast<uint16_t>(port), peers[r].len);
    if (!addr) return with_context(addr.error(), "rank " + std::to_string(r) + "'s heartbeat address");
    peers[r].addr = *addr;
    peers[r].id = id;
  }
  peers_ = std::move(peers);
  timeout_ = timeout;
  drained_ = Clock::now();
  thread_ = std::thread([this] { loop(); });
  return {};
}

void PeerWatch::loop() {
  const auto interval = std::max(timeout_ / 5, std::chrono::milliseconds(20));
  const auto started = Clock::now();
  const Datagram mine{kMagic, static_cast<uint32_t>(rank_), id_};
  auto next_send = started;
  std::unique_lock lock(mu_);
  while (!stop_) {
    const auto now = Clock::now();
    if (now >= next_send) {
      lock.unlock();
      for (size_t r = 0; r < peers_.size(); ++r)
        if (static_cast<int>(r) != rank_ && peers_[r].len > 0)  // a lost datagram is a missed beat, nothing more
          (void)::sendto(fd_, &mine, sizeof(mine), MSG_DONTWAIT, reinterpret_cast<const sockaddr*>(&peers_[r].addr),
                         peers_[r].len);
      lock.lock();
      next_send = now + interval;
      for (size_t r = 0; r < peers_.size(); ++r) {
        auto& p = peers_[r];
        if (static_cast<int>(r) == rank_ || p.len == 0 || p.ever || p.warned || now - started < timeout_) continue;
        p.warned = true;
        log::warn("process group rank " + std::to_string(rank_) + ": no heartbeat from rank " + std::to_string(r) +
                  " in " + seconds(now - started) +
                  " (UDP blocked between them?); a frozen rank " + std::to_string(r) +
                  " is noticed only at the group's timeout");
      }
    }
    lock.unlock();
    pollfd pfd{fd_, POLLIN, 0};
    const auto wait = std::chrono::duration_cast<std::chrono::milliseconds>(next_send - Clock::now());
    // A short poll, so that the destructor's stop is seen within a tick.
    const int got = ::poll(&pfd, 1, static_cast<int>(std::clamp<int64_t>(wait.count(), 0, 50)));
    lock.lock();
    if (got > 0) {
      Datagram d{};
      while (true) {
        const auto n = ::recv(fd_, &d, sizeof(d), MSG_DONTWAIT);
        if (n < 0) break;
        if (n != sizeof(d) || d.magic != kMagic || d.rank >= peers_.size() || static_cast<int>(d.rank) == rank_ ||
            peers_[d.rank].len == 0 || d.id != peers_[d.rank].id)
          continue;  // not one of this group's ranks
        peers_[d.rank].heard = Clock::now();
        if (!peers_[d.rank].ever) first_heard_.notify_all();
        peers_[d.rank].ever = true;
      }
    }
    drained_ = Clock::now();
  }
}

std::vector<int> PeerWatch::await_peers(std::chrono::milliseconds bound) const {
  std::vector<int> unheard;
  std::unique_lock lock(mu_);
  first_heard_.wait_for(lock, bound, [&] {
    unheard.clear();
    for (size_t r = 0; r < peers_.size(); ++r)
      if (static_cast<int>(r) != rank_ && peers_[r].len > 0 && !peers_[r].ever) unheard.push_back(static_cast<int>(r));
    return unheard.empty();
  });
  return unheard;
}

std::optional<std::string> PeerWatch::silent() const {
  std::lock_guard lock(mu_);
  // The loop looks at its socket at least every 50 ms; a look longer ago
  // means this process stood still, and the datagrams that came meanwhile
  // are still unread: no verdict until it has caught up.
  if (Clock::now() - drained_ > std::chrono::milliseconds(500)) return std::nullopt;
  for (size_t r = 0; r < peers_.size(); ++r) {
    const auto& p = peers_[r];
    if (static_cast<int>(r) == rank_ || !p.ever || drained_ - p.heard <= timeout_) continue;
    return "rank " + std::to_string(r) + " has sent no heartbeat for " + seconds(drained_ - p.heard) +
           " (its process frozen, or its link cut; the peer timeout is " + seconds(timeout_) + ")";
  }
  return std::nullopt;
}

}  // namespace glint::components
