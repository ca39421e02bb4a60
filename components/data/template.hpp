#pragma once
/// `Template`: a chat format (ChatML as Qwen writes it, or Llama-3's) that
/// turns a conversation into token ids and a loss mask, as the model's own
/// chat template would:
///
///   auto tok = std::make_shared<const Tokenizer>(*Tokenizer::load("models/tiny/tokenizer.json"));
///   auto chat = Template::make(tok, {.name = "chatml", .max_length = 512});
///   auto row = chat->encode(messages, /*add_generation_prompt=*/false);
///   // row->input_ids: the whole conversation; row->loss_mask: 1 where the
///   // next token is an assistant token (its text and its end-of-turn token)
///
/// The loss mask follows TrainBatch's convention (position t counts the
/// prediction of token t + 1), the same as the sampler's SampledSequence,
/// so SFT rows and sampled completions make batches the same way. Each
/// piece of the rendered text (role headers, contents, end tokens) is
/// encoded on its own and the ids concatenated, so the labels line up with
/// message boundaries exactly.
///
/// With add_generation_prompt the conversation ends with the assistant's
/// header, ready to sample from; a trailing assistant message (a reference
/// answer) is left out. Immutable after make: safe to share between threads.

#include "components/data/tokenizer.hpp"
#include "runtime/error.hpp"

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace glint::components {

struct Message {
  std::string role;  ///< system, user, assistant or tool
  std::string content;
  friend bool operator==(const Message&, const Message&) = default;
};

/// What happens to a conversation longer than max_length tokens.
enum class Truncation : uint8_t {
  refuse,  ///< an error (a dataset skips the row, counted as too long)
  left,    ///< keep the last max_length tokens (prompts: the question and the generation prompt stay)
  right,   ///< keep the first max_length tokens
};
Result<Truncation> parse_truncation(std::string_view name);

struct TemplateOptions {
  std::string name = "chatml";  ///< chatml (Qwen) or llama3
  int64_t max_length = 0;       ///< tokens; 0: no limit
  Truncation truncation = Truncation::refuse;
  /// Put first when a conversation has no system message; empty: none.
  std::string default_system{};
};

struct EncodedRow {
  std::vector<int64_t> input_ids;
  std::vector<float> loss_mask;  ///< [input_ids.size()], TrainBatch's convention
  int64_t truncated_tokens = 0;  ///< how many tokens truncation removed
  friend bool operator==(const EncodedRow&, const EncodedRow&) = default;
};

class Template {
public:
  /// Errors: an unknown name, a tokenizer that lacks the format's special
  /// tokens or cannot encode, max_length < 0.
  static Result<Template> make(std::shared_ptr<const Tokenizer> tokenizer, TemplateOptions options);

  /// The conversation as text, as the model's Jinja chat template renders it.
  Result<std::string> render(std::span<const Message> messages, bool add_generation_prompt) const;
  /// Tokens and loss mask. Errors: invalid_argument for no messages, an
  /// unknown role, a system message that is not first, no assistant turn
  /// in a training row; resource_exhausted for a conversation longer than
  /// max_length under Truncation::refuse, or a training row with no
  /// assistant token left once truncated.
  Result<EncodedRow> encode(std::span<const Message> messages, bool add_generation_prompt) const;

  /// The token that ends an assistant turn (<|im_end|>, <|eot_id|>):
  /// sampling stops on it.
  int64_t end_of_turn_id() const { return end_of_turn_id_; }
  const TemplateOptions& options() const { return options_; }
  const Tokenizer& tokenizer() const { return *tokenizer_; }

private:
  struct Piece {
    std::string text;
    bool learned = false;  // an assistant token the loss counts
    bool special = false;  // one special token, by id
  };
  Result<std::vector<Piece>> pieces(std::span<const Message> messages, bool add_generation_prompt) const;

  std::shared_ptr<const Tokenizer> tokenizer_;
  TemplateOptions options_;
  int64_t end_of_turn_id_ = -1;
};

}  // namespace glint::components
