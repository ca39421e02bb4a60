// The fault-injecting file system: what it keeps and drops at a crash
// follows the fsyncs made before it, and an AtomicDir commit crashed at
// each of its writes leaves the directory whole or absent, never half.
#include "components/checkpoint/atomic_dir.hpp"
#include "components/checkpoint/file_system.hpp"
#include "support/temp_dir.hpp"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

namespace glint::components {
namespace {

namespace fs = std::filesystem;

std::string read(const std::string& path) {
  std::ifstream in{path};
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

TEST(FaultInjectionFileSystem, APowerLossKeepsOnlyWhatWasSynced) {
  auto root = glint::testing::fresh_dir("faultfs");
  FaultInjectionFileSystem f;
  ASSERT_TRUE(f.create_dirs(root + "/a"));
  ASSERT_TRUE(f.sync_dir(root));  // a is durable
  ASSERT_TRUE(f.write_file(root + "/a/synced", "kept"));
  ASSERT_TRUE(f.sync_file(root + "/a/synced"));
  ASSERT_TRUE(f.write_file(root + "/a/unsynced", "lost"));
  ASSERT_TRUE(f.write_file(root + "/a/renamed", "x"));
  ASSERT_TRUE(f.sync_file(root + "/a/renamed"));
  ASSERT_TRUE(f.sync_dir(root + "/a"));  // the three names are durable, one content is not
  ASSERT_TRUE(f.create_dirs(root + "/b"));  // never synced into root
  ASSERT_TRUE(f.rename(root + "/a/renamed", root + "/a/moved"));  // its directory is not synced after
  ASSERT_TRUE(f.write_file(root + "/a/fresh", "y"));
  ASSERT_TRUE(f.sync_file(root + "/a/fresh"));  // content synced, name not
  ASSERT_TRUE(f.drop_unsynced());
  EXPECT_EQ(read(root + "/a/synced"), "kept");
  EXPECT_FALSE(fs::exists(root + "/a/unsynced")) << "never synced: gone";
  EXPECT_FALSE(fs::exists(root + "/b")) << "its parent was not synced after it was made";
  EXPECT_TRUE(fs::exists(root + "/a/renamed")) << "the rename was not durable";
  EXPECT_EQ(read(root + "/a/renamed"), "x");
  EXPECT_FALSE(fs::exists(root + "/a/moved"));
  EXPECT_FALSE(fs::exists(root + "/a/fresh")) << "its name was never made durable";
}

// Appends, as a log is written: a power loss keeps each file up to its last
// fsync, and a file that existed before the file system saw it keeps what
// it had (it was durable then).
TEST(FaultInjectionFileSystem, APowerLossCutsAnAppendedFileBackToItsLastSync) {
  auto root = glint::testing::fresh_dir("faultfs-append");
  std::ofstream{root + "/old"} << "before;";
  FaultInjectionFileSystem f;
  ASSERT_TRUE(f.append_file(root + "/old", "after;"));
  ASSERT_TRUE(f.append_file(root + "/log", "one;"));
  ASSERT_TRUE(f.sync_file(root + "/log"));
  ASSERT_TRUE(f.sync_dir(root));
  ASSERT_TRUE(f.append_file(root + "/log", "two;"));
  ASSERT_TRUE(f.append_file(root + "/new", "never synced"));
  EXPECT_EQ(read(root + "/log"), "one;two;");
  ASSERT_TRUE(f.drop_unsynced());
  EXPECT_EQ(read(root + "/log"), "one;");
  EXPECT_EQ(read(root + "/old"), "before;");
  EXPECT_FALSE(fs::exists(root + "/new"));
  f.crash_after(0);
  EXPECT_FALSE(f.append_file(root + "/log", "three;"));
  EXPECT_EQ(read(root + "/log"), "one;") << "a crashed append writes nothing";
}

TEST(FaultInjectionFileSystem, TheCrashFailsThatWriteAndEveryLaterOne) {
  auto root = glint::testing::fresh_dir("faultfs-crash");
  FaultInjectionFileSystem f;
  f.crash_after(1);
  EXPECT_TRUE(f.write_file(root + "/one", "1"));
  auto second = f.write_file(root + "/two", "2");
  ASSERT_FALSE(second);
  EXPECT_EQ(code_of(second.error()), errc::unavailable);
  EXPECT_NE(describe(second.error()).find("simulated crash at write 2"), std::string::npos) << describe(second.error());
  EXPECT_FALSE(fs::exists(root + "/two")) << "a crashed write does nothing";
  EXPECT_FALSE(f.sync_dir(root));
  EXPECT_TRUE(f.crashed());
  EXPECT_EQ(f.writes(), 3);
  ASSERT_TRUE(f.drop_unsynced());
  EXPECT_FALSE(f.crashed()) << "the machine is back";
  EXPECT_TRUE(f.write_file(root + "/three", "3"));
}

TEST(FaultInjectionFileSystem, ACommitCrashedAtAnyWriteLeavesTheDirectoryWholeOrAbsent) {
  auto root = glint::testing::fresh_dir("faultfs-commit");
  ASSERT_TRUE(local_file_system().create_dirs(root + "/run"));
  FaultInjectionFileSystem f;
  auto count = [&] {
    auto d = AtomicDir::begin(root + "/run/probe", f);
    EXPECT_TRUE(d);
    EXPECT_TRUE(d->write_file("a.bin", std::string(1000, 'a')));
    EXPECT_TRUE(d->write_file("b.bin", "b"));
    EXPECT_TRUE(d->commit());
  };
  const auto before = f.writes();
  count();
  const auto writes = f.writes() - before;
  ASSERT_GE(writes, 7);
  for (int64_t k = 0; k < writes; ++k) {
    const auto path = root + "/run/c" + std::to_string(k);
    {
      f.crash_after(k);
      auto d = AtomicDir::begin(path, f);
      if (d) {
        (void)d->write_file("a.bin", std::string(1000, 'a'));
        (void)d->write_file("b.bin", "b");
        EXPECT_FALSE(d->commit()) << "crash at write " << k + 1;
      }
    }
    ASSERT_TRUE(f.drop_unsynced());
    if (fs::exists(path)) {
      EXPECT_TRUE(verify_dir(path)) << "a crash at write " << k + 1 << " left a damaged directory";
    }
    EXPECT_EQ(remove_temporaries(root + "/run"), 0) << "crash at write " << k + 1 << " left a temporary behind";
  }
}

// A file system that cannot swap two names in one step (as some network
// file systems): a replace falls back to renaming the old one aside.
class NoExchangeFileSystem : public FaultInjectionFileSystem {
public:
  Result<void> swap_paths(const std::string& a, const std::string&) override {
    if (auto ok = FaultInjectionFileSystem::create_dirs(a); !ok) return ok;  // counts as a write, as a real call would
    return make_error(errc::unimplemented, "no RENAME_EXCHANGE here");
  }
};

// Replacing a committed directory (the server's autosave): crashed at any
// write, the final name holds the old one or the new one, whole, never
// neither and never a mix; without a crash, the new one.
template <class FS>
void replace_crashed_at_every_write(const std::string& tag) {
  auto root = glint::testing::fresh_dir(tag);
  ASSERT_TRUE(local_file_system().create_dirs(root + "/run"));
  FS f;
  auto save = [&](const std::string& path, const std::string& v, bool replace) {
    auto d = replace ? AtomicDir::begin_replacing(path, f) : AtomicDir::begin(path, f);
    if (!d) return false;
    (void)d->write_file("big.bin", std::string(1000, v[0]));
    (void)d->write_file("v", v);
    return static_cast<bool>(d->commit());
  };
  const auto probe = root + "/run/probe";
  ASSERT_TRUE(save(probe, "old", false));
  const auto before = f.writes();
  ASSERT_TRUE(save(probe, "new", true)) << "a replace with no crash works";
  EXPECT_EQ(read(probe + "/v"), "new");
  EXPECT_TRUE(verify_dir(probe));
  const auto writes = f.writes() - before;
  ASSERT_GE(writes, 8);
  for (int64_t k = 0; k <= writes; ++k) {
    const auto path = root + "/run/c" + std::to_string(k);
    ASSERT_TRUE(save(path, "old", false));
    f.crash_after(k);
    const bool done = save(path, "new", true);
    // The last write removes the old one: the replace is done before it.
    EXPECT_EQ(done, k >= writes - 1) << "crash at write " << k + 1;
    ASSERT_TRUE(f.drop_unsynced());
    (void)remove_temporaries(root + "/run");
    ASSERT_TRUE(fs::exists(path)) << "a crash at write " << k + 1 << " left nothing under the name";
    EXPECT_TRUE(verify_dir(path)) << "a crash at write " << k + 1 << " left a damaged directory";
    const auto v = read(path + "/v");
    EXPECT_TRUE(v == "old" || v == "new") << v;
    EXPECT_EQ(read(path + "/big.bin"), std::string(1000, v[0])) << "the files of one save, not a mix";
    if (done) EXPECT_EQ(v, "new");
    EXPECT_EQ(remove_temporaries(root + "/run"), 0) << "crash at write " << k + 1 << " left a temporary behind";
  }
}

TEST(FaultInjectionFileSystem, AReplaceCrashedAtAnyWriteLeavesTheOldOrTheNewWhole) {
  replace_crashed_at_every_write<FaultInjectionFileSystem>("faultfs-replace");
}

TEST(FaultInjectionFileSystem, AReplaceWithoutASwapStillLeavesTheOldOrTheNewWhole) {
  replace_crashed_at_every_write<NoExchangeFileSystem>("faultfs-replace-rename");
}

TEST(FaultInjectionFileSystem, ASwapNotYetDurableIsUndoneByACrash) {
  auto root = glint::testing::fresh_dir("faultfs-exchange");
  FaultInjectionFileSystem f;
  ASSERT_TRUE(f.create_dirs(root + "/a"));
  ASSERT_TRUE(f.create_dirs(root + "/b"));
  ASSERT_TRUE(f.write_file(root + "/a/x", "from a"));
  ASSERT_TRUE(f.write_file(root + "/b/x", "from b"));
  ASSERT_TRUE(f.sync_file(root + "/a/x"));
  ASSERT_TRUE(f.sync_file(root + "/b/x"));
  ASSERT_TRUE(f.sync_dir(root + "/a"));
  ASSERT_TRUE(f.sync_dir(root + "/b"));
  ASSERT_TRUE(f.sync_dir(root));
  auto swapped = f.swap_paths(root + "/a", root + "/b");
  if (!swapped && code_of(swapped.error()) == errc::unimplemented)
    GTEST_SKIP() << "this file system cannot swap two names: " << describe(swapped.error());
  ASSERT_TRUE(swapped) << describe(swapped.error());
  EXPECT_EQ(read(root + "/a/x"), "from b");
  f.crash_after(0);
  ASSERT_TRUE(f.drop_unsynced());
  EXPECT_EQ(read(root + "/a/x"), "from a") << "the swap was never made durable";
  EXPECT_EQ(read(root + "/b/x"), "from b");
  ASSERT_TRUE(f.swap_paths(root + "/a", root + "/b"));
  ASSERT_TRUE(f.sync_dir(root));
  ASSERT_TRUE(f.drop_unsynced());
  EXPECT_EQ(read(root + "/a/x"), "from b") << "synced, it stays";
}

}  // namespace
}  // namespace glint::components
