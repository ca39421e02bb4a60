// The OpenAI-compatible door's translation (rpc/tinker/openai.hpp): a chat
// request is the model's own template rendered with its tools and encoded,
// every field maps to the sampling parameter OpenAI defines or is refused by
// name, and sampled sequences become OpenAI's objects: tool calls read in
// the template's format (arguments as a JSON string), logprobs without the
// stop token, and a stream whose deltas add up to the whole answer.
#include "rpc/tinker/openai.hpp"

#include "components/data/agent_rows.hpp"

#include "runtime/file.hpp"
#include "support/tokenizers.hpp"

#include <gtest/gtest.h>

namespace glint::rpc::openai {
namespace {

using json = nlohmann::json;
using components::Template;

std::shared_ptr<const Template> qwen25() {
  auto text = read_text_file(std::string{GLINT_TEST_SOURCE_DIR} + "/data/chat_templates/qwen2.5.jinja");
  EXPECT_TRUE(text);
  components::TokenizerConfig config;
  config.chat_template = *text;
  config.chat_template_origin = "qwen2.5.jinja";
  auto t = Template::make(glint::testing::chat_tokenizer(std::move(config)), {.name = "jinja"});
  EXPECT_TRUE(t) << describe(t.error());
  return std::make_shared<const Template>(std::move(*t));
}

const json kTools = json::parse(R"([{"type": "function", "function": {"name": "lookup", "description": "Looks up.",
    "parameters": {"type": "object", "properties": {"word": {"type": "string"}}}}}])");

json chat_body() {
  return {{"model", "base"},
          {"messages", json::array({{{"role", "user"}, {"content", "What is 6 * 7?"}}})},
          {"tools", kTools}};
}

TEST(OpenAi, AChatIsTheModelsTemplateAndEveryFieldMapsToSampling) {
  auto chat = qwen25();
  const auto& tok = chat->tokenizer();
  auto body = chat_body();
  body["n"] = 3;
  body["max_tokens"] = 20;
  body["temperature"] = 0.5;
  body["top_p"] = 0.9;
  body["seed"] = 7;
  body["stop"] = json::array({"\n\n", "END"});
  body["logprobs"] = true;
  body["top_logprobs"] = 2;
  body["user"] = "someone";
  auto r = parse_request(body, true, chat.get(), tok, {.max_context = 4096});
  ASSERT_TRUE(r) << describe(r.error());
  auto messages = components::agent_messages(nlohmann::ordered_json::parse(body["messages"].dump()), false);
  auto text = chat->render(*messages, true, kTools.dump());
  ASSERT_TRUE(text);
  EXPECT_NE(text->find("lookup"), std::string::npos) << "the tools are rendered";
  EXPECT_EQ(r->prompt, *tok.encode(*text));
  EXPECT_EQ(r->params.num_samples, 3);
  EXPECT_EQ(r->params.max_tokens, 20);
  EXPECT_EQ(r->params.temperature, 0.5);
  EXPECT_EQ(r->params.top_p, 0.9);
  EXPECT_EQ(r->params.seed, 7);
  EXPECT_EQ(r->params.stop, (std::vector<std::string>{"\n\n", "END"}));
  EXPECT_EQ(r->params.logprobs, 2);
  EXPECT_EQ(r->params.stop_token_ids, (std::vector<int64_t>{chat->end_of_turn_id()}));
  EXPECT_TRUE(r->parse_tools);
  // Defaults: the rest of the context for a chat, 16 tokens for a completion; no seed.
  auto d = parse_request(chat_body(), true, chat.get(), tok, {.max_context = 4096});
  ASSERT_TRUE(d);
  EXPECT_EQ(d->params.max_tokens, 4096 - static_cast<int64_t>(d->prompt.size()));
  EXPECT_EQ(d->params.seed, -1);
  EXPECT_EQ(d->params.logprobs, -1);
  auto c = parse_request({{"model", "base"}, {"prompt", "the quick"}, {"logprobs", 3}}, false, chat.get(), tok,
                         {.max_context = 4096});
  ASSERT_TRUE(c) << describe(c.error());
  EXPECT_EQ(c->prompt, *tok.encode("the quick"));
  EXPECT_EQ(c->params.max_tokens, 16);
  EXPECT_EQ(c->params.logprobs, 3);
  EXPECT_TRUE(c->params.stop_token_ids.empty());
  // OpenAI's tool-call arguments are a JSON string; the template reads an object.
  auto convo = chat_body();
  convo["messages"].push_back({{"role", "assistant"},
                               {"content", nullptr},
                               {"tool_calls", json::array({{{"id", "c1"},
                                                            {"type", "function"},
                                                            {"function", {{"name", "lookup"}, {"arguments", "{\"word\": \"fox\"}"}}}}})}});
  convo["messages"].push_back({{"role", "tool"}, {"tool_call_id", "c1"}, {"content", "an animal"}});
  auto t = parse_request(convo, true, chat.get(), tok, {.max_context = 4096});
  ASSERT_TRUE(t) << describe(t.error());
  EXPECT_NE(tok.decode(t->prompt, false).find("{\"name\": \"lookup\", \"arguments\": {\"word\": \"fox\"}}"),
            std::string::npos)
      << tok.decode(t->prompt, false);
}

