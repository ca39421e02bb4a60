#pragma once
/// Versions of the compute libraries components/ is built with, for `glint info`.

#include <string>

namespace glint::components {

/// "1.13.1" (LibTorch), "+cuda" appended when built with CUDA.
std::string torch_version();

}  // namespace glint::components
