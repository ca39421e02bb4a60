#pragma once
/// `Clock`: where glint code asks for the time, so that a test can set it
/// instead of sleeping (LevelDB's Env::NowMicros is the model):
///
///   ManualClock clock;                       // starts at a fixed instant
///   CompletionRewardMetric m{clock};
///   clock.advance(std::chrono::seconds(2));  // two seconds pass, at once
///   clock.set_unix_ms(0);                    // the wall clock steps back (NTP), the steady one does not
///
/// Two readings, because they answer different questions: `now()` is
/// monotonic (durations, deadlines), `unix_ms()` is the wall clock
/// (timestamps written to disk, which may jump either way and must never
/// order events). Implementations are thread-safe.

#include <atomic>
#include <chrono>
#include <cstdint>

namespace glint {

class Clock {
public:
  using time_point = std::chrono::steady_clock::time_point;
  virtual ~Clock() = default;
  /// Monotonic time: never goes back.
  virtual time_point now() const = 0;
  /// Wall-clock time in milliseconds since the Unix epoch.
  virtual int64_t unix_ms() const = 0;
};

/// The machine's clocks (std::chrono's steady and system clocks).
const Clock& real_clock();

/// A clock that moves only when told. It starts at a fixed instant, so two
/// runs of a test read the same times.
class ManualClock final : public Clock {
public:
  explicit ManualClock(int64_t unix_ms = 1'700'000'000'000) : wall_ms_(unix_ms) {}

  time_point now() const override { return time_point{std::chrono::nanoseconds{steady_ns_.load()}}; }
  int64_t unix_ms() const override { return wall_ms_.load(); }

  /// Moves both clocks forward by `d` (negative durations are ignored: the
  /// steady clock never goes back).
  void advance(std::chrono::nanoseconds d) {
    if (d.count() <= 0) return;
    steady_ns_ += d.count();
    wall_ms_ += std::chrono::duration_cast<std::chrono::milliseconds>(d).count();
  }
  /// Sets the wall clock alone, as an NTP step or an operator would.
  void set_unix_ms(int64_t ms) { wall_ms_ = ms; }

private:
  std::atomic<int64_t> steady_ns_{1'000'000'000};
  std::atomic<int64_t> wall_ms_;
};

}  // namespace glint
