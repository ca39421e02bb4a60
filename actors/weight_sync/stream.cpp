#include "actors/weight_sync/stream.hpp"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <memory>
#include <optional>
#include <thread>

namespace glint::actors::weight_sync {

namespace {

constexpr uint64_t kMagic = 0x676c696e74777331ULL;  // "glintws1"

struct Header {
  uint64_t magic = kMagic;
  uint64_t tensors = 0;
  uint64_t bytes = 0;
};

int64_t total_bytes(const std::vector<Tensor>& tensors) {
  int64_t n = 0;
  for (const auto& t : tensors) n += static_cast<int64_t>(t.nbytes());
  return n;
}

int ms_left(Deadline deadline) {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now()).count();
  return left <= 0 ? 0 : static_cast<int>(std::min<int64_t>(left, 1 << 30));
}

caf::error sys_error(const std::string& what) {
  return make_error(errc::unavailable, what + ": " + std::strerror(errno));
}

/// Waits until `fd` is ready for `events` or the deadline passes.
Result<void> wait(int fd, short events, Deadline deadline, const std::string& what) {
  for (;;) {
    pollfd p{fd, events, 0};
    int r = ::poll(&p, 1, ms_left(deadline));
    if (r > 0) return {};
    if (r == 0) return make_error(errc::deadline_exceeded, what + ": timed out");
    if (errno != EINTR) return sys_error(what);
  }
}

Result<void> send_all(int fd, const std::byte* p, size_t n, Deadline deadline, const std::string& what) {
  while (n > 0) {
    auto k = ::send(fd, p, n, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (k > 0) {
      p += k;
      n -= static_cast<size_t>(k);
      continue;
    }
    if (k < 0 && errno == EINTR) continue;
    if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      if (auto ok = wait(fd, POLLOUT, deadline, what); !ok) return ok;
      continue;
    }
    return sys_error(what);
  }
  return {};
}

Result<void> recv_all(int fd, std::byte* p, size_t n, Deadline deadline, const std::string& what) {
  while (n > 0) {
    auto k = ::recv(fd, p, n, MSG_DONTWAIT);
    if (k > 0) {
      p += k;
      n -= static_cast<size_t>(k);
      continue;
    }
    if (k == 0) return make_error(errc::unavailable, what + ": the other side closed the connection early");
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      if (auto ok = wait(fd, POLLIN, deadline, what); !ok) return ok;
      continue;
    }
    return sys_error(what);
  }
  return {};
}

struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

}  // namespace

Result<Listener> Listener::open(const std::string& host) {
  addrinfo hints{}, *found = nullptr;
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  if (int rc = ::getaddrinfo(host.c_str(), nullptr, &hints, &found); rc != 0 || !found)
    return make_error(errc::unavailable, "weight stream: cannot resolve " + host + ": " + ::gai_strerror(rc));
  sockaddr_in addr = *reinterpret_cast<const sockaddr_in*>(found->ai_addr);
  ::freeaddrinfo(found);
  addr.sin_port = 0;
  Listener l;
  l.fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (l.fd_ < 0) return sys_error("weight stream: socket");
  socklen_t len = sizeof(addr);
  if (::bind(l.fd_, reinterpret_cast<sockaddr*>(&addr), len) != 0 || ::listen(l.fd_, 64) != 0 ||
      ::getsockname(l.fd_, reinterpret_cast<sockaddr*>(&addr), &len) != 0)
    return sys_error("weight stream: listening on " + host);
  l.port_ = ntohs(addr.sin_port);
  return l;
}

Listener& Listener::operator=(Listener&& o) noexcept {
  std::swap(fd_, o.fd_);
  std::swap(port_, o.port_);
  return *this;
}

Listener::~Listener() {
  if (fd_ >= 0) ::close(fd_);
}

