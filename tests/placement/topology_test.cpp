#include "placement/topology.hpp"

#include <gtest/gtest.h>

#include <set>
#include <thread>

namespace glint::placement {
namespace {

TEST(Topology, DiscoversThisMachinesCores) {
  auto m = discover_topology();
  ASSERT_TRUE(m) << describe(m.error());
  EXPECT_FALSE(m->host.empty());
  EXPECT_GE(m->cores.size(), 1u);
  std::set<int> pus;
  for (const auto& c : m->cores)
    for (int p : c.pus) EXPECT_TRUE(pus.insert(p).second) << "cpu " << p << " listed twice";
  EXPECT_LE(static_cast<unsigned>(m->num_pus()), std::max(1u, std::thread::hardware_concurrency()));
  EXPECT_NE(m->describe().find("core"), std::string::npos);
}

}  // namespace
}  // namespace glint::placement
