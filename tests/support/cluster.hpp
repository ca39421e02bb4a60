#pragma once
// Starts a glint job inside a test: the driver runtime in this process and
// `world - 1` node processes running this same test binary.

#include "runtime/process.hpp"
#include "runtime/runtime.hpp"

#include <memory>
#include <vector>

namespace glint::testing {

struct TestJob {
  std::unique_ptr<Runtime> rt;
  std::vector<ChildProcess> nodes;  // nodes[i] is process rank i + 1

  /// mode local: just a runtime; cluster: a driver plus world - 1 nodes.
  static Result<TestJob> start(Mode mode, int world = 2, Options base = {});
};

}  // namespace glint::testing
