// LoRA adapters: zero-init equals the base, training touches only its
// adapter, PEFT layout round trips, merge/unmerge, several tenants on one base.
#include "components/kernels/fused.hpp"
#include "components/model/trainer.hpp"
#include "components/model/transformer.hpp"

#include "components/tensor/torch_bridge.hpp"
#include "support/temp_dir.hpp"

#include "support/tensors.hpp"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <ATen/CPUGeneratorImpl.h>
#include <c10/core/GradMode.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
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
  auto nothing = lm.add_adapter("x", {.target_modules = {"embed_tokens"}});
  ASSERT_FALSE(nothing);
  EXPECT_NE(describe(nothing.error()).find("select model.embed_tokens"), std::string::npos) << describe(nothing.error());
  auto no_projection = lm.add_adapter("x", {.target_modules = {"qproj"}});
  ASSERT_FALSE(no_projection);
  EXPECT_NE(describe(no_projection.error()).find("match no projection"), std::string::npos);
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

// -- adapter_config.json fields, as PEFT means them -------------------------------

constexpr const char* q0 = "model.layers.0.self_attn.q_proj";
constexpr const char* v0 = "model.layers.0.self_attn.v_proj";
constexpr const char* down0 = "model.layers.0.mlp.down_proj";
constexpr const char* q1 = "model.layers.1.self_attn.q_proj";
constexpr const char* v1 = "model.layers.1.self_attn.v_proj";
constexpr const char* down1 = "model.layers.1.mlp.down_proj";

struct HandLora {
  at::Tensor A, B;
  double scaling;  ///< written out by hand in the test
};

// Writes a PEFT adapter directory by hand: `config` as adapter_config.json
// and, for each module, A [r, in] and B [out, r] of normal noise (B is not
// zero, so the adapter changes the output).
std::map<std::string, HandLora> write_adapter(const std::string& dir, const CausalLM& lm, const std::string& config,
                                              const std::map<std::string, std::pair<int64_t, double>>& rank_and_scale,
                                              uint64_t seed = 11) {
  std::ofstream{dir + "/adapter_config.json"} << config;
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  std::map<std::string, HandLora> out;
  NamedTensors tensors;
  for (const auto& [m, rs] : rank_and_scale) {
    const auto& w = lm.impl().param(m + ".weight");
    auto A = at::empty({rs.first, w.size(1)}, at::kFloat).normal_(0, 0.3, gen);
    auto B = at::empty({w.size(0), rs.first}, at::kFloat).normal_(0, 0.3, gen);
    out[m] = {A, B, rs.second};
    tensors.emplace_back("base_model.model." + m + ".lora_A.weight", *from_torch(A));
    tensors.emplace_back("base_model.model." + m + ".lora_B.weight", *from_torch(B));
  }
  EXPECT_TRUE(write_safetensors(dir + "/adapter_model.safetensors", tensors));
  return out;
}

// The log-probs of a fresh copy of the base with W += scaling * B A folded
// in by hand for every module: what the adapter must compute.
at::Tensor folded_by_hand(const std::map<std::string, HandLora>& lora, double scale_factor = 1.0) {
  auto copy = model();
  c10::NoGradGuard no_grad;
  for (const auto& [m, l] : lora) copy.impl().params.at(m + ".weight").add_(at::matmul(l.B, l.A) * l.scaling * scale_factor);
  return logps(copy);
}

std::string error_text(const Result<void>& r) { return r ? std::string{"(no error)"} : describe(r.error()); }

