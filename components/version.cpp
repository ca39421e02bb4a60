#include "components/version.hpp"

#include <torch/version.h>

namespace glint::components {

std::string torch_version() {
  std::string v = TORCH_VERSION;
#ifdef GLINT_WITH_CUDA
  v += "+cuda";
#endif
  return v;
}

}  // namespace glint::components
