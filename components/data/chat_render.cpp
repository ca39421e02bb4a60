#include "components/data/chat_render.hpp"

namespace glint::components {

using json = nlohmann::ordered_json;

std::map<std::string, std::string> special_tokens_of(const Tokenizer& tokenizer) {
  return tokenizer.config().special_tokens;
}

json chat_variables(const ChatInput& input, const std::map<std::string, std::string>& special_tokens) {
  json v = json::object();
  v["messages"] = input.messages;
  v["tools"] = input.tools;
  v["documents"] = input.documents;
  v["add_generation_prompt"] = input.add_generation_prompt;
  for (const auto& [role, token] : special_tokens) v[role] = token;
  for (const auto& [k, x] : input.kwargs.items()) v[k] = x;
  return v;
}

namespace {

bool is_space(char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; }

}  // namespace

Result<RenderedChat> render_chat(const JinjaTemplate& t, const ChatInput& input,
                                 const std::map<std::string, std::string>& special_tokens) {
  if (!input.messages.is_array())
    return make_error(errc::invalid_argument, "the conversation's messages must be a JSON array, got " +
                                                  std::string{input.messages.type_name()});
  for (size_t i = 0; i < input.messages.size(); ++i)
    if (!input.messages[i].is_object() || !input.messages[i].contains("role") || !input.messages[i]["role"].is_string())
      return make_error(errc::invalid_argument, "message " + std::to_string(i) + " is not an object with a string \"role\"");
  auto full = t.render(chat_variables(input, special_tokens));
  if (!full) return full.error();
  RenderedChat out;
  out.text = std::move(full->text);
  if (!full->generation.empty()) {
    out.learned = std::move(full->generation);
    out.from_generation_blocks = true;
    return out;
  }
  for (size_t i = 0; i < input.messages.size(); ++i) {
    if (input.messages[i]["role"] != "assistant") continue;
    auto prefix = [&](size_t n, bool generation_prompt) {
      ChatInput p = input;
      p.messages = json::array();
      for (size_t k = 0; k < n; ++k) p.messages.push_back(input.messages[k]);
      p.add_generation_prompt = generation_prompt;
      return t.render(chat_variables(p, special_tokens));
    };
    const std::string turn = "assistant message " + std::to_string(i);
    auto before = prefix(i, true);
    if (!before) return with_context(before.error(), "rendering the messages before " + turn + " (for the loss mask)");
    auto upto = prefix(i + 1, false);
    if (!upto) return with_context(upto.error(), "rendering the messages up to " + turn + " (for the loss mask)");
    // Where the assistant's turn starts: after the generation prompt; or,
    // where the template's generation prompt writes what its rendering of a
    // past turn does not (QwQ opens <think>, and renders a past turn without
    // its reasoning), where the two part, backed off to a line end or the
    // end of a tag, so that no shared letters of two different markups count.
    size_t start = before->text.size();
    if (!upto->text.starts_with(before->text)) {
      size_t common = 0;
      while (common < before->text.size() && common < upto->text.size() && before->text[common] == upto->text[common]) ++common;
      while (common > 0 && before->text[common - 1] != '\n' && before->text[common - 1] != '>') --common;
      if (common == 0)
        return make_error(errc::invalid_argument,
                          "chat template " + t.name() + ": the messages up to " + turn + " share no start with the "
                          "messages before it; the loss mask cannot come from rendering prefixes (mark the assistant's "
                          "text with {% generation %} blocks)");
      start = common;
    }
    if (!out.text.starts_with(upto->text))
      return make_error(errc::invalid_argument,
                        "chat template " + t.name() + " renders " + turn + " differently once later messages follow (it "
                        "rewrites earlier turns, as Qwen3's drops the reasoning of turns before the last user message); "
                        "the loss mask cannot come from rendering prefixes: end the conversation at that turn, or mark "
                        "the assistant's text with {% generation %} blocks");
    size_t end = upto->text.size();
    // The newline after an end-of-turn token is the template's, not the
    // model's: it is never sampled (sampling stops at the token).
    while (end > start && is_space(upto->text[end - 1])) --end;
    if (end > start) out.learned.emplace_back(start, end);
  }
  return out;
}

Result<TokenizedChat> tokenize_chat(const Tokenizer& tokenizer, const RenderedChat& chat) {
  auto ids = tokenizer.encode(chat.text);
  if (!ids) return ids.error();
  TokenizedChat out;
  out.input_ids = std::move(*ids);
  out.loss_mask.assign(out.input_ids.size(), 0.f);
  size_t at = 0, span = 0;
  for (size_t k = 0; k < out.input_ids.size(); ++k) {
    while (span < chat.learned.size() && chat.learned[span].second <= at) ++span;
    const bool learned = span < chat.learned.size() && at >= chat.learned[span].first && at < chat.learned[span].second;
    if (learned && k > 0) out.loss_mask[k - 1] = 1.f;
    at += tokenizer.token_bytes(out.input_ids[k]).size();
  }
  if (at != chat.text.size())
    return make_error(errc::invalid_argument, "the tokens' bytes (" + std::to_string(at) + ") are not the rendered text's (" +
                                                  std::to_string(chat.text.size()) +
                                                  "): the tokenizer's normalizer changes the text, so its tokens cannot be "
                                                  "lined up with the assistant's text");
  return out;
}

}  // namespace glint::components
