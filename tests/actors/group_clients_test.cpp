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
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>

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

  // forward_backward answers the whole batch's loss; clip_grad_and_step steps every rank alike.
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

TEST_P(GroupClientsTest, SampleOnKeepsAKeysRequestsOnOneRank) {
  // Multi-turn rollouts key each conversation: all its turns on one rank, so
  // that rank's prefix cache holds its earlier turns; keys spread over ranks.
  auto s = sampler(2);
  const components::SamplingParams p{.max_tokens = 2, .temperature = 0, .ignore_eos = true};
  auto prompts_on = [&](uint64_t key) {
    EXPECT_TRUE(s.sample_on(key, {SampleRequest{.index = 0, .prompt = {1, 2, 3, 4}}}, p).take());
    auto stats = s.stats().take();
    EXPECT_TRUE(stats);
    std::vector<double> tokens;
    for (const auto& m : *stats) tokens.push_back(m.at("prompt_tokens"));
    return tokens;
  };
  auto a = prompts_on(0);
  auto b = prompts_on(2);  // the same rank as key 0
  auto c = prompts_on(1);  // the other
  ASSERT_EQ(a.size(), 2u);
  EXPECT_GT(a[0], 0);
  EXPECT_EQ(a[1], 0);
  EXPECT_GT(b[0], a[0]);
  EXPECT_EQ(b[1], 0);
  EXPECT_GT(c[1], 0);
  EXPECT_EQ(c[0], b[0]);
}

TEST_P(GroupClientsTest, ModelGroupMetricsAreTheWholeBatchsWhenTheRanksHalvesDiffer) {
  auto two = model(2);
  auto one = model(1);
  // Rank 0 gets two rows of 5 real tokens, rank 1 two rows of 2: the batch's
  // mean loss is over 4 + 4 + 1 + 1 = 10 targets, not the mean of two means.
  auto b = four_rows();
  b.tensors["attention_mask"] = glint::testing::ids_of({{1, 1, 1, 1, 1}, {1, 1, 1, 1, 1}, {1, 1, 0, 0, 0}, {1, 1, 0, 0, 0}});
  auto m2 = two.forward_backward(b).take();
  auto m1 = one.forward_backward(b).take();
  ASSERT_TRUE(m2) << describe(m2.error());
  ASSERT_TRUE(m1) << describe(m1.error());
  EXPECT_NEAR(m2->at("loss"), m1->at("loss"), 1e-5);
  EXPECT_EQ(m2->at("tokens"), m1->at("tokens"));
  EXPECT_EQ(m2->at("tokens"), 10);
  EXPECT_EQ(m2->at("sequences"), 4);
  EXPECT_EQ(m2->count("loss_weighted"), 0u) << "the group's own bookkeeping stays inside";
}

