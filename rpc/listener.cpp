#include "rpc/detail/listener.hpp"

#include "runtime/log.hpp"

#include <kj/debug.h>

#include <sys/resource.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace glint::rpc::detail {

bool RateLimitedLog::write(const std::string& kind, const std::string& line, bool warn) {
  std::string text;
  {
    std::lock_guard<std::mutex> guard{mx_};
    auto& k = kinds_[kind];
    const auto now = std::chrono::steady_clock::now();
    if (k.any && now - k.last < every_) {
      ++k.left_out;
      return false;
    }
    text = line;
    if (k.left_out > 0)
      text += " (and " + std::to_string(k.left_out) + " more like it in the last " +
              std::to_string(std::chrono::duration_cast<std::chrono::seconds>(now - k.last).count()) + " s)";
    k = Kind{now, 0, true};
  }
  if (warn) log::warn(text);
  else log::info(text);
  return true;
}

Listener::Listener(kj::Timer& timer, kj::Own<kj::ConnectionReceiver> receiver, Options options, Serve serve)
    : timer_(timer), receiver_(kj::mv(receiver)), o_(std::move(options)), serve_(std::move(serve)), tasks_(errors_) {
  errors_.self = this;
}

Listener::~Listener() = default;

void Listener::Errors::taskFailed(kj::Exception&& e) {
  self->log_.write("ended", "serve: " + self->o_.name + ": a connection ended: " + e.getDescription().cStr(), false);
}

bool Listener::out_of_descriptors(const kj::Exception& e) {
  const std::string text = e.getDescription().cStr();
  for (int code : {EMFILE, ENFILE, ENOBUFS, ENOMEM})
    if (text.find(std::strerror(code)) != std::string::npos) return true;
  return false;
}

int64_t Listener::raise_descriptor_limit(int64_t needed) {
  rlimit l{};
  if (::getrlimit(RLIMIT_NOFILE, &l) != 0) return -1;
  if (l.rlim_cur != RLIM_INFINITY && static_cast<int64_t>(l.rlim_cur) < needed) {
    rlimit want = l;
    want.rlim_cur = l.rlim_max == RLIM_INFINITY ? static_cast<rlim_t>(needed)
                                                : std::min<rlim_t>(l.rlim_max, static_cast<rlim_t>(needed));
    if (::setrlimit(RLIMIT_NOFILE, &want) == 0) l = want;
  }
  return l.rlim_cur == RLIM_INFINITY ? INT64_MAX : static_cast<int64_t>(l.rlim_cur);
}

kj::Promise<void> Listener::run() {
  // evalNow: KJ's accept() throws at once (not through the promise) when
  // accept4 fails before it had to wait, as it does out of descriptors; a
  // throw here would end the loop past the error handler below.
  return kj::evalNow([this] { return receiver_->accept(); })
      .then(
          [this](kj::Own<kj::AsyncIoStream> stream) -> kj::Promise<void> {
            backoff_ = 0 * kj::MILLISECONDS;
            admit(kj::mv(stream));
            return kj::READY_NOW;
          },
          [this](kj::Exception&& e) { return recover(kj::mv(e)); })
      .then([this] { return run(); });
}

void Listener::admit(kj::Own<kj::AsyncIoStream> stream) {
  if (open() >= o_.max_connections) {
    ++refused_total_;
    log_.write("refused", "serve: " + o_.name + ": refused a connection: " + std::to_string(open()) +
                              " are open, the most it takes (" + std::to_string(o_.max_connections) + ")");
    return;  // the stream goes: closed at once
  }
  const auto id = next_id_++;
  auto state = std::make_shared<ConnectionState>();
  auto closer = kj::newPromiseAndFulfiller<void>();
  open_.emplace(id, Entry{state, kj::mv(closer.fulfiller)});
  kj::Promise<kj::Own<kj::AsyncIoStream>> ready = nullptr;
  if (o_.tls) {
    ready = o_.tls->wrapServer(kj::mv(stream))
                .exclusiveJoin(timer_.afterDelay(o_.handshake_timeout).then([]() -> kj::Own<kj::AsyncIoStream> {
                  KJ_FAIL_REQUIRE("the TLS handshake did not finish in time");
                }));
  } else {
    ready = kj::mv(stream);
  }
  auto served = ready.then([this, state](kj::Own<kj::AsyncIoStream> s) { return serve_(kj::mv(s), state); });
  // The entry (and its fulfiller) goes after the promise above, which the
  // attachment outlives.
  tasks_.add(served.exclusiveJoin(kj::mv(closer.promise)).attach(kj::defer([this, id] { open_.erase(id); })));
}

int64_t Listener::shed(int64_t n) {
  int64_t done = 0;
  for (auto& [_, e] : open_) {
    if (done >= n) break;
    if (!e.state->sheddable()) continue;
    e.state->shed = true;
    e.close->fulfill();
    ++done;
  }
  shed_total_ += done;
  return done;
}

kj::Promise<void> Listener::recover(kj::Exception&& e) {
  const bool fds = out_of_descriptors(e);
  int64_t closed = 0;
  if (fds) {
    // Room for a burst: a sixteenth of what is open, at least one.
    closed = shed(std::max<int64_t>(1, open() / 16));
    backoff_ = std::min(std::max(backoff_ * 2, 10 * kj::MILLISECONDS), 1 * kj::SECONDS);
  } else {
    backoff_ = 10 * kj::MILLISECONDS;
  }
  log_.write(fds ? "descriptors" : "accept",
             "serve: " + o_.name + ": accept failed: " + e.getDescription().cStr() +
                 (fds ? "; closed " + std::to_string(closed) + " idle connection(s) of " + std::to_string(open()) +
                            " and tries again"
                      : "; tries again"));
  return timer_.afterDelay(backoff_);
}

kj::Promise<size_t> PreAuthLimit::tryRead(void* buffer, size_t min_bytes, size_t max_bytes) {
  if (*authenticated_) return inner_->tryRead(buffer, min_bytes, max_bytes);
  // Never more than the rest of the allowance in one read, so that the
  // bytes taken in before the key is checked stay within it.
  const uint64_t left = limit_ > read_ ? limit_ - read_ : 0;
  if (left == 0)
    return KJ_EXCEPTION(DISCONNECTED, "the peer sent more than the bytes allowed before authenticating",
                        limit_);
  max_bytes = static_cast<size_t>(std::min<uint64_t>(max_bytes, left));
  min_bytes = std::min(min_bytes, max_bytes);
  return inner_->tryRead(buffer, min_bytes, max_bytes).then([this](size_t n) {
    if (!*authenticated_) read_ += n;
    return n;
  });
}

}  // namespace glint::rpc::detail
