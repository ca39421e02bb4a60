#pragma once
// Unicode services for the tokenizer, defined as Rust defines them (Hugging
// Face's tokenizers is written in Rust, and tokenizer.json means what it
// does there): the four normalisation forms, per-character lowercasing,
// White_Space and regex word characters. ICU does the work; its headers stay
// in unicode.cpp.
//
// Text may hold bytes that are not valid UTF-8 (encode takes any bytes).
// Such bytes are kept as they are and are neither whitespace nor word
// characters; a normalisation form works on the valid runs between them, so
// it never composes across an invalid byte.

#include "runtime/error.hpp"

#include <cstdint>
#include <string>
#include <string_view>

namespace glint::components::detail {

/// The code point of strictly valid UTF-8 (no overlongs, surrogates or values
/// past U+10FFFF) at `text[i]`, with `i` advanced past it; or -1 with `i`
/// advanced past the maximal invalid subpart (at least one byte).
int32_t next_utf8(std::string_view text, size_t& i);

/// The code point whose encoding ends at byte `end`, with its first byte
/// stored in `begin`; -1 (and `begin` = end - 1) when the bytes before `end`
/// are not one valid character. `end` must be > 0.
int32_t previous_utf8(std::string_view text, size_t end, size_t& begin);

/// Appends code point `cp` (at most U+10FFFF) as UTF-8.
void append_utf8(std::string& out, int32_t cp);

enum class NormalForm { nfc, nfd, nfkc, nfkd };

/// `text` in normalisation form `form` (Unicode UAX #15). An error only when
/// ICU fails (its data missing: an installation fault).
Result<std::string> normalize(std::string_view text, NormalForm form);

/// Each character replaced by its full lowercase mapping on its own, as
/// Rust's `char::to_lowercase` does: "İ" becomes "i̇" (two code points), and
/// no context applies, so "Σ" is always "σ", never the final "ς".
Result<std::string> lowercase_chars(std::string_view text);

/// The whole text in upper or lower case, as Python's str.upper() and
/// str.lower() are: full mappings ("ß" -> "SS"), the final-sigma context,
/// no language rule (the root locale). Invalid bytes are kept.
Result<std::string> change_case(std::string_view text, bool upper);

/// The Unicode White_Space property: Rust's `char::is_whitespace` and its
/// regex `\s`.
bool is_white_space(int32_t cp);

/// Rust's regex `\w`: Alphabetic, marks, decimal digits, connector
/// punctuation and Join_Control. -1 (an invalid byte) is not one.
bool is_word_char(int32_t cp);

}  // namespace glint::components::detail
