// Killing a node process fails pending and new calls to its ranks within
// 5 s with `unavailable` naming the node; the driver keeps working and shuts
// down cleanly. Killing the driver makes its node processes stop their
// actors and exit.
#include "actors/probe.hpp"
#include "placement/service.hpp"
#include "runtime/group.hpp"
#include "support/cluster.hpp"

#include <gtest/gtest.h>

#include <signal.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <thread>

namespace glint {
namespace {

using namespace std::chrono_literals;
using actors::probe_actor;

TEST(NodeLoss, PendingAndNewCallsFailFastNamingTheNode) {
  auto job = testing::TestJob::start(Mode::cluster, 3);
  ASSERT_TRUE(job) << describe(job.error());
  auto& rt = *job->rt;
  {
    auto svc = placement::service(rt, {.strategy = placement::Strategy::spread});
    ASSERT_TRUE(svc) << describe(svc.error());
  }
  auto g = placement::spawn_group<probe_actor>(rt, placement::DeviceGroup::of("probe", 3), actors::probe_type);
  ASSERT_TRUE(g) << describe(g.error());
  ASSERT_EQ(g->rank(1).ctx.node, 1);
  ASSERT_EQ(g->rank(2).ctx.node, 2);

  // A long call in flight to node 1, then node 1 dies. No wait between
  // them: whether the call is still on the wire or running there when the
  // node dies, the driver must fail it once the node is lost.
  auto pending = g->call_rank(1, actors::sleep_atom::value, int64_t{30'000});
  auto killed_at = std::chrono::steady_clock::now();
  job->nodes[0].signal(SIGKILL);
  ASSERT_TRUE(pending.wait_for(5s)) << "the pending call did not fail within 5 s";
  EXPECT_LT(std::chrono::steady_clock::now() - killed_at, 5s);
  auto r = pending.get();
  ASSERT_FALSE(r);
  EXPECT_EQ(code_of(r.error()), errc::unavailable);
  auto text = describe(r.error());
  EXPECT_NE(text.find("node 1 ("), std::string::npos) << text;
  EXPECT_NE(text.find("rank 1 of group 'probe'"), std::string::npos) << text;

  // New calls to the lost rank fail at once; a whole-group call fails naming it.
  auto start = std::chrono::steady_clock::now();
  auto again = g->call_rank(1, actors::echo_atom::value, int64_t{1}).get();
  ASSERT_FALSE(again);
  EXPECT_EQ(code_of(again.error()), errc::unavailable);
  EXPECT_LT(std::chrono::steady_clock::now() - start, 5s);
  auto all = g->call<Collect::flatten>(Dispatch::all, actors::echo_atom::value, int64_t{1}).get();
  ASSERT_FALSE(all);
  EXPECT_NE(describe(all.error()).find("node 1 ("), std::string::npos) << describe(all.error());

  // The other ranks, local and remote, still serve.
  EXPECT_TRUE(g->call_rank(0, actors::echo_atom::value, int64_t{2}).get());
  EXPECT_TRUE(g->call_rank(2, actors::echo_atom::value, int64_t{3}).get());

  // Spawning on the lost node is refused with its name.
  auto spawn = rt.spawn<probe_actor>(1, actors::probe_type, caf::make_message(RankContext{}));
  ASSERT_FALSE(spawn);
  EXPECT_NE(describe(spawn.error()).find("was lost"), std::string::npos) << describe(spawn.error());

  rt.shutdown();
  EXPECT_EQ(job->nodes[1].wait_for(10s), std::optional<int>{0});
  EXPECT_EQ(job->nodes[0].wait_for(1s), std::optional<int>{128 + SIGKILL});
}

// A frozen node process (SIGSTOP: its sockets stay open, it answers
// nothing) is found by the heartbeat: the driver declares it lost once the
// set peer timeout passes (3 s here; the tick that sees it comes within a
// heartbeat) and fails the call in flight to it. Continued, the process
// finds its driver gone and exits.
TEST(NodeLoss, AFrozenNodeIsLostWithinThePeerTimeout) {
  Options base;
  base.peer_timeout = 3s;
  auto job = testing::TestJob::start(Mode::cluster, 2, base);
  ASSERT_TRUE(job) << describe(job.error());
  auto& rt = *job->rt;
  ASSERT_TRUE(placement::service(rt, {.strategy = placement::Strategy::spread}));
  auto g = placement::spawn_group<probe_actor>(rt, placement::DeviceGroup::of("probe", 2), actors::probe_type);
  ASSERT_TRUE(g) << describe(g.error());
  ASSERT_EQ(g->rank(1).ctx.node, 1);
  ASSERT_TRUE(g->call_rank(1, actors::echo_atom::value, int64_t{1}).get());

  job->nodes[0].signal(SIGSTOP);
  auto frozen_at = std::chrono::steady_clock::now();
  // The stop takes effect when the kernel next schedules the process; wait
  // for /proc to show it stopped, so no call is answered after this point.
  auto state = [pid = job->nodes[0].pid()] {
    std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
    std::string line;
    std::getline(f, line);
    auto close = line.rfind(')');
    return close == std::string::npos || close + 2 >= line.size() ? '?' : line[close + 2];
  };
  for (int i = 0; i < 200 && state() != 'T'; ++i) std::this_thread::sleep_for(5ms);
  ASSERT_EQ(state(), 'T') << "the node process did not stop";
  auto pending = g->call_rank(1, actors::echo_atom::value, int64_t{2});
  ASSERT_TRUE(pending.wait_for(10s)) << "the frozen node was not detected within 10 s";
  auto took = std::chrono::steady_clock::now() - frozen_at;
  auto r = pending.get();
  ASSERT_FALSE(r) << "a frozen node answered";
  EXPECT_EQ(code_of(r.error()), errc::unavailable) << describe(r.error());
  EXPECT_NE(describe(r.error()).find("node 1 ("), std::string::npos) << describe(r.error());
  // The call fails when its rank's actor is seen down; the node's own
  // mark follows from the same dropped connection a moment later.
  for (int i = 0; i < 50 && !rt.node(1).lost; ++i) std::this_thread::sleep_for(100ms);
  EXPECT_TRUE(rt.node(1).lost);
  EXPECT_GE(took, 2500ms) << "lost before the peer timeout: something else than the heartbeat found it";
  EXPECT_LT(took, 5s);
  std::printf("frozen node lost after %.2f s\n", std::chrono::duration<double>(took).count());
  EXPECT_TRUE(g->call_rank(0, actors::echo_atom::value, int64_t{3}).get());

  job->nodes[0].signal(SIGCONT);
  EXPECT_EQ(job->nodes[0].wait_for(15s), std::optional<int>{kExitLostDriver}) << "the thawed node did not leave, as one that lost its driver";
  rt.shutdown();
}

// A process started again for a lost node's rank (`glint run
// --max-restarts`) is admitted in its place: the node serves again, and
// the ranks that lived in the dead process stay out of every live() view.
TEST(NodeLoss, ARestartedNodeProcessIsAdmittedInItsPlace) {
  auto job = testing::TestJob::start(Mode::cluster, 2);
  ASSERT_TRUE(job) << describe(job.error());
  auto& rt = *job->rt;
  ASSERT_TRUE(placement::service(rt, {.strategy = placement::Strategy::spread}));
  auto g = placement::spawn_group<probe_actor>(rt, placement::DeviceGroup::of("probe", 2), actors::probe_type);
  ASSERT_TRUE(g) << describe(g.error());
  ASSERT_EQ(g->rank(1).ctx.node, 1);
  EXPECT_EQ(g->live().size(), 2);
  job->nodes[0].signal(SIGKILL);
  ASSERT_TRUE(testing::eventually([&] { return rt.node(1).lost; })) << "the kill was not seen within 30 s";
  ASSERT_EQ(g->live().size(), 1);
  EXPECT_EQ(g->live().rank(0).ctx.dp_rank, 0);
  ASSERT_TRUE(job->restart_node(1));
  ASSERT_TRUE(testing::eventually([&] { return !rt.node(1).lost; })) << "the restarted process was not admitted within 30 s";
  EXPECT_EQ(rt.node(1).restarts, 1);
  EXPECT_EQ(g->live().size(), 1) << "the old process's rank came back to life";
  auto late = g->live().call<Collect::flatten>(Dispatch::all, actors::echo_atom::value, int64_t{4}).get();
  EXPECT_TRUE(late) << describe(late.error());
  // The node takes new actors again.
  auto again = placement::spawn_group<probe_actor>(rt, placement::DeviceGroup::of("again", 2), actors::probe_type);
  ASSERT_TRUE(again) << describe(again.error());
  ASSERT_EQ(again->rank(1).ctx.node, 1);
  auto echo = again->call_rank(1, actors::echo_atom::value, int64_t{5}).get();
  ASSERT_TRUE(echo) << describe(echo.error());
  EXPECT_EQ(again->live().size(), 2);
  rt.shutdown();
  EXPECT_EQ(job->nodes[0].wait_for(10s), std::optional<int>{0});
}

// A node process started again just as the job ends (a kill near the last
// step) finds the driver shutting down: it leaves with 0, not a failure,
// which would make `glint run` stop the driver mid-shutdown (a chaos run
// failed so: "the driver refused this node ... shutting down", exit 143).
TEST(NodeLoss, ANodeRestartedAsTheJobEndsLeavesWithoutFailing) {
  Options base;
  base.peer_timeout = 3s;
  auto job = testing::TestJob::start(Mode::cluster, 3, base);
  ASSERT_TRUE(job) << describe(job.error());
  auto& rt = *job->rt;
  job->nodes[0].signal(SIGKILL);
  ASSERT_TRUE(testing::eventually([&] { return rt.node(1).lost; })) << "the kill was not seen within 30 s";
  // A frozen node 2 holds the shutdown open (it waits for node 2 to leave
  // or be lost, up to the peer timeout): the restarted node 1 comes then.
  job->nodes[1].signal(SIGSTOP);
  Result<void> restarted{caf::error{}};
  std::thread restarter{[&] {
    std::this_thread::sleep_for(100ms);
    restarted = job->restart_node(1);
  }};
  rt.shutdown();
  restarter.join();
  ASSERT_TRUE(restarted) << describe(restarted.error());
  auto code = job->nodes[0].wait_for(20s);
  job->nodes[1].signal(SIGKILL);
  (void)job->nodes[1].wait_for(10s);
  EXPECT_EQ(code, std::optional<int>{0}) << "a node that came as the job ended failed it";
}

TEST(DriverLoss, NodeProcessesExitWhenTheDriverIsKilled) {
  auto port = pick_free_port();
  ASSERT_TRUE(port) << describe(port.error());
  ClusterEnv c;
  c.world_size = 2;
  c.local_world_size = 2;
  c.master_port = *port;
  c.source = "test";
  auto ready = std::filesystem::temp_directory_path() / ("glint-driver-ready-" + std::to_string(getpid()));
  std::filesystem::remove(ready);
  auto driver_env = c.to_environment();
  driver_env["GLINT_TEST_ROLE"] = "driver";
  driver_env["GLINT_TEST_READY_FILE"] = ready.string();
  auto driver = ChildProcess::start({self_executable()}, driver_env);
  ASSERT_TRUE(driver) << describe(driver.error());
  auto node_env = c;
  node_env.rank = node_env.local_rank = 1;
  auto node = ChildProcess::start({self_executable()}, node_env.to_environment());
  ASSERT_TRUE(node) << describe(node.error());

  // Wait until the driver has a probe running on the node.
  auto deadline = std::chrono::steady_clock::now() + 30s;
  while (!std::filesystem::exists(ready) && std::chrono::steady_clock::now() < deadline && driver->running())
    std::this_thread::sleep_for(20ms);
  ASSERT_TRUE(std::filesystem::exists(ready)) << "the driver did not start its job";
  std::filesystem::remove(ready);

  driver->signal(SIGKILL);
  auto killed_at = std::chrono::steady_clock::now();
  // The node stops its actors and exits with kExitLostDriver ("lost its driver").
  auto code = node->wait_for(15s);
  ASSERT_TRUE(code.has_value()) << "the node process outlived its driver by 15 s";
  EXPECT_EQ(*code, kExitLostDriver);
  EXPECT_LT(std::chrono::steady_clock::now() - killed_at, 15s);
}

}  // namespace
}  // namespace glint
