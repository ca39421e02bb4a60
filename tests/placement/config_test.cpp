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
  // Floats are no counts: 1.1e29 had no int64 (undefined behaviour in toml++'s conversion, found by fuzzing).
  expect_error("[[group]]\nname = \"m\"\nranks = 1.1e29\n", "'ranks' must be a count or a list");
  expect_error("[[group]]\nname = \"m\"\nranks = [1e30]\n", "integers from 0 to 65535");
}

// Found by fuzz/targets/job_toml.cpp: toml++ 3.3.0 reaches
// __builtin_unreachable (undefined behaviour) on some non-ASCII characters
// (U+00A1 to U+0499 among them) where it tests for whitespace, outside
// strings and comments. glint refuses non-ASCII text there (TOML does too)
// before toml++ sees it, and keeps it in strings and comments.
TEST(JobConfig, NonAsciiOutsideStringsIsRefusedBeforeParsing) {
  expect_error("[[group]]\nname = \"m\"\nranks = 1 \xc3\xa9\n", "job.toml:3: a non-ASCII character (byte 0xC3)");
  expect_error("\n\xef\xba\xbf = 1\n", "job.toml:2: a non-ASCII character (byte 0xEF)");
  expect_error("a = \"x\" \xc5\x9b\n", "job.toml:1: a non-ASCII character");
  expect_error("a = \"\"\"x\"\"\"\"\" \xc5\x9b\n", "job.toml:1: a non-ASCII character");  // closed by 5 quotes
  expect_error("a = '''x'''\xc5\x9b\n", "job.toml:1: a non-ASCII character");
  expect_error("a = \"x\\\"\"\xc5\x9b\n", "job.toml:1: a non-ASCII character");  // after an escaped quote
  // A quote inside a bare value or key opens no string for toml++, so none here either.
  expect_error("sb=5\"s\xef\xba\xbf@\n", "job.toml:1: a non-ASCII character (byte 0xEF)");
  expect_error("a = 1.\"\xc3\xa9\"\n", "job.toml:1: a non-ASCII character (byte 0xC3)");
  expect_error("a\"\xc3\xa9\" = 1\n", "job.toml:1: a non-ASCII character (byte 0xC3)");
  // After a backslash in a string toml++ tests for whitespace as well.
  expect_error("a = \"\"\"x \\\n  \xc3\xa9\"\"\"\n", "job.toml:2: a non-ASCII character (byte 0xC3)");
  expect_error("a = \"\\\xc3\xa9\"\n", "job.toml:1: a non-ASCII character (byte 0xC3)");
  // In strings and comments, any character: names and paths in any language.
  auto ok = JobConfig::parse("# caf\xc3\xa9 \xe6\xa8\xa1\xe5\x9e\x8b\n[[group]]\nname = \"model\xc5\x9b\"\nranks = 1\n"
                             "[[group]]\nname = '\xd0\x9f\xd1\x80'\nranks = 1\n",
                             "job.toml");
  ASSERT_TRUE(ok) << describe(ok.error());
  EXPECT_EQ(ok->groups.at(0).group.name, "model\xc5\x9b");
  EXPECT_EQ(ok->groups.at(1).group.name, "\xd0\x9f\xd1\x80");
}

TEST(JobConfig, MissingFileIsNotFound) {
  auto c = JobConfig::load("/nonexistent/job.toml");
  ASSERT_FALSE(c);
  EXPECT_EQ(code_of(c.error()), errc::not_found);
}

}  // namespace
}  // namespace glint::placement
