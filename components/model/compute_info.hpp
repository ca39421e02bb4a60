#pragma once
/// What decides a run's bits beyond its config: the matrix-product library
/// of each size class (components/model/kernels.hpp) and LibTorch's thread
/// counts (a reduction split over another count of threads rounds
/// differently). The recipes record it in each run directory
/// (compute.json) and warn when a resumed run's differs. LibTorch-free.
///
///   auto info = components::compute_info();
///   write_text(out + "/compute.json", info.json());

#include <cstdint>
#include <string>

namespace glint::components {

struct ComputeInfo {
  std::string matmul_small;   ///< "aten" or "onednn": products below kLargeProductRows rows
  std::string matmul_large;   ///< the same for larger products
  std::string matmul_choice;  ///< "rule", "GLINT_MATMUL=aten|onednn" or "GLINT_MATMUL=measure (timed)"
  int64_t intra_op_threads = 0;
  int64_t inter_op_threads = 0;
  bool avx512 = false;
  /// One JSON object, keys in a fixed order (equal infos give equal text).
  std::string json() const;
};

/// This process's (deciding each size class's library now if not yet).
ComputeInfo compute_info();

}  // namespace glint::components