// A pairwise loss's batch goes to the ranks in whole pairs: 3 pairs over 2
// ranks are 2 pairs and 1 (rows split 3 and 3 would pair a chosen row of
// one pair with the rejected row of another), and the update is one rank's.
TEST_P(GroupClientsTest, APairwiseLossSlicesTheBatchInWholePairs) {
  auto two = model(2);
  auto one = model(1);
  Batch b;
  b.tensors["input_ids"] = glint::testing::ids_of(
      {{1, 2, 3, 4, 5}, {1, 2, 3, 9, 8}, {7, 7, 2, 5, 5}, {7, 7, 2, 1, 1}, {4, 3, 6, 2, 8}, {4, 3, 6, 5, 9}});
  b.tensors["loss_mask"] = glint::testing::ids_of(
      {{0, 0, 1, 1, 0}, {0, 0, 1, 1, 0}, {0, 1, 1, 1, 0}, {0, 1, 1, 1, 0}, {0, 0, 1, 1, 0}, {0, 0, 1, 0, 0}});
  // The reference: another model's log-probs, so the loss is not at ln 2.
  auto other = model(1);
  ASSERT_TRUE(other.set_optimizer({.kind = OptimizerConfig::Kind::sgd, .lr = 1.0}).get());
  ASSERT_TRUE(other.forward_backward(four_rows()).take());
  ASSERT_TRUE(other.clip_grad_and_step().take());
  auto ref = other.forward_only(b).take();
  ASSERT_TRUE(ref) << describe(ref.error());
  b.tensors["ref_logps"] = *ref;
  for (auto* g : {&two, &one}) {
    ASSERT_TRUE(g->set_optimizer({.kind = OptimizerConfig::Kind::sgd, .lr = 0.5}).get());
    ASSERT_TRUE(g->set_loss({.kind = LossKind::dpo, .beta = 0.5}).get());
  }
  auto m2 = two.forward_backward(b).take();
  auto m1 = one.forward_backward(b).take();
  ASSERT_TRUE(m2) << describe(m2.error());
  ASSERT_TRUE(m1) << describe(m1.error());
  EXPECT_NEAR(m2->at("loss"), m1->at("loss"), 1e-5);
  EXPECT_EQ(m2->at("loss_count"), 3) << "pairs";
  // The reward metrics are the batch's too (2 pairs and 1: weighed, not the mean of two means).
  for (const char* k : {"reward_margin", "reward_chosen", "reward_rejected", "reward_accuracy"})
    EXPECT_NEAR(m2->at(k), m1->at(k), 1e-5) << k;
  for (const auto& [k, v] : *m2) EXPECT_EQ(k.find("_weighted"), std::string::npos) << k;
  ASSERT_TRUE(two.clip_grad_and_step().take());
  ASSERT_TRUE(one.clip_grad_and_step().take());
  auto after1 = one.forward_only(four_rows()).take(), after2 = two.forward_only(four_rows()).take();
  ASSERT_TRUE(after1 && after2);
  auto x = *after1->values<float>(), y = *after2->values<float>();
  for (size_t i = 0; i < x.size(); ++i) EXPECT_NEAR(x[i], y[i], 1e-5) << "after one step, element " << i;
  // Back to a per-row loss: the rows are sliced 3 and 3 again, and a
  // pairwise batch's columns are refused by name.
  ASSERT_TRUE(two.set_loss({}).get());
  auto ce = two.forward_backward(b).take();
  ASSERT_FALSE(ce);
  EXPECT_TRUE(contains(describe(ce.error()), "ref_logps, which cross_entropy does not read")) << describe(ce.error());
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

TEST_P(GroupClientsTest, LoadAdapterReadsAPeftDirectoryOnEveryRankOfModelAndSampler) {
  // An adapter made on the groups' base (tiny(), seed 7), with a rank of
  // its own for down_proj and B not zero, saved in PEFT layout.
  auto lm = components::CausalLM::init_random(tiny(), 7);
  ASSERT_TRUE(lm);
  components::LoraConfig c{.r = 4, .alpha = 8, .target_modules = {"all-linear"}};
  c.rank_pattern = {{"down_proj", 2}};
  ASSERT_TRUE(lm->add_adapter("src", c, 1));
  auto params = lm->adapter_parameters("src");  // a local: a range-for over *temporary dangles
  for (auto& [key, t] : *params) {
    auto* v = reinterpret_cast<float*>(t.mutable_data());
    for (int64_t i = 0; i < t.numel(); ++i) v[i] = 0.05f * static_cast<float>((i * 5) % 11 - 5);
  }
  auto dir = glint::testing::fresh_dir("clients-load-adapter");
  ASSERT_TRUE(lm->save_adapter("src", dir));
  auto want = lm->forward({.input_ids = four_rows().tensors.at("input_ids")}, {.adapter = "src"});
  ASSERT_TRUE(want);
  auto expected = *want->logprobs.values<float>();

  auto two = model(2);
  auto base = two.forward_only(four_rows()).take();
  ASSERT_TRUE(base);
  auto ok = two.load_adapter("x", dir).get();
  ASSERT_TRUE(ok) << describe(ok.error());
  auto got = two.with_adapter("x").forward_only(four_rows()).take();
  ASSERT_TRUE(got) << describe(got.error());
  auto g = *got->values<float>();
  ASSERT_EQ(g.size(), expected.size());
  for (size_t i = 0; i < g.size(); ++i) EXPECT_NEAR(g[i], expected[i], 1e-5) << "element " << i;
  EXPECT_NE(*got, *base);
  EXPECT_FALSE(two.load_adapter("x", dir).get()) << "the name is taken";
  EXPECT_FALSE(two.load_adapter("", dir).get()) << "an adapter needs a name";
  auto missing = two.load_adapter("y", dir + "/nope").get();
  ASSERT_FALSE(missing);
  EXPECT_TRUE(contains(describe(missing.error()), dir + "/nope/adapter_config.json")) << describe(missing.error());
  EXPECT_TRUE(contains(describe(missing.error()), "rank")) << describe(missing.error());
  auto dora = glint::testing::fresh_dir("clients-load-adapter-dora");
  std::filesystem::copy(dir, dora, std::filesystem::copy_options::recursive | std::filesystem::copy_options::overwrite_existing);
  {
    std::ifstream in{dora + "/adapter_config.json"};
    auto j = nlohmann::json::parse(in);
    j["use_dora"] = true;
    std::ofstream{dora + "/adapter_config.json"} << j.dump();
  }
  auto refused = two.load_adapter("y", dora).get();
  ASSERT_FALSE(refused);
  EXPECT_TRUE(contains(describe(refused.error()), "use_dora = true")) << describe(refused.error());
  EXPECT_FALSE(two.with_adapter("y").forward_only(four_rows()).get()) << "a refused directory adds nothing";
  EXPECT_EQ(*two.with_adapter("x").forward_only(four_rows()).take(), *got);

  // The sampler group serves the same directory: its prompt log-probs with
  // the adapter are the model's.
  auto samplers = sampler(2);
  ASSERT_TRUE(samplers.load_adapter("x", dir).get());
  EXPECT_FALSE(samplers.load_adapter("y", dora).get());
  const SamplingParams score{.max_tokens = 0, .prompt_logprobs = 0};
  auto seqs = samplers.with_adapter("x").sample({{1, 2, 3, 4, 5}, {7, 8, 9, 10, 11}}, score).take();
  ASSERT_TRUE(seqs) << describe(seqs.error());
  ASSERT_EQ(seqs->size(), 2u);
  for (size_t row = 0; row < 2; ++row) {
    const auto& chosen = (*seqs)[row].prompt_logprobs.chosen;
    ASSERT_EQ(chosen.size(), 4u);
    for (size_t t = 0; t < 4; ++t) EXPECT_NEAR(chosen[t], expected[row * 5 + t], 1e-4) << "row " << row << ", token " << t;
  }
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
