#include "placement/device_mesh.hpp"

#include <gtest/gtest.h>

namespace glint::placement {
namespace {

TEST(DeviceMesh, TpIsInnermost) {
  auto m = DeviceMesh::from_sizes({.dp = 2, .tp = 2, .pp = 2});
  ASSERT_TRUE(m);
  EXPECT_EQ(m->world_size(), 8);
  // rank = (pp * dp_size + dp) * tp_size + tp.
  struct Row {
    int rank, pp, dp, tp;
  };
  const Row table[] = {{0, 0, 0, 0}, {1, 0, 0, 1}, {2, 0, 1, 0}, {3, 0, 1, 1},
                       {4, 1, 0, 0}, {5, 1, 0, 1}, {6, 1, 1, 0}, {7, 1, 1, 1}};
  for (const auto& row : table) {
    EXPECT_EQ(m->coord(row.rank, Dim::pp), row.pp) << row.rank;
    EXPECT_EQ(m->coord(row.rank, Dim::dp), row.dp) << row.rank;
    EXPECT_EQ(m->coord(row.rank, Dim::tp), row.tp) << row.rank;
    EXPECT_EQ(*m->rank_of(*m->coords(row.rank)), row.rank);
  }
  EXPECT_EQ(m->groups(Dim::tp), (std::vector<std::vector<int>>{{0, 1}, {2, 3}, {4, 5}, {6, 7}}));
  EXPECT_EQ(m->groups(Dim::dp), (std::vector<std::vector<int>>{{0, 2}, {1, 3}, {4, 6}, {5, 7}}));
  EXPECT_EQ(m->groups(Dim::pp), (std::vector<std::vector<int>>{{0, 4}, {1, 5}, {2, 6}, {3, 7}}));
}

TEST(DeviceMesh, FsdpAndDpFormTheDataRank) {
  auto m = DeviceMesh::from_sizes({.dp = 2, .fsdp = 4});
  ASSERT_TRUE(m);
  EXPECT_EQ(m->data_size(), 8);
  for (int r = 0; r < 8; ++r) EXPECT_EQ(m->data_rank(r), r);
  auto tp = DeviceMesh::from_sizes({.dp = 2, .tp = 2});
  // tp peers see the same data.
  EXPECT_EQ(tp->data_rank(0), 0);
  EXPECT_EQ(tp->data_rank(1), 0);
  EXPECT_EQ(tp->data_rank(2), 1);
  EXPECT_EQ(tp->data_rank(3), 1);
  // ep ranks are data-parallel too (each routes its own tokens), inside dp.
  auto ep = DeviceMesh::from_sizes({.dp = 2, .tp = 2, .ep = 2});
  ASSERT_TRUE(ep);
  EXPECT_EQ(ep->data_size(), 4);
  for (int r = 0; r < 8; ++r) EXPECT_EQ(ep->data_rank(r), r / 2) << r;
}

TEST(DeviceMesh, AllSixDimensionsRoundTrip) {
  auto m = DeviceMesh::from_sizes({.dp = 2, .fsdp = 1, .tp = 2, .pp = 1, .cp = 3, .ep = 2});
  ASSERT_TRUE(m);
  EXPECT_EQ(m->world_size(), 24);
  for (int r = 0; r < 24; ++r) EXPECT_EQ(*m->rank_of(*m->coords(r)), r);
  EXPECT_EQ(m->groups(Dim::cp).size(), 8u);
  EXPECT_EQ(m->describe(), "dp=2 x ep=2 x cp=3 x tp=2 (24 ranks)");
}

TEST(DeviceMesh, SizesThatDoNotMakeTheWorldAreRefused) {
  auto m = DeviceMesh::from_sizes({.dp = 2, .tp = 2, .world_size = 6});
  ASSERT_FALSE(m);
  EXPECT_NE(describe(m.error()).find("needs 4 ranks, but world_size is 6"), std::string::npos) << describe(m.error());
  EXPECT_FALSE(DeviceMesh::from_sizes({.dp = 0}));
  EXPECT_FALSE(DeviceMesh::from_sizes({.tp = -1}));
  auto ok = DeviceMesh::from_sizes({.dp = 4, .world_size = 4});
  EXPECT_TRUE(ok);
  EXPECT_FALSE(ok->coords(4));
}

// A component refuses the dimensions it does not run, naming them, rather
// than treat a tp=2 mesh's ranks as replicas that each get the whole batch.
TEST(DeviceMesh, AComponentRefusesTheDimensionsItDoesNotRun) {
  auto tp = DeviceMesh::from_sizes({.dp = 2, .tp = 2});
  ASSERT_TRUE(tp);
  auto r = tp->require_only({Dim::dp}, "model group 'policy'");
  ASSERT_FALSE(r);
  EXPECT_EQ(code_of(r.error()), errc::unimplemented);
  EXPECT_NE(describe(r.error()).find("model group 'policy' cannot run on mesh dp=2 x tp=2 (4 ranks): it is built for "
                                     "dp only, not tp"),
            std::string::npos)
      << describe(r.error());
  EXPECT_TRUE(tp->require_only({Dim::dp, Dim::tp}, "x"));
  EXPECT_TRUE(DeviceMesh::from_sizes({.dp = 4})->require_only({Dim::dp}, "x"));
}

TEST(DeviceGroup, ValidatesItsRanks) {
  EXPECT_FALSE(DeviceGroup::of("empty", 0).validate());
  EXPECT_FALSE(DeviceGroup::of("", 1).validate());
  EXPECT_FALSE(DeviceGroup::on("dup", {0, 0}).validate());
  EXPECT_TRUE(DeviceGroup::on("ok", {2, 3}, DeviceType::cuda).validate());
  auto zero = DeviceGroup::of("model", 0).validate();
  EXPECT_NE(describe(zero.error()).find("group 'model' has 0 ranks"), std::string::npos);
}

}  // namespace
}  // namespace glint::placement

namespace glint::placement {
namespace {

// --mesh's text, and the sizes a rank's context carries, back to the mesh.
TEST(DeviceMesh, ParsesTheMeshFlagAndRoundTripsItsSizes) {
  auto m = DeviceMesh::parse("fsdp=2,dp=3");
  ASSERT_TRUE(m) << describe(m.error());
  EXPECT_EQ(m->size(Dim::fsdp), 2);
  EXPECT_EQ(m->size(Dim::dp), 3);
  EXPECT_EQ(m->size(Dim::tp), 1);
  EXPECT_EQ(m->world_size(), 6);
  auto back = DeviceMesh::from_dims(m->sizes());
  ASSERT_TRUE(back);
  EXPECT_EQ(back->describe(), m->describe());
  EXPECT_EQ(DeviceMesh::parse("tp=2")->world_size(), 2);
  for (const char* bad : {"", "tp", "tp=", "tp=0", "tp=-1", "tq=2", "tp=2,tp=2", "tp=2,", "tp=x"}) {
    auto r = DeviceMesh::parse(bad);
    EXPECT_FALSE(r) << bad;
    if (!r) EXPECT_NE(describe(r.error()).find("mesh '"), std::string::npos) << describe(r.error());
  }
  EXPECT_FALSE(DeviceMesh::from_dims({1, 2}));
}

}  // namespace
}  // namespace glint::placement