TEST(Lora, AlphaPatternGivesThatModuleItsOwnScale) {
  auto lm = model();
  auto dir = glint::testing::fresh_dir("lora-alpha-pattern");
  // r 4, alpha 8: scaling 2, except q_proj (alpha 32: 8) and layer 1's
  // down_proj (r 2: 8 / 2 = 4), written out here, not computed by glint.
  auto lora = write_adapter(dir, lm, R"({
    "peft_type": "LORA", "task_type": "CAUSAL_LM", "r": 4, "lora_alpha": 8, "lora_dropout": 0.0,
    "target_modules": ["q_proj", "v_proj", "down_proj"],
    "alpha_pattern": {"q_proj": 32}, "rank_pattern": {"model.layers.1.mlp.down_proj": 2}})",
                            {{q0, {4, 8.0}}, {v0, {4, 2.0}}, {down0, {4, 2.0}},
                             {q1, {4, 8.0}}, {v1, {4, 2.0}}, {down1, {2, 4.0}}});
  auto ok = lm.load_adapter("a", dir);
  ASSERT_TRUE(ok) << error_text(ok);
  const auto& scaling = lm.impl().adapters.at("a").scaling;
  for (const auto& [m, l] : lora) EXPECT_DOUBLE_EQ(scaling.at(m), l.scaling) << m;
  auto got = logps(lm, "a");
  EXPECT_TRUE(at::allclose(got, folded_by_hand(lora), 1e-5, 1e-5));
  // The hand reference tells the scales apart: alpha / r everywhere is not it.
  auto uniform = lora;
  for (auto& [m, l] : uniform) l.scaling = 2.0;
  uniform[down1].scaling = 4.0;
  EXPECT_FALSE(at::allclose(got, folded_by_hand(uniform), 1e-3, 1e-3));
  // Merging folds the same per-module scales into the base.
  ASSERT_TRUE(lm.merge_adapter("a"));
  EXPECT_TRUE(at::allclose(logps(lm), folded_by_hand(lora), 1e-5, 1e-5));
}

TEST(Lora, RankAndAlphaPatternsFollowPeftsFirstMatchingKey) {
  // PEFT's get_pattern_key: the first key (in file order) that matches the
  // whole path or its end after a "."; scaling alpha / r, or / sqrt(r) with rslora.
  LoraConfig c{.r = 4, .alpha = 8, .target_modules = {"all-linear"}};
  c.rank_pattern = {{"q_proj", 2}, {".*", 16}};
  c.alpha_pattern = {{"layers\\.0\\..*", 2}, {"proj", 100}};
  ASSERT_TRUE(c.validate());
  EXPECT_EQ(c.rank_of(q0), 2);
  EXPECT_EQ(c.rank_of(v0), 16) << "the catch-all comes second";
  EXPECT_DOUBLE_EQ(c.alpha_of(q0), 2);
  EXPECT_DOUBLE_EQ(c.alpha_of(q1), 8) << "\"proj\" is not a whole path segment of q_proj";
  EXPECT_DOUBLE_EQ(c.scaling_of(q0), 1.0);   // 2 / 2
  EXPECT_DOUBLE_EQ(c.scaling_of(v1), 0.5);   // 8 / 16
  c.rslora = true;
  EXPECT_DOUBLE_EQ(c.scaling_of(q1), 8 / std::sqrt(2.0));
  EXPECT_DOUBLE_EQ(c.scaling_of(down0), 0.5);  // 2 / sqrt(16)
  // add_adapter gives each module its rank.
  auto lm = model();
  ASSERT_TRUE(lm.add_adapter("a", c, 1));
  EXPECT_EQ(lm.impl().adapters.at("a").weights.at(q1).first.size(0), 2);
  EXPECT_EQ(lm.impl().adapters.at("a").weights.at(down1).second.size(1), 16);
  c.rank_pattern = {{"(unclosed", 2}};
  auto bad = c.validate();
  ASSERT_FALSE(bad);
  EXPECT_NE(describe(bad.error()).find("(unclosed"), std::string::npos) << describe(bad.error());
}

std::vector<std::string> modules_of(const CausalLM& lm, const std::string& adapter) {
  return lm.impl().adapters.at(adapter).modules;
}