TEST(OpenAi, WhatIsNotServedIsRefusedByName) {
  auto chat = qwen25();
  const auto& tok = chat->tokenizer();
  auto refused = [&](json body, const std::string& needle, bool is_chat = true) {
    auto r = parse_request(body, is_chat, chat.get(), tok, {.max_context = 256});
    ASSERT_FALSE(r) << body.dump();
    EXPECT_NE(describe(r.error()).find(needle), std::string::npos) << describe(r.error());
    EXPECT_EQ(code_of(r.error()), errc::invalid_argument);
  };
  auto with = [](const char* k, json v) {
    auto b = chat_body();
    b[k] = std::move(v);
    return b;
  };
  refused(with("frequency_penalty", 0.5), "frequency_penalty");
  refused(with("presence_penalty", -1), "presence_penalty");
  refused(with("logit_bias", {{"5", 10}}), "logit_bias");
  refused(with("response_format", {{"type", "json_object"}}), "response_format");
  refused(with("tool_choice", "required"), "tool_choice");
  refused(with("tool_choice", {{"type", "function"}, {"function", {{"name", "lookup"}}}}), "tool_choice");
  refused(with("parallel_tool_calls", false), "parallel_tool_calls");
  refused(with("n", 17), "n must be");
  refused(with("temperature", 3), "temperature");
  refused(with("top_logprobs", 2), "top_logprobs comes with logprobs");
  refused(with("stream_options", {{"include_usage", true}}), "stream_options");
  refused(with("max_tokens", 1000), "context");
  refused(with("stop", json::array({"a", "b", "c", "d", "e"})), "stop holds at most");
  refused(with("stop", ""), "must not be empty");
  refused(with("store", true), "store");
  refused(with("functions", json::array()), "'functions' is not a field");
  refused(with("messages", json::array()), "messages");
  refused(with("messages", json::array({{{"role", "user"}, {"content", json::array({{{"type", "image_url"}}})}}})),
          "text parts");
  refused(json{{"messages", chat_body()["messages"]}}, "model");
  refused({{"model", "base"}, {"prompt", "x"}, {"echo", true}}, "echo", false);
  refused({{"model", "base"}, {"prompt", "x"}, {"suffix", "y"}}, "suffix", false);
  refused({{"model", "base"}, {"prompt", "x"}, {"best_of", 3}}, "best_of", false);
  refused({{"model", "base"}, {"prompt", json::array({"a", "b"})}}, "one prompt", false);
  refused({{"model", "base"}, {"prompt", json::array({1, 2, 100000})}}, "token ids", false);
  refused({{"model", "base"}, {"prompt", "x"}, {"messages", json::array()}}, "'messages' is not a field", false);
  // No chat template: chat is refused, completions are not.
  auto none = parse_request(chat_body(), true, nullptr, tok, {.max_context = 256});
  ASSERT_FALSE(none);
  EXPECT_NE(describe(none.error()).find("/v1/completions"), std::string::npos);
}

// The ids of `text` and the end-of-turn token, with log-probabilities -0.25.
Choice choice_of(const Template& chat, const std::string& text) {
  Choice c;
  c.tokens = *chat.tokenizer().encode(text);
  c.tokens.push_back(chat.end_of_turn_id());
  c.logprobs.chosen.assign(c.tokens.size(), -0.25f);
  c.logprobs.k = 1;
  c.logprobs.top_ids = c.tokens;
  c.logprobs.top_logprobs.assign(c.tokens.size(), -0.25f);
  c.stop_reason = components::StopReason::stop;
  c.stop_token = chat.end_of_turn_id();
  return c;
}

