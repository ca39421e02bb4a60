// The switch between the fused kernels and LibTorch's composition.
#include "components/kernels/fused.hpp"

#include <atomic>
#include <cstdlib>
#include <cstring>

namespace glint::components::kernels {

namespace {

std::atomic<bool>& flag() {
  static std::atomic<bool> on{[] {
    const char* v = std::getenv("GLINT_FUSED_KERNELS");
    return !(v && std::strcmp(v, "0") == 0);
  }()};
  return on;
}

}  // namespace

bool enabled() { return flag().load(std::memory_order_relaxed); }

void set_enabled(bool on) { flag().store(on); }

}  // namespace glint::components::kernels
