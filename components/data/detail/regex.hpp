#pragma once
// A compiled PCRE2 pattern (UTF, Unicode properties, invalid UTF-8 allowed in
// subjects) that cuts text into pre-tokenizer pieces. Shared by the
// tokenizer's encoder and the BPE trainer so both split text the same way.
// Immutable after compile: safe to share between threads (each split call
// makes its own match data).

#include "runtime/error.hpp"

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

namespace glint::components::detail {

/// GPT-2's pre-tokenizer pattern (ByteLevel with use_regex).
inline constexpr const char* kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
/// Qwen2's (and Llama-3's, up to \p{N}{1,3}): digits one by one, which suits arithmetic.
inline constexpr const char* kQwen2Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

/// A pattern that matches `literal` and nothing else (every ASCII character
/// that is not a letter or digit escaped).
std::string quote(std::string_view literal);

class Regex {
public:
  /// An error names `what`, the offset and PCRE2's message.
  static Result<Regex> compile(const std::string& pattern, std::string_view what = "the pre-tokenizer regex");

  /// Calls `piece` for every match of the pattern in `text`, in order, and
  /// for every run of bytes between matches (bytes that are not valid UTF-8
  /// never match, so they come out as pieces of their own). The pieces
  /// concatenate to `text`. Stops at the first error `piece` returns.
  Result<void> split(std::string_view text, const std::function<Result<void>(std::string_view)>& piece) const;

  /// The first match that starts at or after byte `offset` of `text`, as
  /// [begin, end) (lookbehinds see the bytes before `offset`); none if
  /// there is none. An error only when PCRE2 gives up (its match limit).
  Result<std::optional<std::pair<size_t, size_t>>> find(std::string_view text, size_t offset) const;

private:
  std::shared_ptr<void> code_;  // pcre2_code, freed by its deleter
};

}  // namespace glint::components::detail
