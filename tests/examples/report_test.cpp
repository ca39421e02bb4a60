// The examples' metrics.jsonl keeps every line across kills: what a resumed
// (or restarted) run will write again is moved aside, never truncated away,
// and the rest is on disk before the first new step.
#include "runtime/report.hpp"
#include "support/temp_dir.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <sstream>

namespace glint::examples {
namespace {

std::string read(const std::string& path) {
  std::ifstream in{path};
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

void write_steps(const std::string& dir, int from, int to) {
  RunReport r{dir, "grpo", from - 1};
  for (int s = from; s <= to; ++s) r.add(s, "grpo", {{"reward", s * 0.5}});
}

// A resumed run killed before its first step kept its history on disk: the
// file was truncated at open and the kept lines only buffered until then.
TEST(Report, AResumeKeepsTheEarlierLinesOnDiskBeforeItsFirstStep) {
  auto dir = glint::testing::fresh_dir("report");
  write_steps(dir, 1, 5);
  {
    RunReport resumed{dir, "grpo", 3};
    ASSERT_TRUE(resumed.ok());
    // Killed here: nothing added, nothing flushed by the object.
    const auto now = read(dir + "/metrics.jsonl");
    EXPECT_NE(now.find("\"step\": 3"), std::string::npos) << now;
    EXPECT_EQ(now.find("\"step\": 4"), std::string::npos) << "steps after the resume point are written again";
    const auto aside = read(dir + "/metrics.abandoned.jsonl");
    EXPECT_NE(aside.find("\"step\": 4"), std::string::npos) << aside;
    EXPECT_NE(aside.find("\"step\": 5"), std::string::npos) << aside;
  }
  write_steps(dir, 4, 6);
  const auto all = read(dir + "/metrics.jsonl");
  for (int s = 1; s <= 6; ++s) EXPECT_NE(all.find("\"step\": " + std::to_string(s) + ","), std::string::npos) << s;
  EXPECT_EQ(std::count(all.begin(), all.end(), '\n'), 6) << all;
}

TEST(Report, AFreshStartMovesTheOldRunsLinesAside) {
  auto dir = glint::testing::fresh_dir("report-fresh");
  write_steps(dir, 1, 2);
  RunReport fresh{dir};
  ASSERT_TRUE(fresh.ok());
  EXPECT_EQ(read(dir + "/metrics.jsonl"), "");
  const auto aside = read(dir + "/metrics.abandoned.jsonl");
  EXPECT_EQ(std::count(aside.begin(), aside.end(), '\n'), 2) << aside;
}

}  // namespace
}  // namespace glint::examples