TEST(Lora, RegexTargetModulesMatchTheWholeModulePath) {
  auto lm = model();
  auto dir = glint::testing::fresh_dir("lora-regex");
  auto lora = write_adapter(dir, lm, R"({"peft_type": "LORA", "r": 4, "lora_alpha": 4,
    "target_modules": ".*\\.layers\\.1\\.self_attn\\.(q|v)_proj"})",
                            {{q1, {4, 1.0}}, {v1, {4, 1.0}}});
  auto ok = lm.load_adapter("a", dir);
  ASSERT_TRUE(ok) << error_text(ok);
  EXPECT_EQ(modules_of(lm, "a"), (std::vector<std::string>{q1, v1}));
  EXPECT_TRUE(at::allclose(logps(lm, "a"), folded_by_hand(lora), 1e-5, 1e-5));
  // A full match: "q_proj" alone as a regex matches no path.
  LoraConfig partial{.target_regex = "q_proj"};
  auto none = lm.add_adapter("b", partial);
  ASSERT_FALSE(none);
  EXPECT_NE(describe(none.error()).find("match no projection"), std::string::npos) << describe(none.error());
  LoraConfig mlp{.r = 2, .target_regex = ".*mlp\\.\\w+_proj"};
  ASSERT_TRUE(lm.add_adapter("mlp", mlp));
  EXPECT_EQ(modules_of(lm, "mlp").size(), 6u) << "gate, up and down of 2 layers";
  // ".*mlp\..*" also selects the activation (mlp.act_fn): PEFT fails on it, so does glint.
  auto act = lm.add_adapter("act", {.target_regex = ".*mlp\\..*"});
  ASSERT_FALSE(act);
  EXPECT_NE(describe(act.error()).find("model.layers.0.mlp.act_fn"), std::string::npos) << describe(act.error());
  // Re-saved, the regex stays a string (a list would mean suffixes).
  auto again = glint::testing::fresh_dir("lora-regex-again");
  ASSERT_TRUE(lm.save_adapter("a", again));
  std::ifstream in{again + "/adapter_config.json"};
  EXPECT_EQ(nlohmann::json::parse(in)["target_modules"], ".*\\.layers\\.1\\.self_attn\\.(q|v)_proj");
  ASSERT_TRUE(lm.load_adapter("a2", again));
  EXPECT_TRUE(at::equal(logps(lm, "a2"), logps(lm, "a")));
}

TEST(Lora, LayersToTransformAndLayersPatternPickTheLayers) {
  auto lm = model();
  LoraConfig c{.r = 2, .target_modules = {"q_proj", "down_proj"}};
  c.layers_to_transform = {1};
  c.layers_pattern = {"layers"};
  ASSERT_TRUE(lm.add_adapter("one", c));
  EXPECT_EQ(modules_of(lm, "one"), (std::vector<std::string>{q1, down1}));
  // PEFT: a module named by its whole path is not filtered by layer.
  c.target_modules = {v0, "q_proj"};
  ASSERT_TRUE(lm.add_adapter("whole", c));
  EXPECT_EQ(modules_of(lm, "whole"), (std::vector<std::string>{v0, q1}));
  // A pattern that names no module list here: no layer index, no module.
  c.target_modules = {"q_proj"};
  c.layers_pattern = {"h"};
  EXPECT_FALSE(lm.add_adapter("gpt2", c));

  // From a file, with the weights of just those layers.
  auto dir = glint::testing::fresh_dir("lora-layers");
  auto lora = write_adapter(dir, lm, R"({"peft_type": "LORA", "r": 4, "lora_alpha": 16,
    "target_modules": ["v_proj", "down_proj"], "layers_to_transform": 0, "layers_pattern": "layers"})",
                            {{v0, {4, 4.0}}, {down0, {4, 4.0}}});
  auto ok = lm.load_adapter("file", dir);
  ASSERT_TRUE(ok) << error_text(ok);
  EXPECT_EQ(modules_of(lm, "file"), (std::vector<std::string>{v0, down0}));
  EXPECT_TRUE(at::allclose(logps(lm, "file"), folded_by_hand(lora), 1e-5, 1e-5));
  // PEFT refuses layers_to_transform with a string target, and a pattern without layers.
  EXPECT_FALSE((LoraConfig{.target_modules = {"all-linear"}, .layers_to_transform = {0}}.validate()));
  EXPECT_FALSE((LoraConfig{.target_regex = ".*q_proj", .layers_to_transform = {0}}.validate()));
  EXPECT_FALSE((LoraConfig{.layers_pattern = {"layers"}}.validate()));
}

