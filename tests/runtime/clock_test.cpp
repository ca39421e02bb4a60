#include "runtime/clock.hpp"

#include <gtest/gtest.h>

#include <thread>
#include <vector>

namespace glint {
namespace {

TEST(ManualClock, MovesOnlyWhenTold) {
  ManualClock clock{1000};
  const auto t0 = clock.now();
  EXPECT_EQ(clock.now(), t0);
  clock.advance(std::chrono::milliseconds(1500));
  EXPECT_EQ(clock.now() - t0, std::chrono::milliseconds(1500));
  EXPECT_EQ(clock.unix_ms(), 2500);
}

TEST(ManualClock, TheWallClockStepsAloneAndTheSteadyOneNeverGoesBack) {
  ManualClock clock{50'000};
  const auto t0 = clock.now();
  clock.set_unix_ms(10);
  EXPECT_EQ(clock.unix_ms(), 10);
  EXPECT_EQ(clock.now(), t0);
  clock.advance(std::chrono::seconds(-3));
  EXPECT_EQ(clock.now(), t0);
  EXPECT_EQ(clock.unix_ms(), 10);
}

TEST(ManualClock, AdvancesFromManyThreadsAddUp) {
  ManualClock clock{0};
  const auto t0 = clock.now();
  std::vector<std::thread> threads;
  for (int i = 0; i < 4; ++i)
    threads.emplace_back([&] {
      for (int k = 0; k < 1000; ++k) clock.advance(std::chrono::milliseconds(1));
    });
  for (auto& t : threads) t.join();
  EXPECT_EQ(clock.now() - t0, std::chrono::seconds(4));
  EXPECT_EQ(clock.unix_ms(), 4000);
}

TEST(RealClock, FollowsTheMachine) {
  const auto& c = real_clock();
  const auto a = c.now();
  const auto wall = std::chrono::duration_cast<std::chrono::milliseconds>(
                        std::chrono::system_clock::now().time_since_epoch())
                        .count();
  EXPECT_LE(a, c.now());
  EXPECT_NEAR(static_cast<double>(c.unix_ms()), static_cast<double>(wall), 5000.0);
}

}  // namespace
}  // namespace glint
