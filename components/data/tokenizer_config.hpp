#pragma once
/// `TokenizerConfig`: what a model directory's tokenizer_config.json (and
/// chat_template.jinja, which current transformers writes beside it and
/// which wins over the JSON's field) says beyond tokenizer.json:
///
///   auto cfg = TokenizerConfig::load_dir("models/qwen");   // no file: defaults
///   if (cfg->chat_template) ...                             // the Jinja text
///
/// `Tokenizer::load` reads it with the tokenizer and checks it against the
/// vocabulary; `Template::make` with name "auto" picks the chat format from
/// its chat_template. Fields that would change ids or text and that glint
/// does not follow are refused here, naming the file, the field and its
/// value: split_special_tokens true, errors other than "replace",
/// add_prefix_space or do_lower_case true. Fields that change nothing glint
/// computes (padding_side, model_max_length, tokenizer_class, ...) and
/// fields it does not know are listed once at debug level.

#include "runtime/error.hpp"

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace glint::components {

struct TokenizerConfig {
  /// The Jinja chat template, if the model has one.
  std::optional<std::string> chat_template;
  /// Where chat_template came from ("…/tokenizer_config.json: chat_template",
  /// "…/chat_template.jinja"), for errors.
  std::string chat_template_origin;
  /// decode() then removes the space before . , ! ? and English
  /// contractions, as Hugging Face's clean_up_tokenization does. Absent:
  /// false, current transformers' default.
  bool clean_up_tokenization_spaces = false;
  /// Hugging Face's tokenizer(text) adds these; glint's Tokenizer::encode is
  /// encode(text, add_special_tokens=False), as apply_chat_template uses, so
  /// they are kept for callers and change no glint encoding.
  std::optional<bool> add_bos_token, add_eos_token;
  /// The longest input the model takes, when the file says (Hugging Face's
  /// int(1e30) for "no limit" reads as none). The dataloader uses it when
  /// no max_length is given and the model's config.json has none.
  std::optional<int64_t> model_max_length;
  /// Special tokens by role (bos_token, eos_token, pad_token, unk_token);
  /// each must be a token of the tokenizer.
  std::map<std::string, std::string> special_tokens;
  /// added_tokens_decoder: id -> content, checked against tokenizer.json.
  std::map<int64_t, std::string> added_tokens;
  std::string origin;  ///< the file read, or "" for none

  /// Parses the text of a tokenizer_config.json; `origin` names it in errors.
  static Result<TokenizerConfig> parse(const std::string& json_text, const std::string& origin);
  /// dir/tokenizer_config.json and dir/chat_template.jinja, where present;
  /// a directory with neither gives the defaults.
  static Result<TokenizerConfig> load_dir(const std::string& dir);
};

/// Hugging Face's clean_up_tokenization: " ." -> ".", " n't" -> "n't", ...
std::string clean_up_tokenization(std::string text);

}  // namespace glint::components