TEST(Lora, ExcludeModulesAndAllLinearSelectAsPeftDoes) {
  auto lm = model();
  LoraConfig c{.r = 2, .target_modules = {"all-linear"}, .exclude_modules = {"o_proj", v1}};
  ASSERT_TRUE(lm.add_adapter("a", c));
  auto mods = modules_of(lm, "a");
  EXPECT_EQ(mods.size(), 14u - 2 - 1) << "7 projections x 2 layers, less 2 o_proj and layer 1's v_proj";
  EXPECT_EQ(std::count(mods.begin(), mods.end(), std::string{v1}), 0);
  c.exclude_modules.clear();
  c.exclude_regex = ".*\\.mlp\\..*";
  ASSERT_TRUE(lm.add_adapter("attn", c));
  EXPECT_EQ(modules_of(lm, "attn").size(), 8u);
  // From a file: "ALL-LINEAR" in any case, as PEFT reads it.
  auto dir = glint::testing::fresh_dir("lora-all-linear");
  std::map<std::string, std::pair<int64_t, double>> all;
  for (const auto& m : lm.impl().linear_modules()) all[m] = {2, 3.0};
  auto lora = write_adapter(dir, lm, R"({"peft_type": "LORA", "r": 2, "lora_alpha": 6, "target_modules": "ALL-LINEAR"})", all);
  auto ok = lm.load_adapter("file", dir);
  ASSERT_TRUE(ok) << error_text(ok);
  EXPECT_TRUE(at::allclose(logps(lm, "file"), folded_by_hand(lora), 1e-5, 1e-5));
}

