#include "components/data/template.hpp"

#include "components/data/agent_rows.hpp"
#include "components/data/chat_render.hpp"
#include "components/data/jinja.hpp"
#include "runtime/log.hpp"
#include "runtime/text.hpp"

#include <algorithm>

namespace glint::components {

namespace {

struct Format {
  const char* name;
  const char* begin_text;     // once at the start ("" for none)
  const char* header_open;    // before the role
  const char* header_close;   // after the role, before the content
  const char* end_of_turn;    // a special token
  const char* after_turn;     // plain text after end_of_turn
  bool trim;                  // Llama-3 trims contents
  bool tool_responses;        // Qwen2.5/3: tool messages go in a user turn as <tool_response> blocks
  bool think;                 // Qwen3: <think> blocks on the assistant turns after the last query
};

const Format kChatml{"chatml", "", "<|im_start|>", "\n", "<|im_end|>", "\n", false, false, false};
const Format kQwen25{"qwen2.5", "", "<|im_start|>", "\n", "<|im_end|>", "\n", false, true, false};
const Format kQwen3{"qwen3", "", "<|im_start|>", "\n", "<|im_end|>", "\n", false, true, true};
const Format kLlama3{"llama3", "<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>\n\n", "<|eot_id|>", "",
                     true, false, false};

const Format* format_of(const std::string& name) {
  if (name == "chatml" || name == "qwen") return &kChatml;
  if (name == "qwen2.5") return &kQwen25;
  if (name == "qwen3") return &kQwen3;
  if (name == "llama3") return &kLlama3;
  return nullptr;
}

// The literal after '<|im_start|>system and a line break (written \n in
// the Jinja string, or a real one) that closes with <|im_end|>: a default
// system message, unescaped.
std::optional<std::string> default_system_literal(const std::string& jinja) {
  const std::string open = "<|im_start|>system", close = "<|im_end|>";
  for (size_t at = jinja.find(open); at != std::string::npos; at = jinja.find(open, at + 1)) {
    size_t from = at + open.size();
    if (jinja.compare(from, 2, "\\n") == 0) from += 2;
    else if (jinja.compare(from, 1, "\n") == 0) from += 1;
    else continue;
    const size_t to = jinja.find(close, from);
    if (to == std::string::npos) break;
    auto body = jinja.substr(from, to - from);
    if (body.empty() || body.find_first_of("'\"{}+") != std::string::npos) continue;  // an expression, not a literal
    std::string out;
    for (size_t i = 0; i < body.size(); ++i) {
      if (body[i] != '\\' || i + 1 == body.size()) {
        out += body[i];
        continue;
      }
      char c = body[++i];
      out += c == 'n' ? '\n' : c == 't' ? '\t' : c;
    }
    return out;
  }
  return std::nullopt;
}

// Python's str.strip/lstrip/rstrip of newlines.
std::string_view strip_newlines(std::string_view s, bool left, bool right) {
  while (left && !s.empty() && s.front() == '\n') s.remove_prefix(1);
  while (right && !s.empty() && s.back() == '\n') s.remove_suffix(1);
  return s;
}

// Qwen3's split of an assistant message into its reasoning and its answer:
// the reasoning is what lies between <think> and the first </think>, the
// answer what follows the last </think>.
std::pair<std::string, std::string> split_thinking(const std::string& content) {
  const std::string close = "</think>";
  const auto first = content.find(close);
  if (first == std::string::npos) return {"", content};
  std::string_view before = strip_newlines(std::string_view{content}.substr(0, first), false, true);
  if (auto open = before.rfind("<think>"); open != std::string_view::npos) before = before.substr(open + 7);
  const auto last = content.rfind(close);
  return {std::string{strip_newlines(before, true, false)},
          std::string{strip_newlines(std::string_view{content}.substr(last + close.size()), true, false)}};
}

bool is_tool_response(const std::string& s) {
  const std::string open = "<tool_response>", close = "</tool_response>";
  return s.size() >= open.size() + close.size() && s.compare(0, open.size(), open) == 0 &&
         s.compare(s.size() - close.size(), close.size(), close) == 0;
}

// The conversation as the interpreter's input: a trailing assistant message
// left out under a generation prompt (a reference answer), the default
// system message put first where there is none.
// `default_system`: one the caller gave (the template's own it writes itself).
Result<ChatInput> chat_input(std::span<const Message> messages, bool add_generation_prompt, const TemplateOptions& o,
                             const std::optional<std::string>& default_system, std::string_view tools) {
  if (messages.empty()) return make_error(errc::invalid_argument, "the conversation has no messages");
  auto turns = messages;
  if (add_generation_prompt && turns.back().role == "assistant") turns = turns.first(turns.size() - 1);
  ChatInput in;
  if ((turns.empty() || turns.front().role != "system") && default_system && !default_system->empty())
    in.messages.push_back({{"role", "system"}, {"content", *default_system}});
  for (const auto& m : turns) in.messages.push_back(message_json(m));
  if (!tools.empty()) {
    in.tools = nlohmann::ordered_json::parse(tools, nullptr, false);
    if (!in.tools.is_array()) return make_error(errc::invalid_argument, "the tools are not a JSON list");
  }
  in.add_generation_prompt = add_generation_prompt;
  if (!o.enable_thinking) in.kwargs["enable_thinking"] = false;
  return in;
}

}  // namespace

ChatTemplateInfo detect_chat_template(const std::string& j) {
  auto has = [&](const char* s) { return j.find(s) != std::string::npos; };
  ChatTemplateInfo info;
  if (has("<|im_start|>")) {
    info.default_system = default_system_literal(j);
    if (has("trim")) info.why = "it trims message contents, which glint's ChatML formats do not";
    else if (has("preserve_thinking") || has("reasoning_effort")) info.why = "it has thinking options later than Qwen3's";
    else if (has("<think>")) {
      if (has("last_query_index") && has("enable_thinking")) info.name = "qwen3";
      else info.why = "its <think> handling is not Qwen3's (thinking kept on every turn?)";
    } else if (has("<tool_response>")) info.name = "qwen2.5";
    else if (has("tools") || has("tool_calls")) info.why = "it renders tool calls in a way glint does not recognise";
    else if (has("message['content']") || has("message.content") || has("message[\"content\"]")) info.name = "chatml";
    else info.why = "it does not render message contents the way ChatML does";
    if (info.name == "qwen3" && info.default_system)
      info.name.clear(), info.why = "it is Qwen3's with a default system message";
  } else if (has("<|start_header_id|>") && has("<|eot_id|>")) {
    if (has("Cutting Knowledge") || has("date_string") || has("tools") || has("ipython"))
      info.why = "it is Llama 3.1's or later (a dated system header, tool calls), which glint does not render";
    else if (!has("trim")) info.why = "it does not trim contents the way Llama 3's does";
    else info.name = "llama3";
  } else {
    info.why = "it is neither ChatML nor Llama 3";
  }
  if (!info.name.empty()) info.why.clear();
  return info;
}

Result<Truncation> parse_truncation(std::string_view name) {
  if (name == "refuse") return Truncation::refuse;
  if (name == "left") return Truncation::left;
  if (name == "right") return Truncation::right;
  return make_error(errc::invalid_argument,
                    "unknown truncation '" + std::string{name} + "'; use refuse, left or right");
}

Result<Template> Template::make(std::shared_ptr<const Tokenizer> tokenizer, TemplateOptions options) {
  if (!tokenizer) return make_error(errc::invalid_argument, "a template needs a tokenizer");
  const auto& model = tokenizer->config();
  std::optional<ChatTemplateInfo> seen;
  if (model.chat_template) seen = detect_chat_template(*model.chat_template);
  if (options.name == "auto") {
    if (!seen)
      return make_error(errc::invalid_argument,
                        "the tokenizer has no chat template (tokenizer_config.json's chat_template or "
                        "chat_template.jinja); name the format: chatml, qwen2.5, qwen3 or llama3");
    options.name = seen->name.empty() ? "jinja" : seen->name;
    if (seen->name.empty())
      log::info(model.chat_template_origin + " is not one of glint's C++ chat formats (" + seen->why +
                "): rendering it with glint's Jinja interpreter");
  }
  if (options.name == "jinja") return make_jinja(std::move(tokenizer), std::move(options));
  const auto* f = format_of(options.name);
  if (!f)
    return make_error(errc::invalid_argument, "unknown chat template '" + options.name +
                                                  "'; use auto (the model's), jinja, chatml, qwen2.5, qwen3 or llama3");
  if (seen && !seen->name.empty() && seen->name != f->name)
    return make_error(errc::invalid_argument, "chat template '" + options.name + "' is not the model's: " +
                                                  model.chat_template_origin + " is " + seen->name +
                                                  "'s; use auto or " + seen->name);
  if (seen && seen->name.empty())
    log::warn(model.chat_template_origin + " is not a template glint renders (" + seen->why + "); rendering " +
              f->name + " as asked, which may not be the text the model was trained on");
  if (!options.enable_thinking && !f->think)
    return make_error(errc::invalid_argument, "enable_thinking false needs a template with thinking (qwen3), not " +
                                                  std::string{f->name});
  const bool templates_default = !options.default_system && seen && seen->name == f->name;
  if (templates_default) options.default_system = seen->default_system;
  options.name = f->name;
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
  t.templates_default_system_ = templates_default;
  t.end_of_turn_id_ = tokenizer->token_id(f->end_of_turn);
  // The model's own template renders what the format cannot (tools, tool
  // calls), where it is this format's; one the interpreter cannot parse, or
  // a format named over an unrecognised template, leaves those rows refused.
  if (model.chat_template && seen && seen->name == f->name)
    if (auto parsed = JinjaTemplate::parse(*model.chat_template, model.chat_template_origin))
      t.jinja_ = std::make_shared<const JinjaTemplate>(std::move(*parsed));
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
  auto open = [&](const std::string& role) {
    out.push_back({f.header_open, false, true});
    out.push_back({role + f.header_close, false, false});
  };
  auto close = [&](bool learned) {
    out.push_back({f.end_of_turn, learned, true});
    if (*f.after_turn) out.push_back({f.after_turn, false, false});
  };
  auto turn = [&](const std::string& role, const std::string& content, bool learned) {
    open(role);
    out.push_back({f.trim ? std::string{trim(content)} : content, learned, false});
    close(learned);
  };
  bool has_system = !turns.empty() && turns.front().role == "system";
  if (!has_system && options_.default_system && !options_.default_system->empty())
    turn("system", *options_.default_system, false);
  // Qwen3: the last user message that is not a tool response; the assistant
  // turns after it keep their reasoning.
  size_t last_query = turns.size() - 1;
  if (f.think)
    for (size_t i = turns.size(); i-- > 0;)
      if (turns[i].role == "user" && !is_tool_response(turns[i].content)) {
        last_query = i;
        break;
      }
  for (size_t i = 0; i < turns.size(); ++i) {
    const auto& m = turns[i];
    if (m.role == "system" && i != 0)
      return make_error(errc::invalid_argument, "message " + std::to_string(i) + " is a system message; only the first may be");
    if (m.role != "system" && m.role != "user" && m.role != "assistant" && m.role != "tool")
      return make_error(errc::invalid_argument, "message " + std::to_string(i) + " has role '" + m.role +
                                                    "'; use system, user, assistant or tool");
    if (m.role == "tool" && f.tool_responses) {
      // Consecutive tool messages share one user turn, each block on a line
      // of its own.
      if (i == 0 || turns[i - 1].role != "tool") {
        out.push_back({f.header_open, false, true});
        out.push_back({"user", false, false});
      }
      out.push_back({"\n<tool_response>\n" + m.content + "\n</tool_response>", false, false});
      if (i + 1 == turns.size() || turns[i + 1].role != "tool") close(false);
      continue;
    }
    if (m.role == "assistant" && f.think) {
      auto [reasoning, answer] = split_thinking(m.content);
      const bool last = i + 1 == turns.size();
      if (i > last_query && (last || !reasoning.empty()))
        turn("assistant",
             "<think>\n" + std::string{strip_newlines(reasoning, true, true)} + "\n</think>\n\n" +
                 std::string{strip_newlines(answer, true, false)},
             true);
      else
        turn("assistant", answer, true);
      continue;
    }
    turn(m.role, m.content, m.role == "assistant");
  }
  if (add_generation_prompt) {
    open("assistant");
    if (f.think && !options_.enable_thinking) out.push_back({"<think>\n\n</think>\n\n", false, false});
  }
  return out;
}

Result<bool> Template::needs_interpreter(std::span<const Message> messages, std::string_view tools) const {
  if (options_.name == "jinja") return true;
  bool more = !tools.empty();
  for (const auto& m : messages) more = more || !m.extra.empty();
  if (more && !jinja_)
    return make_error(errc::invalid_argument,
                      "the conversation has tools, tool calls or other fields beside role and content, which glint's " +
                          options_.name + " format does not render, and the model has no chat template of its own "
                          "(tokenizer_config.json's chat_template or chat_template.jinja) to render them");
  return more;
}

Result<std::string> Template::render(std::span<const Message> messages, bool add_generation_prompt,
                                     std::string_view tools) const {
  auto interpret = needs_interpreter(messages, tools);
  if (!interpret) return interpret.error();
  if (*interpret) {
    auto in = chat_input(messages, add_generation_prompt, options_, given_default_system(), tools);
    if (!in) return in.error();
    auto r = jinja_->render(chat_variables(*in, tokenizer_->config().special_tokens));
    if (!r) return r.error();
    return std::move(r->text);
  }
  auto ps = pieces(messages, add_generation_prompt);
  if (!ps) return ps.error();
  std::string text;
  for (const auto& p : *ps) text += p.text;
  return text;
}

Result<EncodedRow> Template::encode(std::span<const Message> messages, bool add_generation_prompt,
                                   std::string_view tools) const {
  auto interpret = needs_interpreter(messages, tools);
  if (!interpret) return interpret.error();
  if (*interpret) return encode_jinja(messages, add_generation_prompt, tools);
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
  return finish(std::move(ids), std::move(learned), add_generation_prompt);
}

Result<EncodedRow> Template::finish(std::vector<int64_t> ids, std::vector<uint8_t> learned, bool add_generation_prompt) const {
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


Result<Template> Template::make_jinja(std::shared_ptr<const Tokenizer> tokenizer, TemplateOptions options) {
  const auto& model = tokenizer->config();
  if (!model.chat_template)
    return make_error(errc::invalid_argument, "chat template 'jinja' runs the model's own template, and the tokenizer "
                                              "has none (tokenizer_config.json's chat_template or chat_template.jinja)");
  if (options.max_length < 0)
    return make_error(errc::invalid_argument, "max_length must be 0 (no limit) or more, not " +
                                                  std::to_string(options.max_length));
  if (!options.enable_thinking && model.chat_template->find("enable_thinking") == std::string::npos)
    return make_error(errc::invalid_argument, "enable_thinking false: " + model.chat_template_origin +
                                                  " never reads enable_thinking, so it would change nothing");
  auto parsed = JinjaTemplate::parse(*model.chat_template, model.chat_template_origin);
  if (!parsed) return parsed.error();
  if (auto probe = tokenizer->encode("a"); !probe)
    return with_context(probe.error(), "the model's chat template needs a tokenizer that encodes");
  Template t;
  t.jinja_ = std::make_shared<const JinjaTemplate>(std::move(*parsed));
  t.tokenizer_ = std::move(tokenizer);
  options.name = "jinja";
  t.options_ = std::move(options);
  // The token that ends an assistant turn: the last one the loss counts in
  // a one-turn conversation, where it is special; else eos_token.
  const std::vector<Message> probe = {{"user", "1"}, {"assistant", "2"}};
  auto row = t.encode_jinja(probe, false, {});
  if (row) {
    for (size_t k = row->input_ids.size(); k-- > 1;)
      if (row->loss_mask[k - 1] > 0) {
        if (t.tokenizer_->is_special(row->input_ids[k])) t.end_of_turn_id_ = row->input_ids[k];
        break;
      }
  }
  if (t.end_of_turn_id_ < 0)
    if (auto eos = model.special_tokens.find("eos_token"); eos != model.special_tokens.end())
      t.end_of_turn_id_ = t.tokenizer_->token_id(eos->second);
  if (t.end_of_turn_id_ < 0)
    return make_error(errc::invalid_argument,
                      model.chat_template_origin + ": cannot tell which token ends an assistant turn (no special token "
                      "ends one, and tokenizer_config.json has no eos_token)" +
                          (row ? std::string{} : "; rendering a one-turn conversation failed: " + describe(row.error())));
  return t;
}

Result<EncodedRow> Template::encode_jinja(std::span<const Message> messages, bool add_generation_prompt,
                                         std::string_view tools) const {
  auto in = chat_input(messages, add_generation_prompt, options_, given_default_system(), tools);
  if (!in) return in.error();
  const auto& special = tokenizer_->config().special_tokens;
  // As the C++ formats do, a prompt's earlier assistant turns count too
  // (a multi-turn prompt trained on is a conversation).
  auto chat = render_chat(*jinja_, *in, special);
  if (!chat) return chat.error();
  auto tokens = tokenize_chat(*tokenizer_, *chat);
  if (!tokens) return tokens.error();
  std::vector<int64_t> ids = std::move(tokens->input_ids);
  std::vector<uint8_t> learned(ids.size(), 0);
  for (size_t k = 0; k + 1 < ids.size(); ++k) learned[k + 1] = tokens->loss_mask[k] > 0;
  return finish(std::move(ids), std::move(learned), add_generation_prompt);
}

}  // namespace glint::components
