// Checkpointer: save then resume restores weights, optimizer step and the
// dataloader's position; a damaged checkpoint is refused before anything
// loads; a new run resumes to nothing.
#include "actors/checkpointer.hpp"
#include "components/checkpoint/atomic_dir.hpp"
#include "components/checkpoint/file_system.hpp"
#include "components/data/bpe_trainer.hpp"
#include "components/data/synthetic.hpp"
#include "components/model/config.hpp"
#include "components/store/index.hpp"
#include "support/cluster.hpp"
#include "support/temp_dir.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>

namespace glint::actors {
namespace {

using placement::DeviceGroup;

class CheckpointerTest : public glint::testing::ModeJobTest {
protected:
  int groups_ = 0;
  ModelGroup model(uint64_t seed) {
    auto cfg = components::ModelConfig::make(components::Architecture::qwen3, 300, 16, 32, 1, 4, 2);
    auto g = open_model_group(*job_.rt, DeviceGroup::of("model" + std::to_string(groups_++), 1),
                               *placement::DeviceMesh::from_sizes({.dp = 1}), {.config_json = cfg.to_json(), .seed = seed});
    EXPECT_TRUE(g) << describe(g.error());
    return std::move(*g);
  }
  DataLoaderGroup loader(const std::string& dir) {
    auto rows = components::arithmetic_rows(30, {.seed = 2});
    EXPECT_TRUE(components::save_jsonl(rows, dir + "/data.jsonl"));
    auto json = components::train_bpe(components::texts_of(components::Dataset::from_rows(rows)), {.vocab_size = 300});
    EXPECT_TRUE(components::save_chatml_tokenizer(dir, *json));
    auto g = open_dataloader(*job_.rt, DeviceGroup::of("data" + std::to_string(groups_++), 1),
                              {.dataset = dir + "/data.jsonl", .preprocess = "gsm8k", .tokenizer = dir,
                               .batch_size = 4, .seed = 3, .epochs = 0});
    EXPECT_TRUE(g) << describe(g.error());
    return std::move(*g);
  }
  static Batch batch() {
    Batch b;
    b.tensors["input_ids"] = *Tensor::from_values(std::vector<int64_t>{1, 2, 3, 4, 5, 6, 7, 8}, {2, 4});
    return b;
  }
  static Tensor logps(const ModelGroup& m) { return *m.forward_only(batch()).get(); }
  static Metrics train_step(const ModelGroup& m) {
    EXPECT_TRUE(m.forward_backward(batch()).get());
    auto s = m.clip_grad_and_step().get();
    EXPECT_TRUE(s);
    return s ? *s : Metrics{};
  }
};

TEST_P(CheckpointerTest, ResumeRestoresWeightsOptimizerAndDataPosition) {
  auto root = glint::testing::fresh_dir("ckpt");
  auto a = model(1);
  auto data = loader(root);
  for (int i = 0; i < 2; ++i) train_step(a);
  ASSERT_TRUE(data.next_batch().get());
  {
    auto c = Checkpointer::open(root, "run");
    ASSERT_TRUE(c) << describe(c.error());
    auto saved = c->save("step-2", a, &data, {.step = 2, .seed = 9, .phase = "sft"}, "loss 1");
    ASSERT_TRUE(saved) << describe(saved.error());
    EXPECT_FALSE(c->save("step-2", a, &data, {.step = 2})) << "never overwritten";
    auto reuse = c->start_over(/*fresh=*/false);
    ASSERT_FALSE(reuse) << "a run with checkpoints is not started over unless asked";
    EXPECT_NE(describe(reuse.error()).find("latest step-2"), std::string::npos) << describe(reuse.error());
    EXPECT_EQ(*c->list(), std::vector<std::string>{"step-2"}) << "and its checkpoints stay";
  }
  // What an uninterrupted run does next.
  auto next_batch = data.next_batch().get();
  auto next_step = train_step(a);
  auto after = logps(a);

  // A fresh model and loader resumed from the checkpoint do the same.
  auto b = model(5);
  auto data2 = loader(root);
  auto c = Checkpointer::open(root, "run");
  ASSERT_TRUE(c);
  auto state = c->resume(b, &data2);
  ASSERT_TRUE(state) << describe(state.error());
  ASSERT_TRUE(*state);
  EXPECT_EQ((*state)->step, 2);
  EXPECT_EQ((*state)->seed, 9u);
  EXPECT_EQ((*state)->phase, "sft");
  EXPECT_EQ((*state)->loader.position, 4);
  EXPECT_EQ(*data2.next_batch().get(), *next_batch);
  auto resumed_step = train_step(b);
  EXPECT_EQ(resumed_step.at("step"), next_step.at("step")) << "the optimizer's step came back";
  EXPECT_EQ(resumed_step.at("grad_norm"), next_step.at("grad_norm"));
  EXPECT_EQ(logps(b), after);
}

TEST_P(CheckpointerTest, DamagedCheckpointsAreRefusedAndNewRunsStartAfresh) {
  auto root = glint::testing::fresh_dir("ckpt-bad");
  auto a = model(1);
  auto c = Checkpointer::open(root, "run");
  ASSERT_TRUE(c);
  auto none = c->resume(a, nullptr);
  ASSERT_TRUE(none) << describe(none.error());
  EXPECT_FALSE(*none) << "no checkpoint yet";
  auto saved = c->save("s1", a, nullptr, {.step = 1});
  ASSERT_TRUE(saved) << describe(saved.error());
  std::ofstream{*saved + "/model/model.safetensors", std::ios::binary | std::ios::trunc} << "oops";
  auto b = model(5);
  auto before = logps(b);
  auto bad = c->resume(b, nullptr);
  ASSERT_FALSE(bad);
  EXPECT_NE(describe(bad.error()).find("differs from its manifest"), std::string::npos) << describe(bad.error());
  EXPECT_EQ(logps(b), before) << "nothing was loaded";
  EXPECT_EQ(code_of(c->resume(b, nullptr, "nope").error()), errc::not_found);
  EXPECT_FALSE(Checkpointer::open(root, "a/b"));
}

// A save crashed at each of its writes in turn, then the disk left as a
// power loss would leave it (every write not yet fsynced dropped): the
// newest indexed checkpoint always verifies and resumes, and the crashed
// one is either whole or absent. Deterministic: no process is killed at a
// random moment (the kill test in checkpoint_store_test does that).
TEST_P(CheckpointerTest, ACrashAtAnyWriteOfASaveLeavesTheNewestIndexedCheckpointWhole) {
  if (GetParam() != Mode::local) GTEST_SKIP() << "the file system seam is the driver's; one mode covers it";
  auto root = glint::testing::fresh_dir("ckpt-crash");
  auto m = model(1);
  components::FaultInjectionFileSystem faulty;
  {
    auto c = Checkpointer::open(root, "run", &faulty);
    ASSERT_TRUE(c) << describe(c.error());
    ASSERT_TRUE(c->save("step-1", m, nullptr, {.step = 1}));
  }
  // How many writes a whole save into an existing run directory makes, its
  // index entry (RocksDB's log append and sync) included.
  int64_t per_save = 0;
  {
    auto c = Checkpointer::open(root, "run", &faulty);
    ASSERT_TRUE(c);
    const auto before = faulty.writes();
    ASSERT_TRUE(c->save("step-1b", m, nullptr, {.step = 1}));
    per_save = faulty.writes() - before;
  }
  ASSERT_GE(per_save, 10) << "begin, state file, a sync per file, manifest, directory syncs, rename, parent sync, "
                             "the index's log append and sync";
  int whole = 0, absent = 0;
  for (int64_t k = 0; k < per_save; ++k) {
    const std::string name = "step-" + std::to_string(k + 2);
    {
      auto c = Checkpointer::open(root, "run", &faulty);
      ASSERT_TRUE(c) << describe(c.error());
      faulty.crash_after(k);
      auto saved = c->save(name, m, nullptr, {.step = k + 2});
      EXPECT_FALSE(saved) << "the save crashed at write " << k + 1 << " of " << per_save;
      EXPECT_TRUE(faulty.crashed());
    }
    ASSERT_TRUE(faulty.drop_unsynced());
    // After the "reboot": the index's newest checkpoint is whole.
    auto c = Checkpointer::open(root, "run");
    ASSERT_TRUE(c) << describe(c.error());
    auto names = c->list();
    ASSERT_TRUE(names && !names->empty());
    const auto newest = root + "/run/" + names->back();
    EXPECT_TRUE(components::verify_dir(newest)) << "after a crash at write " << k + 1 << ": " << newest;
    for (const auto& n : *names)
      EXPECT_TRUE(components::verify_dir(root + "/run/" + n))
          << "after a crash at write " << k + 1 << " the index lists " << n << ", which is not whole";
    auto state = c->resume(m, nullptr);
    ASSERT_TRUE(state) << "after a crash at write " << k + 1 << ": " << describe(state.error());
    ASSERT_TRUE(*state) << "after a crash at write " << k + 1;
    // The crashed checkpoint is whole (its rename was durable) or absent.
    const auto crashed = root + "/run/" + name;
    if (std::filesystem::exists(crashed)) {
      EXPECT_TRUE(components::verify_dir(crashed)) << "a crash at write " << k + 1 << " left a damaged " << crashed;
      ++whole;
    } else {
      ++absent;
    }
  }
  EXPECT_GT(absent, 0) << "no crash point came before the rename";
  EXPECT_GT(whole, 0) << "no crash point came between the rename and the index";
  EXPECT_EQ(whole + absent, per_save);
}

// -- the index is a cache of the self-describing directories --------------

// The driver-side logic below is the same in both modes: one covers it.
#define GLINT_LOCAL_ONLY() \
  if (GetParam() != Mode::local) GTEST_SKIP() << "the checkpointer's own logic; one mode covers it"

// Saves step-1 .. step-n of run "run" under root, each summarised "s<step>".
void save_steps(const std::string& root, const ModelGroup& m, int n) {
  auto c = Checkpointer::open(root, "run");
  ASSERT_TRUE(c) << describe(c.error());
  for (int s = 1; s <= n; ++s)
    ASSERT_TRUE(c->save("step-" + std::to_string(s), m, nullptr, {.step = s}, "s" + std::to_string(s)));
}

std::vector<std::string> dirs_under(const std::string& dir) {
  std::vector<std::string> out;
  for (const auto& e : std::filesystem::directory_iterator(dir)) out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

// A process killed between a checkpoint's rename and its index write left a
// whole directory the index did not list; the run then resumed from the one
// before and died at every later save with "step-N exists already".
TEST_P(CheckpointerTest, AWholeCheckpointTheIndexLacksIsAdoptedAndResumed) {
  GLINT_LOCAL_ONLY();
  auto root = glint::testing::fresh_dir("ckpt-adopt");
  auto m = model(1);
  {
    auto c = Checkpointer::open(root, "run");
    ASSERT_TRUE(c);
    ASSERT_TRUE(c->save("step-1", m, nullptr, {.step = 1}, "loss 2"));
    ASSERT_TRUE(c->save("step-2", m, nullptr, {.step = 2}, "loss 1"));
  }
  {
    auto idx = components::RunIndex::open(root);
    ASSERT_TRUE(idx);
    ASSERT_TRUE(idx->remove_checkpoints("run", {"step-2"}));  // the index write the kill lost
  }
  auto c = Checkpointer::open(root, "run");
  ASSERT_TRUE(c) << describe(c.error());
  EXPECT_EQ(c->reconciled().adopted, std::vector<std::string>{"step-2"});
  EXPECT_EQ(*c->list(), (std::vector<std::string>{"step-1", "step-2"}));
  auto state = c->resume(m, nullptr);
  ASSERT_TRUE(state && *state) << (state ? "nothing" : describe(state.error()));
  EXPECT_EQ((*state)->step, 2);
  ASSERT_TRUE(c->save("step-3", m, nullptr, {.step = 3}));
  auto idx = components::RunIndex::open(root, {.read_only = true});
  EXPECT_EQ(idx->checkpoints("run")->at(1).summary, "loss 1") << "the summary came from the directory";
}

// An entry whose directory is gone (a kill while --fresh deleted, or a
// person's rm) is forgotten; a damaged directory is reported by name, not
// resumed, and moved aside when its name is saved again.
TEST_P(CheckpointerTest, MissingAndDamagedCheckpointsAreForgottenAndReported) {
  GLINT_LOCAL_ONLY();
  auto root = glint::testing::fresh_dir("ckpt-reconcile");
  auto m = model(1);
  save_steps(root, m, 3);
  std::filesystem::remove_all(root + "/run/step-3");
  std::ofstream{root + "/run/step-2/model/model.safetensors", std::ios::binary | std::ios::trunc} << "oops";
  {
    auto c = Checkpointer::open(root, "run");
    ASSERT_TRUE(c) << describe(c.error());
    EXPECT_EQ(c->reconciled().forgotten, std::vector<std::string>{"step-3"});
    ASSERT_EQ(c->reconciled().damaged.size(), 1u);
    EXPECT_EQ(c->reconciled().damaged[0].rfind("step-2: ", 0), 0u) << c->reconciled().damaged[0];
    EXPECT_EQ(*c->list(), std::vector<std::string>{"step-1"});
    auto state = c->resume(m, nullptr);
    ASSERT_TRUE(state && *state);
    EXPECT_EQ((*state)->step, 1);
    // The loop goes on from step 1: saving step-2 again keeps the damaged one aside.
    ASSERT_TRUE(c->save("step-2", m, nullptr, {.step = 2}));
    bool kept = false;
    for (const auto& d : dirs_under(root + "/run"))
      kept |= d.rfind("damaged-", 0) == 0 && std::filesystem::exists(root + "/run/" + d + "/step-2");
    EXPECT_TRUE(kept) << "the damaged step-2 was kept under run/damaged-*/";
  }
  auto again = Checkpointer::open(root, "run");
  ASSERT_TRUE(again);
  EXPECT_TRUE(again->reconciled().empty());
  EXPECT_EQ(*again->list(), (std::vector<std::string>{"step-1", "step-2"}));
}

// Resuming from an older checkpoint than the newest (the natural fallback
// when the newest is damaged) continues the run from there: the newer ones
// are kept as an abandoned branch, and the run saves their names again.
TEST_P(CheckpointerTest, ResumingAnOlderCheckpointMovesTheNewerOnesAside) {
  GLINT_LOCAL_ONLY();
  auto root = glint::testing::fresh_dir("ckpt-branch");
  auto m = model(1);
  save_steps(root, m, 3);
  {
    auto c = Checkpointer::open(root, "run");
    ASSERT_TRUE(c);
    auto state = c->resume(m, nullptr, "step-1");
    ASSERT_TRUE(state && *state) << (state ? "nothing" : describe(state.error()));
    EXPECT_EQ((*state)->step, 1);
    EXPECT_EQ(*c->list(), std::vector<std::string>{"step-1"});
    std::string branch;
    for (const auto& d : dirs_under(root + "/run"))
      if (d.rfind("abandoned-", 0) == 0) branch = root + "/run/" + d;
    ASSERT_FALSE(branch.empty());
    EXPECT_EQ(dirs_under(branch), (std::vector<std::string>{"step-2", "step-3"}));
    ASSERT_TRUE(c->save("step-2", m, nullptr, {.step = 2})) << "the branch does not block the run";
  }
  auto c = Checkpointer::open(root, "run");
  ASSERT_TRUE(c);
  EXPECT_TRUE(c->reconciled().empty()) << "an abandoned branch is not adopted back";
  EXPECT_EQ(*c->list(), (std::vector<std::string>{"step-1", "step-2"}));
}

// The index stored absolute paths: a copied run root resumed from the
// original's files, and failed once they were gone.
TEST_P(CheckpointerTest, ACopiedRunRootResumesFromItsOwnFiles) {
  GLINT_LOCAL_ONLY();
  auto from = glint::testing::fresh_dir("ckpt-from");
  auto to = glint::testing::fresh_dir("ckpt-to");
  auto m = model(1);
  {
    auto c = Checkpointer::open(from, "run");
    ASSERT_TRUE(c);
    ASSERT_TRUE(c->save("step-1", m, nullptr, {.step = 1}));
  }
  std::filesystem::remove_all(to);
  std::filesystem::copy(from, to, std::filesystem::copy_options::recursive);
  std::filesystem::remove_all(from);
  auto c = Checkpointer::open(to, "run");
  ASSERT_TRUE(c) << describe(c.error());
  EXPECT_TRUE(c->reconciled().empty()) << "nothing to mend: the paths are relative";
  auto state = c->resume(m, nullptr);
  ASSERT_TRUE(state) << describe(state.error());
  ASSERT_TRUE(*state);
  EXPECT_EQ((*state)->step, 1);
}

// reset() (what --fresh does) is one durable decision: a crash at any of its
// writes, then a power loss, leaves either the whole run or none of it, and
// the index agrees with the directories.
TEST_P(CheckpointerTest, AResetCrashedAtAnyWriteLeavesAllOrNothing) {
  GLINT_LOCAL_ONLY();
  auto m = model(1);
  components::FaultInjectionFileSystem faulty;
  int64_t per_reset = 0;
  for (int64_t k = 0;; ++k) {
    auto root = glint::testing::fresh_dir("ckpt-reset");
    {
      auto c = Checkpointer::open(root, "run", &faulty);
      ASSERT_TRUE(c);
      ASSERT_TRUE(c->save("step-1", m, nullptr, {.step = 1}));
      ASSERT_TRUE(c->save("step-2", m, nullptr, {.step = 2}));
      const auto before = faulty.writes();
      if (per_reset > 0) faulty.crash_after(k);
      auto reset = c->reset();
      if (per_reset == 0) {  // the first round counts the writes of a whole reset
        ASSERT_TRUE(reset) << describe(reset.error());
        per_reset = faulty.writes() - before;
        k = -1;
        continue;
      }
      EXPECT_FALSE(reset) << "crashed at write " << k + 1;
    }
    ASSERT_TRUE(faulty.drop_unsynced());
    auto c = Checkpointer::open(root, "run");
    ASSERT_TRUE(c) << describe(c.error());
    auto names = *c->list();
    EXPECT_TRUE(names.empty() || names == (std::vector<std::string>{"step-1", "step-2"}))
        << "a crash at write " << k + 1 << " of " << per_reset << " left " << names.size() << " checkpoints";
    size_t on_disk = 0;
    for (const auto& d : dirs_under(root + "/run")) on_disk += d.rfind("step-", 0) == 0;
    EXPECT_EQ(on_disk, names.size()) << "the index and the directories agree after a crash at write " << k + 1;
    if (k + 1 >= per_reset) break;
  }
  EXPECT_GE(per_reset, 4) << "the marker, its sync, the directory sync, the index's write";
}

// A damaged run index is an error that says how to repair it, never a
// silent truncation; the repair rebuilds it from the directories.
TEST_P(CheckpointerTest, ADamagedIndexIsRefusedAndRebuiltFromTheDirectories) {
  GLINT_LOCAL_ONLY();
  auto root = glint::testing::fresh_dir("ckpt-repair");
  auto m = model(1);
  save_steps(root, m, 3);
  // One flipped byte inside the first record of the newest log.
  std::string log;
  for (const auto& e : std::filesystem::directory_iterator(root + "/index"))
    if (e.path().extension() == ".log" && (log.empty() || e.path().string() > log)) log = e.path().string();
  ASSERT_FALSE(log.empty());
  ASSERT_GT(std::filesystem::file_size(log), 100u) << "the three additions are in the log";
  {
    std::fstream f{log, std::ios::in | std::ios::out | std::ios::binary};
    f.seekg(20);
    char b = 0;
    f.read(&b, 1);
    f.seekp(20);
    b = static_cast<char>(b ^ 0x5a);
    f.write(&b, 1);
  }
  auto broken = Checkpointer::open(root, "run");
  ASSERT_FALSE(broken) << "a damaged log must not open as a shorter index";
  EXPECT_EQ(code_of(broken.error()), errc::failed_precondition);
  EXPECT_NE(describe(broken.error()).find("--repair"), std::string::npos) << describe(broken.error());
  auto repaired = Checkpointer::repair(root);
  ASSERT_TRUE(repaired) << describe(repaired.error());
  EXPECT_EQ(repaired->runs, 1);
  EXPECT_EQ(repaired->checkpoints, 3);
  EXPECT_TRUE(std::filesystem::exists(repaired->set_aside));
  auto c = Checkpointer::open(root, "run");
  ASSERT_TRUE(c) << describe(c.error());
  EXPECT_EQ(*c->list(), (std::vector<std::string>{"step-1", "step-2", "step-3"}));
  auto state = c->resume(m, nullptr);
  ASSERT_TRUE(state && *state);
  EXPECT_EQ((*state)->step, 3);
}

INSTANTIATE_TEST_SUITE_P(Modes, CheckpointerTest, ::testing::Values(Mode::local, Mode::cluster),
                         [](const auto& info) { return info.param == Mode::local ? "local" : "cluster"; });

}  // namespace
}  // namespace glint::actors