TEST(Lora, FieldsGlintCannotHonourAreRefusedNamingFileFieldAndValue) {
  auto lm = model();
  const std::vector<std::pair<std::string, std::string>> cases = {
      {R"("use_dora": true)", "use_dora = true"},
      {R"("fan_in_fan_out": true)", "fan_in_fan_out = true"},
      {R"("bias": "lora_only")", "bias = \"lora_only\""},
      {R"("modules_to_save": ["lm_head"])", "modules_to_save = [\"lm_head\"]"},
      {R"("lora_bias": true)", "lora_bias = true"},
      {R"("layer_replication": [[0, 1], [0, 2]])", "layer_replication = [[0,1],[0,2]]"},
      {R"("trainable_token_indices": [5])", "trainable_token_indices = [5]"},
      {R"("task_type": "SEQ_CLS")", "task_type = \"SEQ_CLS\""},
      {R"("peft_type": "IA3")", "peft_type = \"IA3\""},
      {R"("alora_invocation_tokens": [1, 2])", "alora_invocation_tokens = [1,2]"},
  };
  auto dir = glint::testing::fresh_dir("lora-refused");
  for (const auto& [field, named] : cases) {
    write_adapter(dir, lm, R"({"r": 4, "lora_alpha": 8, "target_modules": ["q_proj"], )" + field + "}",
                  {{q0, {4, 2.0}}, {q1, {4, 2.0}}});
    auto r = lm.load_adapter("a", dir);
    ASSERT_FALSE(r) << field << " was accepted";
    auto text = describe(r.error());
    EXPECT_NE(text.find(dir + "/adapter_config.json"), std::string::npos) << text;
    EXPECT_NE(text.find(named), std::string::npos) << text;
    EXPECT_TRUE(lm.adapters().empty()) << "a refused adapter left something behind";
  }
  // Targets glint cannot adapt, or no target at all.
  for (const auto& [targets, named] : std::vector<std::pair<std::string, std::string>>{
           {R"(["q_proj", "embed_tokens"])", "model.embed_tokens"},
           {R"(".*embed_tokens")", "model.embed_tokens"},
           {R"(["mlp"])", "model.layers.0.mlp"},
           {"null", "target_modules = null"}}) {
    write_adapter(dir, lm, R"({"r": 4, "lora_alpha": 8, "target_modules": )" + targets + "}", {{q0, {4, 2.0}}});
    auto r = lm.load_adapter("a", dir);
    ASSERT_FALSE(r) << targets << " was accepted";
    EXPECT_NE(describe(r.error()).find(named), std::string::npos) << describe(r.error());
    EXPECT_NE(describe(r.error()).find("adapter_config.json"), std::string::npos) << describe(r.error());
  }
  // Mistyped values name the field and the value too.
  write_adapter(dir, lm, R"({"r": "4", "target_modules": ["q_proj"]})", {{q0, {4, 2.0}}});
  EXPECT_NE(error_text(lm.load_adapter("a", dir)).find("r = \"4\""), std::string::npos) << error_text(lm.load_adapter("a", dir));
  // The neutral values of the same fields load (PEFT writes them so).
  write_adapter(dir, lm, R"({"r": 4, "lora_alpha": 8, "target_modules": ["q_proj"], "use_dora": false,
    "fan_in_fan_out": false, "bias": "none", "modules_to_save": null, "lora_bias": false, "task_type": "CAUSAL_LM",
    "layer_replication": null, "init_lora_weights": "gaussian", "lora_dropout": 0.25})",
                {{q0, {4, 2.0}}, {q1, {4, 2.0}}});
  auto ok = lm.load_adapter("a", dir);
  ASSERT_TRUE(ok) << error_text(ok);
  EXPECT_DOUBLE_EQ(lm.adapter_config("a")->dropout, 0.25);
}

TEST(Lora, ABadDirectoryIsAnErrorNamingTheFileAndLeavesTheModelUnchanged) {
  auto lm = model();
  auto before = logps(lm);
  auto dir = glint::testing::fresh_dir("lora-bad-dir");
  // The config targets q_proj and v_proj; the weights hold only q_proj.
  write_adapter(dir, lm, R"({"r": 4, "lora_alpha": 8, "target_modules": ["q_proj", "v_proj"]})",
                {{q0, {4, 2.0}}, {q1, {4, 2.0}}});
  auto r = lm.load_adapter("a", dir);
  ASSERT_FALSE(r);
  EXPECT_NE(describe(r.error()).find(dir + "/adapter_model.safetensors"), std::string::npos) << describe(r.error());
  EXPECT_NE(describe(r.error()).find(v0 + std::string{" has no lora_A or lora_B"}), std::string::npos)
      << describe(r.error());
  std::filesystem::remove(dir + "/adapter_model.safetensors");
  r = lm.load_adapter("a", dir);
  ASSERT_FALSE(r);
  EXPECT_EQ(code_of(r.error()), errc::not_found);
  EXPECT_NE(describe(r.error()).find(dir + "/adapter_model.safetensors"), std::string::npos) << describe(r.error());
  std::ofstream{dir + "/adapter_config.json"} << "{ not json";
  r = lm.load_adapter("a", dir);
  ASSERT_FALSE(r);
  EXPECT_NE(describe(r.error()).find(dir + "/adapter_config.json"), std::string::npos) << describe(r.error());
  EXPECT_TRUE(lm.adapters().empty());
  EXPECT_TRUE(at::equal(logps(lm), before));
}

