#pragma once
/// Tool calls in what a model wrote: the calls parsed out of a completion in
/// the format the model's chat template renders them in, so that an agent's
/// loop can run them and an OpenAI-style reply can carry them:
///
///   auto format = tool_call_format_of(*tokenizer.config().chat_template);
///   auto reply = parse_tool_calls(completion_text, format);
///   for (const auto& call : reply.calls) run(call.name, call.arguments);
///   for (const auto& e : reply.errors) observe(e);   // a malformed call, said back to the model
///
/// The formats:
/// - hermes: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`
///   blocks (Qwen2.5, Qwen3, QwQ, Hermes);
/// - qwen_xml: `<tool_call><function=NAME><parameter=KEY>VALUE</parameter>
///   </function></tool_call>` (Qwen3.5, Qwen3-Coder); a value is JSON where
///   it reads as JSON and the tool's schema does not make it a string, else
///   the text;
/// - llama3: a JSON object `{"name": ..., "parameters": {...}}` as the whole
///   reply, after an optional `<|python_tag|>`; several separated by `;`
///   (Llama 3.1, 3.2);
/// - mistral: `[TOOL_CALLS]` then a JSON list of `{"name", "arguments",
///   "id"}`, or `NAME[ARGS]{...}` per call (Mistral's later tokenizers).
///
/// A trailing end-of-turn token (<|im_end|>, <|eot_id|>, </s>, ...) is not
/// part of the reply. A call that cannot be read (invalid JSON, no name, a block never closed)
/// is not a crash and not silently dropped: it becomes an entry of `errors`
/// naming the call and what is wrong, for the model to be told, and the
/// other calls stand. Pure functions; thread-safe.

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace glint::components {

enum class ToolCallFormat : uint8_t { none, hermes, qwen_xml, llama3, mistral };
std::string_view to_string(ToolCallFormat f);

/// The format a chat template renders assistant tool calls in, from its
/// text; none where it renders none glint reads.
ToolCallFormat tool_call_format_of(std::string_view chat_template);

struct ToolCall {
  std::string id;  ///< the model's (Mistral's), else "" (the caller numbers them)
  std::string name;
  nlohmann::ordered_json arguments = nlohmann::ordered_json::object();
};

struct ParsedReply {
  std::string content;  ///< the text outside the calls, trimmed
  std::vector<ToolCall> calls;
  std::vector<std::string> errors;  ///< one per call that could not be read
};

/// `tools` (OpenAI's function list, or null) types qwen_xml's parameters.
ParsedReply parse_tool_calls(std::string_view text, ToolCallFormat format,
                             const nlohmann::ordered_json& tools = nullptr);

/// The calls as an assistant message's OpenAI `tool_calls` (ids "call_N"
/// where the model gave none; arguments as an object, as chat templates
/// read them).
nlohmann::ordered_json to_openai(const std::vector<ToolCall>& calls);

}  // namespace glint::components
