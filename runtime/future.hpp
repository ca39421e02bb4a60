#pragma once
/// `glint::Future<T>`: the result of an actor call, filled in by the thread
/// that delivers the answer. Every call carries a timeout, so waiting on a
/// future never outlasts it. Thread-safe: any thread may wait on or read a
/// future.
///
/// Waiting spins for a short while (`spin_before_park`) before it sleeps:
/// most answers to small calls come within microseconds, and waking a
/// sleeping thread costs tens of microseconds on many machines (about 40 on
/// the 2-core VM this was measured on), more than the call itself.

#include "runtime/error.hpp"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <type_traits>
#include <vector>

namespace glint {

namespace detail {
/// How long a waiter polls before it sleeps on the condition variable.
inline constexpr std::chrono::microseconds spin_before_park{50};

/// Polls `ready` for up to spin_before_park; true if it became true.
template <class Ready>
bool spin_until(const Ready& ready) {
  auto until = std::chrono::steady_clock::now() + spin_before_park;
  for (;;) {
    for (int i = 0; i < 64; ++i) {
      if (ready()) return true;
#if defined(__x86_64__) || defined(__i386__)
      __builtin_ia32_pause();
#endif
    }
    if (std::chrono::steady_clock::now() >= until) return false;
  }
}

template <class R>
struct result_value;
template <class T>
struct result_value<caf::expected<T>> {
  using type = T;
};

template <class T>
struct FutureState {
  std::mutex mx;
  std::condition_variable cv;
  std::optional<Result<T>> value;  ///< written once, under mx, before `ready`
  std::atomic<bool> ready{false};
  std::atomic<int> sleepers{0};
  /// Run once, after the value is set, on the thread that sets it (under no
  /// lock); `then` registers them.
  std::vector<std::function<void()>> callbacks;

  /// Sets the value once; later calls are ignored and return false.
  bool set(Result<T> v) {
    std::vector<std::function<void()>> run;
    {
      std::lock_guard<std::mutex> guard{mx};
      if (value) return false;
      value.emplace(std::move(v));
      ready.store(true, std::memory_order_release);
      run.swap(callbacks);
    }
    if (sleepers.load(std::memory_order_acquire) > 0) cv.notify_all();
    for (auto& f : run) f();
    return true;
  }

  /// Calls `f` once the value is set: now, on this thread, if it is already.
  void on_ready(std::function<void()> f) {
    {
      std::lock_guard<std::mutex> guard{mx};
      if (!value) {
        callbacks.push_back(std::move(f));
        return;
      }
    }
    f();
  }

  bool is_ready() const { return ready.load(std::memory_order_acquire); }

  /// Waits until set or `deadline`; true if set.
  bool wait_until(std::chrono::steady_clock::time_point deadline) {
    if (spin_until([this] { return is_ready(); })) return true;
    std::unique_lock<std::mutex> lock{mx};
    sleepers.fetch_add(1, std::memory_order_acq_rel);
    bool ok = cv.wait_until(lock, deadline, [this] { return value.has_value(); });
    sleepers.fetch_sub(1, std::memory_order_acq_rel);
    return ok;
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
    wait();
    return *state_->value;
  }

  /// Waits for the result and moves it out, without a copy (a batch of
  /// sampled sequences, a tensor). The future keeps a `failed_precondition`
  /// error in its place: take a result once, and only where no other copy of
  /// this future still reads it.
  Result<T> take() const {
    wait();
    std::lock_guard<std::mutex> guard{state_->mx};
    Result<T> out = std::move(*state_->value);
    state_->value.emplace(make_error(errc::failed_precondition, "this future's result was taken already"));
    return out;
  }

  /// A future of `f(result)`, computed on the thread that completes this one
  /// (or now, if it is complete). `f` takes `const Result<T>&` and returns a
  /// Result<U>; keep it short, it runs on a transport thread.
  template <class F>
  auto then(F f) const {
    using U = typename detail::result_value<std::invoke_result_t<F, const Result<T>&>>::type;
    auto out = std::make_shared<detail::FutureState<U>>();
    // The source calls back from its own set(), so a raw pointer to it stays
    // valid; a shared one would be a cycle until then.
    auto* src = state_.get();
    state_->on_ready([src, out, f = std::move(f)]() mutable { out->set(f(*src->value)); });
    return Future<U>(std::move(out));
  }

  bool ready() const { return state_->is_ready(); }

  template <class Rep, class Period>
  bool wait_for(std::chrono::duration<Rep, Period> d) const {
    return state_->wait_until(std::chrono::steady_clock::now() + d);
  }

  void wait() const {
    while (!state_->wait_until(std::chrono::steady_clock::now() + std::chrono::hours(24))) {
    }
  }

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
