#pragma once
// Process groups whose ranks are threads of the test: each runs f(rank,
// group) on its own thread over Gloo on loopback.

#include "components/comm/process_group.hpp"
#include "runtime/process.hpp"

#include <gtest/gtest.h>

#include <chrono>
#include <functional>
#include <thread>
#include <vector>

namespace glint::testing {

// Runs f(rank, group) on `world` threads, one process group rank each.
inline void on_ranks(int world, const std::function<void(int, components::ProcessGroup&)>& f) {
  auto port = pick_free_port();
  ASSERT_TRUE(port);
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r)
    threads.emplace_back([&, r] {
      auto pg = components::ProcessGroup::create(
          {.store_port = *port, .rank = r, .world_size = world, .timeout = std::chrono::seconds(30)});
      ASSERT_TRUE(pg) << describe(pg.error());
      f(r, **pg);
    });
  for (auto& t : threads) t.join();
}

// A group a test owns as a shared_ptr without owning it (the trainer's
// configs take shared_ptr).
inline std::shared_ptr<components::ProcessGroup> borrowed(components::ProcessGroup& pg) {
  return {&pg, [](components::ProcessGroup*) {}};
}

}  // namespace glint::testing
