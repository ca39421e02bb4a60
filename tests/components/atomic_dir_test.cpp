// manifest.json of a committed directory (parse_manifest): what fuzzing
// found. Commits, crashes and verify_dir are tested in
// checkpoint_store_test.cpp and file_system_test.cpp.
#include "components/checkpoint/atomic_dir.hpp"
#include "support/temp_dir.hpp"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

namespace glint::components {
namespace {

TEST(Manifest, ParsesWhatCommitWrites) {
  auto dir = glint::testing::fresh_dir("manifest-commit");
  auto d = AtomicDir::begin(dir + "/step-1");
  ASSERT_TRUE(d) << describe(d.error());
  ASSERT_TRUE(d->write_file("a.json", "{}"));
  ASSERT_TRUE(d->commit());
  std::ifstream in{dir + "/step-1/manifest.json"};
  std::string text{std::istreambuf_iterator<char>{in}, {}};
  auto files = parse_manifest(text, "manifest.json");
  ASSERT_TRUE(files) << describe(files.error());
  ASSERT_EQ(files->size(), 1u);
  EXPECT_EQ((*files)[0].path, "a.json");
  EXPECT_EQ((*files)[0].bytes, 2u);
  EXPECT_EQ((*files)[0].fnv1a.size(), 16u);
}

// Found by fuzz/targets/manifest.cpp: nlohmann's value() throws on an entry
// that is not an object (or a "bytes" that is not a number), and nothing
// caught it: a damaged manifest ended the process (Checkpointer::open
// verifies every checkpoint's). And a listed "../x" was read outside the
// directory.
TEST(Manifest, DamagedEntriesAndPathsOutsideTheDirectoryAreErrors) {
  for (const char* text : {R"({"files": {"a": 3}})", R"({"files": {"a": {"bytes": "3", "fnv1a": "00"}}})",
                           R"({"files": {"a": {"bytes": 3}}})", R"({"files": {"../../etc/passwd": {"bytes": 3, "fnv1a": "00"}}})",
                           R"({"files": {"/etc/passwd": {"bytes": 3, "fnv1a": "00"}}})",
                           R"({"files": {"a/./b": {"bytes": 3, "fnv1a": "00"}}})", R"({"files": []})", "[1", "1e999"}) {
    auto files = parse_manifest(text, "m.json");
    ASSERT_FALSE(files) << text;
    EXPECT_EQ(code_of(files.error()), errc::invalid_argument) << text;
    EXPECT_NE(describe(files.error()).find("m.json is damaged"), std::string::npos) << describe(files.error());
  }
  auto dir = glint::testing::fresh_dir("manifest-damaged");
  std::ofstream{dir + "/manifest.json"} << R"({"files": {"a": 3}})";
  auto v = verify_dir(dir, Verify::sizes);
  ASSERT_FALSE(v);
  EXPECT_EQ(code_of(v.error()), errc::invalid_argument);
}

// A manifest emptied by hand (and a weight byte changed beside it) resumed
// silently: a manifest must list files, and every file of the directory.
TEST(Manifest, AnEmptiedManifestOrAFileItDoesNotListIsRefused) {
  auto dir = glint::testing::fresh_dir("manifest-emptied");
  auto d = AtomicDir::begin(dir + "/step-1");
  ASSERT_TRUE(d) << describe(d.error());
  ASSERT_TRUE(d->write_file("weights.bin", std::string(64, 'w')));
  ASSERT_TRUE(d->write_file("trainer_state.json", "{}"));
  ASSERT_TRUE(d->commit());
  const auto step = dir + "/step-1";
  ASSERT_TRUE(verify_dir(step)) << "as committed";
  ASSERT_TRUE(verify_dir(step, Verify::sizes));
  std::filesystem::create_directories(step + "/model");
  { std::ofstream{step + "/model/extra.bin"} << "x"; }
  for (auto how : {Verify::sizes, Verify::full}) {
    auto v = verify_dir(step, how);
    ASSERT_FALSE(v);
    EXPECT_NE(describe(v.error()).find("model/extra.bin is not in"), std::string::npos) << describe(v.error());
  }
  std::filesystem::remove(step + "/model/extra.bin");
  { std::ofstream{step + "/manifest.json", std::ios::trunc} << R"({"files": {}})"; }
  auto v = verify_dir(step);
  ASSERT_FALSE(v);
  EXPECT_NE(describe(v.error()).find("lists no files"), std::string::npos) << describe(v.error());
  { std::ofstream{step + "/manifest.json", std::ios::trunc} << ""; }
  EXPECT_FALSE(verify_dir(step)) << "an empty file is no manifest";
}

}  // namespace
}  // namespace glint::components
