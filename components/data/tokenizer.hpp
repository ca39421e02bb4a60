#pragma once
/// `Tokenizer`: a Hugging Face tokenizer.json: text to token ids and back.
///
///   auto tok = Tokenizer::load("models/tiny/tokenizer.json");
///   auto ids = tok->encode("Hello world");   // Result<std::vector<int64_t>>
///   std::string text = tok->decode(*ids);
///
/// Encoding covers byte-level BPE tokenizers (GPT-2, Qwen, Llama-3) and
/// follows Hugging Face's tokenizers, as `encode(text,
/// add_special_tokens=False)` there: added tokens with normalized = false
/// are matched on the text first; each piece between them is normalized
/// (tokenizer.json's "normalizer"), added tokens with normalized = true are
/// matched on that, and the rest is split by the pre-tokenizer (PCRE2 with
/// Unicode properties) and merged by BPE rank. The lstrip, rstrip and
/// single_word flags of added tokens, unk_token, fuse_unk, byte_fallback and
/// ignore_merges are honoured. A field that would change the ids and is not
/// supported is refused, naming the file, the field and its value: an
/// unsupported normalizer or model type at load; an unsupported
/// pre-tokenizer, BPE dropout, a subword prefix or suffix, or added-token ids
/// that Hugging Face would number otherwise by `encode`, which then says why
/// (the tokenizer still decodes). The post-processor does not apply (no
/// special tokens are added), nor do truncation and padding.
///
/// Any bytes encode: a byte sequence that is not valid UTF-8 is never
/// matched by the regex and becomes pieces of its own (normalizers leave it
/// as it is), so without a normalizer encode then decode gives back valid
/// UTF-8 text exactly and turns invalid bytes into U+FFFD. Decoding also
/// reads SentencePiece-style vocabularies ("▁" for spaces, <0xNN> byte
/// fallback), which do not encode yet. Immutable after load: safe to share
/// between threads.

#include "components/data/tokenizer_config.hpp"
#include "runtime/error.hpp"

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <vector>

namespace glint::components {

/// How a tokenizer works, beyond what its files say.
struct TokenizerOptions {
  /// The longest piece BPE merges (a "word": the pre-tokenizer's unit, a run
  /// with no space or punctuation). Longer is refused (resource_exhausted,
  /// a dataset row counted as too long) rather than truncated: a 1 MiB word
  /// is garbage in the data, and encoding it takes ~0.5 s.
  size_t max_word_bytes = size_t{1} << 20;
};

class Tokenizer {
public:
  /// A tokenizer.json, or a model directory holding one; the
  /// tokenizer_config.json (and chat_template.jinja) beside it are read as
  /// well (TokenizerConfig) and checked against the vocabulary: a special
  /// token or added_tokens_decoder entry it lacks is refused.
  static Result<Tokenizer> load(const std::string& path, const TokenizerOptions& options = {});
  /// Parses the text of a tokenizer.json; `origin` names it in errors.
  static Result<Tokenizer> parse(const std::string& json_text, const std::string& origin = "tokenizer.json",
                                 TokenizerConfig config = {}, const TokenizerOptions& options = {});

  /// One past the largest id.
  int64_t vocab_size() const { return static_cast<int64_t>(bytes_.size()); }
  /// The bytes a token stands for (an added token's content as it is);
  /// empty for an id outside the vocabulary.
  const std::string& token_bytes(int64_t id) const;
  bool is_special(int64_t id) const { return special_.count(id) > 0; }
  /// The text of `ids`, special tokens left out unless asked for. Bytes
  /// that are not valid UTF-8 (a character cut between tokens) become
  /// U+FFFD, as Hugging Face's decode does; with the config's
  /// clean_up_tokenization_spaces, spaces before punctuation go too.
  std::string decode(std::span<const int64_t> ids, bool skip_special = true) const;
  /// The ids of `text`; an error for a tokenizer that cannot encode (why:
  /// the file and field it does not honour), or for a byte the vocabulary
  /// lacks when there is no unk_token or byte fallback.
  Result<std::vector<int64_t>> encode(std::string_view text) const;
  /// The id of an added or vocabulary token given by its text, or -1.
  int64_t token_id(std::string_view token) const;
  /// What tokenizer_config.json said (defaults without one).
  const TokenizerConfig& config() const;
  /// Decoded bytes as decode() finishes them: valid UTF-8, cleaned up
  /// where the config asks (the sampler's text with stop strings).
  std::string finish_text(std::string_view bytes) const;

private:
  static Result<Tokenizer> parse_vocabulary(const std::string& json_text, const std::string& origin,
                                            const TokenizerOptions& options);
  struct Encoder;
  std::vector<std::string> bytes_;  // by id
  std::unordered_set<int64_t> special_;
  std::shared_ptr<const Encoder> encoder_;  // null: cannot encode (why in encode_error_)
  std::string encode_error_;
  std::shared_ptr<const TokenizerConfig> config_;
};

/// `text` with every byte sequence that is not valid UTF-8 replaced by
/// U+FFFD (one per maximal invalid subpart, as the Unicode standard
/// recommends).
std::string to_valid_utf8(std::string_view text);

}  // namespace glint::components
