// LoRA adapters: zero-init equals the base, training touches only its
// adapter, PEFT layout round trips, merge/unmerge, several tenants on one base.
#include "components/model/trainer.hpp"
#include "components/model/transformer.hpp"

#include "components/tensor/torch_bridge.hpp"
#include "support/temp_dir.hpp"

#include "support/tensors.hpp"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <fstream>

namespace glint::components {
namespace {

using glint::testing::ids_of;

CausalLM model(uint64_t seed = 4) { return *CausalLM::init_random(ModelConfig::make(Architecture::qwen2, 29, 16, 32, 2, 4, 2), seed); }

at::Tensor logps(const CausalLM& lm, const std::string& adapter = "") {
  auto r = lm.forward({.input_ids = ids_of({{1, 2, 3, 4, 5, 6}, {6, 5, 4, 3, 2, 1}})}, {.adapter = adapter});
  EXPECT_TRUE(r) << describe(r.error());
  return to_torch(r->logprobs).clone();
}

void train(Trainer& tr, int steps) {
  for (int i = 0; i < steps; ++i) {
    auto m = tr.forward_backward({.tokens = {.input_ids = ids_of({{1, 2, 3, 4, 5, 6}})}}, {});
    ASSERT_TRUE(m) << describe(m.error());
    ASSERT_TRUE(tr.clip_grad_and_step());
  }
}

TEST(Lora, AtInitTheOutputIsTheBase) {
  auto lm = model();
  ASSERT_TRUE(lm.add_adapter("a", {.r = 4, .alpha = 8, .target_modules = {"all-linear"}}, 1));
  EXPECT_TRUE(at::equal(logps(lm), logps(lm, "a")));
  auto params = lm.adapter_parameters("a");
  ASSERT_TRUE(params);
  EXPECT_EQ(params->size(), 2u * 7 * 2);  // A and B, 7 projections, 2 layers
  EXPECT_EQ(params->front().first, "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight");
  EXPECT_EQ(params->front().second.shape(), (std::vector<int64_t>{4, 16}));
  ASSERT_TRUE(lm.add_adapter("qv", {.r = 2, .target_modules = {"q_proj", "v_proj"}}));
  EXPECT_EQ(lm.adapter_parameters("qv")->size(), 2u * 2 * 2);
  EXPECT_DOUBLE_EQ((LoraConfig{.r = 16, .alpha = 32, .rslora = true}.scaling()), 8.0);
}

TEST(Lora, TrainingChangesOnlyItsAdapterAndTenantsStayApart) {
  auto lm = model();
  ASSERT_TRUE(lm.add_adapter("alice", {.r = 4, .alpha = 8}, 1));
  ASSERT_TRUE(lm.add_adapter("bob", {.r = 4, .alpha = 8}, 2));
  auto base_before = logps(lm);
  std::map<std::string, at::Tensor> weights_before;
  for (auto& [n, p] : lm.impl().params) weights_before[n] = p.clone();
  auto bob_before = logps(lm, "bob");

  auto alice = Trainer::create(lm, {.optimizer = {.lr = 1e-2}, .adapter = "alice"});
  ASSERT_TRUE(alice) << describe(alice.error());
  train(*alice, 5);
  EXPECT_FALSE(at::allclose(logps(lm, "alice"), base_before)) << "the adapter learned nothing";
  EXPECT_TRUE(at::equal(logps(lm), base_before)) << "training an adapter changed the base";
  EXPECT_TRUE(at::equal(logps(lm, "bob"), bob_before)) << "training alice changed bob";
  for (auto& [n, p] : lm.impl().params) EXPECT_TRUE(at::equal(p, weights_before.at(n))) << n;
  // The adapter's loss falls on what it is trained on.
  auto first = alice->forward_backward({.tokens = {.input_ids = ids_of({{1, 2, 3, 4, 5, 6}})}}, {});
  alice->zero_grad();
  auto fresh = Trainer::create(lm, {.optimizer = {.lr = 1e-2}, .adapter = "bob"});
  auto bob_first = fresh->forward_backward({.tokens = {.input_ids = ids_of({{1, 2, 3, 4, 5, 6}})}}, {});
  EXPECT_LT(first->at("loss"), bob_first->at("loss"));
}

TEST(Lora, AnAdapterStepLeavesTheBaseGradientsAlone) {
  auto lm = model();
  ASSERT_TRUE(lm.add_adapter("a", {.r = 2}));
  auto full = Trainer::create(lm, {});  // makes the base weights require gradients
  auto tenant = Trainer::create(lm, {.adapter = "a"});
  ASSERT_TRUE(full && tenant);
  ASSERT_TRUE(tenant->forward_backward({.tokens = {.input_ids = ids_of({{1, 2, 3}})}}, {}));
  for (auto& [n, p] : lm.impl().params)
    EXPECT_FALSE(p.grad().defined() && p.grad().abs().sum().item<double>() > 0) << n << " got the tenant's gradient";
  auto step = full->clip_grad_and_step();
  ASSERT_FALSE(step);
  EXPECT_EQ(code_of(step.error()), errc::failed_precondition);
  ASSERT_TRUE(tenant->clip_grad_and_step());
}

TEST(Lora, SavesAndLoadsInPeftLayoutBitExact) {
  auto lm = model();
  ASSERT_TRUE(lm.add_adapter("a", {.r = 4, .alpha = 8, .dropout = 0.1, .target_modules = {"q_proj", "down_proj"}}, 3));
  auto tr = Trainer::create(lm, {.optimizer = {.lr = 1e-2}, .adapter = "a"});
  train(*tr, 3);
  auto dir = glint::testing::fresh_dir("lora-save");
  ASSERT_TRUE(lm.save_adapter("a", dir));
  std::ifstream cfg{dir + "/adapter_config.json"};
  auto j = nlohmann::json::parse(cfg);
  EXPECT_EQ(j["peft_type"], "LORA");
  EXPECT_EQ(j["r"], 4);
  EXPECT_EQ(j["lora_alpha"], 8.0);
  EXPECT_EQ(j["target_modules"], (nlohmann::json{"q_proj", "down_proj"}));

  auto other = model();  // the same base weights
  ASSERT_TRUE(other.load_adapter("a2", dir));
  EXPECT_TRUE(at::equal(logps(lm, "a"), logps(other, "a2")));
  auto mine = *lm.adapter_parameters("a"), theirs = *other.adapter_parameters("a2");
  ASSERT_EQ(mine.size(), theirs.size());
  for (size_t i = 0; i < mine.size(); ++i) {
    EXPECT_EQ(mine[i].first, theirs[i].first);
    EXPECT_EQ(mine[i].second, theirs[i].second) << mine[i].first;
  }
  EXPECT_FALSE(other.load_adapter("a2", dir)) << "a second adapter of the same name";
}

TEST(Lora, MergeAndUnmerge) {
  auto lm = model();
  ASSERT_TRUE(lm.add_adapter("a", {.r = 4, .alpha = 8, .target_modules = {"all-linear"}}, 5));
  auto tr = Trainer::create(lm, {.optimizer = {.lr = 1e-2}, .adapter = "a"});
  train(*tr, 3);
  auto base = logps(lm), with = logps(lm, "a");
  ASSERT_TRUE(lm.merge_adapter("a"));
  EXPECT_TRUE(at::allclose(logps(lm), with, 1e-5, 1e-5)) << "merged base differs from base + adapter";
  EXPECT_TRUE(at::allclose(logps(lm, "a"), with, 1e-5, 1e-5)) << "a merged adapter was applied twice";
  EXPECT_FALSE(lm.merge_adapter("a"));
  auto busy = tr->forward_backward({.tokens = {.input_ids = ids_of({{1, 2}})}}, {});
  ASSERT_FALSE(busy);
  EXPECT_NE(describe(busy.error()).find("merged"), std::string::npos);
  EXPECT_FALSE(lm.remove_adapter("a"));
  ASSERT_TRUE(lm.unmerge_adapter("a"));
  EXPECT_TRUE(at::allclose(logps(lm), base, 1e-5, 1e-5));
  ASSERT_TRUE(lm.remove_adapter("a"));
  EXPECT_TRUE(lm.adapters().empty());
}

TEST(Lora, BadAdaptersAreClearErrors) {
  auto lm = model();
  auto unknown = lm.forward({.input_ids = ids_of({{1, 2}})}, {.adapter = "nobody"});
  ASSERT_FALSE(unknown);
  EXPECT_NE(describe(unknown.error()).find("no adapter 'nobody' on this model (adapters: none)"), std::string::npos)
      << describe(unknown.error());
  auto nothing = lm.add_adapter("x", {.target_modules = {"lm_head"}});
  ASSERT_FALSE(nothing);
  EXPECT_NE(describe(nothing.error()).find("match no projection"), std::string::npos);
  EXPECT_FALSE(lm.add_adapter("x", {.r = 0}));
  EXPECT_FALSE(Trainer::create(lm, {.adapter = "ghost"}));

  // An adapter of another rank does not load, and says why.
  ASSERT_TRUE(lm.add_adapter("r4", {.r = 4}));
  auto dir = glint::testing::fresh_dir("lora-bad");
  ASSERT_TRUE(lm.save_adapter("r4", dir));
  {
    std::ifstream in{dir + "/adapter_config.json"};
    auto j = nlohmann::json::parse(in);
    j["r"] = 8;
    std::ofstream{dir + "/adapter_config.json"} << j.dump();
  }
  auto wrong = lm.load_adapter("r8", dir);
  ASSERT_FALSE(wrong);
  EXPECT_NE(describe(wrong.error()).find("expected [8, 16]"), std::string::npos) << describe(wrong.error());
  auto missing = lm.load_adapter("none", dir + "/nope");
  ASSERT_FALSE(missing);
  EXPECT_EQ(code_of(missing.error()), errc::not_found);
}

}  // namespace
}  // namespace glint::components
