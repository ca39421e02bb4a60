#pragma once
/// `Tokenizer`: a Hugging Face tokenizer.json, for turning token ids back
/// into text (the sampler's decoded output and stop strings).
///
///   auto tok = Tokenizer::load("models/tiny/tokenizer.json");
///   std::string text = tok->decode(ids);
///
/// Reads the vocabulary and added tokens of byte-level BPE tokenizers
/// (GPT-2, Qwen, Llama-3: the ByteLevel decoder) and of SentencePiece-style
/// ones ("▁" for spaces, <0xNN> byte fallback). Encoding comes with the
/// data pipeline. Immutable after load: safe to share between threads.

#include "runtime/error.hpp"

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <unordered_set>
#include <vector>

namespace glint::components {

class Tokenizer {
public:
  static Result<Tokenizer> load(const std::string& path);
  /// Parses the text of a tokenizer.json; `origin` names it in errors.
  static Result<Tokenizer> parse(const std::string& json_text, const std::string& origin = "tokenizer.json");

  /// One past the largest id.
  int64_t vocab_size() const { return static_cast<int64_t>(bytes_.size()); }
  /// The bytes a token stands for (an added token's content as it is);
  /// empty for an id outside the vocabulary.
  const std::string& token_bytes(int64_t id) const;
  bool is_special(int64_t id) const { return special_.count(id) > 0; }
  /// The text of `ids`, special tokens left out unless asked for. Bytes
  /// that are not valid UTF-8 (a character cut between tokens) become
  /// U+FFFD, as Hugging Face's decode does.
  std::string decode(std::span<const int64_t> ids, bool skip_special = true) const;

private:
  std::vector<std::string> bytes_;  // by id
  std::unordered_set<int64_t> special_;
};

/// `text` with every byte sequence that is not valid UTF-8 replaced by
/// U+FFFD (one per maximal invalid subpart, as the Unicode standard
/// recommends).
std::string to_valid_utf8(std::string_view text);

}  // namespace glint::components
