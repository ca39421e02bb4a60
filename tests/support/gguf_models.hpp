#pragma once
// Tiny model directories with a trained tokenizer, for the GGUF export tests.

#include "components/data/bpe_trainer.hpp"
#include "components/data/dataset.hpp"
#include "components/data/synthetic.hpp"
#include "components/model/model.hpp"
#include "support/temp_dir.hpp"

#include <gtest/gtest.h>

#include <string>

namespace glint::testing {

struct TinyModelSpec {
  components::Architecture arch = components::Architecture::qwen3;
  bool tie = false;
  Dtype dtype = Dtype::f32;
  int64_t extra_vocab = 13;  ///< model vocabulary past the tokenizer's (padding)
  uint64_t seed = 3;
  components::RopeScaling rope{};  ///< e.g. Llama 3.1's, with a short original context so that it shows
};

/// A model directory (config.json, model.safetensors, tokenizer.json,
/// tokenizer_config.json) whose vocabulary is a ChatML BPE tokenizer trained
/// on arithmetic questions, plus `extra_vocab` ids no token uses.
inline std::string tiny_model_dir(const std::string& name, const TinyModelSpec& s = {}) {
  auto dir = fresh_dir(name);
  std::vector<std::string> texts;
  for (const auto& r : components::arithmetic_rows(300, {.seed = 1}))
    for (const auto& [k, v] : r.fields) texts.push_back(v);
  texts.push_back("The quick brown fox jumps over the lazy dog. Don't we'll they're 12345 + 678 = ?");
  auto json = components::train_bpe(texts, {.vocab_size = 320});
  EXPECT_TRUE(json) << describe(json.error());
  auto tok = components::Tokenizer::parse(*json);
  EXPECT_TRUE(tok);
  auto cfg = components::ModelConfig::make(s.arch, tok->vocab_size() + s.extra_vocab, 64, 96, 2, 4, 2);
  cfg.tie_word_embeddings = s.tie;
  cfg.dtype = s.dtype;
  cfg.rope_scaling = s.rope;
  cfg.eos_token_ids = {tok->token_id("<|im_end|>")};
  if (components::is_moe(s.arch)) {  // llama.cpp's qwen3moe renormalises, its qwen2moe does not
    const bool qwen2 = s.arch == components::Architecture::qwen2_moe;
    cfg.moe = {.num_experts = 4, .num_experts_per_tok = 2, .moe_intermediate_size = 32,
               .shared_expert_intermediate_size = qwen2 ? 48 : 0, .norm_topk_prob = !qwen2};
  }
  auto lm = components::CausalLM::init_random(cfg, s.seed);
  EXPECT_TRUE(lm) << describe(lm.error());
  EXPECT_TRUE(lm->save(dir));
  EXPECT_TRUE(components::save_chatml_tokenizer(dir, *json));
  return dir;
}

}  // namespace glint::testing
