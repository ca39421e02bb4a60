// The GGUF export against llama.cpp itself (node-llama-cpp's prebuilt
// binaries, installed from npm by scripts/setup_llamacpp.sh, which .ci/run
// calls): node-llama-cpp's own GGUF reader parses the file, llama.cpp's
// tokenizer gives glint's ids, and llama.cpp's greedy tokens are glint's.
// Skipped, saying why, where llama.cpp is not installed.
#include "bench/llamacpp.hpp"
#include "components/checkpoint/gguf.hpp"
#include "components/data/tokenizer.hpp"
#include "components/model/gguf_export.hpp"
#include "components/model/model.hpp"
#include "components/tensor/torch_bridge.hpp"
#include "support/gguf_models.hpp"

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <filesystem>

namespace glint::components {
namespace {

struct Case {
  Architecture arch;
  bool tie;
  Dtype dtype;
  RopeScaling::Type rope = RopeScaling::Type::none;
};

std::string case_name(const Case& c) {
  return std::string{c.arch == Architecture::llama       ? "Llama"
                     : c.arch == Architecture::qwen2     ? "Qwen2"
                     : c.arch == Architecture::qwen2_moe ? "Qwen2Moe"
                     : c.arch == Architecture::qwen3_moe ? "Qwen3Moe"
                                                         : "Qwen3"} +
         (c.tie ? "Tied" : "") + std::string{to_string(c.dtype)} +
         (c.rope == RopeScaling::Type::llama3   ? "RopeLlama3"
          : c.rope == RopeScaling::Type::linear ? "RopeLinear"
                                                : "");
}

RopeScaling rope_of(RopeScaling::Type t) {
  RopeScaling r;
  r.type = t;
  // A short original context, so that the scaling changes positions the test reaches.
  if (t == RopeScaling::Type::llama3) r = {.type = t, .factor = 8, .original_max_position_embeddings = 32};
  if (t == RopeScaling::Type::linear) r.factor = 4;
  return r;
}

class GgufLlamaCpp : public ::testing::TestWithParam<Case> {};

TEST_P(GgufLlamaCpp, ParsesTokenizesAndGeneratesAsGlintDoes) {
  const auto modules = bench::llamacpp_dir();
  if (!bench::llamacpp_installed(modules))
    GTEST_SKIP() << "llama.cpp is not installed in " << modules
                 << ": scripts/setup_llamacpp.sh installs it from the npm registry (.ci/run does)";
  const auto c = GetParam();
  // The model is stored in the export's dtype, so that glint computes with
  // the very weights the file has.
  auto model_dir = glint::testing::tiny_model_dir("gguf-llamacpp", {.arch = c.arch, .tie = c.tie, .dtype = c.dtype, .rope = rope_of(c.rope)});
  const auto path = model_dir + "/model.gguf";
  auto done = export_gguf(model_dir, path);
  ASSERT_TRUE(done) << describe(done.error());
  auto ours = *read_gguf_header(path);

  auto llama = bench::LlamaCpp::start({.modules = modules,
                                       .script = std::string{GLINT_TEST_SOURCE_DIR} + "/../bench/llamacpp/llamacpp_child.mjs",
                                       .model = path,
                                       .threads = 1,
                                       .context = 256});
  ASSERT_TRUE(llama) << describe(llama.error());
  std::printf("[ llama.cpp ] %s\n", llama->banner().c_str());

  // 1. node-llama-cpp's GGUF reader sees the file as glint wrote it.
  auto seen = llama->inspect();
  ASSERT_TRUE(seen) << describe(seen.error());
  auto j = nlohmann::json::parse(*seen);
  EXPECT_EQ(j["version"], 3);
  const auto& meta = j["metadata"];
  EXPECT_EQ(meta["general.architecture"], done->architecture);
  EXPECT_EQ(meta[done->architecture + ".block_count"], 2);
  EXPECT_EQ(meta["tokenizer.ggml.tokens"]["length"], done->vocab);
  EXPECT_EQ(meta["tokenizer.ggml.pre"], "qwen2");
  ASSERT_EQ(j["tensors"].size(), ours.tensors.size());
  for (size_t i = 0; i < ours.tensors.size(); ++i) {
    const auto& t = j["tensors"][i];
    EXPECT_EQ(t["name"], ours.tensors[i].name);
    std::vector<int64_t> dims = t["dims"];
    std::reverse(dims.begin(), dims.end());
    EXPECT_EQ(dims, ours.tensors[i].shape) << ours.tensors[i].name;
    EXPECT_EQ(t["offset"], ours.tensors[i].offset) << ours.tensors[i].name;
    EXPECT_EQ(t["type"], ggml_type_of(ours.tensors[i].dtype)) << ours.tensors[i].name;
  }

  // 2. llama.cpp's tokenizer (pre-tokenizer "qwen2", the merges, the special
  // tokens) gives glint's ids.
  auto tok = *Tokenizer::load(model_dir);
  for (std::string text : {"Question: 12 + 7 = ?", "The answer is 19.", "  two spaces\nand\n\nnewlines\t tab",
                           "<|im_start|>user\nWhat is 3+4?<|im_end|>\n<|im_start|>assistant\n",
                           "Don't we'll THEY'RE 123456", "ünïcödé 日本語 🎉"}) {
    auto theirs = llama->tokenize(text);
    ASSERT_TRUE(theirs) << describe(theirs.error());
    EXPECT_EQ(*theirs, *tok.encode(text)) << text;
  }

  // 3. The logits after every position, and greedy generation. llama.cpp's
  // logits (with an f32 KV cache) must be glint's within the rounding of two
  // implementations (f32: summation order; f16/bf16: ggml also rounds
  // activations). Each
  // token llama.cpp picks greedily must be glint's argmax at that position,
  // given the same context, or a tie within that rounding.
  auto lm = *CausalLM::load(model_dir);
  // Measured: about 3e-7 (f32), 1.5e-4 (f16), 2e-3 (bf16); Llama without
  // its q/k reordering is 8e-3 off.
  const double tol = c.dtype == Dtype::f32 ? 1e-5 : c.dtype == Dtype::f16 ? 1e-3 : 5e-3;
  double worst = 0, scale = 0;
  int64_t exact = 0, total = 0;
  for (std::string text : {"Question: 12 + 7 = ?", "<|im_start|>user\nWhat is 3+4?<|im_end|>\n", "9 - 4 ="}) {
    auto prompt = *tok.encode(text);
    auto gen = llama->greedy(16, prompt);
    ASSERT_TRUE(gen) << describe(gen.error());
    ASSERT_EQ(gen->size(), 16u);
    std::vector<int64_t> ids = prompt;
    ids.insert(ids.end(), gen->begin(), gen->end() - 1);
    auto input = *Tensor::from_values(ids, {1, static_cast<int64_t>(ids.size())});
    auto out = lm.forward({.input_ids = input}, {.logits = true});
    ASSERT_TRUE(out) << describe(out.error());
    auto logits = to_torch(out->logits)[0].to(at::kDouble);  // [T, V]
    auto theirs = llama->logits(ids);
    ASSERT_TRUE(theirs) << describe(theirs.error());
    ASSERT_EQ(theirs->size(), ids.size());
    for (size_t p = 0; p < ids.size(); ++p) {
      ASSERT_EQ(static_cast<int64_t>((*theirs)[p].size()), logits.size(1));
      auto row = at::tensor((*theirs)[p], at::kDouble);
      worst = std::max(worst, (row - logits[static_cast<int64_t>(p)]).abs().max().item<double>());
      scale = std::max(scale, logits[static_cast<int64_t>(p)].abs().max().item<double>());
    }
    for (size_t i = 0; i < gen->size(); ++i) {
      auto row = logits[static_cast<int64_t>(prompt.size() + i - 1)];
      const double best = row.max().item<double>();
      const double picked = row[(*gen)[i]].item<double>();
      EXPECT_GE(picked, best - tol) << text << ": token " << i << " is " << (*gen)[i] << " with logit " << picked
                                    << ", glint's best is " << best;
      exact += row.argmax().item<int64_t>() == (*gen)[i];
      ++total;
    }
  }
  std::printf("[ llama.cpp ] logits within %.2e of glint's (largest |logit| %.3f); %lld of %lld greedy tokens are "
              "glint's argmax exactly\n",
              worst, scale, static_cast<long long>(exact), static_cast<long long>(total));
  EXPECT_LE(worst, tol);
  EXPECT_GE(exact * 10, total * 9);
}

INSTANTIATE_TEST_SUITE_P(Exports, GgufLlamaCpp,
                         ::testing::Values(Case{Architecture::llama, false, Dtype::f32},
                                           Case{Architecture::qwen2, true, Dtype::f32},
                                           Case{Architecture::qwen3, false, Dtype::f32},
                                           Case{Architecture::qwen3, true, Dtype::f16},
                                           Case{Architecture::llama, false, Dtype::bf16},
                                           Case{Architecture::llama, false, Dtype::f32, RopeScaling::Type::llama3},
                                           Case{Architecture::qwen2, false, Dtype::f32, RopeScaling::Type::linear},
                                           Case{Architecture::qwen3_moe, false, Dtype::f32},
                                           Case{Architecture::qwen2_moe, true, Dtype::f32},
                                           Case{Architecture::qwen3_moe, true, Dtype::f16}),
                         [](const auto& info) { return case_name(info.param); });

}  // namespace
}  // namespace glint::components
