#include "placement/plan.hpp"

#include <gtest/gtest.h>

namespace glint::placement {
namespace {

ClusterResources two_nodes(int cores, int gpus) {
  return {synthetic_topology("a", cores, gpus), synthetic_topology("b", cores, gpus)};
}

std::vector<int> nodes_of(const std::vector<RankSlot>& s) {
  std::vector<int> out;
  for (auto& x : s) out.push_back(x.node);
  return out;
}

TEST(Planner, PackFillsNodesInOrder) {
  Planner p{two_nodes(4, 2), {.strategy = Strategy::pack}};
  auto s = p.place(DeviceGroup::of("model", 3, DeviceType::cuda));
  ASSERT_TRUE(s) << describe(s.error());
  EXPECT_EQ(nodes_of(*s), (std::vector<int>{0, 0, 1}));
  EXPECT_EQ((*s)[0].device, 0);
  EXPECT_EQ((*s)[1].device, 1);
  EXPECT_EQ((*s)[2].device, 0);
}

TEST(Planner, SpreadDealsRoundRobin) {
  Planner p{two_nodes(4, 2), {.strategy = Strategy::spread}};
  auto s = p.place(DeviceGroup::of("model", 4, DeviceType::cuda));
  ASSERT_TRUE(s);
  EXPECT_EQ(nodes_of(*s), (std::vector<int>{0, 1, 0, 1}));
}

TEST(Planner, GroupsNeverShareAGpuAndARefusalExplains) {
  Planner p{{synthetic_topology("a", 8, 2)}, {}};
  ASSERT_TRUE(p.place(DeviceGroup::of("model", 1, DeviceType::cuda)));
  auto s = p.place(DeviceGroup::of("sampler", 4, DeviceType::cuda));
  ASSERT_FALSE(s);
  EXPECT_EQ(code_of(s.error()), errc::resource_exhausted);
  EXPECT_EQ(context_of(s.error()),
            "group 'sampler' needs 4 cuda devices; the cluster has 2 (1 free; the rest belong to group 'model')");
  p.release("model");
  EXPECT_FALSE(p.place(DeviceGroup::of("sampler", 4, DeviceType::cuda)));
  EXPECT_TRUE(p.place(DeviceGroup::of("sampler", 2, DeviceType::cuda)));
}

TEST(Planner, ExplicitDeviceListsAreGlobalAndMustNotOverlap) {
  Planner p{two_nodes(2, 2), {}};
  auto m = p.place(DeviceGroup::on("model", {0, 3}, DeviceType::cuda));
  ASSERT_TRUE(m);
  EXPECT_EQ(nodes_of(*m), (std::vector<int>{0, 1}));
  EXPECT_EQ((*m)[1].device, 1);
  auto clash = p.place(DeviceGroup::on("sampler", {3}, DeviceType::cuda));
  ASSERT_FALSE(clash);
  EXPECT_NE(context_of(clash.error()).find("'sampler' and 'model' both claim cuda device 3"), std::string::npos);
  auto missing = p.place(DeviceGroup::on("x", {9}, DeviceType::cuda));
  ASSERT_FALSE(missing);
  EXPECT_NE(context_of(missing.error()).find("the cluster has 4"), std::string::npos);
  auto cpu = p.place(DeviceGroup::on("a", {1}));
  ASSERT_TRUE(cpu);
  EXPECT_FALSE(p.place(DeviceGroup::on("b", {1, 2})));
}

TEST(Planner, CpuRanksSplitTheCoresOfTheirNode) {
  Planner p{{synthetic_topology("a", 8)}, {}};
  auto s = p.place(DeviceGroup::of("model", 2));
  ASSERT_TRUE(s);
  EXPECT_EQ((*s)[0].cpus, (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ((*s)[1].cpus, (std::vector<int>{4, 5, 6, 7}));
  // Another cpu group may share the cores.
  auto t = p.place(DeviceGroup::of("sampler", 4));
  ASSERT_TRUE(t);
  EXPECT_EQ((*t)[3].cpus, (std::vector<int>{6, 7}));
}

TEST(Planner, CpuOversubscriptionWrapsOrIsRefused) {
  Planner lax{two_nodes(1, 0), {}};
  auto s = lax.place(DeviceGroup::of("model", 4));
  ASSERT_TRUE(s);
  EXPECT_EQ(nodes_of(*s), (std::vector<int>{0, 1, 0, 1}));
  Planner strict{two_nodes(1, 0), {.allow_cpu_oversubscribe = false}};
  auto r = strict.place(DeviceGroup::of("model", 4));
  ASSERT_FALSE(r);
  EXPECT_NE(context_of(r.error()).find("needs 4 cpu cores; the cluster has 2"), std::string::npos);
}

TEST(Planner, PlanAllAppliesMeshesAndRejectsDuplicates) {
  auto mesh = *DeviceMesh::from_sizes({.dp = 2, .tp = 2});
  std::vector<GroupRequest> reqs{{DeviceGroup::of("model", 4, DeviceType::cuda), mesh}};
  auto plan = plan_all(two_nodes(4, 2), reqs, {});
  ASSERT_TRUE(plan);
  auto& s = plan->at("model");
  EXPECT_EQ(s[1].dp_rank, 0);
  EXPECT_EQ(s[2].dp_rank, 1);
  EXPECT_EQ(s[3].dp_size, 2);
  reqs.push_back(reqs.front());
  EXPECT_FALSE(plan_all(two_nodes(4, 2), reqs, {}));
  std::vector<GroupRequest> wrong{{DeviceGroup::of("model", 3), mesh}};
  auto w = plan_all(two_nodes(4, 0), wrong, {});
  ASSERT_FALSE(w);
  EXPECT_NE(context_of(w.error()).find("has 3 ranks but its mesh"), std::string::npos);
}

// A supervised group respawning a rank asks the planner again: the same
// slot while the rank's node lives; else the live node with the fewest of
// the group's ranks, a GPU free there, the cores its other ranks there do
// not hold; the lost GPU is freed.
TEST(Planner, ReplacingALostRankPlansItOnALiveNode) {
  auto three = ClusterResources{synthetic_topology("a", 4, 2), synthetic_topology("b", 4, 2),
                                synthetic_topology("c", 4, 2)};
  Planner p{three, {.strategy = Strategy::spread}};
  auto s = p.place(DeviceGroup::of("sampler", 3, DeviceType::cuda));
  ASSERT_TRUE(s);
  ASSERT_EQ(nodes_of(*s), (std::vector<int>{0, 1, 2}));
  auto same = p.replace("sampler", 1, {});
  ASSERT_TRUE(same);
  EXPECT_EQ(*same, (*s)[1]) << "its node lives: the same slot";
  ASSERT_TRUE(p.place(DeviceGroup::of("model", 1, DeviceType::cuda)));  // takes node 0's gpu 1
  auto moved = p.replace("sampler", 1, {1});
  ASSERT_TRUE(moved) << describe(moved.error());
  EXPECT_EQ(moved->node, 2) << "node 0 holds rank 0 and a full gpu list; node 2 holds only rank 2";
  EXPECT_EQ(moved->device, 1);
  EXPECT_TRUE(moved->cpus.empty()) << "rank 2 holds all of node 2's cores";
  // Node 1's gpu 0 was freed: another group may take it.
  Planner q{three, {.strategy = Strategy::pack}};
  auto one = q.place(DeviceGroup::of("sampler", 1, DeviceType::cuda));
  ASSERT_TRUE(one && (*one)[0].node == 0);
  auto away = q.replace("sampler", 0, {0});
  ASSERT_TRUE(away);
  EXPECT_EQ(away->node, 1);
  auto takes = q.place(DeviceGroup::of("other", 2, DeviceType::cuda));
  ASSERT_TRUE(takes);
  EXPECT_EQ(nodes_of(*takes), (std::vector<int>{0, 0})) << "the lost rank's gpus on node 0 are free again";
  // CPU ranks: the free cores of the node.
  Planner c{two_nodes(4, 0), {.strategy = Strategy::pack}};
  auto cpu = c.place(DeviceGroup::of("loader", 1));
  ASSERT_TRUE(cpu);
  auto back = c.replace("loader", 0, {0});
  ASSERT_TRUE(back);
  EXPECT_EQ(back->node, 1);
  EXPECT_EQ(back->cpus.size(), 4u) << "node 1's cores, none of them taken by the group";
  // Refusals.
  EXPECT_EQ(code_of(c.replace("nobody", 0, {}).error()), errc::not_found);
  EXPECT_EQ(code_of(c.replace("loader", 3, {}).error()), errc::invalid_argument);
  EXPECT_EQ(code_of(c.replace("loader", 0, {0, 1}).error()), errc::unavailable);
  Planner e{two_nodes(4, 2), {}};
  auto listed = e.place(DeviceGroup::on("pinned", {1}, DeviceType::cuda));
  ASSERT_TRUE(listed);
  auto pinned = e.replace("pinned", 0, {0});
  ASSERT_FALSE(pinned);
  EXPECT_NE(describe(pinned.error()).find("explicit device list"), std::string::npos) << describe(pinned.error());
  Planner full{two_nodes(4, 1), {}};
  ASSERT_TRUE(full.place(DeviceGroup::of("x", 2, DeviceType::cuda)));
  auto none = full.replace("x", 0, {0});
  ASSERT_FALSE(none);
  EXPECT_EQ(code_of(none.error()), errc::resource_exhausted);
  EXPECT_TRUE(full.replace("x", 0, {})) << "a refusal leaves the old slot in place";
}

TEST(Topology, ShareOfSplitsCoresAndGpusByLocalRank) {
  auto m = synthetic_topology("a", 4, 4);
  auto s1 = share_of(m, 1, 2);
  ASSERT_EQ(s1.cores.size(), 2u);
  EXPECT_EQ(s1.cores[0].pus, std::vector<int>{2});
  ASSERT_EQ(s1.gpus.size(), 2u);
  EXPECT_EQ(s1.gpus[0].index, 1);
  auto tiny = share_of(synthetic_topology("b", 1), 1, 2);
  EXPECT_EQ(tiny.cores.size(), 1u);
}

}  // namespace
}  // namespace glint::placement
