#pragma once
// What the CPU kernels share: argument checks and the float/double dispatch.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <string>

namespace glint::components::kernels::cpu {

/// Throws c10::Error (LibTorch's way: these run inside autograd) unless t is
/// a CPU tensor of f32 or f64.
inline void check_floating_cpu(const at::Tensor& t, const char* op, const char* name) {
  TORCH_CHECK(t.defined(), op, ": ", name, " is undefined");
  TORCH_CHECK(t.device().is_cpu(), op, ": no kernel for ", t.device(), " yet (components/kernels/cpu only); ", name,
              " is there");
  TORCH_CHECK(t.scalar_type() == at::kFloat || t.scalar_type() == at::kDouble, op, ": ", name, " is ",
              t.scalar_type(), "; the kernel takes float32 or float64");
}

/// Rows per at::parallel_for task so that each task touches about `work`
/// elements: small tensors stay on one thread.
inline int64_t grain_rows(int64_t row_elems, int64_t work = 32768) {
  return std::max<int64_t>(1, work / std::max<int64_t>(row_elems, 1));
}

}  // namespace glint::components::kernels::cpu
