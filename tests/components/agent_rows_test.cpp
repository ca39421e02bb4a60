// Agent data for SFT: OpenAI's tool-call messages, ms-swift's agent rows,
// ShareGPT and CSV read into messages, and trained through the model's own
// chat template: only the assistant's tokens (its tool calls included) are
// learned, never the tool's results.
#include "components/data/agent_rows.hpp"
#include "components/data/dataset.hpp"
#include "runtime/file.hpp"
#include "support/tokenizers.hpp"

#include "support/temp_dir.hpp"

#include <gtest/gtest.h>

#include <sstream>

namespace glint::components {
namespace {

using json = nlohmann::ordered_json;

Dataset parse(const std::string& name, const std::string& text) {
  std::istringstream in{text};
  auto ds = Dataset::parse(in, {.path = name, .log = [](const std::string&) {}});
  EXPECT_TRUE(ds) << describe(ds.error());
  return std::move(*ds);
}

// A ChatML tokenizer whose chat template is Qwen2.5's: a C++ format renders
// plain rows, and its own template the rows with tools.
std::shared_ptr<const Tokenizer> qwen25() {
  auto text = read_text_file(std::string{GLINT_TEST_SOURCE_DIR} + "/data/chat_templates/qwen2.5.jinja");
  EXPECT_TRUE(text);
  TokenizerConfig config;
  config.chat_template = *text;
  config.chat_template_origin = "qwen2.5.jinja";
  return glint::testing::chat_tokenizer(std::move(config));
}

std::string learned_text(const Template& t, const EncodedRow& row) {
  std::vector<int64_t> ids;
  for (size_t i = 0; i + 1 < row.input_ids.size(); ++i)
    if (row.loss_mask[i] == 1.f) ids.push_back(row.input_ids[i + 1]);
  return t.tokenizer().decode(ids, /*skip_special=*/false);
}

const char* kTools = R"([{"type": "function", "function": {"name": "get_weather", "description": "Weather.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}])";

TEST(AgentRows, OpenAiAndMsSwiftAndShareGptLayoutsReadAsTheSameConversation) {
  const std::string openai = std::string{R"({"tools": )"} + kTools + R"(, "messages": [{"role": "user", "content": "Weather in Zürich?"},
      {"role": "assistant", "content": null, "tool_calls": [{"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Zürich"}}}]},
      {"role": "tool", "content": "21C"}, {"role": "assistant", "content": "It is 21C."}]})";
  const std::string swift = R"({"tools": "[{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"description\": \"Weather.\", \"parameters\": {\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\"}}}}}]",
      "messages": [{"role": "user", "content": "Weather in Zürich?"},
      {"role": "tool_call", "content": "{\"name\": \"get_weather\", \"arguments\": \"{\\\"city\\\": \\\"Zürich\\\"}\"}"},
      {"role": "tool_response", "content": "21C"}, {"role": "assistant", "content": "It is 21C."}]})";
  const std::string sharegpt = R"({"tools": "[{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"description\": \"Weather.\", \"parameters\": {\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\"}}}}}]",
      "system": "Use tools.", "conversations": [{"from": "human", "value": "Weather in Zürich?"},
      {"from": "function_call", "value": "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Zürich\"}}"},
      {"from": "observation", "value": "21C"}, {"from": "gpt", "value": "It is 21C."}]})";
  auto ds = parse("agent.json", "[" + openai + ",\n" + swift + ",\n" + sharegpt + "]");
  ASSERT_EQ(ds.size(), 3u) << ds.skipped().summary();
  const auto& a = ds.row(0);
  ASSERT_EQ(a.messages.size(), 4u);
  EXPECT_EQ(json::parse(a.tools), json::parse(kTools));
  EXPECT_EQ(json::parse(a.messages[1].extra)["tool_calls"][0]["function"]["arguments"], (json{{"city", "Zürich"}}));
  EXPECT_TRUE(json::parse(a.messages[1].extra)["content"].is_null()) << "a null content stays null";
  // ms-swift's: the call becomes the assistant's tool_calls, the response a tool message.
  const auto& b = ds.row(1);
  ASSERT_EQ(b.messages.size(), 4u);
  EXPECT_EQ(b.messages[1].role, "assistant");
  EXPECT_EQ(json::parse(b.messages[1].extra)["tool_calls"], json::parse(a.messages[1].extra)["tool_calls"]);
  EXPECT_EQ(b.messages[2].role, "tool");
  EXPECT_EQ(b.tools, a.tools);
  // ShareGPT's: the same, its system prompt first.
  const auto& c = ds.row(2);
  ASSERT_EQ(c.messages.size(), 5u);
  EXPECT_EQ(c.messages[0].role, "system");
  EXPECT_EQ(c.messages[0].content, "Use tools.");
  EXPECT_EQ(c.messages[2].extra, b.messages[1].extra);
  EXPECT_EQ(c.messages[4].role, "assistant");
}

