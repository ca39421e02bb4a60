#pragma once
/// `train_bpe`: learns a byte-level BPE vocabulary from texts and writes it
/// as a Hugging Face tokenizer.json that `Tokenizer` (and Hugging Face's
/// tokenizers) load, so `glint init-model` can build a small tokenizer from
/// the data a job ships, without a download:
///
///   std::vector<std::string> texts = ...;
///   auto json = train_bpe(texts, {.vocab_size = 1024});
///   // ids 0..255: the bytes; then one token per merge; then the special tokens
///
/// The texts are cut by the pre-tokenizer regex (Qwen2's by default, which
/// keeps digits apart); merges never cross a piece. Each round merges the
/// most frequent adjacent pair, ties broken by the smaller pair of ids, so
/// the same texts always give the same vocabulary. Pure function; no state.

#include "runtime/error.hpp"

#include <cstdint>
#include <functional>
#include <string>
#include <span>
#include <string>
#include <vector>

namespace glint::components {

struct BpeTrainerOptions {
  /// The whole vocabulary: 256 bytes + merges + special tokens. Training
  /// stops earlier when no pair occurs min_frequency times.
  int64_t vocab_size = 1024;
  int64_t min_frequency = 2;
  /// Added as special tokens after the merges, in this order.
  std::vector<std::string> special_tokens = {"<|endoftext|>", "<|im_start|>", "<|im_end|>"};
  /// The pre-tokenizer regex written into tokenizer.json (a Split, then ByteLevel without its regex).
  std::string pattern = "";  ///< empty: Qwen2's
  /// Called now and then with (merges done, merges wanted).
  std::function<void(int64_t, int64_t)> progress = nullptr;
};

/// The tokenizer.json text. Errors: vocab_size below 256 + special tokens,
/// a pattern that does not compile (invalid_argument).
Result<std::string> train_bpe(std::span<const std::string> texts, const BpeTrainerOptions& options);

/// Writes `tokenizer_json` as dir/tokenizer.json and a tokenizer_config.json
/// naming the ChatML special tokens (eos <|im_end|>, pad <|endoftext|>) and
/// its Jinja chat template, as a Qwen model directory has them. With
/// `tools`, the template is glint's ChatML with tools (kChatmlToolsTemplate):
/// the tools listed in the system turn, assistant tool calls as hermes
/// <tool_call> JSON, tool results as <tool_response> user turns, as
/// Qwen 2.5 writes them. Error: a file that cannot be written.
Result<void> save_chatml_tokenizer(const std::string& dir, const std::string& tokenizer_json, bool tools = false);

/// glint's own compact ChatML template with tool calls (above).
extern const char* const kChatmlToolsTemplate;

}  // namespace glint::components
