#pragma once
// Hand-made byte-level tokenizer.json texts for tests.

#include <nlohmann/json.hpp>

#include <string>
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

/// A byte-level BPE tokenizer.json: ids 0..255 are the single bytes, then
/// one token per merge (in order, from raw-byte pairs), then `added` tokens
/// (special) with the ids after those; `pre_tokenizer` as given.
inline std::string bpe_tokenizer_json(const std::vector<std::pair<std::string, std::string>>& merges,
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
  return j.dump();
}

}  // namespace glint::testing
