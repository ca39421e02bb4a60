#pragma once
/// `Template`: a chat format (ChatML, Qwen2.5's, Qwen3's or Llama-3's) that
/// turns a conversation into token ids and a loss mask, as the model's own
/// chat template would:
///
///   auto tok = std::make_shared<const Tokenizer>(*Tokenizer::load("models/tiny"));
///   auto chat = Template::make(tok, {.max_length = 512});   // name "auto"
///
/// With name "auto" a model's chat_template (tokenizer_config.json or
/// chat_template.jinja) that glint recognises as one of four formats
/// (ChatML, Qwen2.5's, Qwen3's, Llama 3's) is rendered by glint's C++
/// rendering of that format, which is checked equal to the template and is
/// faster; any other template is run by glint's Jinja interpreter
/// (jinja.hpp), as transformers runs it, with the loss mask from its
/// {% generation %} blocks or from rendering prefixes (chat_render.hpp).
/// Name "jinja" runs the interpreter whatever the template. A format named
/// explicitly is refused when the model's template is recognised as another
/// (and logged as a warning when it is not recognised).
/// detect_chat_template() says what a template is recognised as.
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
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace glint::components {

class JinjaTemplate;

struct Message {
  std::string role;  ///< system, user, assistant or tool
  std::string content;
  /// The message's other fields as a JSON object (tool_calls, tool_call_id,
  /// name, reasoning_content, ...), "" for none: what a model's own chat
  /// template renders (agent_rows.hpp reads them).
  std::string extra{};
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
  /// auto (the model's chat_template), jinja (the model's chat_template run
  /// by the interpreter, even where a C++ format would do), chatml, qwen2.5,
  /// qwen3 or llama3.
  std::string name = "auto";
  int64_t max_length = 0;  ///< tokens; 0: no limit
  Truncation truncation = Truncation::refuse;
  /// Put first when a conversation has no system message; "": none; unset:
  /// the default the model's chat template writes (Qwen2.5's "You are Qwen,
  /// created by Alibaba Cloud. ..."), if any.
  std::optional<std::string> default_system{};
  /// false: Qwen3's enable_thinking=False (an empty <think></think> block in
  /// the generation prompt); for a Jinja template, enable_thinking=false is
  /// passed, and refused when the template never reads it.
  bool enable_thinking = true;
};

/// What a Jinja chat template is recognised as.
struct ChatTemplateInfo {
  std::string name;  ///< chatml, qwen2.5, qwen3 or llama3; "" when not recognised
  /// The system message the template puts first when a conversation has none.
  std::optional<std::string> default_system;
  std::string why;  ///< when not recognised: what glint does not render
};
ChatTemplateInfo detect_chat_template(const std::string& jinja);

struct EncodedRow {
  std::vector<int64_t> input_ids;
  std::vector<float> loss_mask;  ///< [input_ids.size()], TrainBatch's convention
  int64_t truncated_tokens = 0;  ///< how many tokens truncation removed
  friend bool operator==(const EncodedRow&, const EncodedRow&) = default;
};

class Template {
public:
  /// Errors: an unknown name; "auto" or "jinja" with a tokenizer that has no
  /// chat template, or one the interpreter cannot parse; a name other than the one
  /// the model's template is recognised as; enable_thinking false for a
  /// format without thinking; a tokenizer that lacks the format's special
  /// tokens or cannot encode; max_length < 0.
  static Result<Template> make(std::shared_ptr<const Tokenizer> tokenizer, TemplateOptions options);

  /// The conversation as text, as the model's Jinja chat template renders
  /// it. `tools`: the tools offered, a JSON list ("" for none).
  Result<std::string> render(std::span<const Message> messages, bool add_generation_prompt,
                             std::string_view tools = {}) const;
  /// Tokens and loss mask. Errors: invalid_argument for no messages, an
  /// unknown role, a system message that is not first, no assistant turn
  /// in a training row; resource_exhausted for a conversation longer than
  /// max_length under Truncation::refuse, or a training row with no
  /// assistant token left once truncated.
  /// A conversation with tools or with messages that carry more than text
  /// (tool calls, reasoning_content) goes through the model's own template
  /// even where a C++ format renders the rest: an error (invalid_argument)
  /// where the model has none.
  Result<EncodedRow> encode(std::span<const Message> messages, bool add_generation_prompt,
                            std::string_view tools = {}) const;

  /// The token that ends an assistant turn (<|im_end|>, <|eot_id|>):
  /// sampling stops on it.
  int64_t end_of_turn_id() const { return end_of_turn_id_; }
  /// The options as made: name is the format rendered ("auto" resolved),
  /// default_system the one in use.
  const TemplateOptions& options() const { return options_; }
  const Tokenizer& tokenizer() const { return *tokenizer_; }

private:
  struct Piece {
    std::string text;
    bool learned = false;  // an assistant token the loss counts
    bool special = false;  // one special token, by id
  };
  Result<std::vector<Piece>> pieces(std::span<const Message> messages, bool add_generation_prompt) const;
  static Result<Template> make_jinja(std::shared_ptr<const Tokenizer> tokenizer, TemplateOptions options);
  Result<EncodedRow> encode_jinja(std::span<const Message> messages, bool add_generation_prompt, std::string_view tools) const;
  /// Whether the C++ format cannot render this conversation (an error when
  /// the model has no template to render it instead).
  Result<bool> needs_interpreter(std::span<const Message> messages, std::string_view tools) const;
  /// Truncation and the loss mask from each token's `learned` flag.
  Result<EncodedRow> finish(std::vector<int64_t> ids, std::vector<uint8_t> learned, bool add_generation_prompt) const;

  std::shared_ptr<const Tokenizer> tokenizer_;
  /// The model's template for the interpreter: every conversation under
  /// name "jinja", those a C++ format cannot render under the others.
  std::shared_ptr<const JinjaTemplate> jinja_;
  /// options_.default_system is the template's own (found in its text),
  /// which the template writes itself when interpreted.
  bool templates_default_system_ = false;
  std::optional<std::string> given_default_system() const {
    return templates_default_system_ ? std::nullopt : options_.default_system;
  }
  TemplateOptions options_;
  int64_t end_of_turn_id_ = -1;
};

}  // namespace glint::components
