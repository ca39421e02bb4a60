#pragma once
// Hand-made byte-level tokenizer.json texts for tests.

#include "components/data/bpe_trainer.hpp"
#include "components/data/tokenizer.hpp"

#include <nlohmann/json.hpp>

#include <memory>

#include <string>
#include <utility>
#include <vector>

namespace glint::testing {

/// GPT-2's byte-level character for byte `b`, as UTF-8.
inline std::string byte_char(int b) {
  static const std::vector<int> map = [] {
    std::vector<int> m(256);
    int extra = 0;
    for (int x = 0; x < 256; ++x) {
      bool printable = (x >= 33 && x <= 126) || (x >= 161 && x <= 172) || (x >= 174 && x <= 255);
      m[static_cast<size_t>(x)] = printable ? x : 256 + extra++;
    }
    return m;
  }();
  int cp = map[static_cast<size_t>(b)];
  std::string s;
  if (cp < 0x80) s.push_back(static_cast<char>(cp));
  else {
    s.push_back(static_cast<char>(0xc0 | (cp >> 6)));
    s.push_back(static_cast<char>(0x80 | (cp & 0x3f)));
  }
  return s;
}

/// A text in byte-level characters.
inline std::string byte_level(const std::string& raw) {
  std::string out;
  for (unsigned char c : raw) out += byte_char(c);
  return out;
}

/// A byte-level BPE tokenizer.json, as an object to change before it is
/// dumped (a normalizer, added tokens with flags, model fields): ids 0..255
/// are the single bytes, then one token per merge (in order, from raw-byte
/// pairs), then `added` tokens (special) with the ids after those;
/// `pre_tokenizer` as given.
inline nlohmann::json bpe_tokenizer(const std::vector<std::pair<std::string, std::string>>& merges,
                                    const std::vector<std::string>& added, nlohmann::json pre_tokenizer) {
  nlohmann::json vocab = nlohmann::json::object();
  for (int b = 0; b < 256; ++b) vocab[byte_char(b)] = b;
  nlohmann::json m = nlohmann::json::array();
  int id = 256;
  for (const auto& [a, b] : merges) {
    m.push_back(byte_level(a) + " " + byte_level(b));
    vocab[byte_level(a + b)] = id++;
  }
  nlohmann::json added_tokens = nlohmann::json::array();
  for (const auto& a : added) added_tokens.push_back({{"id", id++}, {"content", a}, {"special", true}});
  nlohmann::json j = {{"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", m}}},
                      {"pre_tokenizer", pre_tokenizer},
                      {"decoder", {{"type", "ByteLevel"}}},
                      {"added_tokens", added_tokens}};
  return j;
}

/// bpe_tokenizer's text.
inline std::string bpe_tokenizer_json(const std::vector<std::pair<std::string, std::string>>& merges,
                                      const std::vector<std::string>& added, nlohmann::json pre_tokenizer) {
  return bpe_tokenizer(merges, added, std::move(pre_tokenizer)).dump();
}

/// A small tokenizer trained on chat-like text, with the special tokens of
/// ChatML and Llama-3, and `config` as its tokenizer_config.json.
inline std::shared_ptr<const components::Tokenizer> chat_tokenizer(components::TokenizerConfig config = {}) {
  std::vector<std::string> texts;
  for (int i = 0; i < 30; ++i)
    texts.push_back("system\nYou are helpful.\nuser\nWhat is " + std::to_string(i) + " + " + std::to_string(i * 3) +
                    "?\nassistant\nThe answer is " + std::to_string(i * 4) + ".\n#### " + std::to_string(i * 4));
  auto json = components::train_bpe(
      texts, {.vocab_size = 400,
              .special_tokens = {"<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|begin_of_text|>",
                                 "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"}});
  auto tok = components::Tokenizer::parse(*json, "tokenizer.json", std::move(config));
  return std::make_shared<const components::Tokenizer>(std::move(*tok));
}

}  // namespace glint::testing
