#pragma once
/// Rendering a conversation with a model's own chat template, as
/// transformers' apply_chat_template does, and finding the assistant's text
/// in it for the loss:
///
///   auto t = JinjaTemplate::parse(*tok.config().chat_template, tok.config().chat_template_origin);
///   ChatInput in{.messages = row["messages"], .tools = row.value("tools", json())};
///   auto chat = render_chat(*t, in, special_tokens_of(tok));
///   // chat->text: the rendered conversation; chat->learned: the byte ranges
///   // of assistant turns (their text and end-of-turn markup)
///
/// The variables are transformers': messages, tools and documents (null
/// when absent, as transformers passes None), add_generation_prompt, the
/// tokenizer's special tokens by role (bos_token, eos_token, ...), and the
/// template keyword arguments (enable_thinking, ...).
///
/// The learned ranges come from {% generation %} blocks where the template
/// has them (transformers' return_assistant_tokens_mask), else from
/// rendering prefixes: assistant message i spans from the end of
/// messages[:i] rendered with a generation prompt to the end of
/// messages[:i+1] rendered without (where the generation prompt writes
/// more than a past turn shows, as QwQ's opens <think>, from where the two
/// renders part, at a line end or tag end). That needs a template that renders a
/// conversation's start the same whatever follows; one that rewrites
/// earlier turns (Qwen3 drops the reasoning of turns before the last user
/// message) is refused for that conversation, naming the turn, rather than
/// mislabelled.

#include "components/data/jinja.hpp"
#include "components/data/tokenizer.hpp"
#include "runtime/error.hpp"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace glint::components {

struct ChatInput {
  nlohmann::ordered_json messages = nlohmann::ordered_json::array();
  nlohmann::ordered_json tools;      ///< null: none
  nlohmann::ordered_json documents;  ///< null: none
  bool add_generation_prompt = false;
  /// Template keyword arguments (enable_thinking, ...), passed as variables.
  nlohmann::ordered_json kwargs = nlohmann::ordered_json::object();
};

struct RenderedChat {
  std::string text;
  std::vector<std::pair<size_t, size_t>> learned;  ///< [begin, end) bytes of assistant text
  bool from_generation_blocks = false;             ///< else from rendering prefixes
};

/// bos_token, eos_token, pad_token, unk_token as the tokenizer's config names them.
std::map<std::string, std::string> special_tokens_of(const Tokenizer& tokenizer);

/// The variables transformers passes the template.
nlohmann::ordered_json chat_variables(const ChatInput& input, const std::map<std::string, std::string>& special_tokens);

/// The conversation rendered, with its assistant ranges (see above).
/// Errors: the template's own (raise_exception, a type error), messages not
/// an array of objects, a prefix render that the whole render does not
/// start with (invalid_argument, naming the assistant turn).
Result<RenderedChat> render_chat(const JinjaTemplate& t, const ChatInput& input,
                                 const std::map<std::string, std::string>& special_tokens);

struct TokenizedChat {
  std::vector<int64_t> input_ids;
  std::vector<float> loss_mask;  ///< TrainBatch's convention: position t counts token t + 1
};
/// The rendered text's ids (the whole text encoded at once, as
/// apply_chat_template(tokenize=True) does) and the loss mask: a token is
/// learned when its first byte lies in a learned range.
Result<TokenizedChat> tokenize_chat(const Tokenizer& tokenizer, const RenderedChat& chat);

}  // namespace glint::components
