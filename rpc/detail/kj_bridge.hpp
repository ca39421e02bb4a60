#pragma once
// Between KJ's event loop (one I/O thread owns the connections) and glint's
// futures (answered on CAF threads). rpc's own.

#include "runtime/future.hpp"

#include <capnp/message.h>
#include <kj/async.h>
#include <kj/exception.h>

#include <memory>
#include <optional>
#include <string>

namespace glint::rpc::detail {

/// A promise, on the calling KJ thread, of `f`'s result: the thread that
/// answers `f` copies it into a slot and wakes the loop through a
/// cross-thread fulfiller. The promise's continuation holds only the slot,
/// never the future, so a future dropped unanswered drops its callback, the
/// fulfiller with it, and the promise rejects instead of waiting forever.
template <class T>
kj::Promise<Result<T>> await_future(Future<T> f) {
  struct Slot {
    std::optional<Result<T>> value;
    kj::Own<kj::CrossThreadPromiseFulfiller<void>> fulfiller;
  };
  auto paf = kj::newPromiseAndCrossThreadFulfiller<void>();
  auto slot = std::make_shared<Slot>();
  slot->fulfiller = kj::mv(paf.fulfiller);
  f.then([slot](const Result<T>& r) {
    slot->value.emplace(r);
    slot->fulfiller->fulfill();
    return Result<bool>{true};
  });
  return paf.promise.then([slot]() -> Result<T> { return std::move(*slot->value); });
}

/// What a KJ exception (a lost connection, a refused message) means to a
/// glint caller.
inline caf::error error_of(const kj::Exception& e, const std::string& what) {
  // FAILED is a bug on one side (a message too large to build, say), not
  // something a retry fixes.
  auto code = e.getType() == kj::Exception::Type::DISCONNECTED  ? errc::unavailable
              : e.getType() == kj::Exception::Type::OVERLOADED  ? errc::resource_exhausted
              : e.getType() == kj::Exception::Type::UNIMPLEMENTED ? errc::unimplemented
                                                                  : errc::internal;
  return make_error(code, what + ": " + std::string{e.getDescription().cStr()});
}

/// Message limits of both ends: the largest message (the traversal limit
/// counts words) and the default nesting.
inline capnp::ReaderOptions reader_options(uint64_t max_message_bytes) {
  capnp::ReaderOptions o;
  o.traversalLimitInWords = max_message_bytes / 8 + 1024;
  return o;
}

}  // namespace glint::rpc::detail
