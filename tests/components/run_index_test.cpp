// The run index under the file system and clock seams: what a crash at any
// of its RocksDB writes leaves after a power loss, and an order of
// checkpoints that a wall clock stepping back cannot change.
#include "components/checkpoint/file_system.hpp"
#include "components/store/index.hpp"
#include "runtime/clock.hpp"
#include "support/temp_dir.hpp"

#include <gtest/gtest.h>

#include <filesystem>
#include <string>

namespace glint::components {
namespace {

CheckpointRecord record(int64_t step) {
  return {.run = "run", .name = "step-" + std::to_string(step), .path = "p" + std::to_string(step), .step = step};
}

TEST(RunIndex, TakesTimestampsFromItsClock) {
  auto root = glint::testing::fresh_dir("index-clock");
  ManualClock clock{1'234'000};
  auto idx = RunIndex::open(root, {.clock = &clock});
  ASSERT_TRUE(idx) << describe(idx.error());
  ASSERT_TRUE(idx->add_checkpoint(record(1)));
  EXPECT_EQ(idx->latest("run")->value().created_ms, 1'234'000);
  EXPECT_EQ(idx->runs()->at(0).created_ms, 1'234'000);
  clock.advance(std::chrono::seconds(3));
  ASSERT_TRUE(idx->add_checkpoint(record(2)));
  EXPECT_EQ(idx->latest("run")->value().created_ms, 1'237'000);
  EXPECT_EQ(idx->runs()->at(0).created_ms, 1'234'000) << "a run is created once";
}

// Two checkpoints of one step (a run resumed from an older checkpoint saves
// that step again under another name): the one added last is the latest,
// even when the wall clock stepped back between them. It used to pick by
// created_ms, so an NTP step made resume load the older one.
TEST(RunIndex, LatestAmongEqualStepsIsTheLastAddedEvenWhenTheWallClockStepsBack) {
  auto root = glint::testing::fresh_dir("index-order");
  ManualClock clock{5'000'000};
  {
    auto idx = RunIndex::open(root, {.clock = &clock});
    ASSERT_TRUE(idx);
    ASSERT_TRUE(idx->add_checkpoint({.run = "run", .name = "step-5", .path = root + "/a", .step = 5}));
    clock.set_unix_ms(4'000'000);
    ASSERT_TRUE(idx->add_checkpoint({.run = "run", .name = "step-5-again", .path = root + "/b", .step = 5}));
    EXPECT_EQ(idx->latest("run")->value().path, root + "/b");
    ASSERT_TRUE(idx->add_checkpoint({.run = "run", .name = "step-4", .path = root + "/c", .step = 4}));
    EXPECT_EQ(idx->latest("run")->value().path, root + "/b") << "the highest step first";
  }
  // The order is durable: the reopened index agrees.
  auto again = RunIndex::open(root, {.read_only = true});
  ASSERT_TRUE(again) << describe(again.error());
  EXPECT_EQ(again->latest("run")->value().path, root + "/b");
}

// An addition that returned success survives a power loss: nothing it
// wrote is left unsynced (`indexed` means durable).
TEST(RunIndex, AnIndexedCheckpointSurvivesAPowerLoss) {
  auto root = glint::testing::fresh_dir("index-durable");
  FaultInjectionFileSystem faulty;
  {
    auto idx = RunIndex::open(root, {.fs = &faulty});
    ASSERT_TRUE(idx) << describe(idx.error());
    ASSERT_TRUE(idx->add_checkpoint(record(1)));
    ASSERT_TRUE(idx->add_checkpoint(record(2)));
    auto dropped = faulty.drop_unsynced();  // the power fails with the index still open
    ASSERT_TRUE(dropped) << describe(dropped.error());
  }
  auto idx = RunIndex::open(root, {.read_only = true});
  ASSERT_TRUE(idx) << describe(idx.error());
  auto all = idx->checkpoints("run");
  ASSERT_TRUE(all) << describe(all.error());
  ASSERT_EQ(all->size(), 2u);
  EXPECT_EQ(idx->latest("run")->value().step, 2);
}

// Paths under the root are stored relative to it and come back joined to
// it; others come back absolute, wherever the reader runs.
TEST(RunIndex, PathsUnderTheRootFollowTheRoot) {
  auto root = glint::testing::fresh_dir("index-paths");
  {
    auto idx = RunIndex::open(root);
    ASSERT_TRUE(idx);
    ASSERT_TRUE(idx->add_checkpoint({.run = "r", .name = "in", .path = root + "/r/in", .step = 1}));
    ASSERT_TRUE(idx->add_checkpoint({.run = "r", .name = "out", .path = "/elsewhere/out", .step = 2}));
    ASSERT_TRUE(idx->add_checkpoint({.run = "r", .name = "cwd", .path = "here", .step = 3}));
  }
  auto moved = root + "-moved";
  std::filesystem::remove_all(moved);
  std::filesystem::rename(root, moved);
  auto idx = RunIndex::open(moved, {.read_only = true});
  ASSERT_TRUE(idx) << describe(idx.error());
  auto all = *idx->checkpoints("r");
  ASSERT_EQ(all.size(), 3u);
  EXPECT_EQ(all[0].path, moved + "/r/in");
  EXPECT_EQ(all[1].path, "/elsewhere/out");
  EXPECT_EQ(all[2].path, (std::filesystem::current_path() / "here").string());
}

// An addition crashed at each of its RocksDB writes in turn, then the disk
// left as a power loss would: the index opens, every earlier checkpoint is
// still listed, and the crashed one is listed whole or not at all.
TEST(RunIndex, ACrashAtAnyWriteOfAnAdditionLeavesTheIndexWholeAndOpenable) {
  auto root = glint::testing::fresh_dir("index-crash");
  FaultInjectionFileSystem faulty;
  int64_t per_add = 0;
  {
    auto idx = RunIndex::open(root, {.fs = &faulty});
    ASSERT_TRUE(idx) << describe(idx.error());
    ASSERT_TRUE(idx->add_checkpoint(record(1)));
    const auto before = faulty.writes();
    ASSERT_TRUE(idx->add_checkpoint(record(2)));
    per_add = faulty.writes() - before;
  }
  ASSERT_GE(per_add, 2) << "at least the log's append and its sync";
  int64_t expected = 2, listed = 0, lost = 0;
  for (int64_t k = 0; k < per_add; ++k) {
    const int64_t step = expected + 1;
    {
      auto idx = RunIndex::open(root, {.fs = &faulty});
      ASSERT_TRUE(idx) << "after a crash at write " << k << ": " << describe(idx.error());
      faulty.crash_after(k);
      EXPECT_FALSE(idx->add_checkpoint(record(step))) << "the addition crashed at write " << k + 1;
      EXPECT_TRUE(faulty.crashed());
    }
    auto dropped = faulty.drop_unsynced();
    ASSERT_TRUE(dropped) << describe(dropped.error());
    auto idx = RunIndex::open(root, {.read_only = true});
    ASSERT_TRUE(idx) << "a crash at write " << k + 1 << " left an index that does not open: " << describe(idx.error());
    auto all = idx->checkpoints("run");
    ASSERT_TRUE(all) << describe(all.error());
    ASSERT_GE(static_cast<int64_t>(all->size()), expected) << "a crash at write " << k + 1 << " lost an earlier entry";
    for (int64_t i = 0; i < expected; ++i) EXPECT_EQ((*all)[static_cast<size_t>(i)].step, i + 1);
    if (static_cast<int64_t>(all->size()) == expected + 1) {
      EXPECT_EQ(all->back().path, record(step).path) << "listed, and whole";
      ++listed;
      ++expected;
    } else {
      ASSERT_EQ(static_cast<int64_t>(all->size()), expected);
      ++lost;
    }
  }
  EXPECT_GT(lost, 0) << "no crash point came before the log's sync";
  EXPECT_EQ(listed + lost, per_add);
}

}  // namespace
}  // namespace glint::components
