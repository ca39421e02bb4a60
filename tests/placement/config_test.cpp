#include "placement/config.hpp"

#include <gtest/gtest.h>

namespace glint::placement {
namespace {

TEST(JobConfig, ParsesGroupsMeshesAndStrategy) {
  auto c = JobConfig::parse(R"(
strategy = "spread"
[[group]]
name = "model"
ranks = 4
device_type = "cuda"
mesh = { dp = 2, tp = 2 }
[[group]]
name = "sampler"
ranks = [4, 5]
device_type = "cuda"
)");
  ASSERT_TRUE(c) << describe(c.error());
  EXPECT_EQ(c->options.strategy, Strategy::spread);
  ASSERT_EQ(c->groups.size(), 2u);
  EXPECT_EQ(c->groups[0].mesh.size(Dim::tp), 2);
  EXPECT_EQ(c->groups[1].group.ranks, (std::vector<int>{4, 5}));
  EXPECT_EQ(c->groups[1].mesh.size(Dim::dp), 2);
}

void expect_error(const char* text, const char* fragment) {
  auto c = JobConfig::parse(text, "job.toml");
  ASSERT_FALSE(c) << text;
  EXPECT_EQ(code_of(c.error()), errc::invalid_argument);
  EXPECT_NE(describe(c.error()).find(fragment), std::string::npos) << describe(c.error());
}

TEST(JobConfig, BadInputGetsAnErrorWithFileAndLine) {
  expect_error("[[group]\nname = 1", "malformed TOML: job.toml:1");
  expect_error("[[group]]\nname = \"m\"\nranks = 0\n", "job.toml:3: group 'm' has 0 ranks");
  expect_error("[[group]]\nname = \"m\"\nranks = 4\nmesh = { dp = 3 }\n", "needs 3 ranks, but world_size is 4");
  expect_error("[[group]]\nname = \"m\"\nranks = 2\ndevice_type = \"tpu\"\n", "unknown device type 'tpu'");
  expect_error("strategy = \"random\"\n", "unknown placement strategy 'random'");
  expect_error("[[group]]\nname = \"m\"\nrank = 2\n", "unknown group key 'rank'");
  expect_error("[[group]]\nranks = 2\n", "needs a non-empty 'name'");
  expect_error("[[group]]\nname = \"m\"\nranks = [1, -1]\n", "integers from 0 to 65535");
  // 64-bit TOML integers are not truncated into glint's int ranks (this was 1 rank).
  expect_error("[[group]]\nname = \"m\"\nranks = 4294967297\n", "group 'm' has 4294967297 ranks; a group has 1 to 65536");
  expect_error("[[group]]\nname = \"m\"\nranks = [0, 4294967296]\n", "integers from 0 to 65535");
}

TEST(JobConfig, MissingFileIsNotFound) {
  auto c = JobConfig::load("/nonexistent/job.toml");
  ASSERT_FALSE(c);
  EXPECT_EQ(code_of(c.error()), errc::not_found);
}

}  // namespace
}  // namespace glint::placement
