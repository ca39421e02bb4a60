#pragma once
/// Conversations with tools in the layouts agent datasets use, read into
/// messages a model's own chat template renders (Dataset reads rows with it):
///
/// - OpenAI's: `{"tools": [...], "messages": [{"role": "assistant",
///   "content": null, "tool_calls": [{"type": "function", "function":
///   {"name", "arguments"}}]}, {"role": "tool", "tool_call_id", "content"}]}`;
/// - ms-swift's agent rows: `"tools"` as a JSON string, and messages with the
///   roles `tool_call` (its content the call's JSON: `{"name", "arguments"}`)
///   and `tool_response`, which become an assistant message's tool_calls
///   (consecutive calls in one message, joined to an assistant message just
///   before that has none) and `tool` messages;
/// - ShareGPT's: `"conversations": [{"from": "human" | "gpt" | "system" |
///   "function_call" | "observation", "value"}]`, with `"system"` and
///   `"tools"` beside it.
///
/// A message's fields besides role and content (tool_calls, tool_call_id,
/// name, reasoning_content, ...) are kept, in their order, as
/// Message::extra. Errors name what is wrong (the row is skipped with it).

#include "components/data/template.hpp"
#include "runtime/error.hpp"

#include <nlohmann/json.hpp>

#include <string>
#include <vector>

namespace glint::components {

/// The messages of a "messages" list (OpenAI's or ms-swift's roles) or,
/// with `sharegpt`, of a "conversations" list of {"from", "value"}.
Result<std::vector<Message>> agent_messages(const nlohmann::ordered_json& list, bool sharegpt);

/// Whether `list` is a ShareGPT conversation ({"from", "value"} objects).
bool is_sharegpt(const nlohmann::ordered_json& list);

/// A row's "tools": a JSON list, or a string holding one. Its JSON text.
Result<std::string> agent_tools(const nlohmann::ordered_json& tools);

/// A message as the chat template sees it: role, content and its extra fields.
nlohmann::ordered_json message_json(const Message& m);

}  // namespace glint::components