namespace {

/// What a connection says first: which receiver it is, and whether it
/// takes the weights or declines them (for itself, or the driver for a
/// receiver whose node was lost).
struct Hello {
  uint32_t magic = static_cast<uint32_t>(kMagic);
  int32_t receiver = 0;
  uint32_t declines = 0;
};

/// A connection to the listener, read up to its hello; false where it is
/// not one of ours (closed, garbage, too slow): it is dropped and ignored.
/// An error where the listener itself fails (out of descriptors).
Result<bool> take_hello(const Listener& listener, Fd& c, Hello& h, int receivers) {
  c.fd = ::accept4(listener.fd(), nullptr, nullptr, SOCK_CLOEXEC);
  if (c.fd < 0)
    return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR || errno == ECONNABORTED
               ? Result<bool>{false}
               : Result<bool>{sys_error("weight stream: accepting a receiver")};
  // A hello is 12 bytes sent right after connecting: a second is plenty,
  // and the sender never waits longer on a stranger.
  auto ok = recv_all(c.fd, reinterpret_cast<std::byte*>(&h), sizeof h,
                     std::chrono::steady_clock::now() + std::chrono::seconds(1), "weight stream: a hello");
  return ok && h.magic == static_cast<uint32_t>(kMagic) && h.receiver >= 0 && h.receiver < receivers;
}

std::string receiver_name(int r, int receivers) {
  return "receiver " + std::to_string(r + 1) + " of " + std::to_string(receivers);
}

caf::error declined(int r, int receivers) {
  return make_error(errc::unavailable, "weight stream: " + receiver_name(r, receivers) +
                                           " declined (it cannot take the weights, or its node was lost)");
}

}  // namespace

Result<int64_t> send_weights(const Listener& listener, int receivers, const std::vector<Tensor>& tensors,
                             Deadline deadline) {
  if (receivers < 1) return make_error(errc::invalid_argument, "weight stream: no receivers");
  const auto n = static_cast<size_t>(receivers);
  std::vector<Fd> conns(n);
  std::vector<char> said_no(n, 0);
  // Every receiver connects and says which it is, or is declined. All are
  // heard before the send fails for a decline: closing the listener on the
  // first would leave the others retrying to connect until their deadline.
  std::optional<caf::error> refused;
  for (size_t heard = 0; heard < n;) {
    size_t first_missing = 0;
    while (conns[first_missing].fd >= 0 || said_no[first_missing]) ++first_missing;
    const auto what = "weight stream: waiting for " + receiver_name(static_cast<int>(first_missing), receivers);
    if (auto ok = wait(listener.fd(), POLLIN, deadline, what); !ok) return ok.error();
    Fd c;
    Hello h;
    auto ours = take_hello(listener, c, h, receivers);
    if (!ours) return ours.error();
    if (!*ours) continue;
    const auto r = static_cast<size_t>(h.receiver);
    if (said_no[r]) continue;
    if (h.declines) {
      said_no[r] = 1;
      if (!refused) refused = declined(h.receiver, receivers);
      if (conns[r].fd < 0) ++heard;
      continue;
    }
    if (conns[r].fd >= 0) continue;  // a second connection for one receiver: not ours
    std::swap(conns[r].fd, c.fd);
    ++heard;
  }
  // The others get a closed connection at once (their call fails too).
  if (refused) return *refused;
  const Header header{kMagic, tensors.size(), static_cast<uint64_t>(total_bytes(tensors))};
  std::vector<caf::error> failed(n);
  std::vector<std::atomic<bool>> cancelled(n);
  std::atomic<size_t> finished{0};
  auto send_to = [&](size_t r) {
    const int fd = conns[r].fd;
    int one = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    const auto what = "weight stream: sending to " + receiver_name(static_cast<int>(r), receivers);
    auto ok = send_all(fd, reinterpret_cast<const std::byte*>(&header), sizeof header, deadline, what);
    for (size_t i = 0; ok && i < tensors.size(); ++i) ok = send_all(fd, tensors[i].data(), tensors[i].nbytes(), deadline, what);
    // The receiver answers one byte once it holds everything.
    char ack = 0;
    if (ok) ok = recv_all(fd, reinterpret_cast<std::byte*>(&ack), 1, deadline, what + " (its acknowledgement)");
    // This thread alone writes failed[r]; the watcher below only cancels.
    if (!ok) failed[r] = cancelled[r] ? declined(static_cast<int>(r), receivers) : ok.error();
    ++finished;
  };
  std::vector<std::thread> threads;
  for (size_t r = 0; r < n; ++r) threads.emplace_back(send_to, r);
  // Meanwhile the listener stays open for declines: a receiver lost mid-send
  // (its link cut: no reset, its acknowledgement never comes) is declined by
  // the driver, and its connection is shut, so the send fails now rather
  // than at its deadline.
  while (finished < n) {
    pollfd p{listener.fd(), POLLIN, 0};
    if (::poll(&p, 1, 20) <= 0) continue;
    Fd c;
    Hello h;
    auto ours = take_hello(listener, c, h, receivers);
    if (!ours) std::this_thread::sleep_for(std::chrono::milliseconds(20));  // out of descriptors: the threads end anyway
    if (!ours || !*ours || !h.declines) continue;
    const auto r = static_cast<size_t>(h.receiver);
    if (cancelled[r].exchange(true)) continue;
    ::shutdown(conns[r].fd, SHUT_RDWR);  // wakes its thread: the send or the wait for the acknowledgement fails
  }
  for (auto& t : threads) t.join();
  for (auto& e : failed)
    if (e) return e;
  return static_cast<int64_t>(header.bytes);
}

