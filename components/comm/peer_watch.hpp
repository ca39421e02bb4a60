#pragma once
/// `PeerWatch`: heartbeats among the ranks of a process group, so that a
/// collective stops waiting for a rank that has gone silent.
///
/// Gloo waits for a silent peer until its own timeout (5 minutes): a frozen
/// process (SIGSTOP, a machine that hangs) or a link cut without a reset
/// sends nothing, not even an error. Each rank's watch sends a small UDP
/// datagram to every other rank every timeout/5 and notes when it last heard
/// each one; `silent()` names a rank not heard from for the timeout. UDP, not
/// the group's TCP store: the store lives in rank 0's process, and a frozen
/// rank 0 would freeze the watch with it.
///
///   auto w = PeerWatch::open(rank, "10.0.0.2", 5s);   // binds its socket
///   publish(w->address()); ... w->start(addresses_of_all_ranks);
///   if (auto why = w->silent()) fail(*why);
///
/// A rank never heard from at all (UDP blocked between the machines) is not
/// called silent: the watch cannot tell a firewall from a freeze, and a
/// false alarm would end a healthy run. It is logged once instead, and such
/// a group falls back on Gloo's timeout.

#include "runtime/error.hpp"

#include <chrono>
#include <memory>
#include <condition_variable>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace glint::components {

class PeerWatch {
public:
  /// Binds a UDP socket on `host` (this machine's address that the other
  /// ranks reach it by), port chosen by the kernel.
  static Result<std::unique_ptr<PeerWatch>> open(int rank, const std::string& host, std::chrono::milliseconds timeout);
  ~PeerWatch();
  PeerWatch(const PeerWatch&) = delete;
  PeerWatch& operator=(const PeerWatch&) = delete;

  /// "host port id timeout_ms": what the other ranks need to hear this one,
  /// to tell its datagrams from a stranger's, and to agree on the timeout.
  std::string address() const;
  /// Starts sending and listening; `addresses[r]` is rank r's address()
  /// (this rank's own entry is skipped; kNoWatch: a rank without a watch,
  /// never expected to be heard). The timeout becomes the longest of all
  /// ranks', so that no rank sends more slowly than another listens for.
  Result<void> start(const std::vector<std::string>& addresses);
  /// Waits (after start) until every watched rank has been heard once, or
  /// `bound` has passed; returns the ranks still unheard. A rank frozen
  /// before its first heartbeat arrived would otherwise count as "never
  /// heard" (UDP blocked) and never as silent: a group waits for this
  /// before it is handed out, so its watch is armed from the first call.
  std::vector<int> await_peers(std::chrono::milliseconds bound) const;
  /// Why a rank counts as gone: "rank 1 has sent no heartbeat for 5.2 s";
  /// empty while every rank heard from at all was heard within the timeout.
  /// Time this process itself stood still (paused, its watch thread not
  /// run) does not count: silence is measured up to the watch's last look
  /// at its socket, and none is told while that look is not recent.
  std::optional<std::string> silent() const;
  /// The agreed timeout (after start).
  std::chrono::milliseconds timeout() const { return timeout_; }

  /// The address a rank publishes when it could not open a watch.
  static constexpr const char* kNoWatch = "-";

private:
  struct Peer;
  PeerWatch(int rank, int fd, std::string host, uint16_t port, uint64_t id, std::chrono::milliseconds timeout);
  void loop();

  const int rank_;
  const int fd_;
  const std::string host_;
  const uint16_t port_;
  const uint64_t id_;
  std::chrono::milliseconds timeout_;  // fixed once started
  std::vector<Peer> peers_;  // by rank; fixed once started
  mutable std::mutex mu_;
  mutable std::condition_variable first_heard_;  // a rank heard for the first time
  bool stop_ = false;
  std::chrono::steady_clock::time_point drained_{};  // the loop's last look at its socket
  std::thread thread_;
};

}  // namespace glint::components
