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

// Runs f(rank, inner, outer) on outer x inner threads, rank = o * inner + i:
// `inner` groups the ranks with one o (size `inner`), `outer` those with
// one i (size `outer`), as a 2-D mesh's two dimensions do (fsdp within dp,
// pipeline stages within dp).
inline void on_grid(int outer, int inner,
                    const std::function<void(int, components::ProcessGroup&, components::ProcessGroup&)>& f) {
  std::vector<uint16_t> ports;  // the inner groups', then the outer groups'
  for (int g = 0; g < outer + inner; ++g) {
    auto port = pick_free_port();
    ASSERT_TRUE(port);
    ports.push_back(*port);
  }
  std::vector<std::thread> threads;
  for (int rank = 0; rank < outer * inner; ++rank)
    threads.emplace_back([&, rank] {
      const int o = rank / inner, i = rank % inner;
      auto in = components::ProcessGroup::create({.store_port = ports[static_cast<size_t>(o)], .rank = i,
                                                  .world_size = inner, .timeout = std::chrono::seconds(30)});
      ASSERT_TRUE(in) << describe(in.error());
      auto out = components::ProcessGroup::create({.store_port = ports[static_cast<size_t>(outer + i)], .rank = o,
                                                   .world_size = outer, .timeout = std::chrono::seconds(30)});
      ASSERT_TRUE(out) << describe(out.error());
      f(rank, **in, **out);
    });
  for (auto& t : threads) t.join();
}

// A group a test owns as a shared_ptr without owning it (the trainer's
// configs take shared_ptr).
inline std::shared_ptr<components::ProcessGroup> borrowed(components::ProcessGroup& pg) {
  return {&pg, [](components::ProcessGroup*) {}};
}

}  // namespace glint::testing
