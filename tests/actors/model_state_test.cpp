// The model rank's state called directly, without an actor or a runtime:
// it trains like a Trainer, keeps each adapter's settings and metrics
// apart, refuses bad input without changing anything, and exports, saves
// and loads its weights.
#include "actors/model_state.hpp"
#include "actors/weight_sync/buckets.hpp"
#include "support/tensors.hpp"
#include "support/temp_dir.hpp"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>

namespace glint::actors {
namespace {

using glint::testing::ids_of;

components::ModelConfig tiny() {
  return components::ModelConfig::make(components::Architecture::qwen3, 31, 16, 32, 2, 4, 2);
}

ModelState make(uint64_t seed = 7) {
  return ModelState{RankContext{.group = "model"}, {.config_json = tiny().to_json(), .seed = seed}};
}

Batch batch() {
  Batch b;
  b.tensors["input_ids"] = ids_of({{1, 2, 3, 4, 5, 6}, {7, 8, 9, 0, 0, 0}});
  b.tensors["attention_mask"] = ids_of({{1, 1, 1, 1, 1, 1}, {1, 1, 1, 0, 0, 0}});
  return b;
}

TEST(ModelState, TrainsLikeATrainerOnTheSameBatches) {
  auto st = make();
  const OptimizerConfig opt{.kind = OptimizerConfig::Kind::sgd, .lr = 0.1};
  ASSERT_TRUE(st.set_optimizer("", opt));
  auto single = components::Trainer::create(*components::CausalLM::init_random(tiny(), 7), {.optimizer = opt});
  ASSERT_TRUE(single);
  for (int step = 1; step <= 3; ++step) {
    auto m = st.forward_backward(batch(), "");
    ASSERT_TRUE(m) << describe(m.error());
    auto want = single->forward_backward({.tokens = {.input_ids = batch().tensors.at("input_ids"),
                                                     .attention_mask = batch().tensors.at("attention_mask")}},
                                         {});
    ASSERT_TRUE(want);
    EXPECT_DOUBLE_EQ(m->at("loss"), want->at("loss")) << "step " << step;
    auto s = st.clip_grad_and_step("");
    ASSERT_TRUE(s) << describe(s.error());
    EXPECT_EQ(s->at("step"), step);
    ASSERT_TRUE(single->clip_grad_and_step());
  }
  auto metrics = st.calculate_metric("");
  ASSERT_TRUE(metrics);
  EXPECT_EQ(metrics->at("step"), 3);
  EXPECT_TRUE(metrics->count("loss"));
  EXPECT_FALSE(st.calculate_metric("")->count("loss")) << "calculate_metric clears what it averaged";
}

TEST(ModelState, AdaptersHaveTheirOwnSettingsAndUnknownOnesAreNamed) {
  auto st = make();
  ASSERT_TRUE(st.add_adapter("a", {.r = 4, .alpha = 8, .target_modules = {"q_proj", "v_proj"}}, 1));
  ASSERT_TRUE(st.set_loss("a", {.kind = LossKind::grpo, .epsilon = 0.3}));
  auto cfg = st.train_configs("a");
  ASSERT_TRUE(cfg) << describe(cfg.error());
  auto j = nlohmann::json::parse(*cfg);
  EXPECT_EQ(j["adapter"], "a");
  EXPECT_EQ(j["loss"]["kind"], "grpo");
  EXPECT_EQ(j["lora"]["r"], 4);
  EXPECT_EQ(nlohmann::json::parse(*st.train_configs(""))["loss"]["kind"], "cross_entropy")
      << "the full model keeps its own loss";
  auto bad = st.forward_backward(batch(), "b");
  ASSERT_FALSE(bad);
  EXPECT_EQ(code_of(bad.error()), errc::not_found);
  EXPECT_NE(describe(bad.error()).find("adapters: a"), std::string::npos) << describe(bad.error());
  ASSERT_TRUE(st.remove_adapter("a"));
  EXPECT_FALSE(st.remove_adapter("")) << "the full model is not an adapter";
}

TEST(ModelState, BadInputIsRefusedAndTheStateStaysUsable) {
  auto st = make();
  Batch extra = batch();
  extra.tensors["labels"] = ids_of({{1}});
  auto e = st.forward_backward(extra, "");
  ASSERT_FALSE(e);
  EXPECT_NE(describe(e.error()).find("labels"), std::string::npos) << describe(e.error());
  EXPECT_FALSE(st.forward_backward(Batch{}, "")) << "no input_ids";
  EXPECT_FALSE(st.set_loss("", {.epsilon = -1})) << "LossSpec::validate";
  EXPECT_FALSE(st.set_optimizer("", {.lr = -1})) << "OptimizerConfig::validate";
  EXPECT_FALSE(st.export_weights("", /*merged=*/true, false)) << "merging needs an adapter";
  EXPECT_TRUE(st.forward_backward(batch(), ""));
  EXPECT_TRUE(st.clip_grad_and_step(""));
}

// Shapes that come from the caller are the caller's error (invalid_argument),
// never glint's (internal): each is checked before LibTorch sees it.
TEST(ModelState, MisshapenBatchesAreTheCallersError) {
  auto st = make();
  auto with = [](const char* key, Tensor t) {
    Batch b = batch();
    b.tensors[key] = std::move(t);
    return b;
  };
  const std::vector<std::pair<std::string, Batch>> bad = {
      {"3-d input_ids", with("input_ids", *Tensor::zeros(Dtype::i64, {2, 6, 1}))},
      {"float input_ids", with("input_ids", *Tensor::zeros(Dtype::f32, {2, 6}))},
      {"attention_mask of another shape", with("attention_mask", ids_of({{1, 1, 1}, {1, 1, 1}}))},
      {"loss_mask of another shape", with("loss_mask", *Tensor::zeros(Dtype::f32, {2, 5}))},
      {"old_logps of another shape", with("old_logps", *Tensor::zeros(Dtype::f32, {3, 6}))},
      {"advantages per token of another length", with("advantages", *Tensor::zeros(Dtype::f32, {2, 5}))},
      {"advantages of another batch", with("advantages", *Tensor::zeros(Dtype::f32, {3}))},
      {"position_ids of another shape", with("position_ids", ids_of({{0, 1}, {0, 1}}))},
      {"target_ids of another shape", with("target_ids", ids_of({{0, 1}, {0, 1}}))},
      {"an id outside the vocabulary", with("input_ids", ids_of({{1, 2, 3, 4, 5, 600}, {7, 8, 9, 0, 0, 0}}))},
      {"an empty batch", with("input_ids", *Tensor::zeros(Dtype::i64, {0, 6}))},
  };
  for (const auto& [what, b] : bad) {
    for (bool train : {true, false}) {
      auto code = train ? (st.forward_backward(b, "") ? errc::ok : code_of(st.forward_backward(b, "").error()))
                        : (st.forward_only(b, "") ? errc::ok : code_of(st.forward_only(b, "").error()));
      if (!train && (what.rfind("loss_mask", 0) == 0 || what.rfind("old_logps", 0) == 0 || what.rfind("advantages", 0) == 0))
        continue;  // forward_only does not read them
      EXPECT_EQ(code, errc::invalid_argument) << what << (train ? " (forward_backward)" : " (forward_only)");
    }
  }
  EXPECT_TRUE(st.forward_backward(batch(), "")) << "and the next good batch is served";
}

TEST(ModelState, AModelThatDoesNotLoadAnswersWhyToEveryCall) {
  ModelState st{RankContext{.group = "model"}, {.model_dir = "/nonexistent/glint-model"}};
  auto e = st.forward_backward(batch(), "");
  ASSERT_FALSE(e);
  EXPECT_NE(describe(e.error()).find("/nonexistent/glint-model"), std::string::npos) << describe(e.error());
  EXPECT_FALSE(st.export_weights("", false, true));
  EXPECT_NE(describe(st.fail(e.error())).find("rank 0 of model group 'model'"), std::string::npos);
}

TEST(ModelState, SnapshotsAreCopiesAndSavedWeightsLoadBack) {
  auto st = make();
  auto live = st.export_weights("", false, /*snapshot=*/false);
  auto copy = st.export_weights("", false, /*snapshot=*/true);
  ASSERT_TRUE(live && copy);
  ASSERT_EQ(live->size(), copy->size());
  auto m = st.sync_manifest("", false);
  ASSERT_TRUE(m);
  ASSERT_EQ(m->tensors.size(), live->size());
  for (size_t i = 0; i < live->size(); ++i) {
    EXPECT_EQ(m->tensors[i].name, (*live)[i].first);
    EXPECT_EQ(m->tensors[i].shape, (*live)[i].second.shape());
    EXPECT_EQ(m->tensors[i].dtype, (*live)[i].second.dtype());
  }
  ASSERT_TRUE(st.forward_backward(batch(), ""));
  ASSERT_TRUE(st.clip_grad_and_step(""));
  auto after = st.export_weights("", false, true);
  ASSERT_TRUE(after);
  EXPECT_EQ((*live)[0].second, (*after)[0].second) << "the live export follows training";
  bool changed = false;
  for (size_t i = 0; i < copy->size(); ++i) changed |= !((*copy)[i].second == (*after)[i].second);
  EXPECT_TRUE(changed) << "the snapshot does not";

  auto dir = glint::testing::fresh_dir("model-state");
  auto saved = st.save("", dir, /*with_optimizer=*/true);
  ASSERT_TRUE(saved) << describe(saved.error());
  auto other = make(/*seed=*/99);
  ASSERT_TRUE(other.load("", dir, /*with_optimizer=*/true));
  auto loaded = other.export_weights("", false, true);
  ASSERT_TRUE(loaded);
  for (size_t i = 0; i < after->size(); ++i) EXPECT_EQ((*loaded)[i].second, (*after)[i].second) << (*after)[i].first;
  EXPECT_FALSE(other.load("", dir + "/missing", false));
  EXPECT_TRUE(other.forward_backward(batch(), "")) << "a failed load changes nothing";
}

// An adapter on the base make() builds, with B not zero and its own scale
// for v_proj, saved in PEFT layout; `lm` keeps it as "src".
std::string saved_adapter(components::CausalLM& lm, const std::string& name) {
  components::LoraConfig c{.r = 4, .alpha = 8, .target_modules = {"q_proj", "v_proj"}};
  c.alpha_pattern = {{"v_proj", 32}};
  EXPECT_TRUE(lm.add_adapter("src", c, 1));
  auto params = lm.adapter_parameters("src");  // a local: a range-for over *temporary dangles
  for (auto& [key, t] : *params) {
    auto* v = reinterpret_cast<float*>(t.mutable_data());
    for (int64_t i = 0; i < t.numel(); ++i) v[i] = 0.05f * static_cast<float>((i * 7) % 13 - 6);
  }
  auto dir = glint::testing::fresh_dir(name);
  EXPECT_TRUE(lm.save_adapter("src", dir));
  return dir;
}

TEST(ModelState, LoadAdapterMakesANewAdapterFromADirectoryAndABadOneChangesNothing) {
  auto st = make();
  auto lm = components::CausalLM::init_random(tiny(), 7);
  ASSERT_TRUE(lm);
  auto dir = saved_adapter(*lm, "state-load-adapter");
  auto ok = st.load_adapter("x", dir);
  ASSERT_TRUE(ok) << describe(ok.error());
  auto got = st.forward_only(batch(), "x");
  ASSERT_TRUE(got) << describe(got.error());
  auto want = lm->forward({.input_ids = batch().tensors.at("input_ids"),
                           .attention_mask = batch().tensors.at("attention_mask")},
                          {.adapter = "src"});
  ASSERT_TRUE(want);
  EXPECT_EQ(*got, want->logprobs);
  EXPECT_NE(*got, *st.forward_only(batch(), "")) << "the adapter changes the output";
  ASSERT_TRUE(st.forward_backward(batch(), "x")) << "it trains";
  ASSERT_TRUE(st.clip_grad_and_step("x"));
  auto trained = st.forward_only(batch(), "x");
  ASSERT_TRUE(trained);

  auto taken = st.load_adapter("x", dir);
  ASSERT_FALSE(taken);
  EXPECT_EQ(code_of(taken.error()), errc::failed_precondition);
  auto missing = st.load_adapter("y", dir + "/missing");
  ASSERT_FALSE(missing);
  EXPECT_NE(describe(missing.error()).find(dir + "/missing/adapter_config.json"), std::string::npos)
      << describe(missing.error());
  // Another rank, another shape: the error names the file and the tensor.
  auto wrong = glint::testing::fresh_dir("state-load-adapter-wrong");
  components::CausalLM other = *components::CausalLM::init_random(tiny(), 7);
  ASSERT_TRUE(other.add_adapter("r2", {.r = 2, .target_modules = {"q_proj", "v_proj"}}));
  ASSERT_TRUE(other.save_adapter("r2", wrong));
  {
    std::ifstream in{wrong + "/adapter_config.json"};
    auto j = nlohmann::json::parse(in);
    j["r"] = 4;
    std::ofstream{wrong + "/adapter_config.json"} << j.dump();
  }
  auto shapes = st.load_adapter("y", wrong);
  ASSERT_FALSE(shapes);
  EXPECT_NE(describe(shapes.error()).find(wrong + "/adapter_model.safetensors"), std::string::npos)
      << describe(shapes.error());
  EXPECT_NE(describe(shapes.error()).find("q_proj: lora_A is"), std::string::npos) << describe(shapes.error());
  auto configs = nlohmann::json::parse(*st.train_configs(""));
  EXPECT_EQ(configs["adapters"], (nlohmann::json{"x"})) << "a refused directory added nothing";
  EXPECT_EQ(*st.forward_only(batch(), "x"), *trained) << "nor changed the adapter there is";
}

TEST(ModelState, SavesTheFullModelInShardsAboveTheLimit) {
  auto st = make();
  auto dir = glint::testing::fresh_dir("model-state-shards");
  ASSERT_TRUE(st.save("", dir, /*with_optimizer=*/false, /*max_shard_bytes=*/1024));
  EXPECT_TRUE(std::filesystem::exists(dir + "/model.safetensors.index.json"));
  EXPECT_FALSE(std::filesystem::exists(dir + "/model.safetensors"));
  auto other = make(/*seed=*/99);
  ASSERT_TRUE(other.load("", dir, false));
  EXPECT_EQ(*other.forward_only(batch(), ""), *st.forward_only(batch(), ""));
}

TEST(ModelState, BucketsKeepTheOrderAndGiveBigTensorsTheirOwn) {
  NamedTensors w;
  for (int64_t n : {4, 4, 16, 2, 2}) w.emplace_back("t" + std::to_string(w.size()), *Tensor::zeros(Dtype::f32, {n}));
  auto b = weight_sync::buckets_of(w, 32);  // 32 bytes: eight floats
  ASSERT_TRUE(b);
  ASSERT_EQ(b->size(), 3u);
  EXPECT_EQ((*b)[0].size(), 2u);  // 16 + 16 bytes
  EXPECT_EQ((*b)[1].size(), 1u);  // 64 bytes, alone
  EXPECT_EQ((*b)[2].size(), 2u);
  EXPECT_EQ((*b)[2][1].first, "t4");
  EXPECT_FALSE(weight_sync::buckets_of(w, 0));
}

}  // namespace
}  // namespace glint::actors
