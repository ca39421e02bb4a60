#include "components/data/agent_rows.hpp"

namespace glint::components {

using json = nlohmann::ordered_json;

namespace {

// A call from ms-swift's tool_call content: {"name", "arguments"} (the
// arguments an object, or a string holding one).
Result<json> call_of(const std::string& content, size_t index) {
  const std::string which = "message " + std::to_string(index) + " (a tool_call)";
  json j = json::parse(content, nullptr, false);
  if (j.is_discarded() || !j.is_object() || !j.contains("name") || !j["name"].is_string())
    return make_error(errc::invalid_argument, which + " is not a JSON object with a \"name\"");
  json args = j.contains("arguments") ? j["arguments"] : j.contains("parameters") ? j["parameters"] : json::object();
  if (args.is_string()) {
    json parsed = json::parse(args.get<std::string>(), nullptr, false);
    if (parsed.is_discarded()) return make_error(errc::invalid_argument, which + "'s arguments are a string that is not JSON");
    args = std::move(parsed);
  }
  if (!args.is_object()) return make_error(errc::invalid_argument, which + "'s arguments are not a JSON object");
  return json{{"type", "function"}, {"function", {{"name", j["name"]}, {"arguments", std::move(args)}}}};
}

std::string role_of_sharegpt(const std::string& from) {
  if (from == "human" || from == "user") return "user";
  if (from == "gpt" || from == "assistant") return "assistant";
  if (from == "system") return "system";
  if (from == "function_call" || from == "tool_call") return "tool_call";
  if (from == "observation" || from == "tool" || from == "tool_response" || from == "function") return "tool_response";
  return "";
}

}  // namespace

bool is_sharegpt(const json& list) {
  return list.is_array() && !list.empty() && std::all_of(list.begin(), list.end(), [](const json& m) {
           return m.is_object() && m.contains("from") && m.contains("value") && m["from"].is_string();
         });
}

Result<std::vector<Message>> agent_messages(const json& list, bool sharegpt) {
  if (!list.is_array()) return make_error(errc::invalid_argument, sharegpt ? "\"conversations\" is not an array" : "\"messages\" is not an array");
  std::vector<Message> out;
  std::vector<json> extras;  // per message of `out`
  for (size_t i = 0; i < list.size(); ++i) {
    const json& m = list[i];
    std::string role, content;
    json extra = json::object();
    if (sharegpt) {
      if (!m.is_object() || !m.contains("from") || !m["from"].is_string() || !m.contains("value") || !m["value"].is_string())
        return make_error(errc::invalid_argument, "conversation turn " + std::to_string(i) + " lacks a string \"from\" or \"value\"");
      role = role_of_sharegpt(m["from"].get<std::string>());
      if (role.empty())
        return make_error(errc::invalid_argument, "conversation turn " + std::to_string(i) + " is from '" +
                                                      m["from"].get<std::string>() +
                                                      "'; use human, gpt, system, function_call or observation");
      content = m["value"].get<std::string>();
    } else {
      if (!m.is_object() || !m.contains("role") || !m["role"].is_string())
        return make_error(errc::invalid_argument, "a message lacks a string \"role\" or \"content\"");
      role = m["role"].get<std::string>();
      const bool has_calls = m.contains("tool_calls") && m["tool_calls"].is_array() && !m["tool_calls"].empty();
      if (m.contains("content") && !m["content"].is_string() && !m["content"].is_null())
        return make_error(errc::invalid_argument, "message " + std::to_string(i) + "'s \"content\" is not a string");
      if (!m.contains("content") && !has_calls)
        return make_error(errc::invalid_argument, "a message lacks a string \"role\" or \"content\"");
      if (m.contains("content") && m["content"].is_string()) content = m["content"].get<std::string>();
      // A null content stays null, first (where message_json writes it back),
      // so that a row saved and read again has the same fields in the same order.
      if (m.contains("content") && m["content"].is_null()) extra["content"] = nullptr;
      for (const auto& [k, v] : m.items())
        if (k != "role" && k != "content") extra[k] = v;
    }
    if (role == "tool_call") {
      auto call = call_of(content, i);
      if (!call) return call.error();
      // Consecutive calls share one assistant message; so does an assistant
      // message just before that made none.
      if (!out.empty() && out.back().role == "assistant" &&
          (!extras.back().contains("tool_calls") || extras.back()["tool_calls"].is_array())) {
        extras.back()["tool_calls"].push_back(std::move(*call));
      } else {
        out.push_back({"assistant", ""});
        extras.push_back({{"tool_calls", json::array({std::move(*call)})}});
      }
      continue;
    }
    if (role == "tool_response") role = "tool";
    out.push_back({role, content});
    extras.push_back(std::move(extra));
  }
  for (size_t i = 0; i < out.size(); ++i)
    if (!extras[i].empty()) out[i].extra = extras[i].dump();
  return out;
}

Result<std::string> agent_tools(const json& tools) {
  json list = tools;
  if (tools.is_string()) {
    list = json::parse(tools.get<std::string>(), nullptr, false);
    if (list.is_discarded()) return make_error(errc::invalid_argument, "\"tools\" is a string that is not JSON");
  }
  if (!list.is_array()) return make_error(errc::invalid_argument, "\"tools\" is not a JSON list of tools");
  for (const auto& t : list)
    if (!t.is_object()) return make_error(errc::invalid_argument, "an entry of \"tools\" is not a JSON object");
  return list.dump();
}

json message_json(const Message& m) {
  json j = {{"role", m.role}, {"content", m.content}};
  if (!m.extra.empty()) {
    json extra = json::parse(m.extra, nullptr, false);
    if (extra.is_object())
      for (const auto& [k, v] : extra.items()) j[k] = v;
  }
  return j;
}

}  // namespace glint::components
