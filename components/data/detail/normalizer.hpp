#pragma once
// The "normalizer" of a tokenizer.json, read and applied as Hugging Face's
// tokenizers (Rust) defines it. Supported: NFC, NFD, NFKC, NFKD, Lowercase
// (each character on its own: Rust's `char::to_lowercase`), Strip
// {strip_left, strip_right} (White_Space), Replace {pattern: {"String": s} or
// {"Regex": r}, content}, Prepend {prepend} (only before non-empty text),
// Sequence {normalizers} and null. Any other type (BertNormalizer,
// StripAccents, Precompiled, ByteLevel, Nmt, ...) or a malformed entry is
// refused by `parse`, naming the file, the field and its value.
// Immutable after parse: safe to share between threads.

#include "components/data/detail/regex.hpp"
#include "runtime/error.hpp"

#include <nlohmann/json_fwd.hpp>

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace glint::components::detail {

class Normalizer {
public:
  /// `json` is the value of tokenizer.json's "normalizer" (null: none);
  /// `origin` names the file in errors, where fields are written as paths
  /// ("normalizer.normalizers[1].type").
  static Result<Normalizer> parse(const nlohmann::json& json, const std::string& origin);

  /// No step: `apply` gives its input back.
  bool empty() const { return steps_.empty(); }

  /// `text` normalized. Bytes that are not valid UTF-8 stay as they are
  /// (see unicode.hpp). An error only when PCRE2 gives up on a Replace regex
  /// or ICU fails.
  Result<std::string> apply(std::string_view text) const;

  enum class Kind { nfc, nfd, nfkc, nfkd, lowercase, strip, replace, prepend };
  /// One normalizer; a Sequence is flattened into its steps, in order.
  struct Step {
    Kind kind = Kind::nfc;
    bool strip_left = false, strip_right = false;  // strip
    std::optional<Regex> pattern;                  // replace
    std::string content;                           // replace: the replacement; prepend: the prefix
  };

private:
  std::vector<Step> steps_;
};

}  // namespace glint::components::detail
