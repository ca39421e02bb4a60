// Tool calls read back out of model text: each format on its own cases
// (several calls, text around them, malformed calls as errors), and a round
// trip through the real chat templates: an assistant message with tool calls
// rendered by the template (glint's Jinja interpreter) parses back, in the
// format the template is recognised as, to the same calls.
#include "components/data/tool_calls.hpp"

#include "components/data/chat_render.hpp"
#include "components/data/jinja.hpp"
#include "runtime/file.hpp"

#include <gtest/gtest.h>

namespace glint::components {
namespace {

using json = nlohmann::ordered_json;

std::string fixture(const std::string& name) {
  auto text = read_text_file(std::string{GLINT_TEST_SOURCE_DIR} + "/data/chat_templates/" + name);
  EXPECT_TRUE(text) << name;
  return text ? *text : "";
}

TEST(ToolCalls, EachTemplateIsRecognisedAsTheFormatItRendersCallsIn) {
  for (const auto& [file, format] : std::vector<std::pair<std::string, ToolCallFormat>>{
           {"qwen2.5.jinja", ToolCallFormat::hermes},
           // qwen3.jinja is Qwen3's template cut down to what the C++ format renders: no tool calls.
           {"qwen3.jinja", ToolCallFormat::none},
           {"qwq.jinja", ToolCallFormat::hermes},           {"hermes.jinja", ToolCallFormat::hermes},
           {"qwen3.5.jinja", ToolCallFormat::qwen_xml},     {"llama3.1-full.jinja", ToolCallFormat::llama3},
           {"llama3.2.jinja", ToolCallFormat::llama3},      {"mistral.jinja", ToolCallFormat::mistral},
           {"chatml_glint.jinja", ToolCallFormat::none},    {"gemma.jinja", ToolCallFormat::none},
           {"llama3.jinja", ToolCallFormat::none}})
    EXPECT_EQ(to_string(tool_call_format_of(fixture(file))), to_string(format)) << file;
}

TEST(ToolCalls, HermesBlocksWithTextAroundThemAndAMalformedOneAsAnError) {
  auto r = parse_tool_calls("Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Zürich\"}}\n"
                            "</tool_call>\n<tool_call>\n{\"name\": \"calculator\", \"arguments\": \"{\\\"expression\\\": \\\"1+1\\\"}\"}"
                            "\n</tool_call>\n<tool_call>{\"name\": broken</tool_call><tool_call>{\"arguments\": {}}</tool_call>",
                            ToolCallFormat::hermes);
  EXPECT_EQ(r.content, "Let me check.");
  ASSERT_EQ(r.calls.size(), 2u);
  EXPECT_EQ(r.calls[0].name, "get_weather");
  EXPECT_EQ(r.calls[0].arguments, (json{{"city", "Zürich"}}));
  EXPECT_EQ(r.calls[1].arguments, (json{{"expression", "1+1"}})) << "arguments given as a JSON string";
  ASSERT_EQ(r.errors.size(), 2u);
  EXPECT_NE(r.errors[0].find("tool call 3: invalid JSON"), std::string::npos) << r.errors[0];
  EXPECT_NE(r.errors[1].find("tool call 4: no \"name\""), std::string::npos) << r.errors[1];
  auto open = parse_tool_calls("<tool_call>{\"name\": \"f\", \"arguments\": {}}", ToolCallFormat::hermes);
  EXPECT_TRUE(open.calls.empty());
  ASSERT_EQ(open.errors.size(), 1u);
  EXPECT_NE(open.errors[0].find("never closed"), std::string::npos);
  EXPECT_EQ(parse_tool_calls("  just text\n", ToolCallFormat::hermes).content, "just text");
}

TEST(ToolCalls, QwenXmlParametersAreTypedByTheToolsSchema) {
  const json tools = json::parse(R"([{"type": "function", "function": {"name": "f", "parameters": {"type": "object",
      "properties": {"n": {"type": "integer"}, "s": {"type": "string"}, "o": {"type": "object"}}}}}])");
  const std::string text = "<tool_call>\n<function=f>\n<parameter=n>\n42\n</parameter>\n<parameter=s>\n42\n</parameter>\n"
                           "<parameter=o>\n{\"k\": [1, 2]}\n</parameter>\n<parameter=free>\nmulti\nline\n</parameter>\n"
                           "</function>\n</tool_call>";
  auto r = parse_tool_calls(text, ToolCallFormat::qwen_xml, tools);
  ASSERT_EQ(r.calls.size(), 1u) << (r.errors.empty() ? "" : r.errors[0]);
  EXPECT_EQ(r.calls[0].arguments, json::parse(R"({"n": 42, "s": "42", "o": {"k": [1, 2]}, "free": "multi\nline"})"));
  // A schema's type may be a list; a name may be anything: no throw.
  const json odd = json::parse(R"([{"function": {"name": 5}}, {"type": "function", "function": {"name": "f",
      "parameters": {"properties": {"n": {"type": ["string", "null"]}, "m": {"type": ["integer", "null"]}}}}}])");
  auto typed = parse_tool_calls("<tool_call><function=f><parameter=n>1</parameter><parameter=m>2</parameter></function></tool_call>",
                                ToolCallFormat::qwen_xml, odd);
  ASSERT_EQ(typed.calls.size(), 1u);
  EXPECT_EQ(typed.calls[0].arguments, json::parse(R"({"n": "1", "m": 2})"));
  std::string deep = "<tool_call>{\"name\": \"f\", \"arguments\": {\"a\": " + std::string(1000, '[') + std::string(1000, ']') + "}}</tool_call>";
  auto too_deep = parse_tool_calls(deep, ToolCallFormat::hermes);
  EXPECT_TRUE(too_deep.calls.empty());
  EXPECT_EQ(too_deep.errors.size(), 1u);
  auto bad = parse_tool_calls("<tool_call>\n<function=f>\n<parameter=n>\n1\n</function>\n</tool_call>", ToolCallFormat::qwen_xml);
  EXPECT_TRUE(bad.calls.empty());
  ASSERT_EQ(bad.errors.size(), 1u);
  EXPECT_NE(bad.errors[0].find("never closed by </parameter>"), std::string::npos) << bad.errors[0];
}

