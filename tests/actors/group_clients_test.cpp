// The typed group clients in local and 2-process cluster mode: each method
// spreads its call over the ranks as documented (forward_backward and
// forward_only by dp rank, in row order; clip_grad_and_step on every rank;
// sample sliced and flattened in prompt order; next_batch from the loader)
// and answers what the raw Group call with the same dispatch answers; bad
// input fails the call with context and changes nothing.
#include "actors/dataloader_group.hpp"
#include "actors/model_group.hpp"
#include "actors/probe_group.hpp"
#include "actors/sampler_group.hpp"
#include "components/data/bpe_trainer.hpp"
#include "components/data/synthetic.hpp"
#include "components/model/config.hpp"
#include "support/cluster.hpp"
#include "support/tensors.hpp"
#include "support/temp_dir.hpp"

#include <gtest/gtest.h>

namespace glint::actors {
namespace {

using placement::DeviceGroup;
using placement::DeviceMesh;

components::ModelConfig tiny() {
  auto c = components::ModelConfig::make(components::Architecture::qwen3, 64, 16, 32, 2, 4, 2);
  c.max_position_embeddings = 128;
  return c;
}

Batch four_rows() {
  Batch b;
  b.tensors["input_ids"] = glint::testing::ids_of({{1, 2, 3, 4, 5}, {7, 8, 9, 10, 11}, {4, 4, 4, 4, 4}, {9, 8, 7, 6, 5}});
  return b;
}

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

class GroupClientsTest : public glint::testing::ModeJobTest {
protected:
  int groups_ = 0;
  std::string name(const char* what) { return what + std::to_string(groups_++); }

  ModelGroup model(int ranks = 2) {
    auto g = open_model_group(*job_.rt, DeviceGroup::of(name("model"), ranks), *DeviceMesh::from_sizes({.dp = ranks}),
                              {.config_json = tiny().to_json(), .seed = 7});
    EXPECT_TRUE(g) << describe(g.error());
    return std::move(*g);
  }
  SamplerGroup sampler(int ranks = 2) {
    auto g = open_sampler_group(*job_.rt, DeviceGroup::of(name("sampler"), ranks), *DeviceMesh::from_sizes({.dp = ranks}),
                                {.config_json = tiny().to_json(), .seed = 7, .cache_bytes = 1 << 20});
    EXPECT_TRUE(g) << describe(g.error());
    return std::move(*g);
  }
};

TEST_P(GroupClientsTest, ModelGroupSlicesByDataParallelRankAndKeepsRowOrder) {
  auto two = model(2);
  auto one = model(1);
  EXPECT_EQ(two.info().size(), 2);
  EXPECT_EQ(two.info().dp_size(), 2);
  // forward_only: each dp rank scores its half; the rows come back in order,
  // equal to one rank scoring them all.
  auto whole = one.forward_only(four_rows()).take();
  auto halves = two.forward_only(four_rows()).take();
  ASSERT_TRUE(whole) << describe(whole.error());
  ASSERT_TRUE(halves) << describe(halves.error());
  EXPECT_EQ(halves->shape(), (std::vector<int64_t>{4, 5}));
  auto a = *whole->values<float>(), b = *halves->values<float>();
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(a[i], b[i], 1e-5) << "element " << i;

  // forward_backward averages the ranks' metrics; clip_grad_and_step steps every rank alike.
  ASSERT_TRUE(two.set_optimizer({.kind = OptimizerConfig::Kind::sgd, .lr = 0.5}).get());
  ASSERT_TRUE(one.set_optimizer({.kind = OptimizerConfig::Kind::sgd, .lr = 0.5}).get());
  auto m2 = two.forward_backward(four_rows()).take();
  auto m1 = one.forward_backward(four_rows()).take();
  ASSERT_TRUE(m2) << describe(m2.error());
  ASSERT_TRUE(m1);
  EXPECT_NEAR(m2->at("loss"), m1->at("loss"), 1e-4) << "equal halves: the mean of the halves is the whole";
  auto s2 = two.clip_grad_and_step().take();
  auto s1 = one.clip_grad_and_step().take();
  ASSERT_TRUE(s2) << describe(s2.error());
  ASSERT_TRUE(s1);
  EXPECT_NEAR(s2->at("grad_norm"), s1->at("grad_norm"), 1e-4);
  auto after2 = two.forward_only(four_rows()).take(), after1 = one.forward_only(four_rows()).take();
  ASSERT_TRUE(after2 && after1);
  auto x = *after1->values<float>(), y = *after2->values<float>();
  for (size_t i = 0; i < x.size(); ++i) EXPECT_NEAR(x[i], y[i], 1e-4) << "after one step, element " << i;
  EXPECT_NE(x[0], a[0]) << "the step changed the model";
}

TEST_P(GroupClientsTest, AnAdapterHandleTrainsTheAdapterOnlyAndRefusalsNameWhatWentWrong) {
  auto base = model(1);
  auto before = base.forward_only(four_rows()).take();
  ASSERT_TRUE(before);
  EXPECT_FALSE(base.add_adapter("", {.r = 4}).get()) << "an adapter needs a name";
  ASSERT_TRUE(base.add_adapter("a", {.r = 4}, /*seed=*/1).get());
  auto a = base.with_adapter("a");
  EXPECT_EQ(a.adapter(), "a");
  EXPECT_EQ(a.base().adapter(), "");
  ASSERT_TRUE(a.set_optimizer({.lr = 0.05}).get());
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(a.forward_backward(four_rows()).get());
    ASSERT_TRUE(a.clip_grad_and_step().get());
  }
  EXPECT_EQ(*base.forward_only(four_rows()).take(), *before) << "the base model is frozen";
  EXPECT_NE(*a.forward_only(four_rows()).take(), *before) << "the adapter moved";
  auto configs = a.train_configs().take();
  ASSERT_TRUE(configs);
  EXPECT_TRUE(contains(*configs, "\"a\"")) << *configs;
  auto exported = a.export_weights().take();
  ASSERT_TRUE(exported) << describe(exported.error());
  EXPECT_EQ(exported->size(), 2u * 4 * 2) << "A and B of q, k, v, o in 2 layers";

