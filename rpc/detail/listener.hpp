#pragma once
// A listening port that holds under load (rpc's own). `glint serve`'s three
// ports (Cap'n Proto, the Tinker API's HTTP, metrics) accept through it:
//
//   Listener door(timer, addr->listen(), {.name = "the Tinker API", .max_connections = 256, .tls = tls},
//                 [&](kj::Own<kj::AsyncIoStream> s, std::shared_ptr<ConnectionState> state) {
//                   return http.listenHttp(kj::mv(s));
//                 });
//   auto accepting = door.run();   // never completes; drop it to stop accepting
//
//  - At most `max_connections` are open at once; one past that is closed as
//    soon as it is accepted.
//  - TLS handshakes run per connection, each within `handshake_timeout`:
//    one slow handshake does not hold the port (KJ's wrapPort does them
//    one at a time).
//  - A failed accept never stops the port. Out of file descriptors, it
//    closes the oldest connections that are neither busy nor kept (see
//    ConnectionState) and tries again after a back-off (10 ms doubling to
//    1 s); other failures are retried after 10 ms.
//  - What it logs about refusals and failures is rate-limited (RateLimitedLog):
//    a flood of connections cannot fill the disk with log lines.

#include <kj/async-io.h>
#include <kj/compat/tls.h>
#include <kj/timer.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>

namespace glint::rpc::detail {

/// At most one line per kind per `every`, with the count of the lines it
/// left out since the last one. Thread-safe.
class RateLimitedLog {
public:
  explicit RateLimitedLog(std::chrono::milliseconds every = std::chrono::seconds(10)) : every_(every) {}
  /// Writes `line` (at warn level when `warn`, else info) unless a line of
  /// `kind` was written within `every`. Answers whether it wrote.
  bool write(const std::string& kind, const std::string& line, bool warn = true);

private:
  struct Kind {
    std::chrono::steady_clock::time_point last{};
    int64_t left_out = 0;
    bool any = false;
  };
  std::chrono::milliseconds every_;
  std::mutex mx_;
  std::map<std::string, Kind> kinds_;
};

/// What a port's serve function tells it about one connection.
struct ConnectionState {
  int busy = 0;               ///< requests in progress (HTTP); a busy connection is never shed
  std::function<bool()> kept; ///< when set and true (an authenticated Cap'n Proto peer), never shed
  bool shed = false;          ///< set when the port closed it to free a descriptor
  bool sheddable() const { return !shed && busy == 0 && !(kept && kept()); }
};

class Listener {
public:
  struct Options {
    std::string name;  ///< for logs: "the Tinker API"
    int64_t max_connections = 256;
    kj::TlsContext* tls = nullptr;  ///< handshakes per connection when set
    kj::Duration handshake_timeout = 10 * kj::SECONDS;
  };
  using Serve = std::function<kj::Promise<void>(kj::Own<kj::AsyncIoStream>, std::shared_ptr<ConnectionState>)>;

  Listener(kj::Timer& timer, kj::Own<kj::ConnectionReceiver> receiver, Options options, Serve serve);
  ~Listener();
  Listener(const Listener&) = delete;
  Listener& operator=(const Listener&) = delete;

  /// Accepts until the promise is dropped; it never completes. Connections
  /// already open stay until the Listener goes.
  kj::Promise<void> run();
  int64_t open() const { return static_cast<int64_t>(open_.size()); }
  int64_t shed_total() const { return shed_total_; }
  int64_t refused_total() const { return refused_total_; }

  /// Whether an accept failure means the process is out of descriptors.
  static bool out_of_descriptors(const kj::Exception& e);
  /// Raises the soft open-file limit towards the hard one so that `needed`
  /// descriptors fit; answers the soft limit in force after.
  static int64_t raise_descriptor_limit(int64_t needed);

private:
  void admit(kj::Own<kj::AsyncIoStream> stream);
  kj::Promise<void> recover(kj::Exception&& e);
  /// Closes up to `n` of the oldest sheddable connections; answers how many.
  int64_t shed(int64_t n);

  struct Entry {
    std::shared_ptr<ConnectionState> state;
    kj::Own<kj::PromiseFulfiller<void>> close;
  };
  struct Errors final : kj::TaskSet::ErrorHandler {
    Listener* self;
    void taskFailed(kj::Exception&& e) override;
  };

  kj::Timer& timer_;
  kj::Own<kj::ConnectionReceiver> receiver_;
  Options o_;
  Serve serve_;
  RateLimitedLog log_;
  kj::Duration backoff_ = 0 * kj::MILLISECONDS;
  uint64_t next_id_ = 0;
  int64_t shed_total_ = 0, refused_total_ = 0;
  std::map<uint64_t, Entry> open_;  // by age; before tasks_, whose ends erase from it
  Errors errors_;
  kj::TaskSet tasks_;
};

/// A Cap'n Proto peer's stream that reads at most `limit` bytes until
/// `*authenticated`: the message reader sizes a frame from its header, so
/// without it a peer with no key could make the server take in most of a
/// max_message_bytes frame (and hold it until auth_seconds) for nothing.
class PreAuthLimit final : public kj::AsyncIoStream {
public:
  PreAuthLimit(kj::Own<kj::AsyncIoStream> inner, std::shared_ptr<bool> authenticated, uint64_t limit)
      : inner_(kj::mv(inner)), authenticated_(std::move(authenticated)), limit_(limit) {}
  kj::Promise<size_t> tryRead(void* buffer, size_t min_bytes, size_t max_bytes) override;
  kj::Promise<void> write(const void* buffer, size_t size) override { return inner_->write(buffer, size); }
  kj::Promise<void> write(kj::ArrayPtr<const kj::ArrayPtr<const kj::byte>> pieces) override {
    return inner_->write(pieces);
  }
  kj::Promise<void> whenWriteDisconnected() override { return inner_->whenWriteDisconnected(); }
  void shutdownWrite() override { inner_->shutdownWrite(); }
  void abortRead() override { inner_->abortRead(); }
  void getsockopt(int level, int option, void* value, kj::uint* length) override {
    inner_->getsockopt(level, option, value, length);
  }
  void setsockopt(int level, int option, const void* value, kj::uint length) override {
    inner_->setsockopt(level, option, value, length);
  }
  void getsockname(struct sockaddr* addr, kj::uint* length) override { inner_->getsockname(addr, length); }
  void getpeername(struct sockaddr* addr, kj::uint* length) override { inner_->getpeername(addr, length); }

private:
  kj::Own<kj::AsyncIoStream> inner_;
  std::shared_ptr<bool> authenticated_;
  uint64_t limit_, read_ = 0;
};

}  // namespace glint::rpc::detail
