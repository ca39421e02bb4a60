// One test body per behaviour, run in local mode and in 2-process cluster
// mode: the results must be the same.
#include "actors/probe.hpp"
#include "support/tensors.hpp"
#include "placement/service.hpp"
#include "runtime/group.hpp"
#include "support/cluster.hpp"

#include <gtest/gtest.h>

#include <unistd.h>

#include <numeric>

namespace glint {
namespace {

using namespace std::chrono_literals;
using actors::probe_actor;
using placement::DeviceGroup;

class GroupTest : public testing::ModeJobTest {
protected:
  void SetUp() override {
    testing::ModeJobTest::SetUp();
    if (HasFatalFailure()) return;
    auto g = placement::spawn_group<probe_actor>(*job_.rt, DeviceGroup::of("probe", 2), actors::probe_type);
    ASSERT_TRUE(g) << describe(g.error());
    group_ = std::move(*g);
  }
  Group<probe_actor> group_;
};

TEST_P(GroupTest, AllWithFlattenGathersEveryRank) {
  auto f = group_.call<Collect::flatten>(Dispatch::all, actors::echo_atom::value, int64_t{7});
  auto r = f.get();
  ASSERT_TRUE(r) << describe(r.error());
  EXPECT_EQ(*r, (std::vector<int64_t>{7, 7}));
}

TEST_P(GroupTest, SliceSplitsTheArgumentAndSumCollects) {
  std::vector<int64_t> xs(11);
  std::iota(xs.begin(), xs.end(), 1);  // 1..11: rank 0 gets 1..6, rank 1 gets 7..11
  auto parts = group_.call<Collect::flatten>(Dispatch::slice, actors::sum_atom::value, xs).get();
  ASSERT_TRUE(parts);
  EXPECT_EQ(*parts, (std::vector<int64_t>{21, 45}));
  auto total = group_.call<Collect::sum>(Dispatch::slice, actors::sum_atom::value, xs).get();
  ASSERT_TRUE(total);
  EXPECT_EQ(*total, 66);
  auto mean = group_.call<Collect::mean>(Dispatch::slice, actors::sum_atom::value, xs).get();
  EXPECT_DOUBLE_EQ(*mean, 33.0);
}

TEST_P(GroupTest, FirstCallsOnlyRankZero) {
  auto t = glint::testing::vector_of<float>({1, 2, 3});
  ASSERT_TRUE(group_.call<Collect::first>(Dispatch::first, actors::accumulate_atom::value, t).get());
  // Rank 1 never accumulated: its running sum starts from this call.
  auto sums = group_.call<Collect::flatten>(Dispatch::all, actors::accumulate_atom::value, t).get();
  ASSERT_TRUE(sums) << describe(sums.error());
  EXPECT_EQ(*sums, *Tensor::from_values<float>(std::vector<float>{2, 4, 6, 1, 2, 3}, {6}));
}

TEST_P(GroupTest, AccumulatorStateLivesInTheRank) {
  auto x = *Tensor::from_values<float>(std::vector<float>{0.5f, -1.f, 2.f, 4.f}, {2, 2});
  Tensor last;
  for (int i = 0; i < 3; ++i) {
    auto s = group_.call<Collect::mean>(Dispatch::all, actors::accumulate_atom::value, x).get();
    ASSERT_TRUE(s) << describe(s.error());
    last = *s;
  }
  EXPECT_EQ(last, *Tensor::from_values<float>(std::vector<float>{1.5f, -3.f, 6.f, 12.f}, {2, 2}));
}

TEST_P(GroupTest, SliceDpRoundTripsABatch) {
  Batch b;
  b.tensors["ids"] = *Tensor::from_values<int64_t>(std::vector<int64_t>{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}, {5, 2});
  b.fields["text"] = {"a", "b", "c", "d", "e"};
  auto back = group_.call<Collect::flatten>(Dispatch::slice_dp, actors::echo_atom::value, b).get();
  ASSERT_TRUE(back) << describe(back.error());
  EXPECT_EQ(*back, b);
}

TEST_P(GroupTest, RanksKnowTheirPlaceAndAreBoundToTheirCpus) {
  auto where = group_.call<Collect::flatten>(Dispatch::all, actors::where_atom::value).get();
  ASSERT_TRUE(where) << describe(where.error());
  ASSERT_EQ(where->size(), 2u);
  for (int r = 0; r < 2; ++r) {
    const auto& info = (*where)[static_cast<size_t>(r)];
    EXPECT_EQ(info.ctx.rank, r);
    EXPECT_EQ(info.ctx.group, "probe");
    EXPECT_EQ(info.ctx.dp_rank, r);
    EXPECT_EQ(info.ctx.dp_size, 2);
    EXPECT_FALSE(info.ctx.cpus.empty());
    EXPECT_EQ(info.bound_cpus, info.ctx.cpus) << "rank " << r << " is not bound to its placement";
  }
  bool same_process = (*where)[1].pid == getpid();
  EXPECT_EQ(same_process, GetParam() == Mode::local);
  EXPECT_EQ((*where)[0].pid, getpid());
}

TEST_P(GroupTest, AnErrorNamesTheRankAndKeepsItsCode) {
  auto r = group_.call<Collect::first>(Dispatch::all, actors::fail_atom::value, std::string{"bad step"}).get();
  ASSERT_FALSE(r);
  EXPECT_EQ(code_of(r.error()), errc::aborted);
  EXPECT_NE(describe(r.error()).find("of group 'probe' on node"), std::string::npos) << describe(r.error());
  EXPECT_NE(describe(r.error()).find("bad step"), std::string::npos);
  // The ranks keep serving.
  EXPECT_TRUE(group_.call<Collect::flatten>(Dispatch::all, actors::echo_atom::value, int64_t{1}).get());
}

TEST_P(GroupTest, ATimeoutFailsTheCallNamingTheRank) {
  auto start = std::chrono::steady_clock::now();
  auto r = group_.with_timeout(200ms).call_rank(1, actors::sleep_atom::value, int64_t{1500}).get();
  auto took = std::chrono::steady_clock::now() - start;
  ASSERT_FALSE(r);
  EXPECT_EQ(code_of(r.error()), errc::deadline_exceeded);
  EXPECT_NE(describe(r.error()).find("rank 1 of group 'probe'"), std::string::npos) << describe(r.error());
  EXPECT_LT(took, 1s);
}

TEST_P(GroupTest, AShortTimeoutFiresOnTimeBehindALongOne) {
  // The first call's deadline is a minute away; the second's must still fire
  // on its own deadline, not when the sweeper would next look for the first.
  // Checked by the order of events, not a wall-clock window: the short
  // call fails while the long call's rank is still busy with it.
  auto slow = group_.with_timeout(60s).call_rank(0, actors::sleep_atom::value, int64_t{1500});
  auto start = std::chrono::steady_clock::now();
  auto r = group_.with_timeout(200ms).call_rank(1, actors::sleep_atom::value, int64_t{1500}).get();
  ASSERT_FALSE(r);
  EXPECT_EQ(code_of(r.error()), errc::deadline_exceeded);
  EXPECT_GE(std::chrono::steady_clock::now() - start, 200ms) << "a timeout never fires early";
  EXPECT_FALSE(slow.wait_for(0ms)) << "the short timeout waited for the long call";
  auto s = slow.get();
  ASSERT_TRUE(s) << describe(s.error());
  EXPECT_EQ(*s, 1500);
}

TEST_P(GroupTest, BadInputIsAClearErrorAndNothingIsSent) {
  auto r = group_.call<Collect::sum>(Dispatch::slice, actors::sum_atom::value, std::vector<int64_t>{1}).get();
  ASSERT_FALSE(r);
  EXPECT_EQ(code_of(r.error()), errc::invalid_argument);
  EXPECT_NE(describe(r.error()).find("cannot split 1 rows over 2 ranks"), std::string::npos) << describe(r.error());
  auto bad = group_.call<Collect::first>(Dispatch::all, actors::accumulate_atom::value, glint::testing::vector_of<int64_t>({1}))
                 .get();
  ASSERT_FALSE(bad);
  EXPECT_NE(describe(bad.error()).find("accumulate takes f32"), std::string::npos);
  auto neg = group_.call_rank(0, actors::sleep_atom::value, int64_t{-5}).get();
  EXPECT_FALSE(neg);
}

TEST_P(GroupTest, ManyOutstandingCallsAllComplete) {
  std::vector<Future<int64_t>> fs;
  for (int64_t i = 0; i < 2000; ++i) fs.push_back(group_.call_rank(static_cast<int>(i % 2), actors::echo_atom::value, i));
  for (int64_t i = 0; i < 2000; ++i) {
    auto r = fs[static_cast<size_t>(i)].get();
    ASSERT_TRUE(r);
    EXPECT_EQ(*r, i);
  }
}

TEST_P(GroupTest, UnknownActorTypeIsNotFound) {
  auto g = placement::spawn_group<probe_actor>(*job_.rt, DeviceGroup::of("other", 1), "no.such.actor");
  ASSERT_FALSE(g);
  EXPECT_EQ(code_of(g.error()), errc::not_found);
  EXPECT_NE(describe(g.error()).find("glint.probe"), std::string::npos) << describe(g.error());
}

// One stretch of a driver (a try of a run that starts again) ends without
// the runtime: the actors spawned since the mark stop, the others serve on;
// the placement service, dropped, starts afresh and places the same name again.
TEST_P(GroupTest, ActorsSpawnedSinceAMarkStopAndThePlacementStartsAfresh) {
  auto& rt = *job_.rt;
  const auto mark = rt.spawned_mark();
  auto later = placement::spawn_group<probe_actor>(rt, DeviceGroup::of("later", 2), actors::probe_type);
  ASSERT_TRUE(later) << describe(later.error());
  ASSERT_TRUE(later->call_rank(1, actors::echo_atom::value, int64_t{1}).get());
  EXPECT_GT(rt.spawned_mark(), mark);
  rt.stop_spawned_since(mark);
  EXPECT_EQ(rt.spawned_mark(), mark);
  for (int r = 0; r < 2; ++r) {
    auto gone = later->call_rank(r, actors::echo_atom::value, int64_t{2}).get();
    EXPECT_FALSE(gone) << "rank " << r << " of the stopped group still answers";
  }
  auto kept = group_.call<Collect::flatten>(Dispatch::all, actors::echo_atom::value, int64_t{3}).get();
  ASSERT_TRUE(kept) << describe(kept.error());
  EXPECT_EQ(*kept, (std::vector<int64_t>{3, 3}));
  auto again = placement::spawn_group<probe_actor>(rt, DeviceGroup::of("later", 2), actors::probe_type);
  EXPECT_FALSE(again) << "the service still holds 'later': placing it twice is refused";
  auto old = rt.service("placement");
  ASSERT_TRUE(old);
  rt.set_service("placement", caf::actor{});
  EXPECT_FALSE(rt.service("placement"));
  again = placement::spawn_group<probe_actor>(rt, DeviceGroup::of("later", 2), actors::probe_type);
  ASSERT_TRUE(again) << describe(again.error());
  EXPECT_NE(rt.service("placement"), old);
  auto echo = again->call_rank(1, actors::echo_atom::value, int64_t{4}).get();
  ASSERT_TRUE(echo) << describe(echo.error());
}

INSTANTIATE_TEST_SUITE_P(Modes, GroupTest, ::testing::Values(Mode::local, Mode::cluster),
                         [](const auto& info) { return std::string{to_string(info.param)}; });

TEST(ClusterTransport, RefusesAnOversizedMessageBeforeSending) {
  Options opts;
  opts.max_message_bytes = 1024;
  auto job = testing::TestJob::start(Mode::cluster, 2, opts);
  ASSERT_TRUE(job) << describe(job.error());
  {
    auto svc = placement::service(*job->rt, {.strategy = placement::Strategy::spread});
    ASSERT_TRUE(svc) << describe(svc.error());
  }
  auto g = placement::spawn_group<probe_actor>(*job->rt, DeviceGroup::of("probe", 2), actors::probe_type);
  ASSERT_TRUE(g);
  auto big = *Tensor::zeros(Dtype::f32, {1024});
  auto r = g->call_rank(1, actors::echo_atom::value, big).get();
  ASSERT_FALSE(r);
  EXPECT_EQ(code_of(r.error()), errc::resource_exhausted);
  EXPECT_NE(describe(r.error()).find("exceeds the limit of 1024 bytes"), std::string::npos) << describe(r.error());
  // Small ones still pass, and rank 0 (in this process) takes any size.
  EXPECT_TRUE(g->call_rank(1, actors::echo_atom::value, *Tensor::zeros(Dtype::f32, {16})).get());
  EXPECT_TRUE(g->call_rank(0, actors::echo_atom::value, big).get());
  job->rt->shutdown();
  EXPECT_EQ(job->nodes[0].wait_for(10s), std::optional<int>{0});
}

TEST(ClusterTransport, InitializeFailsClearlyWhenNodesNeverCome) {
  Options opts;
  opts.mode = Mode::cluster;
  opts.cluster.world_size = 3;
  opts.cluster.local_world_size = 3;
  opts.cluster.master_port = *pick_free_port();
  opts.connect_timeout = 300ms;
  auto rt = initialize(opts);
  ASSERT_FALSE(rt);
  EXPECT_EQ(code_of(rt.error()), errc::unavailable);
  EXPECT_NE(describe(rt.error()).find("node processes 1, 2 did not register"), std::string::npos)
      << describe(rt.error());
}

TEST(LocalRuntime, RemoteModeNeedsTheRpcLayerLinkedIn) {
  // This test binary does not link glint::rpc, so no connector is installed.
  Options opts;
  opts.mode = Mode::remote;
  opts.remote_endpoint = "127.0.0.1:1";
  auto rt = initialize(opts);
  ASSERT_FALSE(rt);
  EXPECT_EQ(code_of(rt.error()), errc::unimplemented);
  EXPECT_NE(describe(rt.error()).find("not linked with glint::rpc"), std::string::npos) << describe(rt.error());
}

}  // namespace
}  // namespace glint
