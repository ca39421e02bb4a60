// A driver that returns while one of its actors is still busy (a call it gave
// up on) exits with its own code after Options::exit_grace, rather than
// waiting for the actor: once this waited for the whole call, and a driver
// that timed out after 300 s never exited.
#include "actors/probe.hpp"
#include "placement/service.hpp"
#include "runtime/group.hpp"
#include "runtime/process.hpp"
#include "support/roles.hpp"
#include "support/temp_dir.hpp"

#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <thread>

namespace glint {
namespace {

using namespace std::chrono_literals;

// The child: starts a ten-minute call, leaves it in flight and returns 3.
int busy_driver() {
  return run_main(
      [](Runtime& rt) -> int {
        auto g = placement::spawn_group<actors::probe_actor>(rt, placement::DeviceGroup::of("busy", 1),
                                                             actors::probe_type);
        if (!g) return 4;
        auto pending = g->call_rank(0, actors::sleep_atom::value, int64_t{600'000});
        std::this_thread::sleep_for(300ms);  // the actor is asleep in the call
        std::ofstream{std::getenv("GLINT_TEST_READY_FILE")} << "";
        return 3;
      },
      [](Options& o) {
        o.mode = Mode::local;
        o.exit_grace = 1s;
      });
}
const bool busy_role = (testing::roles()["busy-driver"] = &busy_driver, true);

TEST(DriverExit, ADriverWhoseActorIsStillBusyExitsWithItsCodeAfterTheGrace) {
  const auto ready = testing::fresh_dir("busy-driver") + "/ready";
  auto child = ChildProcess::start({self_executable()},
                                   {{"GLINT_TEST_ROLE", "busy-driver"}, {"GLINT_TEST_READY_FILE", ready}});
  ASSERT_TRUE(child) << describe(child.error());
  const auto start = std::chrono::steady_clock::now();
  auto code = child->wait_for(60s);
  if (!code) child->signal(SIGKILL);
  ASSERT_TRUE(code.has_value()) << "the driver did not exit within 60 s of its start";
  EXPECT_TRUE(std::filesystem::exists(ready)) << "the driver returned before its call was in flight";
  EXPECT_EQ(*code, 3) << "the driver's own exit code";
  EXPECT_LT(std::chrono::steady_clock::now() - start, 30s);
}

// The child: a runtime made on this thread and shut down on another, with a
// call answered first (so the actor system's threads ran). Exits 0 once the
// shutdown returns.
int shutdown_elsewhere() {
  Options o;
  o.mode = Mode::local;
  auto rt = initialize(o);
  if (!rt) return 4;
  {
    auto g = placement::spawn_group<actors::probe_actor>(**rt, placement::DeviceGroup::of("elsewhere", 1),
                                                         actors::probe_type);
    if (!g || !g->call_rank(0, actors::echo_atom::value, int64_t{1}).get()) return 5;
  }
  std::thread other{[&] { (*rt)->shutdown(); }};
  other.join();
  return 0;
}
const bool elsewhere_role = (testing::roles()["shutdown-elsewhere"] = &shutdown_elsewhere, true);

// CAF 0.17 keeps a reference to its logger in a thread-local of the thread
// that made the actor system, and ~actor_system waits for the logger to go:
// shut down from another thread (a signal handler's, a supervisor's), it
// waited forever while the first thread lived.
TEST(DriverExit, ARuntimeShutDownFromAnotherThreadDoesNotHang) {
  auto child = ChildProcess::start({self_executable()}, {{"GLINT_TEST_ROLE", "shutdown-elsewhere"}});
  ASSERT_TRUE(child) << describe(child.error());
  auto code = child->wait_for(30s);
  if (!code) child->signal(SIGKILL);
  ASSERT_TRUE(code.has_value()) << "the shutdown on another thread hung";
  EXPECT_EQ(*code, 0);
}

}  // namespace
}  // namespace glint
