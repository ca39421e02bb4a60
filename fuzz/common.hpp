#pragma once
// What the fuzz targets share: a bound on input size, a tokenizer to run
// templates and datasets with, and a check that crashes (so libFuzzer keeps
// the input) when a property of a successful parse does not hold.

#include "components/data/tokenizer.hpp"

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

namespace glint::fuzz {

/// Inputs above this are skipped: every parser here reads files that are
/// bounded elsewhere, and a target must not spend seconds on one input for
/// a legitimate reason (libFuzzer's -timeout reports a hang).
inline constexpr size_t kMaxInputBytes = size_t{1} << 20;

inline std::string_view text_of(const uint8_t* data, size_t size) {
  return {reinterpret_cast<const char*>(data), size};
}

/// A small byte-level BPE tokenizer.json trained by train_bpe on chat-like
/// text, with <|endoftext|>, <|im_start|>, <|im_end|>, <|begin_of_text|>,
/// <|start_header_id|>, <|end_header_id|> and <|eot_id|> as special tokens.
/// Trained once per process.
const std::string& chat_tokenizer_json();

/// chat_tokenizer_json() loaded with `config` as its tokenizer_config.json;
/// null when the config does not fit it.
std::shared_ptr<const components::Tokenizer> chat_tokenizer(components::TokenizerConfig config = {});

/// Fails the run (abort: libFuzzer saves the input) with `what`.
[[noreturn]] void fail(const std::string& what);

}  // namespace glint::fuzz

/// A property of the parsed value that must hold.
#define GLINT_FUZZ_CHECK(cond, what) \
  do {                               \
    if (!(cond)) ::glint::fuzz::fail(std::string{"check failed: " #cond ": "} + (what)); \
  } while (0)
