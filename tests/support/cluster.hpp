#pragma once
// Starts a glint job inside a test: the driver runtime in this process and
// `world - 1` node processes running this same test binary.

#include "runtime/process.hpp"
#include "runtime/runtime.hpp"

#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <thread>
#include <vector>

namespace glint::testing {

struct TestJob {
  std::unique_ptr<Runtime> rt;
  std::vector<ChildProcess> nodes;  // nodes[i] is process rank i + 1

  Options options;  // the driver's

  /// mode local: just a runtime; cluster: a driver plus world - 1 nodes.
  static Result<TestJob> start(Mode mode, int world = 2, Options base = {});
  /// Starts process `rank` (> 0) again, as `glint run --max-restarts` does
  /// after it died; it replaces nodes[rank - 1].
  Result<void> restart_node(int rank);
};

/// Polls `pred` every 100 ms for up to 30 s; its last value.
template <class Pred>
bool eventually(Pred pred) {
  for (int i = 0; i < 300 && !pred(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  return pred();
}

/// A fixture run once per Mode (local, cluster): a job of two processes in
/// cluster mode, with a placement service that spreads ranks (rank 0 in the
/// driver, rank 1 in the node process). TearDown shuts down and checks that
/// every node process exits cleanly.
class ModeJobTest : public ::testing::TestWithParam<Mode> {
protected:
  void SetUp() override;
  void TearDown() override;
  TestJob job_;
};

}  // namespace glint::testing
