#include "runtime/stop.hpp"

#include <atomic>
#include <string>

namespace glint {

namespace {
std::atomic<bool> stop_flag{false};
}  // namespace

void request_stop(bool stop) { stop_flag.store(stop, std::memory_order_relaxed); }

bool stop_requested() { return stop_flag.load(std::memory_order_relaxed); }

Result<void> check_stop(std::string_view what) {
  if (!stop_requested()) return {};
  return make_error(errc::aborted, std::string{what} + " stopped: the driver has returned, nothing waits for the result");
}

}  // namespace glint
