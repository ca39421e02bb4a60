#include "components/data/tool_calls.hpp"

#include "components/data/detail/json_depth.hpp"

namespace glint::components {

using json = nlohmann::ordered_json;

std::string_view to_string(ToolCallFormat f) {
  switch (f) {
    case ToolCallFormat::none: return "none";
    case ToolCallFormat::hermes: return "hermes";
    case ToolCallFormat::qwen_xml: return "qwen_xml";
    case ToolCallFormat::llama3: return "llama3";
    case ToolCallFormat::mistral: return "mistral";
  }
  return "none";
}

ToolCallFormat tool_call_format_of(std::string_view t) {
  auto has = [&](std::string_view s) { return t.find(s) != std::string_view::npos; };
  if (has("<function=") && has("<parameter=")) return ToolCallFormat::qwen_xml;
  if (has("<tool_call>")) return ToolCallFormat::hermes;
  if (has("[TOOL_CALLS]")) return ToolCallFormat::mistral;
  if (has("<|start_header_id|>") && has("tool_calls") && (has("\"parameters\"") || has("<|python_tag|>")))
    return ToolCallFormat::llama3;
  return ToolCallFormat::none;
}

namespace {

std::string_view trim(std::string_view s) {
  auto ws = [](char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; };
  while (!s.empty() && ws(s.front())) s.remove_prefix(1);
  while (!s.empty() && ws(s.back())) s.remove_suffix(1);
  return s;
}

// Nesting deeper than this in model text is refused: reading is iterative,
// but copying and writing JSON recurse.
constexpr int kMaxDepth = 64;


json parse_json(std::string_view text) {
  if (detail::json_nests_deeper(text, kMaxDepth)) return json(json::value_t::discarded);
  return json::parse(text.begin(), text.end(), nullptr, false);
}

std::string call_name(size_t n) { return "tool call " + std::to_string(n); }

// A call from a JSON object with "name" and "arguments" (or "parameters"),
// the arguments an object or a string holding one; false with `error` set.
bool call_of_json(const json& j, const std::string& which, ToolCall& out, std::string& error) {
  if (!j.is_object()) {
    error = which + ": expected a JSON object with \"name\" and \"arguments\", got " + std::string{j.type_name()};
    return false;
  }
  if (!j.contains("name") || !j["name"].is_string() || j["name"].get<std::string>().empty()) {
    error = which + ": no \"name\" (a non-empty string)";
    return false;
  }
  out.name = j["name"].get<std::string>();
  if (j.contains("id") && j["id"].is_string()) out.id = j["id"].get<std::string>();
  const char* key = j.contains("arguments") ? "arguments" : j.contains("parameters") ? "parameters" : nullptr;
  if (!key) {
    out.arguments = json::object();
    return true;
  }
  json args = j[key];
  if (args.is_string()) {
    json parsed = parse_json(args.get<std::string>());
    if (parsed.is_discarded()) {
      error = which + " (" + out.name + "): its arguments are a string that is not JSON";
      return false;
    }
    args = std::move(parsed);
  }
  if (!args.is_object()) {
    error = which + " (" + out.name + "): its arguments must be a JSON object, got " + std::string{args.type_name()};
    return false;
  }
  out.arguments = std::move(args);
  return true;
}


void add_json_call(ParsedReply& r, std::string_view body, size_t n) {
  json j = parse_json(trim(body));
  if (j.is_discarded()) {
    r.errors.push_back(call_name(n) + ": invalid JSON: " + std::string{trim(body).substr(0, 200)});
    return;
  }
  ToolCall c;
  std::string error;
  if (call_of_json(j, call_name(n), c, error)) r.calls.push_back(std::move(c));
  else r.errors.push_back(std::move(error));
}

// The blocks between `open` and `close`, each handed to `each`; the text
// outside them is the content. A block never closed is an error.
template <class F>
void blocks(std::string_view text, std::string_view open, std::string_view close, ParsedReply& r, F&& each) {
  std::string content;
  size_t pos = 0, n = 0;
  for (;;) {
    const size_t at = text.find(open, pos);
    if (at == std::string_view::npos) {
      content += text.substr(pos);
      break;
    }
    content += text.substr(pos, at - pos);
    ++n;
    const size_t body = at + open.size(), end = text.find(close, body);
    if (end == std::string_view::npos) {
      r.errors.push_back(call_name(n) + ": " + std::string{open} + " is never closed by " + std::string{close});
      break;
    }
    each(text.substr(body, end - body), n);
    pos = end + close.size();
  }
  r.content = std::string{trim(content)};
}

// The schema type of a tool's parameter, or "".
std::string parameter_type(const json& tools, const std::string& function, const std::string& parameter) {
  if (!tools.is_array()) return "";
  for (const auto& t : tools) {
    const json& f = t.contains("function") ? t["function"] : t;
    if (!f.is_object() || !f.contains("name") || !f["name"].is_string() || f["name"].get<std::string>() != function) continue;
    const json* props = f.contains("parameters") && f["parameters"].is_object() && f["parameters"].contains("properties")
                            ? &f["parameters"]["properties"]
                            : nullptr;
    if (props && props->is_object() && props->contains(parameter) && (*props)[parameter].is_object()) {
      const json& type = (*props)[parameter].contains("type") ? (*props)[parameter]["type"] : json{};
      if (type.is_string()) return type.get<std::string>();
      // ["string", "null"]: a string if it may be one
      if (type.is_array())
        for (const auto& t : type)
          if (t == "string") return "string";
      return type.is_null() ? "" : "any";
    }
  }
  return "";
}

void add_xml_call(ParsedReply& r, std::string_view body, size_t n, const json& tools) {
  const std::string which = call_name(n);
  const size_t f = body.find("<function=");
  const size_t name_end = f == std::string_view::npos ? f : body.find('>', f);
  if (name_end == std::string_view::npos) {
    r.errors.push_back(which + ": no <function=NAME> in the <tool_call> block");
    return;
  }
  ToolCall c;
  c.name = std::string{trim(body.substr(f + 10, name_end - f - 10))};
  if (c.name.empty()) {
    r.errors.push_back(which + ": an empty function name");
    return;
  }
  const size_t fend = body.find("</function>", name_end);
  if (fend == std::string_view::npos) {
    r.errors.push_back(which + " (" + c.name + "): <function=" + c.name + "> is never closed by </function>");
    return;
  }
  std::string_view params = body.substr(name_end + 1, fend - name_end - 1);
  for (size_t at = params.find("<parameter="); at != std::string_view::npos; at = params.find("<parameter=", at)) {
    const size_t key_end = params.find('>', at);
    const size_t value_end = key_end == std::string_view::npos ? key_end : params.find("</parameter>", key_end);
    if (value_end == std::string_view::npos) {
      r.errors.push_back(which + " (" + c.name + "): a <parameter=...> is never closed by </parameter>");
      return;
    }
    const std::string key{trim(params.substr(at + 11, key_end - at - 11))};
    std::string_view value = params.substr(key_end + 1, value_end - key_end - 1);
    if (value.starts_with("\n")) value.remove_prefix(1);
    if (value.ends_with("\n")) value.remove_suffix(1);
    // A value is the text, unless the tool's schema types it otherwise (or,
    // without one, it is a JSON object or list, as the template writes those).
    const std::string type = parameter_type(tools, c.name, key);
    json v = value;
    if (type != "string") {
      json parsed = parse_json(value);
      if (!parsed.is_discarded() && (!type.empty() || parsed.is_object() || parsed.is_array())) v = std::move(parsed);
    }
    c.arguments[key] = std::move(v);
    at = value_end;
  }
  r.calls.push_back(std::move(c));
}

void parse_llama3(std::string_view text, ParsedReply& r) {
  std::string_view t = trim(text);
  const bool tagged = t.starts_with("<|python_tag|>");
  if (tagged) t = trim(t.substr(14));
  if (!t.starts_with("{")) {
    r.content = std::string{trim(text)};
    if (tagged) r.errors.push_back("tool call 1: <|python_tag|> is not followed by a JSON call");
    return;
  }
  json whole = parse_json(t);
  if (!whole.is_discarded()) {
    add_json_call(r, t, 1);
    return;
  }
  // Several calls, separated by ';' between top-level objects.
  size_t n = 0, depth = 0, start = 0;
  bool in_string = false;
  for (size_t i = 0; i < t.size(); ++i) {
    const char c = t[i];
    if (in_string) {
      if (c == '\\') ++i;
      else if (c == '"') in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '{') {
      ++depth;
    } else if (c == '}') {
      if (depth > 0) --depth;
    } else if (c == ';' && depth == 0) {
      add_json_call(r, t.substr(start, i - start), ++n);
      start = i + 1;
    }
  }
  if (!trim(t.substr(start)).empty()) add_json_call(r, t.substr(start), ++n);
}

void parse_mistral(std::string_view text, ParsedReply& r) {
  const size_t at = text.find("[TOOL_CALLS]");
  if (at == std::string_view::npos) {
    r.content = std::string{trim(text)};
    return;
  }
  r.content = std::string{trim(text.substr(0, at))};
  std::string_view rest = trim(text.substr(at + 12));
  if (rest.starts_with("[")) {
    json list = parse_json(rest);
    if (list.is_discarded()) {  // text after the list
      const size_t close = rest.rfind(']');
      list = close == std::string_view::npos ? json{} : parse_json(rest.substr(0, close + 1));
    }
    if (!list.is_array()) {
      r.errors.push_back("tool call 1: [TOOL_CALLS] is not followed by a JSON list of calls: " +
                         std::string{rest.substr(0, 200)});
      return;
    }
    size_t n = 0;
    for (const auto& j : list) {
      ToolCall c;
      std::string error;
      if (call_of_json(j, call_name(++n), c, error)) r.calls.push_back(std::move(c));
      else r.errors.push_back(std::move(error));
    }
    return;
  }
  // NAME[ARGS]{...}, each call after a [TOOL_CALLS] of its own.
  size_t n = 0;
  for (size_t pos = 0; pos < rest.size();) {
    const size_t next = rest.find("[TOOL_CALLS]", pos);
    std::string_view one = trim(rest.substr(pos, next == std::string_view::npos ? std::string_view::npos : next - pos));
    pos = next == std::string_view::npos ? rest.size() : next + 12;
    if (one.empty()) continue;
    ++n;
    const size_t args = one.find("[ARGS]");
    if (args == std::string_view::npos) {
      r.errors.push_back(call_name(n) + ": no [ARGS] after the function name");
      continue;
    }
    json body = {{"name", std::string{trim(one.substr(0, args))}}};
    json a = parse_json(trim(one.substr(args + 6)));
    if (a.is_discarded()) {
      r.errors.push_back(call_name(n) + " (" + body["name"].get<std::string>() + "): its arguments are not JSON");
      continue;
    }
    body["arguments"] = std::move(a);
    ToolCall c;
    std::string error;
    if (call_of_json(body, call_name(n), c, error)) r.calls.push_back(std::move(c));
    else r.errors.push_back(std::move(error));
  }
}

}  // namespace

ParsedReply parse_tool_calls(std::string_view text, ToolCallFormat format, const json& tools) {
  // A completion may end with its end-of-turn token as text.
  text = trim(text);
  for (std::string_view end : {"<|im_end|>", "<|eot_id|>", "<|eom_id|>", "<|end|>", "<|endoftext|>", "</s>"})
    if (text.ends_with(end)) {
      text = trim(text.substr(0, text.size() - end.size()));
      break;
    }
  ParsedReply r;
  switch (format) {
    case ToolCallFormat::none: r.content = std::string{trim(text)}; break;
    case ToolCallFormat::hermes:
      blocks(text, "<tool_call>", "</tool_call>", r, [&](std::string_view body, size_t n) { add_json_call(r, body, n); });
      break;
    case ToolCallFormat::qwen_xml:
      blocks(text, "<tool_call>", "</tool_call>", r,
             [&](std::string_view body, size_t n) { add_xml_call(r, body, n, tools); });
      break;
    case ToolCallFormat::llama3: parse_llama3(text, r); break;
    case ToolCallFormat::mistral: parse_mistral(text, r); break;
  }
  return r;
}

json to_openai(const std::vector<ToolCall>& calls) {
  json out = json::array();
  for (size_t i = 0; i < calls.size(); ++i)
    out.push_back({{"id", calls[i].id.empty() ? "call_" + std::to_string(i + 1) : calls[i].id},
                   {"type", "function"},
                   {"function", {{"name", calls[i].name}, {"arguments", calls[i].arguments}}}});
  return out;
}

}  // namespace glint::components
