#pragma once
// Finds added tokens in text as Hugging Face's AddedVocabulary does
// (tokenizers' added_vocabulary.rs, find_matches): leftmost, then longest,
// non-overlapping matches; a single_word token is dropped where the
// character before or after it is a word character (Rust's regex \w), and
// the search goes on after it; lstrip / rstrip make a match take the
// whitespace (White_Space) on its left / right with it. A tokenizer keeps two
// sets: tokens matched on the raw text (normalized = false) and tokens
// matched, by their normalized content, on the normalized text. Immutable
// after construction: safe to share between threads.

#include "runtime/error.hpp"

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

namespace glint::components::detail {

struct AddedToken {
  std::string pattern;  // what is matched: the content, or the normalized content
  int64_t id = -1;
  bool single_word = false;
  bool lstrip = false;
  bool rstrip = false;
};

class AddedTokenSet {
public:
  AddedTokenSet() = default;
  /// An empty pattern never matches (Hugging Face would match it
  /// everywhere; callers refuse it). On equal matches the first token wins.
  explicit AddedTokenSet(std::vector<AddedToken> tokens) : tokens_(std::move(tokens)) {}

  bool empty() const { return tokens_.empty(); }

  /// Cuts `text` into pieces, in order: `piece(text, id)` for each match
  /// (the matched bytes with any stripped whitespace, and the token's id)
  /// and `piece(text, -1)` for each non-empty run between matches. Stops at
  /// the first error `piece` returns.
  Result<void> split(std::string_view text, const std::function<Result<void>(std::string_view, int64_t)>& piece) const;

private:
  std::vector<AddedToken> tokens_;
};

}  // namespace glint::components::detail
