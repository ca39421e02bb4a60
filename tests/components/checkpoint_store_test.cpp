// Atomic checkpoint directories and the RocksDB run index, and the test the
// issue asks for: a child process killed during saves, many times; the
// latest indexed checkpoint always loads whole.
#include "components/checkpoint/atomic_dir.hpp"
#include "components/store/index.hpp"
#include "runtime/process.hpp"
#include "support/roles.hpp"
#include "support/temp_dir.hpp"

#include <gtest/gtest.h>

#include <signal.h>

#include <filesystem>
#include <fstream>
#include <random>
#include <thread>

namespace glint::components {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

// Files whose content follows from the step, so a reader can check them.
std::string content(int64_t step, int file) {
  std::string s(static_cast<size_t>((step * 7919 + file * 104729) % (1 << 20) + 1), 'x');
  for (size_t i = 0; i < s.size(); i += 97) s[i] = static_cast<char>('a' + (step + file + static_cast<int64_t>(i)) % 26);
  return s;
}

void write_step(const std::string& dir, int64_t step) {
  for (int f = 0; f < 3; ++f) std::ofstream{dir + "/part" + std::to_string(f) + ".bin", std::ios::binary} << content(step, f);
}

TEST(AtomicDir, AppearsWholeOnCommitAndNeverOverwrites) {
  auto root = glint::testing::fresh_dir("atomic");
  auto d = AtomicDir::begin(root + "/step-1");
  ASSERT_TRUE(d) << describe(d.error());
  EXPECT_NE(d->path(), root + "/step-1");
  write_step(d->path(), 1);
  EXPECT_FALSE(fs::exists(root + "/step-1")) << "nothing under the real name before commit";
  ASSERT_TRUE(d->commit());
  EXPECT_TRUE(verify_dir(root + "/step-1"));
  EXPECT_FALSE(fs::exists(d->path()));
  auto again = AtomicDir::begin(root + "/step-1");
  ASSERT_FALSE(again);
  EXPECT_NE(describe(again.error()).find("never overwritten"), std::string::npos);
  {
    auto dropped = AtomicDir::begin(root + "/step-2");
    write_step(dropped->path(), 2);
  }  // not committed: its temporary goes
  EXPECT_FALSE(fs::exists(root + "/step-2"));
  EXPECT_EQ(remove_temporaries(root), 0);
  // A file changed after commit, or a missing manifest, is found.
  std::ofstream{root + "/step-1/part0.bin", std::ios::app} << "tail";
  auto changed = verify_dir(root + "/step-1");
  ASSERT_FALSE(changed);
  EXPECT_NE(describe(changed.error()).find("part0.bin differs"), std::string::npos) << describe(changed.error());
  EXPECT_EQ(code_of(verify_dir(root).error()), errc::not_found);
}

TEST(RunIndex, ListsRunsAndCheckpointsAndFindsTheLatest) {
  auto root = glint::testing::fresh_dir("index");
  {
    auto idx = RunIndex::open(root);
    ASSERT_TRUE(idx) << describe(idx.error());
    ASSERT_TRUE(idx->add_checkpoint({.run = "grpo", .name = "step-10", .path = "p10", .step = 10, .summary = "loss 1"}));
    ASSERT_TRUE(idx->add_checkpoint({.run = "grpo", .name = "step-2", .path = "p2", .step = 2}));
    ASSERT_TRUE(idx->add_checkpoint({.run = "sft", .name = "best", .path = "pb", .step = 5}));
    EXPECT_FALSE(idx->add_checkpoint({.run = "a/b", .name = "x", .path = {}}));
    auto second = RunIndex::open(root);
    ASSERT_FALSE(second) << "one writer at a time";
    EXPECT_EQ(code_of(second.error()), errc::unavailable);
    auto reader = RunIndex::open(root, {.read_only = true});
    ASSERT_TRUE(reader) << describe(reader.error());
    auto list = reader->checkpoints("grpo");
    ASSERT_TRUE(list);
    ASSERT_EQ(list->size(), 2u);
    EXPECT_EQ((*list)[0].name, "step-2") << "by step, not by name";
    EXPECT_EQ((*list)[1].summary, "loss 1");
  }
  auto idx = RunIndex::open(root, {.read_only = true});
  ASSERT_TRUE(idx);
  auto runs = idx->runs();
  ASSERT_TRUE(runs);
  ASSERT_EQ(runs->size(), 2u);
  EXPECT_EQ((*runs)[0].run, "grpo");
  EXPECT_EQ((*runs)[0].checkpoints, 2);
  EXPECT_EQ((*runs)[0].latest->name, "step-10");
  EXPECT_EQ(idx->latest("sft")->value().path, (fs::current_path() / "pb").string()) << "a path outside the root is absolute";
  EXPECT_EQ(code_of(idx->checkpoints("nope").error()), errc::not_found);
  EXPECT_EQ(code_of(RunIndex::open(root + "/empty", {.read_only = true}).error()), errc::not_found);
  idx = RunIndex::open(root);
  ASSERT_TRUE(idx->remove_run("grpo"));
  EXPECT_EQ(code_of(idx->checkpoints("grpo").error()), errc::not_found);
  EXPECT_EQ(idx->runs()->size(), 1u);
  EXPECT_TRUE(idx->remove_run("never-was"));
}

// The child: saves step after step until it is killed.
int checkpoint_writer() {
  const std::string root = std::getenv("GLINT_TEST_ROOT");
  auto idx = RunIndex::open(root);
  if (!idx) return 3;
  auto latest = idx->latest("run");
  int64_t step = latest && *latest ? (*latest)->step + 1 : 1;
  std::ofstream{root + "/started"} << "";
  for (;; ++step) {
    auto path = root + "/run/step-" + std::to_string(step);
    if (fs::exists(path)) continue;  // committed by a killed writer after its index write was lost
    auto d = AtomicDir::begin(path);
    if (!d) return 4;
    write_step(d->path(), step);
    if (!d->commit()) return 5;
    if (!idx->add_checkpoint({.run = "run", .name = "step-" + std::to_string(step), .path = path, .step = step}))
      return 6;
  }
}
const bool writer_role = (glint::testing::roles()["checkpoint-writer"] = &checkpoint_writer, true);

TEST(CheckpointAtomicity, KillingTheWriterAtAnyMomentLeavesTheLatestCheckpointWhole) {
  auto root = glint::testing::fresh_dir("kill");
  std::mt19937 gen{7};
  int64_t last_step = 0;
  int kills = 0, mid_save = 0;  // kills that left a temporary: during a save
  for (int round = 0; round < 12; ++round) {
    auto child = ChildProcess::start({self_executable()},
                                     {{"GLINT_TEST_ROLE", "checkpoint-writer"}, {"GLINT_TEST_ROOT", root}});
    ASSERT_TRUE(child) << describe(child.error());
    // Once it runs, kill it at a random moment of its saves.
    auto deadline = std::chrono::steady_clock::now() + 30s;
    while (!fs::exists(root + "/started") && std::chrono::steady_clock::now() < deadline) std::this_thread::sleep_for(5ms);
    ASSERT_TRUE(fs::remove(root + "/started")) << "the writer did not start";
    std::this_thread::sleep_for(std::chrono::milliseconds(20 + gen() % 200));
    child->signal(SIGKILL);
    auto code = child->wait_for(10s);
    ASSERT_TRUE(code.has_value());
    kills += *code == 128 + SIGKILL;
    if (fs::exists(root + "/run"))
      for (const auto& e : fs::directory_iterator(root + "/run")) mid_save += e.path().filename().string()[0] == '.';
    ASSERT_EQ(*code, 128 + SIGKILL) << "the writer stopped by itself (exit " << *code << ")";
    // The latest indexed checkpoint is complete and holds its step's data.
    auto idx = RunIndex::open(root);
    ASSERT_TRUE(idx) << describe(idx.error());
    auto latest = idx->latest("run");
    if (!latest) continue;  // killed before its first index write
    ASSERT_TRUE(*latest);
    const auto& r = **latest;
    EXPECT_GE(r.step, last_step);
    last_step = r.step;
    ASSERT_TRUE(verify_dir(r.path)) << describe(verify_dir(r.path).error());
    for (int f = 0; f < 3; ++f) {
      std::ifstream in{r.path + "/part" + std::to_string(f) + ".bin", std::ios::binary};
      std::string got{std::istreambuf_iterator<char>(in), {}};
      EXPECT_EQ(got, content(r.step, f)) << r.path;
    }
  }
  EXPECT_EQ(kills, 12);
  EXPECT_GT(mid_save, 0) << "no kill landed inside a save";
  EXPECT_GT(last_step, 0) << "the writers saved something (how much depends on the disk's fsync)";
  // Every directory under a real name is whole; only temporaries may be partial.
  int whole = 0;
  for (const auto& e : fs::directory_iterator(root + "/run")) {
    auto name = e.path().filename().string();
    if (name[0] == '.') continue;
    EXPECT_TRUE(verify_dir(e.path().string())) << name;
    ++whole;
  }
  EXPECT_GE(whole, last_step - 1);
  remove_temporaries(root + "/run");
  for (const auto& e : fs::directory_iterator(root + "/run")) EXPECT_NE(e.path().filename().string()[0], '.');
}

}  // namespace
}  // namespace glint::components
