#pragma once
// A tiny Qwen3 model with random weights and a ChatML tokenizer trained on
// the texts it will see: a real Hugging Face directory, made in seconds, so
// the examples need no download.

#include "components/data/bpe_trainer.hpp"
#include "components/data/tokenizer.hpp"
#include "components/model/model.hpp"

#include <cstdio>
#include <string>
#include <vector>

namespace glint::examples {

struct TinyModel {
  int64_t vocab = 320;  ///< at most; the trainer stops when no pair repeats
  int64_t hidden = 96;
  int64_t intermediate = 256;
  int64_t layers = 3;
  uint64_t seed = 1;
};

inline Result<void> make_tiny_model(const std::string& dir, const std::vector<std::string>& texts, const TinyModel& m) {
  auto json = components::train_bpe(texts, {.vocab_size = m.vocab});
  if (!json) return json.error();
  auto tok = components::Tokenizer::parse(*json);
  if (!tok) return tok.error();
  auto cfg = components::ModelConfig::make(components::Architecture::qwen3, tok->vocab_size(), m.hidden, m.intermediate,
                                           m.layers, 4, 2);
  cfg.max_position_embeddings = 256;
  cfg.eos_token_ids = {tok->token_id("<|im_end|>")};
  auto lm = components::CausalLM::init_random(cfg, m.seed);
  if (!lm) return lm.error();
  if (auto ok = lm->save(dir); !ok) return ok;
  if (auto ok = components::save_chatml_tokenizer(dir, *json); !ok) return ok;
  std::printf("wrote %s: Qwen3, %.2fM parameters, a %lld-token tokenizer trained on the data\n", dir.c_str(),
              static_cast<double>(cfg.num_parameters()) / 1e6, static_cast<long long>(tok->vocab_size()));
  return {};
}

}  // namespace glint::examples