TEST(AgentRows, ToolRowsTrainTheAssistantsCallsAndAnswerNeverTheToolsResult) {
  const std::string row = std::string{R"({"tools": )"} + kTools + R"(, "messages": [{"role": "user", "content": "Weather in Zürich?"},
      {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Zürich"}}}]},
      {"role": "tool", "content": "21C"}, {"role": "assistant", "content": "It is 21C."}]})";
  auto ds = parse("agent.json", "[" + row + ",\n" + R"({"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}]})" "]");
  auto t = Template::make(qwen25(), {});
  ASSERT_TRUE(t) << describe(t.error());
  EXPECT_EQ(t->options().name, "qwen2.5") << "plain rows keep the C++ format";
  ds.set_template(*t);
  ASSERT_TRUE(ds.encode());
  ASSERT_EQ(ds.size(), 2u) << ds.skipped().summary();
  EXPECT_EQ(learned_text(*t, ds.encoded(0)),
            "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Zürich\"}}\n</tool_call><|im_end|>"
            "It is 21C.<|im_end|>");
  EXPECT_EQ(learned_text(*t, ds.encoded(1)), "Hello<|im_end|>");
  // The rendered row is the template's, tools in its system turn.
  auto text = t->render(ds.row(0).messages, false, ds.row(0).tools);
  ASSERT_TRUE(text);
  EXPECT_NE(text->find("<tools>\n{\"type\": \"function\""), std::string::npos) << *text;
  EXPECT_NE(text->find("<tool_response>\n21C\n</tool_response>"), std::string::npos) << *text;
  // As the template alone renders it: the C++ format's default system
  // message (found in the template) is not put in a second time.
  auto interp = Template::make(qwen25(), {.name = "jinja"});
  ASSERT_TRUE(interp);
  EXPECT_EQ(*text, *interp->render(ds.row(0).messages, false, ds.row(0).tools));
  EXPECT_EQ(ds.encoded(0), *interp->encode(ds.row(0).messages, false, ds.row(0).tools));
  // A format with no template of the model's to fall back on refuses such a row by name.
  auto bare = Template::make(glint::testing::chat_tokenizer(), {.name = "chatml"});
  ASSERT_TRUE(bare);
  auto refused = bare->encode(ds.row(0).messages, false, ds.row(0).tools);
  ASSERT_FALSE(refused);
  EXPECT_NE(describe(refused.error()).find("does not render"), std::string::npos) << describe(refused.error());
}

