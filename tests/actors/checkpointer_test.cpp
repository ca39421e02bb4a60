// Checkpointer: save then resume restores weights, optimizer step and the
// dataloader's position; a damaged checkpoint is refused before anything
// loads; a new run resumes to nothing.
#include "actors/checkpointer.hpp"
#include "components/checkpoint/atomic_dir.hpp"
#include "components/checkpoint/file_system.hpp"
#include "components/data/bpe_trainer.hpp"
#include "components/data/synthetic.hpp"
#include "components/model/config.hpp"
#include "support/cluster.hpp"
#include "support/temp_dir.hpp"

#include <gtest/gtest.h>

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

INSTANTIATE_TEST_SUITE_P(Modes, CheckpointerTest, ::testing::Values(Mode::local, Mode::cluster),
                         [](const auto& info) { return info.param == Mode::local ? "local" : "cluster"; });

}  // namespace
}  // namespace glint::actors
