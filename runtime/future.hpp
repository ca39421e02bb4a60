#pragma once
/// `glint::Future<T>`: the result of an actor call, filled in by the runtime's
/// caller actor. Every call carries a timeout, so waiting on a future never
/// outlasts it. Thread-safe: any thread may wait on or read a future.

#include "runtime/error.hpp"

#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>

namespace glint {

namespace detail {
template <class T>
struct FutureState {
  std::mutex mx;
  std::condition_variable cv;
  std::optional<Result<T>> value;

  /// Sets the value once; later calls are ignored and return false.
  bool set(Result<T> v) {
    {
      std::lock_guard<std::mutex> guard{mx};
      if (value) return false;
      value.emplace(std::move(v));
    }
    cv.notify_all();
    return true;
  }
};
}  // namespace detail

template <class T>
class Future {
public:
  Future() : state_(std::make_shared<detail::FutureState<T>>()) {}
  explicit Future(std::shared_ptr<detail::FutureState<T>> s) : state_(std::move(s)) {}

  /// A future that is already complete.
  static Future ready_with(Result<T> v) {
    Future f;
    f.state_->set(std::move(v));
    return f;
  }

  /// Waits for the result and returns a copy of it.
  Result<T> get() const {
    std::unique_lock<std::mutex> lock{state_->mx};
    state_->cv.wait(lock, [&] { return state_->value.has_value(); });
    return *state_->value;
  }

  bool ready() const {
    std::lock_guard<std::mutex> guard{state_->mx};
    return state_->value.has_value();
  }

  template <class Rep, class Period>
  bool wait_for(std::chrono::duration<Rep, Period> d) const {
    std::unique_lock<std::mutex> lock{state_->mx};
    return state_->cv.wait_for(lock, d, [&] { return state_->value.has_value(); });
  }

  void wait() const { (void)wait_for(std::chrono::hours(24 * 365)); }

  const std::shared_ptr<detail::FutureState<T>>& state() const { return state_; }

private:
  std::shared_ptr<detail::FutureState<T>> state_;
};

/// Waits for every future given.
template <class... Ts>
void wait_all(const Future<Ts>&... fs) {
  (fs.wait(), ...);
}

}  // namespace glint
