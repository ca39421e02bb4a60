#include "rpc/tinker/openai.hpp"

#include "components/data/agent_rows.hpp"

#include <algorithm>
#include <cmath>
#include <set>

namespace glint::rpc::openai {

namespace {

using json = nlohmann::json;
using ojson = nlohmann::ordered_json;

caf::error bad(const std::string& what) { return make_error(errc::invalid_argument, what); }

std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

const json& field(const json& j, const char* key) {
  static const json null;
  auto it = j.find(key);
  return it == j.end() ? null : *it;
}

Result<int64_t> integer(const json& j, const char* key, int64_t fallback, int64_t lo, int64_t hi) {
  const auto& v = field(j, key);
  if (v.is_null()) return fallback;
  if (!v.is_number_integer()) return bad(std::string{key} + " must be an integer");
  const auto x = v.get<int64_t>();
  if (x < lo || x > hi)
    return bad(std::string{key} + " must be " + std::to_string(lo) + " to " + std::to_string(hi) + ", not " +
               std::to_string(x));
  return x;
}

Result<double> number(const json& j, const char* key, double fallback, double lo, double hi) {
  const auto& v = field(j, key);
  if (v.is_null()) return fallback;
  if (!v.is_number()) return bad(std::string{key} + " must be a number");
  const auto x = v.get<double>();
  if (!(x >= lo && x <= hi))
    return bad(std::string{key} + " must be in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
  return x;
}

Result<bool> boolean(const json& j, const char* key, bool fallback) {
  const auto& v = field(j, key);
  if (v.is_null()) return fallback;
  if (!v.is_boolean()) return bad(std::string{key} + " must be true or false");
  return v.get<bool>();
}

/// A message's content as text: a string, or a list of text parts.
Result<ojson> text_content(const json& content, size_t index) {
  if (!content.is_array()) return ojson(content);
  std::string text;
  for (const auto& part : content) {
    if (!part.is_object() || field(part, "type") != "text" || !field(part, "text").is_string())
      return bad("messages[" + std::to_string(index) +
                 "].content: only text parts are served here (images, audio and files are not)");
    text += part["text"].get<std::string>();
  }
  return ojson(text);
}

/// The messages in OpenAI's format, as glint's (tool calls kept).
Result<std::vector<components::Message>> messages_of(const json& list) {
  if (!list.is_array() || list.empty()) return bad("messages must be a non-empty list");
  ojson converted = ojson::array();
  for (size_t i = 0; i < list.size(); ++i) {
    const auto& m = list[i];
    if (!m.is_object()) return bad("messages[" + std::to_string(i) + "] must be an object");
    ojson o = ojson::parse(m.dump());
    if (m.contains("content")) {
      auto c = text_content(m["content"], i);
      if (!c) return c.error();
      o["content"] = std::move(*c);
    }
    // OpenAI's arguments are a JSON string; templates read an object.
    if (o.contains("tool_calls") && o["tool_calls"].is_array())
      for (auto& call : o["tool_calls"])
        if (call.is_object() && call.contains("function") && call["function"].is_object() &&
            call["function"].contains("arguments") && call["function"]["arguments"].is_string()) {
          auto args = ojson::parse(call["function"]["arguments"].get<std::string>(), nullptr, false);
          if (args.is_discarded())
            return bad("messages[" + std::to_string(i) + "]: a tool call's arguments are not JSON");
          call["function"]["arguments"] = std::move(args);
        }
    converted.push_back(std::move(o));
  }
  return components::agent_messages(converted, false);
}

/// The prompt of /v1/completions: a string, one string in a list, or token ids.
Result<std::vector<int64_t>> completion_prompt(const json& p, const components::Tokenizer& tok) {
  const json* one = &p;
  if (p.is_array() && p.size() == 1 && (p[0].is_string() || p[0].is_array())) one = &p[0];
  if (one->is_string()) return tok.encode(one->get<std::string>());
  if (p.is_array() && p.size() > 1 && (p[0].is_string() || p[0].is_array()))
    return bad("prompt: one prompt per request here (a list of " + std::to_string(p.size()) + " was given)");
  if (one->is_array() && !one->empty()) {
    std::vector<int64_t> ids;
    for (const auto& t : *one) {
      if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() >= tok.vocab_size())
        return bad("prompt: token ids must be integers in [0, " + std::to_string(tok.vocab_size()) + ")");
      ids.push_back(t.get<int64_t>());
    }
    return ids;
  }
  return bad("prompt must be a string, or one list of token ids (one prompt per request here)");
}

std::string token_text(const components::Tokenizer& tok, int64_t id) {
  return tok.decode(std::vector<int64_t>{id}, false);
}

json bytes_of(const std::string& s) {
  json b = json::array();
  for (unsigned char c : s) b.push_back(static_cast<int>(c));
  return b;
}

/// The tokens a choice reports: without the stop token that ended it.
size_t reported(const Choice& c) {
  size_t n = c.tokens.size();
  if (c.stop_reason == components::StopReason::stop && n > 0 && c.tokens.back() == c.stop_token) --n;
  return n;
}

json chat_logprobs(const Choice& c, const components::Tokenizer& tok, size_t from, size_t to) {
  json content = json::array();
  for (size_t i = from; i < to; ++i) {
    const auto text = token_text(tok, c.tokens[i]);
    json top = json::array();
    for (int64_t k = 0; k < c.logprobs.k; ++k) {
      const auto at = i * static_cast<size_t>(c.logprobs.k) + static_cast<size_t>(k);
      if (at >= c.logprobs.top_ids.size()) break;
      const auto t = token_text(tok, c.logprobs.top_ids[at]);
      top.push_back({{"token", t}, {"logprob", c.logprobs.top_logprobs[at]}, {"bytes", bytes_of(t)}});
    }
    content.push_back({{"token", text},
                       {"logprob", i < c.logprobs.chosen.size() ? c.logprobs.chosen[i] : 0.f},
                       {"bytes", bytes_of(text)},
                       {"top_logprobs", top}});
  }
  return content;
}

std::string sse(const json& chunk) { return "data: " + dump(chunk) + "\n\n"; }

}  // namespace

Result<Request> parse_request(const json& body, bool chat, const components::Template* chat_template,
                              const components::Tokenizer& tok, const Limits& limits) {
  if (!body.is_object()) return bad("the body must be a JSON object");
  static const std::set<std::string> chat_fields = {
      "model", "messages", "n", "max_tokens", "max_completion_tokens", "temperature", "top_p", "seed", "stop",
      "logprobs", "top_logprobs", "stream", "stream_options", "tools", "tool_choice", "parallel_tool_calls",
      "frequency_penalty", "presence_penalty", "logit_bias", "response_format", "user", "metadata", "store"};
  static const std::set<std::string> completion_fields = {
      "model", "prompt", "n", "max_tokens", "temperature", "top_p", "seed", "stop", "logprobs", "stream",
      "stream_options", "frequency_penalty", "presence_penalty", "logit_bias", "echo", "suffix", "best_of", "user"};
  const auto& known = chat ? chat_fields : completion_fields;
  for (const auto& [k, _] : body.items())
    if (!known.count(k))
      return bad("'" + k.substr(0, 60) + "' is not a field glint serves on " +
                 (chat ? "/v1/chat/completions" : "/v1/completions") + " (docs/remote.md lists those it does)");
  Request r;
  r.chat = chat;
  const auto& model = field(body, "model");
  if (!model.is_string() || model.get<std::string>().empty()) return bad("model must name the base or a tinker:// path");
  r.model = model.get<std::string>();
  for (const char* k : {"frequency_penalty", "presence_penalty"}) {
    auto v = number(body, k, 0, -2, 2);
    if (!v) return v.error();
    if (*v != 0) return bad(std::string{k} + " is not served here; leave it at 0");
  }
  if (const auto& lb = field(body, "logit_bias"); !lb.is_null() && !(lb.is_object() && lb.empty()))
    return bad("logit_bias is not served here");
  if (const auto& rf = field(body, "response_format"); !rf.is_null() && !(rf.is_object() && field(rf, "type") == "text"))
    return bad("response_format: only {\"type\": \"text\"} is served here (no JSON mode or schemas)");
  if (auto s = boolean(body, "store", false); !s || *s) return s ? bad("store: glint stores no completions") : s.error();
  if (const auto& u = field(body, "user"); !u.is_null() && !u.is_string()) return bad("user must be a string");
  if (const auto& m = field(body, "metadata"); !m.is_null() && !m.is_object()) return bad("metadata must be an object");

  auto n = integer(body, "n", 1, 1, limits.max_n);
  if (!n) return n.error();
  auto temperature = number(body, "temperature", 1.0, 0, 2);
  if (!temperature) return temperature.error();
  auto top_p = number(body, "top_p", 1.0, 0, 1);
  if (!top_p) return top_p.error();
  if (*top_p <= 0) return bad("top_p must be above 0");
  auto seed = integer(body, "seed", -1, -1, (int64_t{1} << 62));
  if (!seed) return seed.error();
  auto stream = boolean(body, "stream", false);
  if (!stream) return stream.error();
  r.stream = *stream;
  if (const auto& so = field(body, "stream_options"); !so.is_null()) {
    if (!so.is_object() || !r.stream) return bad("stream_options is an object, and comes with stream: true");
    for (const auto& [k, _] : so.items())
      if (k != "include_usage") return bad("stream_options." + k.substr(0, 40) + " is not served here");
    auto u = boolean(so, "include_usage", false);
    if (!u) return u.error();
    r.include_usage = *u;
  }
  std::vector<std::string> stop;
  if (const auto& s = field(body, "stop"); s.is_string()) {
    stop.push_back(s.get<std::string>());
  } else if (s.is_array()) {
    if (static_cast<int64_t>(s.size()) > limits.max_stop)
      return bad("stop holds at most " + std::to_string(limits.max_stop) + " strings");
    for (const auto& x : s) {
      if (!x.is_string()) return bad("stop must be a string or a list of strings");
      stop.push_back(x.get<std::string>());
    }
  } else if (!s.is_null()) {
    return bad("stop must be a string or a list of strings");
  }
  for (const auto& s : stop)
    if (s.empty()) return bad("stop strings must not be empty");

  if (chat) {
    if (!chat_template)
      return bad("the served model has no chat template (tokenizer_config.json): use /v1/completions");
    auto msgs = messages_of(field(body, "messages"));
    if (!msgs) return with_context(msgs.error(), "messages");
    const auto& tools = field(body, "tools");
    if (!tools.is_null() && !tools.is_array()) return bad("tools must be a list");
    const auto& choice = field(body, "tool_choice");
    if (!choice.is_null() && choice != "auto" && choice != "none")
      return bad("tool_choice: \"auto\" and \"none\" are served here (not \"required\" or a named function)");
    if (auto p = boolean(body, "parallel_tool_calls", true); !p || !*p)
      return p ? bad("parallel_tool_calls: false is not served here (every call the model writes is returned)") : p.error();
    std::string tools_text;
    if (tools.is_array() && !tools.empty()) {
      r.tools = ojson::parse(tools.dump());
      tools_text = tools.dump();
      r.parse_tools = choice != "none";
    }
    auto text = chat_template->render(*msgs, true, tools_text);
    if (!text) return with_context(text.error(), "the model's chat template");
    auto ids = tok.encode(*text);
    if (!ids) return ids.error();
    r.prompt = std::move(*ids);
    auto logprobs = boolean(body, "logprobs", false);
    if (!logprobs) return logprobs.error();
    auto top = integer(body, "top_logprobs", 0, 0, 20);
    if (!top) return top.error();
    if (*top > 0 && !*logprobs) return bad("top_logprobs comes with logprobs: true");
    r.logprobs = *logprobs;
    r.top_logprobs = *top;
    r.params.stop_token_ids = {chat_template->end_of_turn_id()};
  } else {
    if (auto e = boolean(body, "echo", false); !e || *e) return e ? bad("echo is not served here") : e.error();
    if (!field(body, "suffix").is_null()) return bad("suffix is not served here");
    if (auto b = integer(body, "best_of", *n, 1, limits.max_n); !b || *b != *n)
      return b ? bad("best_of other than n is not served here") : b.error();
    auto ids = completion_prompt(field(body, "prompt"), tok);
    if (!ids) return ids.error();
    r.prompt = std::move(*ids);
    if (r.prompt.empty()) return bad("prompt is empty");
    auto logprobs = integer(body, "logprobs", -1, 0, 5);
    if (!logprobs) return logprobs.error();
    r.logprobs = *logprobs >= 0;
    r.top_logprobs = std::max<int64_t>(*logprobs, 0);
  }
  const auto prompt_len = static_cast<int64_t>(r.prompt.size());
  if (prompt_len >= limits.max_context)
    return bad("the prompt is " + std::to_string(prompt_len) + " tokens, the model's context " +
               std::to_string(limits.max_context));
  const int64_t room = limits.max_context - prompt_len;
  int64_t max_tokens = chat ? room : std::min<int64_t>(16, room);
  if (chat && !field(body, "max_tokens").is_null() && !field(body, "max_completion_tokens").is_null() &&
      field(body, "max_tokens") != field(body, "max_completion_tokens"))
    return bad("max_tokens and max_completion_tokens differ: give one");
  for (const char* k : {"max_tokens", "max_completion_tokens"}) {
    if (!chat && std::string{k} == "max_completion_tokens") continue;
    auto m = integer(body, k, -1, 1, int64_t{1} << 30);
    if (!m) return m.error();
    if (*m < 0) continue;
    if (*m > room)
      return bad(std::string{k} + " " + std::to_string(*m) + " with the prompt's " + std::to_string(prompt_len) +
                 " tokens passes the model's context of " + std::to_string(limits.max_context));
    max_tokens = *m;
  }
  auto& p = r.params;
  p.num_samples = *n;
  p.max_tokens = max_tokens;
  p.temperature = *temperature;
  p.top_p = *top_p;
  p.seed = *seed;
  p.stop = std::move(stop);
  p.logprobs = r.logprobs ? r.top_logprobs : -1;
  if (auto ok = p.validate(); !ok) return ok.error();
  return r;
}

Answer answer(const Request& r, const std::vector<Choice>& choices, const components::Tokenizer& tok,
              components::ToolCallFormat format, const std::string& id, int64_t created) {
  int64_t completion_tokens = 0;
  for (const auto& c : choices) completion_tokens += static_cast<int64_t>(c.tokens.size());
  const json usage = {{"prompt_tokens", r.prompt.size()},
                      {"completion_tokens", completion_tokens},
                      {"total_tokens", static_cast<int64_t>(r.prompt.size()) + completion_tokens}};
  const std::string object = r.chat ? (r.stream ? "chat.completion.chunk" : "chat.completion")
                                    : "text_completion";
  auto head = [&] { return json{{"id", id}, {"object", object}, {"created", created}, {"model", r.model}}; };
  std::string events;
  json out_choices = json::array();
  for (size_t i = 0; i < choices.size(); ++i) {
    const auto& c = choices[i];
    const size_t n = reported(c);
    const std::string text = !c.text.empty() ? c.text : tok.decode(std::vector<int64_t>(c.tokens.begin(), c.tokens.begin() + n), true);
    components::ParsedReply reply;
    if (r.chat && r.parse_tools) reply = components::parse_tool_calls(text, format, r.tools);
    const bool calls = !reply.calls.empty();
    const char* finish = c.stop_reason == components::StopReason::length ? "length" : calls ? "tool_calls" : "stop";
    json tool_calls = json::array();
    for (size_t k = 0; k < reply.calls.size(); ++k) {
      const auto& call = reply.calls[k];
      tool_calls.push_back({{"id", call.id.empty() ? id + "-call-" + std::to_string(i) + "-" + std::to_string(k) : call.id},
                            {"type", "function"},
                            {"function", {{"name", call.name}, {"arguments", call.arguments.dump()}}}});
    }
    if (!r.stream) {
      json choice = {{"index", i}, {"finish_reason", finish}};
      if (r.chat) {
        json message = {{"role", "assistant"}};
        message["content"] = calls ? (reply.content.empty() ? json(nullptr) : json(reply.content)) : json(text);
        if (calls) message["tool_calls"] = tool_calls;
        choice["message"] = message;
        choice["logprobs"] = r.logprobs ? json{{"content", chat_logprobs(c, tok, 0, n)}} : json(nullptr);
      } else {
        choice["text"] = text;
        if (r.logprobs) {
          json tokens = json::array(), lps = json::array(), tops = json::array(), offsets = json::array();
          size_t offset = 0;
          for (size_t t = 0; t < n; ++t) {
            const auto piece = token_text(tok, c.tokens[t]);
            tokens.push_back(piece);
            lps.push_back(t < c.logprobs.chosen.size() ? c.logprobs.chosen[t] : 0.f);
            json top = json::object();
            for (int64_t k = 0; k < c.logprobs.k; ++k) {
              const auto at = t * static_cast<size_t>(c.logprobs.k) + static_cast<size_t>(k);
              if (at < c.logprobs.top_ids.size()) top[token_text(tok, c.logprobs.top_ids[at])] = c.logprobs.top_logprobs[at];
            }
            tops.push_back(top);
            offsets.push_back(offset);
            offset += piece.size();
          }
          choice["logprobs"] = {{"tokens", tokens}, {"token_logprobs", lps}, {"top_logprobs", tops}, {"text_offset", offsets}};
        } else {
          choice["logprobs"] = nullptr;
        }
      }
      out_choices.push_back(std::move(choice));
      continue;
    }
    // Streamed: the sample is whole when its chunks are written (they are
    // cut after it, token by token, so a client reads them as it would
    // read tokens arriving).
    auto chunk = [&](json delta, json finish_reason, json logprobs) {
      auto j = head();
      json choice = {{"index", i}, {"finish_reason", std::move(finish_reason)}};
      if (r.chat) {
        choice["delta"] = std::move(delta);
        choice["logprobs"] = std::move(logprobs);
      } else {
        choice["text"] = std::move(delta);
        choice["logprobs"] = nullptr;
      }
      j["choices"] = json::array({std::move(choice)});
      events += sse(j);
    };
    if (r.chat) chunk(json{{"role", "assistant"}, {"content", ""}}, nullptr, nullptr);
    if (calls) {
      if (!reply.content.empty()) chunk(json{{"content", reply.content}}, nullptr, nullptr);
      json deltas = json::array();
      for (size_t k = 0; k < tool_calls.size(); ++k) {
        auto d = tool_calls[k];
        d["index"] = k;
        deltas.push_back(std::move(d));
      }
      chunk(json{{"tool_calls", deltas}}, nullptr, nullptr);
    } else {
      std::string sent;
      for (size_t t = 0; t < n; ++t) {
        const auto so_far = tok.decode(std::vector<int64_t>(c.tokens.begin(), c.tokens.begin() + t + 1), true);
        // A character cut between tokens waits for its last byte.
        if (so_far.size() <= sent.size() || so_far.compare(0, sent.size(), sent) != 0 ||
            so_far.find("\xEF\xBF\xBD", sent.size()) != std::string::npos)
          continue;
        // Nothing past the text (a stop string cuts it).
        if (so_far.size() > text.size() || text.compare(0, so_far.size(), so_far) != 0) break;
        auto piece = so_far.substr(sent.size());
        sent = so_far;
        json lp = r.logprobs ? json{{"content", chat_logprobs(c, tok, t, t + 1)}} : json(nullptr);
        if (r.chat) chunk(json{{"content", piece}}, nullptr, std::move(lp));
        else chunk(json(piece), nullptr, nullptr);
      }
      if (text.size() > sent.size() && text.compare(0, sent.size(), sent) == 0) {
        const auto rest = text.substr(sent.size());
        if (r.chat) chunk(json{{"content", rest}}, nullptr, nullptr);
        else chunk(json(rest), nullptr, nullptr);
      }
    }
    chunk(r.chat ? json::object() : json(""), finish, nullptr);
  }
  if (r.stream) {
    if (r.include_usage) {
      auto j = head();
      j["choices"] = json::array();
      j["usage"] = usage;
      events += sse(j);
    }
    events += "data: [DONE]\n\n";
    return {"text/event-stream", std::move(events)};
  }
  auto j = head();
  j["choices"] = std::move(out_choices);
  j["usage"] = usage;
  return {"application/json", dump(j)};
}

json models(const std::string& base, const std::vector<std::string>& paths, int64_t created) {
  json data = json::array();
  data.push_back({{"id", base}, {"object", "model"}, {"created", created}, {"owned_by", "glint"}});
  for (const auto& p : paths) data.push_back({{"id", p}, {"object", "model"}, {"created", created}, {"owned_by", "you"}});
  return {{"object", "list"}, {"data", data}};
}

json error_json(const caf::error& e) {
  const auto code = code_of(e);
  const char* type = code == errc::invalid_argument || code == errc::not_found || code == errc::failed_precondition
                         ? "invalid_request_error"
                     : code == errc::permission_denied ? "authentication_error"
                     : code == errc::resource_exhausted ? "rate_limit_error"
                                                        : "server_error";
  return {{"error", {{"message", describe(e)}, {"type", type}, {"param", nullptr}, {"code", nullptr}}}};
}

}  // namespace glint::rpc::openai
