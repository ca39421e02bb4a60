#pragma once
// Between KJ's event loop (one I/O thread owns the connections) and glint's
// futures (answered on CAF threads). rpc's own.

#include "runtime/future.hpp"

#include <capnp/message.h>
#include <kj/async.h>
#include <kj/exception.h>

#include <memory>
#include <string>

namespace glint::rpc::detail {

/// A promise, on the calling KJ thread, of `f`'s result: the thread that
/// answers `f` wakes the loop through a cross-thread fulfiller. If that
/// thread never answers, the promise still settles when the future's
/// callbacks are dropped (the fulfiller's destructor rejects it).
template <class T>
kj::Promise<Result<T>> await_future(Future<T> f) {
  auto paf = kj::newPromiseAndCrossThreadFulfiller<void>();
  auto fulfiller = std::make_shared<kj::Own<kj::CrossThreadPromiseFulfiller<void>>>(kj::mv(paf.fulfiller));
  f.then([fulfiller](const Result<T>&) {
    (*fulfiller)->fulfill();
    return Result<bool>{true};
  });
  return paf.promise.then([f]() { return f.take(); });
}

/// What a KJ exception (a lost connection, a refused message) means to a
/// glint caller.
inline caf::error error_of(const kj::Exception& e, const std::string& what) {
  auto code = e.getType() == kj::Exception::Type::DISCONNECTED  ? errc::unavailable
              : e.getType() == kj::Exception::Type::OVERLOADED  ? errc::resource_exhausted
              : e.getType() == kj::Exception::Type::UNIMPLEMENTED ? errc::unimplemented
                                                                  : errc::unavailable;
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