  auto nobody = base.with_adapter("nobody").forward_backward(four_rows()).get();
  ASSERT_FALSE(nobody);
  EXPECT_TRUE(contains(describe(nobody.error()), "nobody")) << describe(nobody.error());
  Batch bad;
  bad.tensors["input_ids"] = glint::testing::ids_of({{1, 2, 3}, {4, 500, 6}});
  auto out_of_vocab = a.forward_backward(bad).get();
  ASSERT_FALSE(out_of_vocab);
  EXPECT_TRUE(contains(describe(out_of_vocab.error()), "rank")) << describe(out_of_vocab.error());
  ASSERT_TRUE(a.remove_adapter("a").get());
  EXPECT_FALSE(a.forward_backward(four_rows()).get()) << "the adapter is gone";
}

TEST_P(GroupClientsTest, SamplerGroupAnswersInPromptOrderAsOneRankDoes) {
  auto two = sampler(2);
  auto one = sampler(1);
  const std::vector<std::vector<int64_t>> prompts = {{1, 2, 3}, {9, 8}, {5, 50, 6}, {7}, {3, 3, 3, 3}};
  const SamplingParams greedy{.num_samples = 2, .max_tokens = 5, .temperature = 0, .ignore_eos = true};
  auto a = two.sample(prompts, greedy).take();
  auto b = one.sample(prompts, greedy).take();
  ASSERT_TRUE(a) << describe(a.error());
  ASSERT_TRUE(b) << describe(b.error());
  ASSERT_EQ(a->size(), prompts.size() * 2);
  for (size_t i = 0; i < a->size(); ++i) {
    EXPECT_EQ((*a)[i].index, static_cast<int64_t>(i / 2));
    EXPECT_EQ((*a)[i].sample, static_cast<int64_t>(i % 2));
    EXPECT_EQ((*a)[i].tokens, (*b)[i].tokens) << "sequence " << i;
  }
  auto stats = two.stats().take();
  ASSERT_TRUE(stats);
  ASSERT_EQ(stats->size(), 2u) << "one entry per rank";
  EXPECT_GT((*stats)[0].at("generated_tokens"), 0);
  EXPECT_GT((*stats)[1].at("generated_tokens"), 0);
  ASSERT_TRUE(two.reset_prefix_cache().get());
  auto aborted = two.abort().take();
  ASSERT_TRUE(aborted);
  EXPECT_EQ(*aborted, 0) << "nothing was in flight";

  // The training batch of the sequences, with one advantage each.
  std::vector<double> adv(a->size(), 0.5);
  auto batch = training_batch(prompts, *a, {.pad_id = 0, .advantages = adv});
  ASSERT_TRUE(batch) << describe(batch.error());
  EXPECT_EQ(batch->tensors.at("advantages").shape(), (std::vector<int64_t>{static_cast<int64_t>(a->size())}));
  EXPECT_FALSE(training_batch(prompts, *a, {.advantages = {1.0}})) << "one advantage per sequence";
  adv[3] = std::nan("");
  EXPECT_FALSE(training_batch(prompts, *a, {.advantages = adv})) << "advantages must be finite";

  EXPECT_FALSE(two.sample(prompts, {.temperature = -1}).get()) << "bad params fail the call";
  ASSERT_TRUE(two.sleep().get());
  EXPECT_FALSE(two.sample(prompts, greedy).get()) << "asleep";
  ASSERT_TRUE(two.wake().get());
  EXPECT_TRUE(two.sample(prompts, greedy).get());
}

TEST_P(GroupClientsTest, DataLoaderGroupDeliversBatchesAndResumesFromItsState) {
  auto dir = glint::testing::fresh_dir("clients-data");
  auto rows = components::arithmetic_rows(20, {.seed = 2});
  ASSERT_TRUE(components::save_jsonl(rows, dir + "/data.jsonl"));
  auto json = components::train_bpe(components::texts_of(components::Dataset::from_rows(rows)), {.vocab_size = 300});
  ASSERT_TRUE(components::save_chatml_tokenizer(dir, *json));
  DataLoaderSpec spec{.dataset = dir + "/data.jsonl", .preprocess = "gsm8k", .tokenizer = dir, .batch_size = 4,
                      .seed = 3, .epochs = 0};
  auto data = open_dataloader(*job_.rt, DeviceGroup::of(name("data"), 1), spec);
  ASSERT_TRUE(data) << describe(data.error());
  auto info = data->loader_info().take();
  ASSERT_TRUE(info);
  EXPECT_EQ(info->rows, 20);
  ASSERT_TRUE(data->next_batch().get());
  auto state = data->state().take();
  ASSERT_TRUE(state);
  auto next = data->next_batch().take();
  ASSERT_TRUE(next);
  EXPECT_EQ(next->rows.size(), 4u);
  ASSERT_TRUE(data->set_state(*state).get());
  EXPECT_EQ(*data->next_batch().take(), *next) << "the same batch follows the restored state";
  auto foreign = *state;
  foreign.seed += 1;
  EXPECT_FALSE(data->set_state(foreign).get()) << "a state of another seed";
}

TEST_P(GroupClientsTest, ProbeGroupSumsOverDataParallelRanks) {
  auto probes = open_probe_group(*job_.rt, DeviceGroup::of(name("probe"), 2), *DeviceMesh::from_sizes({.dp = 2}));
  ASSERT_TRUE(probes) << describe(probes.error());
  auto total = probes->sum({1, 2, 3, 4, 5, 6}).take();
  ASSERT_TRUE(total);
  EXPECT_EQ(*total, 21);
  EXPECT_EQ(*probes->echo(42).take(), 42);
  auto where = probes->where().take();
  ASSERT_TRUE(where);
  ASSERT_EQ(where->size(), 2u);
  EXPECT_EQ((*where)[1].ctx.rank, 1);
  EXPECT_EQ((*where)[1].ctx.node, GetParam() == Mode::cluster ? 1 : 0);
}

INSTANTIATE_TEST_SUITE_P(Modes, GroupClientsTest, ::testing::Values(Mode::local, Mode::cluster),
                         [](const auto& info) { return info.param == Mode::local ? "local" : "cluster"; });

}  // namespace
}  // namespace glint::actors
