#include "components/data/detail/added_tokens.hpp"

#include "components/data/detail/unicode.hpp"

#include <algorithm>

namespace glint::components::detail {

Result<void> AddedTokenSet::split(std::string_view text,
                                  const std::function<Result<void>(std::string_view, int64_t)>& piece) const {
  constexpr auto none = std::string_view::npos;
  // The next occurrence of each pattern at or after `search`, refreshed only
  // when the search has passed it: O(tokens x text) in all.
  std::vector<size_t> next(tokens_.size());
  for (size_t i = 0; i < tokens_.size(); ++i)
    // An empty pattern never matches (the callers refuse it).
    next[i] = tokens_[i].pattern.empty() ? none : text.find(tokens_[i].pattern);
  size_t search = 0;  // where the next match may start
  size_t done = 0;    // the end of what has been handed out
  for (;;) {
    size_t start = none, len = 0, which = 0;
    for (size_t i = 0; i < tokens_.size(); ++i) {
      if (next[i] != none && next[i] < search) next[i] = text.find(tokens_[i].pattern, search);
      if (next[i] != none && (next[i] < start || (next[i] == start && tokens_[i].pattern.size() > len))) {
        start = next[i];
        len = tokens_[i].pattern.size();
        which = i;
      }
    }
    if (start == none) break;
    size_t stop = start + len;
    // As Hugging Face's matcher does, the search goes on after this match
    // even when single_word drops it or rstrip takes whitespace after it.
    search = stop;
    const auto& token = tokens_[which];
    if (token.single_word) {
      size_t at = 0;
      size_t after = stop;
      const bool word_before = start > 0 && is_word_char(previous_utf8(text, start, at));
      const bool word_after = stop < text.size() && is_word_char(next_utf8(text, after));
      if (word_before || word_after) continue;
    }
    if (token.lstrip) {
      size_t from = start;
      for (size_t at = 0; from > 0 && is_white_space(previous_utf8(text, from, at));) from = at;
      // Whitespace an earlier match already took stays with it.
      start = std::max(from, done);
    }
    if (token.rstrip)
      for (size_t at = stop; at < text.size() && is_white_space(next_utf8(text, at));) stop = at;
    if (done < start)
      if (auto ok = piece(text.substr(done, start - done), -1); !ok) return ok;
    if (auto ok = piece(text.substr(start, stop - start), token.id); !ok) return ok;
    done = stop;
  }
  if (done < text.size()) return piece(text.substr(done), -1);
  return {};
}

}  // namespace glint::components::detail
