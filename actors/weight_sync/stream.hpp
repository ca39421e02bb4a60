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
///   recv_weights(host, port, tensors, deadline);            // a sampler rank, into its tensors
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

/// Accepts `receivers` connections on `listener` and sends `tensors` to
/// each, every receiver on a thread of its own. Answers the bytes sent to
/// each. Errors: a receiver that does not connect or read by `deadline`,
/// a broken connection (the receiver named by its order of arrival).
Result<int64_t> send_weights(const Listener& listener, int receivers, const std::vector<Tensor>& tensors, Deadline deadline);

/// Connects to host:port (retrying while nobody listens yet, until
/// `deadline`) and reads the sent tensors into `tensors`, which must match
/// them in number and sizes.
Result<void> recv_weights(const std::string& host, int32_t port, std::vector<Tensor>& tensors, Deadline deadline);

/// Connects and closes at once: a receiver that cannot take the weights
/// (its engine did not load, the manifest is bad) lets the sender fail
/// now rather than wait for it until the deadline.
Result<void> decline(const std::string& host, int32_t port, Deadline deadline);

}  // namespace glint::actors::weight_sync