TEST(ToolCalls, Llama3AndMistralCalls) {
  auto one = parse_tool_calls("<|python_tag|>{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Oslo\"}}",
                              ToolCallFormat::llama3);
  ASSERT_EQ(one.calls.size(), 1u);
  EXPECT_EQ(one.calls[0].arguments, (json{{"city", "Oslo"}}));
  auto two = parse_tool_calls("{\"name\": \"a\", \"parameters\": {\"x\": \"};\"}}; {\"name\": \"b\", \"parameters\": {}}",
                              ToolCallFormat::llama3);
  ASSERT_EQ(two.calls.size(), 2u);
  EXPECT_EQ(two.calls[0].arguments, (json{{"x", "};"}}));
  EXPECT_EQ(parse_tool_calls("The answer is 4.", ToolCallFormat::llama3).content, "The answer is 4.");
  auto m = parse_tool_calls("[TOOL_CALLS][{\"name\": \"f\", \"arguments\": {\"a\": 1}, \"id\": \"abcdefghi\"}, {\"name\": 3}]</s>",
                            ToolCallFormat::mistral);
  ASSERT_EQ(m.calls.size(), 1u);
  EXPECT_EQ(m.calls[0].id, "abcdefghi");
  ASSERT_EQ(m.errors.size(), 1u);
  auto v11 = parse_tool_calls("[TOOL_CALLS]f[ARGS]{\"a\": 1}[TOOL_CALLS]g[ARGS]{oops}", ToolCallFormat::mistral);
  ASSERT_EQ(v11.calls.size(), 1u);
  EXPECT_EQ(v11.calls[0].name, "f");
  ASSERT_EQ(v11.errors.size(), 1u);
  EXPECT_NE(v11.errors[0].find("not JSON"), std::string::npos);
}

// What the template renders for an assistant turn with tool calls reads back
// as those calls, in the format glint recognises the template as.
TEST(ToolCalls, ACallRenderedByEachTemplateParsesBackToTheSameCall) {
  const json tools = json::parse(R"([{"type": "function", "function": {"name": "get_weather", "description": "Weather.",
      "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"},
      "opts": {"type": "object"}}, "required": ["city"]}}}])");
  const json arguments = {{"city", "Zürich"}, {"days", 3}, {"opts", {{"metric", true}}}};
  for (const char* file : {"qwen2.5.jinja", "qwq.jinja", "hermes.jinja", "qwen3.5.jinja", "llama3.1-full.jinja",
                           "llama3.2.jinja", "mistral.jinja"}) {
    auto t = JinjaTemplate::parse(fixture(file), file);
    ASSERT_TRUE(t) << describe(t.error());
    ChatInput in;
    in.tools = tools;
    in.messages = json::array({{{"role", "user"}, {"content", "Weather in Zürich?"}},
                               {{"role", "assistant"},
                                {"content", ""},
                                {"tool_calls", json::array({{{"id", "abcdefghi"},
                                                             {"type", "function"},
                                                             {"function", {{"name", "get_weather"}, {"arguments", arguments}}}}})}}});
    auto chat = render_chat(*t, in, {{"bos_token", "<s>"}, {"eos_token", "</s>"}});
    ASSERT_TRUE(chat) << file << ": " << describe(chat.error());
    ASSERT_EQ(chat->learned.size(), 1u) << file;
    const std::string turn = chat->text.substr(chat->learned[0].first, chat->learned[0].second - chat->learned[0].first);
    auto r = parse_tool_calls(turn, tool_call_format_of(fixture(file)), tools);
    ASSERT_EQ(r.calls.size(), 1u) << file << ": " << turn << (r.errors.empty() ? "" : "\n" + r.errors[0]);
    EXPECT_TRUE(r.errors.empty()) << file;
    EXPECT_EQ(r.calls[0].name, "get_weather") << file;
    EXPECT_EQ(r.calls[0].arguments, arguments) << file << ": " << turn;
  }
}

TEST(ToolCalls, AsOpenAiToolCalls) {
  std::vector<ToolCall> calls = {{"", "f", {{"a", 1}}}, {"given", "g", json::object()}};
  EXPECT_EQ(to_openai(calls), json::parse(R"([{"id": "call_1", "type": "function", "function": {"name": "f", "arguments": {"a": 1}}},
      {"id": "given", "type": "function", "function": {"name": "g", "arguments": {}}}])"));
}

}  // namespace
}  // namespace glint::components
