#include "components/data/template.hpp"

#include "runtime/text.hpp"

#include <algorithm>

namespace glint::components {

namespace {

struct Format {
  const char* begin_text;     // once at the start ("" for none)
  const char* header_open;    // before the role
  const char* header_close;   // after the role, before the content
  const char* end_of_turn;    // a special token
  const char* after_turn;     // plain text after end_of_turn
  bool trim;                  // Llama-3 trims contents
};

const Format kChatml{"", "<|im_start|>", "\n", "<|im_end|>", "\n", false};
const Format kLlama3{"<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>\n\n", "<|eot_id|>", "", true};

const Format* format_of(const std::string& name) {
  if (name == "chatml" || name == "qwen") return &kChatml;
  if (name == "llama3") return &kLlama3;
  return nullptr;
}

}  // namespace

Result<Truncation> parse_truncation(std::string_view name) {
  if (name == "refuse") return Truncation::refuse;
  if (name == "left") return Truncation::left;
  if (name == "right") return Truncation::right;
  return make_error(errc::invalid_argument,
                    "unknown truncation '" + std::string{name} + "'; use refuse, left or right");
}

Result<Template> Template::make(std::shared_ptr<const Tokenizer> tokenizer, TemplateOptions options) {
  if (!tokenizer) return make_error(errc::invalid_argument, "a template needs a tokenizer");
  const auto* f = format_of(options.name);
  if (!f)
    return make_error(errc::invalid_argument, "unknown chat template '" + options.name + "'; use chatml (Qwen) or llama3");
  if (options.max_length < 0)
    return make_error(errc::invalid_argument, "max_length must be 0 (no limit) or more, not " +
                                                  std::to_string(options.max_length));
  if (auto probe = tokenizer->encode("a"); !probe)
    return with_context(probe.error(), "the " + options.name + " template needs a tokenizer that encodes");
  for (const char* s : {f->begin_text, f->header_open, f->end_of_turn}) {
    std::string token = s;
    if (token.empty() || token == "\n") continue;
    if (tokenizer->token_id(token) < 0)
      return make_error(errc::invalid_argument, "the tokenizer has no token " + token + ", which the " + options.name +
                                                    " template needs (was it trained with it as a special token?)");
  }
  Template t;
  t.end_of_turn_id_ = tokenizer->token_id(f->end_of_turn);
  t.tokenizer_ = std::move(tokenizer);
  t.options_ = std::move(options);
  return t;
}

Result<std::vector<Template::Piece>> Template::pieces(std::span<const Message> messages,
                                                      bool add_generation_prompt) const {
  const auto& f = *format_of(options_.name);
  if (messages.empty()) return make_error(errc::invalid_argument, "the conversation has no messages");
  auto turns = messages;
  if (add_generation_prompt && turns.back().role == "assistant") turns = turns.first(turns.size() - 1);
  std::vector<Piece> out;
  if (*f.begin_text) out.push_back({f.begin_text, false, true});
  auto turn = [&](const std::string& role, const std::string& content, bool learned) {
    out.push_back({f.header_open, false, true});
    out.push_back({role + f.header_close, false, false});
    out.push_back({f.trim ? std::string{trim(content)} : content, learned, false});
    out.push_back({f.end_of_turn, learned, true});
    if (*f.after_turn) out.push_back({f.after_turn, false, false});
  };
  bool has_system = !turns.empty() && turns.front().role == "system";
  if (!has_system && !options_.default_system.empty()) turn("system", options_.default_system, false);
  for (size_t i = 0; i < turns.size(); ++i) {
    const auto& m = turns[i];
    if (m.role == "system" && i != 0)
      return make_error(errc::invalid_argument, "message " + std::to_string(i) + " is a system message; only the first may be");
    if (m.role != "system" && m.role != "user" && m.role != "assistant" && m.role != "tool")
      return make_error(errc::invalid_argument, "message " + std::to_string(i) + " has role '" + m.role +
                                                    "'; use system, user, assistant or tool");
    turn(m.role, m.content, m.role == "assistant");
  }
  if (add_generation_prompt) {
    out.push_back({f.header_open, false, true});
    out.push_back({std::string{"assistant"} + f.header_close, false, false});
  }
  return out;
}

Result<std::string> Template::render(std::span<const Message> messages, bool add_generation_prompt) const {
  auto ps = pieces(messages, add_generation_prompt);
  if (!ps) return ps.error();
  std::string text;
  for (const auto& p : *ps) text += p.text;
  return text;
}

Result<EncodedRow> Template::encode(std::span<const Message> messages, bool add_generation_prompt) const {
  auto ps = pieces(messages, add_generation_prompt);
  if (!ps) return ps.error();
  std::vector<int64_t> ids;
  std::vector<uint8_t> learned;  // per token
  for (const auto& p : *ps) {
    if (p.special) {
      ids.push_back(tokenizer_->token_id(p.text));
      learned.push_back(p.learned);
      continue;
    }
    auto piece = tokenizer_->encode(p.text);
    if (!piece) return piece.error();
    ids.insert(ids.end(), piece->begin(), piece->end());
    learned.insert(learned.end(), piece->size(), p.learned);
  }
  EncodedRow row;
  const auto n = static_cast<int64_t>(ids.size());
  const auto max = options_.max_length;
  if (max > 0 && n > max) {
    if (options_.truncation == Truncation::refuse)
      return make_error(errc::resource_exhausted, "the conversation is " + std::to_string(n) +
                                                    " tokens, more than max_length " + std::to_string(max));
    row.truncated_tokens = n - max;
    auto from = options_.truncation == Truncation::left ? n - max : 0;
    ids = std::vector<int64_t>(ids.begin() + from, ids.begin() + from + max);
    learned = std::vector<uint8_t>(learned.begin() + from, learned.begin() + from + max);
  }
  row.loss_mask.assign(ids.size(), 0.f);
  bool any = false;
  for (size_t t = 0; t + 1 < ids.size(); ++t)
    if (learned[t + 1]) {
      row.loss_mask[t] = 1.f;
      any = true;
    }
  if (!add_generation_prompt && !any)
    return make_error(row.truncated_tokens > 0 ? errc::resource_exhausted : errc::invalid_argument,
                      row.truncated_tokens > 0
                          ? "no assistant token is left after truncating " + std::to_string(row.truncated_tokens) +
                                " tokens to max_length " + std::to_string(max)
                          : std::string{"the conversation has no assistant message to learn from"});
  row.input_ids = std::move(ids);
  return row;
}

}  // namespace glint::components