TEST(Lora, ResavingAnAdapterKeepsEveryFieldItWasLoadedWith) {
  auto lm = model();
  auto dir = glint::testing::fresh_dir("lora-resave-in");
  const std::string config = R"({
    "peft_type": "LORA", "task_type": "CAUSAL_LM", "r": 4, "lora_alpha": 8, "lora_dropout": 0.05,
    "target_modules": ["q_proj", "down_proj"], "layers_to_transform": [0, 1], "layers_pattern": "layers",
    "rank_pattern": {"down_proj": 2, "q_proj": 3}, "alpha_pattern": {"q_proj": 12.5}, "use_rslora": true,
    "exclude_modules": ["gate_proj"], "init_lora_weights": "gaussian", "revision": "abc123",
    "base_model_name_or_path": "Qwen/Qwen2-0.5B", "inference_mode": false, "bias": "none",
    "use_dora": false, "fan_in_fan_out": false, "modules_to_save": null,
    "a_future_peft_field": {"nested": [1, 2]}, "megatron_config": null})";
  write_adapter(dir, lm, config, {{q0, {3, 12.5 / std::sqrt(3.0)}}, {q1, {3, 12.5 / std::sqrt(3.0)}},
                                  {down0, {2, 8 / std::sqrt(2.0)}}, {down1, {2, 8 / std::sqrt(2.0)}}});
  auto ok = lm.load_adapter("a", dir);
  ASSERT_TRUE(ok) << error_text(ok);
  auto out = glint::testing::fresh_dir("lora-resave-out");
  ASSERT_TRUE(lm.save_adapter("a", out));
  auto loaded = nlohmann::ordered_json::parse(config);
  std::ifstream in{out + "/adapter_config.json"};
  auto saved = nlohmann::ordered_json::parse(in);
  for (auto& [field, value] : loaded.items()) {
    ASSERT_TRUE(saved.contains(field)) << field << " was dropped";
    EXPECT_EQ(saved[field], value) << field;
  }
  // The patterns keep their order: the first matching key wins.
  EXPECT_EQ(saved["rank_pattern"].begin().key(), "down_proj");
  // And the re-saved adapter computes the same.
  ASSERT_TRUE(lm.load_adapter("b", out));
  EXPECT_TRUE(at::equal(logps(lm, "a"), logps(lm, "b")));
}

TEST(Lora, SavedAdaptersNameTheirBaseModel) {
  auto base_dir = glint::testing::fresh_dir("lora-base");
  ASSERT_TRUE(model().save(base_dir));
  auto lm = CausalLM::load(base_dir + "/");
  ASSERT_TRUE(lm) << describe(lm.error());
  EXPECT_EQ(lm->name_or_path(), std::filesystem::absolute(base_dir).lexically_normal().string());
  ASSERT_TRUE(lm->add_adapter("a", {.r = 2}));
  auto out = glint::testing::fresh_dir("lora-base-out");
  ASSERT_TRUE(lm->save_adapter("a", out));
  auto read = [](const std::string& dir) {
    std::ifstream in{dir + "/adapter_config.json"};
    return nlohmann::json::parse(in)["base_model_name_or_path"];
  };
  EXPECT_EQ(read(out), lm->name_or_path()) << "the directory the base was loaded from";
  // The caller's name wins, on the model or in the adapter's config.
  auto random = model();
  random.set_name_or_path("Qwen/Qwen2-0.5B");
  ASSERT_TRUE(random.add_adapter("a", {.r = 2}));
  ASSERT_TRUE(random.save_adapter("a", out));
  EXPECT_EQ(read(out), "Qwen/Qwen2-0.5B");
  ASSERT_TRUE(random.add_adapter("b", {.r = 2, .base_model_name_or_path = "my/base"}));
  ASSERT_TRUE(random.save_adapter("b", out));
  EXPECT_EQ(read(out), "my/base");
}