namespace {

/// A connection to the model's listener, retried while nobody listens yet.
Result<void> connect_to(Fd& c, const std::string& host, int32_t port, Deadline deadline) {
  const auto where = host + ":" + std::to_string(port);
  addrinfo hints{}, *found = nullptr;
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  if (int rc = ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found); rc != 0 || !found)
    return make_error(errc::unavailable, "weight stream: cannot resolve " + host + ": " + ::gai_strerror(rc));
  std::unique_ptr<addrinfo, decltype(&::freeaddrinfo)> guard{found, ::freeaddrinfo};
  // The sender may not listen yet when the driver's message arrives: retry until the deadline.
  for (;;) {
    c.fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (c.fd < 0) return sys_error("weight stream: socket");
    if (::connect(c.fd, found->ai_addr, found->ai_addrlen) == 0) break;
    const int err = errno;
    ::close(c.fd);
    c.fd = -1;
    if ((err != ECONNREFUSED && err != EINTR) || ms_left(deadline) == 0)
      return make_error(err == ECONNREFUSED ? errc::deadline_exceeded : errc::unavailable,
                        "weight stream: cannot connect to the model at " + where + ": " + std::strerror(err));
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return {};
}

}  // namespace

Result<void> decline(const std::string& host, int32_t port, int32_t receiver, Deadline deadline) {
  Fd c;
  if (auto ok = connect_to(c, host, port, deadline); !ok) return ok;
  const Hello h{.receiver = receiver, .declines = 1};
  return send_all(c.fd, reinterpret_cast<const std::byte*>(&h), sizeof h, deadline, "weight stream: declining");
}

Result<void> recv_weights(const std::string& host, int32_t port, int32_t receiver, std::vector<Tensor>& tensors,
                          Deadline deadline) {
  const auto where = host + ":" + std::to_string(port);
  Fd c;
  if (auto ok = connect_to(c, host, port, deadline); !ok) return ok;
  const auto what = "weight stream: receiving from " + where;
  const Hello hello{.receiver = receiver, .declines = 0};
  if (auto ok = send_all(c.fd, reinterpret_cast<const std::byte*>(&hello), sizeof hello, deadline, what); !ok) return ok;
  Header h;
  if (auto ok = recv_all(c.fd, reinterpret_cast<std::byte*>(&h), sizeof h, deadline, what); !ok) return ok;
  const auto want = static_cast<uint64_t>(total_bytes(tensors));
  if (h.magic != kMagic || h.tensors != tensors.size() || h.bytes != want)
    return make_error(errc::invalid_argument, what + ": the sender sends " + std::to_string(h.tensors) + " tensors of " +
                                                  std::to_string(h.bytes) + " bytes, the manifest lists " +
                                                  std::to_string(tensors.size()) + " of " + std::to_string(want));
  for (auto& t : tensors)
    if (auto ok = recv_all(c.fd, t.mutable_data(), t.nbytes(), deadline, what); !ok) return ok;
  const char ack = 1;
  return send_all(c.fd, reinterpret_cast<const std::byte*>(&ack), 1, deadline, what + " (acknowledging)");
}

}  // namespace glint::actors::weight_sync