TEST(OpenAi, AnswersAreOpenAisObjectsAndStreamsAddUpToThem) {
  auto chat = qwen25();
  const auto& tok = chat->tokenizer();
  auto body = chat_body();
  body["logprobs"] = true;
  body["top_logprobs"] = 1;
  body["n"] = 2;
  auto r = parse_request(body, true, chat.get(), tok, {.max_context = 4096});
  ASSERT_TRUE(r);
  const std::string call = "<tool_call>\n{\"name\": \"lookup\", \"arguments\": {\"word\": \"fox\"}}\n</tool_call>";
  std::vector<Choice> choices = {choice_of(*chat, call), choice_of(*chat, "It is 42.")};
  const auto format = components::tool_call_format_of(*tok.config().chat_template);
  auto a = answer(*r, choices, tok, format, "chatcmpl-1", 100);
  EXPECT_EQ(a.content_type, "application/json");
  auto j = json::parse(a.body);
  EXPECT_EQ(j["object"], "chat.completion");
  EXPECT_EQ(j["id"], "chatcmpl-1");
  ASSERT_EQ(j["choices"].size(), 2u);
  const auto& first = j["choices"][0];
  EXPECT_EQ(first["finish_reason"], "tool_calls");
  EXPECT_TRUE(first["message"]["content"].is_null());
  ASSERT_EQ(first["message"]["tool_calls"].size(), 1u);
  EXPECT_EQ(first["message"]["tool_calls"][0]["function"]["name"], "lookup");
  EXPECT_EQ(json::parse(first["message"]["tool_calls"][0]["function"]["arguments"].get<std::string>()),
            json({{"word", "fox"}}));
  const auto& second = j["choices"][1];
  EXPECT_EQ(second["finish_reason"], "stop");
  EXPECT_EQ(second["message"]["content"], "It is 42.");
  // Log-probabilities per token, the end-of-turn token left out.
  EXPECT_EQ(second["logprobs"]["content"].size(), choices[1].tokens.size() - 1);
  std::string joined;
  for (const auto& t : second["logprobs"]["content"]) joined += t["token"].get<std::string>();
  EXPECT_EQ(joined, "It is 42.");
  EXPECT_EQ(j["usage"]["completion_tokens"], choices[0].tokens.size() + choices[1].tokens.size());
  EXPECT_EQ(j["usage"]["prompt_tokens"], r->prompt.size());

  // Streamed: a role chunk, content deltas, the finish; usage; [DONE].
  r->stream = true;
  r->include_usage = true;
  auto s = answer(*r, choices, tok, format, "chatcmpl-1", 100);
  EXPECT_EQ(s.content_type, "text/event-stream");
  ASSERT_GE(s.body.size(), 14u);
  EXPECT_EQ(s.body.substr(s.body.size() - 14), "data: [DONE]\n\n");
  std::map<int, std::string> content;
  std::map<int, std::string> finish;
  json usage, calls;
  for (size_t at = 0; (at = s.body.find("data: ", at)) != std::string::npos;) {
    auto end = s.body.find("\n\n", at);
    auto data = s.body.substr(at + 6, end - at - 6);
    at = end;
    if (data == "[DONE]") break;
    auto chunk = json::parse(data);
    EXPECT_EQ(chunk["object"], "chat.completion.chunk");
    if (chunk.contains("usage")) usage = chunk["usage"];
    for (const auto& c : chunk["choices"]) {
      const int i = c["index"];
      if (c["delta"].contains("content") && c["delta"]["content"].is_string()) content[i] += c["delta"]["content"];
      if (c["delta"].contains("tool_calls")) calls = c["delta"]["tool_calls"];
      if (!c["finish_reason"].is_null()) finish[i] = c["finish_reason"];
    }
  }
  EXPECT_EQ(content[1], "It is 42.");
  EXPECT_EQ(content[0], "");
  EXPECT_EQ(calls[0]["function"]["name"], "lookup");
  EXPECT_EQ(finish[0], "tool_calls");
  EXPECT_EQ(finish[1], "stop");
  EXPECT_EQ(usage, j["usage"]);

  // tool_choice "none": the text stays text.
  auto plain = chat_body();
  plain["tool_choice"] = "none";
  auto n = parse_request(plain, true, chat.get(), tok, {.max_context = 4096});
  ASSERT_TRUE(n);
  auto p = json::parse(answer(*n, {choice_of(*chat, call)}, tok, format, "x", 1).body);
  EXPECT_EQ(p["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(p["choices"][0]["message"]["content"], call);
}

}  // namespace
}  // namespace glint::rpc::openai
