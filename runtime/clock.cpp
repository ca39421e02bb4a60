#include "runtime/clock.hpp"

namespace glint {

namespace {

class RealClock final : public Clock {
public:
  time_point now() const override { return std::chrono::steady_clock::now(); }
  int64_t unix_ms() const override {
    return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
        .count();
  }
};

}  // namespace

const Clock& real_clock() {
  static const RealClock clock;
  return clock;
}

}  // namespace glint
