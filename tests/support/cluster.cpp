#include "support/cluster.hpp"

#include "actors/probe.hpp"
#include "placement/service.hpp"
#include "support/roles.hpp"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <thread>

namespace glint::testing {

namespace {

int run_test_driver(const Options& opts) {
  auto rt = initialize(opts);
  if (!rt) {
    std::fprintf(stderr, "test driver: %s\n", describe(rt.error()).c_str());
    return 2;
  }
  for (int n = 0; n < (*rt)->num_nodes(); ++n) {
    auto p = (*rt)->spawn<actors::probe_actor>(n, actors::probe_type, caf::make_message(RankContext{}));
    if (!p) {
      std::fprintf(stderr, "test driver: %s\n", describe(p.error()).c_str());
      return 2;
    }
  }
  if (const char* ready = std::getenv("GLINT_TEST_READY_FILE")) std::ofstream{ready} << "ready\n";
  for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
}

const bool driver_role_set = (driver_role = &run_test_driver, true);

}  // namespace

Result<ChildProcess> start_node(const Options& opts, int rank) {
  auto c = opts.cluster;
  c.rank = rank;
  c.local_rank = rank;
  auto env = c.to_environment();
  env["GLINT_MAX_MESSAGE_BYTES"] = std::to_string(opts.max_message_bytes);
  env["GLINT_HEARTBEAT_MS"] = std::to_string(opts.heartbeat.count());
  env["GLINT_PEER_TIMEOUT_MS"] = std::to_string(opts.peer_timeout.count());
  return ChildProcess::start({self_executable()}, env);
}

Result<void> TestJob::restart_node(int rank) {
  auto child = start_node(options, rank);
  if (!child) return child.error();
  nodes.at(static_cast<size_t>(rank - 1)) = std::move(*child);
  return {};
}

Result<TestJob> TestJob::start(Mode mode, int world, Options opts) {
  TestJob job;
  opts.mode = mode;
  if (mode == Mode::cluster) {
    auto port = pick_free_port();
    if (!port) return port.error();
    opts.cluster.world_size = world;
    opts.cluster.local_world_size = world;
    opts.cluster.master_port = *port;
    opts.cluster.source = "test";
    opts.connect_timeout = std::chrono::seconds(30);
    job.options = opts;
    for (int r = 1; r < world; ++r) {
      auto child = start_node(opts, r);
      if (!child) return child.error();
      job.nodes.push_back(std::move(*child));
    }
  }
  auto rt = initialize(opts);
  if (!rt) return rt.error();
  job.rt = std::move(*rt);
  return job;
}

void ModeJobTest::SetUp() {
  auto job = TestJob::start(GetParam(), 2);
  ASSERT_TRUE(job) << describe(job.error());
  job_ = std::move(*job);
  auto svc = placement::service(*job_.rt, {.strategy = placement::Strategy::spread});
  ASSERT_TRUE(svc) << describe(svc.error());
}

void ModeJobTest::TearDown() {
  if (job_.rt) job_.rt->shutdown();
  for (auto& n : job_.nodes)
    EXPECT_EQ(n.wait_for(std::chrono::seconds(10)), std::optional<int>{0}) << "a node process did not exit cleanly";
}

}  // namespace glint::testing
