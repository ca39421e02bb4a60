#pragma once
/// The stream transport of a weight sync: model rank 0 listens on a TCP
/// port, each sampler rank connects (to the model node's address as the
/// runtime knows it), and the weights go down the socket as
/// their raw bytes, in manifest order, straight into tensors the sampler
/// allocated from the manifest: no serialisation, no copy in between, no
/// byte through the driver (actors' own; CheckpointEngine drives it).
///
///   auto listener = Listener::open(host);                   // model rank 0: its node's address, a free port
///   ... the driver tells the samplers listener->port() ...
///   send_weights(*listener, receivers, tensors, deadline);  // to every receiver, one thread each
///   recv_weights(host, port, r, tensors, deadline);         // sampler rank r of the sync, into its tensors
///
/// A short header (magic, tensor count, total bytes) comes first, so that
/// a receiver whose manifest does not match what is sent fails at once with
/// both sides named, rather than reading someone else's bytes.

#include "runtime/error.hpp"
#include "runtime/tensor.hpp"

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

namespace glint::actors::weight_sync {

using Deadline = std::chrono::steady_clock::time_point;

/// A listening TCP socket on `host` (an address of this machine: the one the
/// receivers will connect to), port chosen by the kernel. Closed on destruction.
class Listener {
public:
  static Result<Listener> open(const std::string& host = "127.0.0.1");
  Listener(Listener&& o) noexcept : fd_(o.fd_), port_(o.port_) { o.fd_ = -1; }
  Listener& operator=(Listener&& o) noexcept;
  Listener(const Listener&) = delete;
  ~Listener();
  int32_t port() const { return port_; }
  int fd() const { return fd_; }

private:
  Listener() = default;
  int fd_ = -1;
  int32_t port_ = 0;
};

/// Accepts one connection from each of receivers 0 .. `receivers` - 1 on
/// `listener` (each says which it is first) and sends `tensors` to each,
/// every receiver on a thread of its own. Answers the bytes sent to each.
/// Errors: a receiver that does not connect or read by `deadline`, a
/// broken connection, a receiver declined (see `decline`): each names the
/// receiver.
Result<int64_t> send_weights(const Listener& listener, int receivers, const std::vector<Tensor>& tensors, Deadline deadline);

/// Connects to host:port (retrying while nobody listens yet, until
/// `deadline`) as receiver `receiver` and reads the sent tensors into
/// `tensors`, which must match them in number and sizes.
Result<void> recv_weights(const std::string& host, int32_t port, int32_t receiver, std::vector<Tensor>& tensors,
                          Deadline deadline);

/// Declines the weights for receiver `receiver`: the sender fails now
/// rather than at its deadline. A receiver that cannot take them (its engine
/// did not load, the manifest is bad) declines before connecting; the
/// driver declines for a receiver whose node was lost, before or while the
/// sender sends to it (a link cut mid-send leaves no reset to fail on).
Result<void> decline(const std::string& host, int32_t port, int32_t receiver, Deadline deadline);

}  // namespace glint::actors::weight_sync