// The server's memory budget sizes adapters from their config alone
// (LoraConfig::parameters): it counts what the model really allocates.
// Tinker's train_unembed: an adapter of the LM head, tied to the embeddings
// or not. It starts at the base, trains only itself, round trips in PEFT's
// layout (base_model.model.lm_head.lora_A.weight), and merges only where
// the head has a weight of its own.
// The pass's adapter through kernels::lora_linear (one node per projection)
// and through the composition: the same log-probs and the same gradients
// for A, B and the base, on every projection and the LM head, with Qwen2's
// biases, in float64.
TEST(Lora, TheFusedAdapterKernelGivesTheComposedValuesAndGradients) {
 for (double dropout : {0.0, 0.25}) {
  SCOPED_TRACE("dropout " + std::to_string(dropout));
  auto cfg = ModelConfig::make(Architecture::qwen2, 29, 16, 32, 2, 4, 2);
  cfg.tie_word_embeddings = false;
  auto lm = *CausalLM::init_random(cfg, 4);
  ASSERT_TRUE(lm.add_adapter("a", {.r = 4, .alpha = 8, .dropout = dropout, .target_modules = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj", "lm_head"}}, 1));
  auto& impl = lm.impl();
  auto& adapter = impl.adapters.at("a");
  ASSERT_EQ(adapter.weights.size(), 2u * 7 + 1);
  at::manual_seed(8);
  for (auto& [n, t] : impl.params) t = t.to(at::kDouble);
  for (auto& [m, ab] : adapter.weights) {
    ab.first = ab.first.to(at::kDouble);
    ab.second = at::randn(ab.second.sizes(), at::kDouble) * 0.3;  // B starts at zero: give it values
  }
  auto p = model_detail::prepare(cfg, {.input_ids = ids_of({{3, 17, 6, 0, 5, 9}, {1, 12, 7, 4, 8, 2}})});
  ASSERT_TRUE(p) << describe(p.error());
  auto w = at::randn({2, 6}, at::kDouble);
  auto run = [&](bool fused, bool base_grads) {
    kernels::set_enabled(fused);
    for (auto& [n, t] : impl.params) t = t.detach().requires_grad_(base_grads);
    for (auto& [m, ab] : adapter.weights) {
      ab.first = ab.first.detach().requires_grad_(true);
      ab.second = ab.second.detach().requires_grad_(true);
    }
    // The same dropout masks both ways: one generator, seeded alike.
    auto rng = at::make_generator<at::CPUGeneratorImpl>(77);
    PassOptions pass{.lora = &adapter, .train = true, .dropout_rng = &rng};
    auto out = impl.run(*p, /*entropies=*/false, /*logits=*/false, pass);
    (out.logprobs * w).sum().backward();
    std::map<std::string, at::Tensor> r{{"logprobs", out.logprobs.detach()}};
    for (auto& [m, ab] : adapter.weights) {
      r[m + " A"] = ab.first.grad();
      r[m + " B"] = ab.second.grad();
    }
    if (base_grads)
      for (auto& [n, t] : impl.params) r[n] = t.grad();
    return r;
  };
  for (bool base_grads : {false, true}) {
    auto fused = run(true, base_grads), composed = run(false, base_grads);
    kernels::set_enabled(true);
    EXPECT_EQ(fused.size(), composed.size());
    for (const auto& [name, want] : composed) {
      ASSERT_TRUE(want.defined() && fused[name].defined()) << name;
      const double diff = (fused[name] - want).abs().max().item<double>();
      EXPECT_LE(diff, 1e-11 * std::max(1.0, want.abs().max().item<double>())) << name;
    }
  }
  if (dropout > 0) {  // and the masks did apply: without them the log-probs differ
    auto rng = at::make_generator<at::CPUGeneratorImpl>(77);
    PassOptions train{.lora = &adapter, .train = true, .dropout_rng = &rng}, eval{.lora = &adapter};
    EXPECT_FALSE(at::allclose(impl.run(*p, false, false, train).logprobs, impl.run(*p, false, false, eval).logprobs));
  }
 }
}

TEST(Lora, AnAdapterOnTheLmHeadTrainsRoundTripsAndMergesOnlyUntied) {
  for (bool tied : {true, false}) {
    auto cfg = ModelConfig::make(Architecture::qwen2, 29, 16, 32, 2, 4, 2);
    cfg.tie_word_embeddings = tied;
    auto lm = *CausalLM::init_random(cfg, 4);
    const LoraConfig head{.r = 4, .alpha = 8, .target_modules = {"q_proj", "lm_head"}};
    ASSERT_TRUE(lm.add_adapter("h", head, 1));
    auto names = lm.adapter_parameters("h");
    ASSERT_TRUE(names);
    EXPECT_EQ(names->back().first, "base_model.model.lm_head.lora_B.weight");
    EXPECT_EQ(names->back().second.shape(), (std::vector<int64_t>{29, 4}));
    EXPECT_TRUE(at::equal(logps(lm), logps(lm, "h"))) << "B starts at zero";
    std::map<std::string, at::Tensor> base;
    for (auto& [n, p] : lm.impl().params) base[n] = p.clone();
    auto tr = Trainer::create(lm, {.optimizer = {.lr = 1e-2}, .adapter = "h"});
    ASSERT_TRUE(tr);
    train(*tr, 3);
    auto trained = logps(lm, "h");
    EXPECT_FALSE(at::allclose(trained, logps(lm))) << "tied " << tied;
    for (auto& [n, p] : lm.impl().params) EXPECT_TRUE(at::equal(p, base.at(n))) << n << " changed";
    // Only the head's adapter changes the head: q_proj's alone does not give these logits.
    const auto& a = lm.impl().adapters.at("h");
    EXPECT_GT(a.weights.at("lm_head").second.abs().sum().item<double>(), 0);
    auto dir = glint::testing::fresh_dir(tied ? "lora-head-tied" : "lora-head");
    ASSERT_TRUE(lm.save_adapter("h", dir));
    auto other = *CausalLM::init_random(cfg, 4);
    ASSERT_TRUE(other.load_adapter("h", dir));
    EXPECT_TRUE(at::equal(logps(other, "h"), trained));
    auto merged = lm.merge_adapter("h");
    if (tied) {
      ASSERT_FALSE(merged);
      EXPECT_NE(describe(merged.error()).find("tied to the embeddings"), std::string::npos) << describe(merged.error());
      EXPECT_FALSE(lm.merged_parameters("h"));
    } else {
      ASSERT_TRUE(merged) << describe(merged.error());
      EXPECT_TRUE(at::allclose(logps(lm), trained, 1e-5, 1e-6)) << "merged equals unmerged";
      ASSERT_TRUE(lm.unmerge_adapter("h"));
    }
  }
}

TEST(Lora, ParametersCountedFromTheConfigEqualTheAdaptersTensors) {
  auto cfg = ModelConfig::make(Architecture::qwen3, 29, 16, 40, 3, 4, 2, 8);  // head_dim 8: q is 32 wide
  auto lm = CausalLM::init_random(cfg, 1);
  ASSERT_TRUE(lm);
  std::vector<LoraConfig> shapes = {
      {.r = 4, .alpha = 8, .target_modules = {"q_proj", "v_proj"}},
      {.r = 2, .alpha = 4, .target_modules = {"all-linear"}, .rank_pattern = {{"down_proj", 6}}},
      {.r = 3, .alpha = 3, .target_modules = {"o_proj", "up_proj"}, .layers_to_transform = {0, 2}},
      {.r = 5, .alpha = 5, .target_modules = {"v_proj", "lm_head"}},
  };
  for (size_t i = 0; i < shapes.size(); ++i) {
    auto name = "a" + std::to_string(i);
    ASSERT_TRUE(lm->add_adapter(name, shapes[i]));
    auto tensors = lm->adapter_parameters(name);
    ASSERT_TRUE(tensors);
    int64_t numel = 0;
    for (const auto& [_, t] : *tensors) numel += t.numel();
    EXPECT_EQ(shapes[i].parameters(cfg), numel) << "shape " << i;
  }
}

}  // namespace
}  // namespace glint::components
