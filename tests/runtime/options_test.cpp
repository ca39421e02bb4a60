#include "runtime/options.hpp"

#include <gtest/gtest.h>

#include <cstdlib>

namespace glint {
namespace {

TEST(ClusterEnv, ReadsGlintVariables) {
  auto c = ClusterEnv::from_environment({{"GLINT_RANK", "2"}, {"GLINT_WORLD_SIZE", "4"}, {"GLINT_LOCAL_RANK", "0"},
                                         {"GLINT_LOCAL_WORLD_SIZE", "2"}, {"GLINT_NODE_RANK", "1"},
                                         {"GLINT_NNODES", "2"}, {"GLINT_MASTER_ADDR", "10.0.0.1"},
                                         {"GLINT_MASTER_PORT", "29500"}});
  ASSERT_TRUE(c) << describe(c.error());
  EXPECT_EQ(c->rank, 2);
  EXPECT_EQ(c->node_rank, 1);
  EXPECT_EQ(c->master_addr, "10.0.0.1");
  EXPECT_EQ(c->master_port, 29500);
  EXPECT_EQ(c->source, "glint run");
}

TEST(ClusterEnv, ReadsTorchrunVariables) {
  auto c = ClusterEnv::from_environment({{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "1"},
                                         {"LOCAL_WORLD_SIZE", "2"}, {"MASTER_ADDR", "127.0.0.1"},
                                         {"MASTER_PORT", "1234"}});
  ASSERT_TRUE(c);
  EXPECT_EQ(c->source, "torchrun");
  EXPECT_EQ(c->rank, 1);
  EXPECT_EQ(c->local_world_size, 2);
}

TEST(ClusterEnv, ReadsSlurmVariables) {
  auto c = ClusterEnv::from_environment({{"SLURM_PROCID", "3"}, {"SLURM_NTASKS", "4"}, {"SLURM_LOCALID", "1"},
                                         {"SLURM_NTASKS_PER_NODE", "2"}, {"SLURM_NODEID", "1"},
                                         {"SLURM_NNODES", "2"}, {"MASTER_ADDR", "n0"}, {"MASTER_PORT", "5000"}});
  ASSERT_TRUE(c) << describe(c.error());
  EXPECT_EQ(c->source, "slurm");
  EXPECT_EQ(c->rank, 3);
  EXPECT_EQ(c->node_rank, 1);
}

TEST(ClusterEnv, MalformedValuesNameTheVariable) {
  auto c = ClusterEnv::from_environment({{"RANK", "x"}, {"WORLD_SIZE", "2"}, {"MASTER_PORT", "1"}});
  ASSERT_FALSE(c);
  EXPECT_NE(describe(c.error()).find("RANK='x'"), std::string::npos);
  auto out = ClusterEnv::from_environment({{"RANK", "5"}, {"WORLD_SIZE", "2"}, {"MASTER_PORT", "1"}});
  ASSERT_FALSE(out);
  EXPECT_NE(describe(out.error()).find("outside world size 2"), std::string::npos);
}

TEST(ClusterEnv, AClusterNeedsAMasterPort) {
  auto c = ClusterEnv::from_environment({{"RANK", "0"}, {"WORLD_SIZE", "2"}});
  ASSERT_FALSE(c);
  EXPECT_NE(describe(c.error()).find("master port"), std::string::npos);
}

TEST(ClusterEnv, NoVariablesMeansNoCluster) {
  auto c = ClusterEnv::from_environment(std::map<std::string, std::string>{});
  ASSERT_TRUE(c);
  EXPECT_TRUE(c->source.empty());
  EXPECT_EQ(c->world_size, 1);
}

TEST(Options, RejectsNonPositiveTimeouts) {
  Options o;
  o.call_timeout = std::chrono::milliseconds(0);
  EXPECT_FALSE(o.validate());
}

// The bound on finding a frozen peer: 10 s at most by default, set from
// the environment, and never shorter than two heartbeats.
TEST(Options, PeerTimeoutDefaultsWithinTenSecondsAndIsReadAndChecked) {
  Options o;
  EXPECT_LE(o.peer_timeout, std::chrono::seconds(10));
  EXPECT_GE(o.peer_timeout, 2 * o.heartbeat);
  EXPECT_TRUE(o.validate());

  setenv("GLINT_PEER_TIMEOUT_MS", "1500", 1);
  setenv("GLINT_HEARTBEAT_MS", "250", 1);
  auto read = Options::from_environment();
  ASSERT_TRUE(read) << describe(read.error());
  EXPECT_EQ(read->peer_timeout, std::chrono::milliseconds(1500));
  EXPECT_EQ(read->heartbeat, std::chrono::milliseconds(250));

  setenv("GLINT_PEER_TIMEOUT_MS", "400", 1);
  auto short_one = Options::from_environment();
  ASSERT_TRUE(short_one);
  auto bad = short_one->validate();
  ASSERT_FALSE(bad);
  EXPECT_NE(describe(bad.error()).find("GLINT_PEER_TIMEOUT_MS"), std::string::npos) << describe(bad.error());

  setenv("GLINT_PEER_TIMEOUT_MS", "soon", 1);
  auto garbled = Options::from_environment();
  ASSERT_FALSE(garbled);
  EXPECT_NE(describe(garbled.error()).find("GLINT_PEER_TIMEOUT_MS='soon'"), std::string::npos) << describe(garbled.error());
  unsetenv("GLINT_PEER_TIMEOUT_MS");
  unsetenv("GLINT_HEARTBEAT_MS");
}

}  // namespace
}  // namespace glint