TEST(AgentRows, ANullContentBesideOtherFieldsSavesAndReadsBackTheSame) {
  // Found by fuzz_dataset: the null content moved after the other fields
  // when saved, so the row read back had its fields in another order.
  auto ds = parse("null.jsonl", R"({"messages": [{"rt i": "user", "role": "user", "content": null}, {"role": "assistant", "content": "ok"}]})");
  ASSERT_EQ(ds.size(), 1u) << ds.skipped().summary();
  auto dir = glint::testing::fresh_dir("agent-rows-null");
  std::vector<Row> rows{ds.row(0)};
  ASSERT_TRUE(save_jsonl(rows, dir + "/rows.jsonl"));
  auto back = Dataset::load({.path = dir + "/rows.jsonl", .log = [](const std::string&) {}});
  ASSERT_TRUE(back) << describe(back.error());
  ASSERT_EQ(back->size(), 1u);
  EXPECT_EQ(back->row(0).messages, rows[0].messages);
  EXPECT_EQ(rows[0].messages[0].extra, R"({"content":null,"rt i":"user"})");
}

TEST(AgentRows, CsvRowsReadAsMsSwiftReadsThem) {
  // The unterminated quote is an error for the whole file.
  std::istringstream in{"query,response\n\"open,x\n"};
  auto bad = Dataset::parse(in, {.path = "bad.csv"});
  ASSERT_FALSE(bad);
  EXPECT_NE(describe(bad.error()).find("never closed"), std::string::npos);
  std::istringstream ok_in{"\xEF\xBB\xBFsystem,query,response\r\nBe brief.,\"What is 2,3?\",\"It is \"\"two, three\"\".\"\r\n,Multi,\"line\none\"\na,b,c,d\n"};
  auto csv = Dataset::parse(ok_in, {.path = "rows.csv", .log = [](const std::string&) {}});
  ASSERT_TRUE(csv) << describe(csv.error());
  ASSERT_EQ(csv->size(), 2u) << csv->skipped().summary();
  EXPECT_EQ(csv->skipped().total(), 1) << "the row with more fields than the header";
  EXPECT_EQ(csv->row(0).fields.at("query"), "What is 2,3?");
  EXPECT_EQ(csv->row(0).fields.at("response"), "It is \"two, three\".");
  EXPECT_EQ(csv->row(1).fields.count("system"), 0u) << "an empty cell is an absent field";
  EXPECT_EQ(csv->row(1).fields.at("response"), "line\none");
  auto l = preprocess::layout("auto");
  ASSERT_TRUE(l);
  csv->map(*l);
  ASSERT_EQ(csv->size(), 2u) << csv->skipped().summary();
  EXPECT_EQ(csv->row(0).messages.front().content, "Be brief.");
  EXPECT_EQ(csv->row(1).messages.back().content, "line\none");
}

TEST(AgentRows, MalformedAgentRowsAreSkippedWithTheReason) {
  auto ds = parse("bad.jsonl",
                  R"({"tools": "not json", "messages": [{"role": "user", "content": "x"}]})" "\n"
                  R"({"messages": [{"role": "tool_call", "content": "{no"}]})" "\n"
                  R"({"conversations": [{"from": "alien", "value": "x"}]})" "\n"
                  R"({"tools": {"a": 1}, "messages": [{"role": "user", "content": "x"}]})" "\n");
  EXPECT_EQ(ds.size(), 0u);
  EXPECT_EQ(ds.skipped().total(), 4) << ds.skipped().summary();
  // No tools, however a tools column writes it: null, "", [], "[]".
  auto none = parse("none.jsonl", R"({"tools": null, "messages": [{"role": "user", "content": "x"}]})" "\n"
                                  R"({"tools": "[]", "messages": [{"role": "user", "content": "x"}]})" "\n"
                                  R"({"tools": [], "messages": [{"role": "user", "content": "x"}]})" "\n");
  ASSERT_EQ(none.size(), 3u) << none.skipped().summary();
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ(none.row(i).tools, "");
  auto deep = parse("deep.jsonl", "{\"messages\": [{\"role\": \"user\", \"content\": \"x\", \"meta\": " +
                                      std::string(100000, '[') + std::string(100000, ']') + "}]}\n");
  EXPECT_EQ(deep.size(), 0u);
  EXPECT_EQ(deep.skipped().counts.count("nested deeper than 64 levels"), 1u) << deep.skipped().summary();
}

}  // namespace
}  // namespace glint::components
