// Chat templates: the text ChatML and Llama-3 render, the loss mask on
// assistant turns only, the generation prompt, truncation and bad input.
#include "components/data/template.hpp"
#include "support/temp_dir.hpp"
#include "support/tokenizers.hpp"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <map>
#include <cstdio>
#include <fstream>
#include <sstream>

namespace glint::components {
namespace {

const std::vector<Message> chat = {
    {"system", "You are helpful."}, {"user", "What is 2 + 6?"}, {"assistant", "The answer is 8."},
    {"user", "And 3 + 9?"},         {"assistant", "It is 12."}};

Template make(std::string name, TemplateOptions o = {}) {
  o.name = std::move(name);
  auto t = Template::make(glint::testing::chat_tokenizer(), o);
  EXPECT_TRUE(t) << describe(t.error());
  return std::move(*t);
}

// The text of the tokens the loss counts (each counted position's next token).
std::string learned_text(const Template& t, const EncodedRow& row) {
  std::vector<int64_t> ids;
  for (size_t i = 0; i + 1 < row.input_ids.size(); ++i)
    if (row.loss_mask[i] == 1.f) ids.push_back(row.input_ids[i + 1]);
  return t.tokenizer().decode(ids, /*skip_special=*/false);
}

TEST(Template, ChatmlRendersAsQwenDoes) {
  auto t = make("chatml");
  auto text = t.render(chat, false);
  ASSERT_TRUE(text);
  EXPECT_EQ(*text,
            "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nWhat is 2 + 6?<|im_end|>\n"
            "<|im_start|>assistant\nThe answer is 8.<|im_end|>\n<|im_start|>user\nAnd 3 + 9?<|im_end|>\n"
            "<|im_start|>assistant\nIt is 12.<|im_end|>\n");
  auto prompt = t.render(std::span{chat}.first(2), true);
  EXPECT_EQ(*prompt,
            "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nWhat is 2 + 6?<|im_end|>\n"
            "<|im_start|>assistant\n");
}

TEST(Template, LabelsCoverAssistantTurnsAndTheirEndTokenOnly) {
  for (std::string name : {"chatml", "llama3"}) {
    auto t = make(name);
    auto row = t.encode(chat, false);
    ASSERT_TRUE(row) << describe(row.error());
    ASSERT_EQ(row->loss_mask.size(), row->input_ids.size());
    EXPECT_EQ(t.tokenizer().decode(row->input_ids, false), *t.render(chat, false)) << name;
    const std::string end = name == "chatml" ? "<|im_end|>" : "<|eot_id|>";
    EXPECT_EQ(learned_text(t, *row), "The answer is 8." + end + "It is 12." + end) << name;
    EXPECT_EQ(row->loss_mask.back(), 0.f);
    EXPECT_EQ(t.end_of_turn_id(), t.tokenizer().token_id(end));
  }
}

TEST(Template, Llama3RendersHeadersAndTrimsContents) {
  auto t = make("llama3");
  std::vector<Message> m = {{"user", "  Hi there \n"}, {"assistant", "Hello."}};
  EXPECT_EQ(*t.render(m, false),
            "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi there<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\nHello.<|eot_id|>");
  EXPECT_EQ(*t.render(std::span{m}.first(1), true),
            "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi there<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n");
}

TEST(Template, GenerationPromptDropsTheReferenceAnswerAndLearnsNothing) {
  auto t = make("chatml");
  std::vector<Message> m = {{"user", "What is 2 + 6?"}, {"assistant", "8"}};
  auto row = t.encode(m, true);
  ASSERT_TRUE(row) << describe(row.error());
  EXPECT_EQ(t.tokenizer().decode(row->input_ids, false), "<|im_start|>user\nWhat is 2 + 6?<|im_end|>\n<|im_start|>assistant\n");
  for (float x : row->loss_mask) EXPECT_EQ(x, 0.f);
}

TEST(Template, DefaultSystemIsAddedWhenTheConversationHasNone) {
  auto t = make("chatml", {.default_system = "Be brief."});
  std::vector<Message> m = {{"user", "Hi"}, {"assistant", "Hello"}};
  EXPECT_EQ(t.render(m, false)->rfind("<|im_start|>system\nBe brief.<|im_end|>\n", 0), 0u);
  EXPECT_EQ(t.render(chat, false)->find("Be brief."), std::string::npos) << "an own system message wins";
}

TEST(Template, TruncationPolicies) {
  auto full = make("chatml").encode(chat, false);
  ASSERT_TRUE(full);
  const auto n = static_cast<int64_t>(full->input_ids.size());
  auto refuse = make("chatml", {.max_length = n - 1}).encode(chat, false);
  ASSERT_FALSE(refuse);
  EXPECT_EQ(code_of(refuse.error()), errc::resource_exhausted);
  EXPECT_NE(describe(refuse.error()).find("more than max_length"), std::string::npos);

  auto left = make("chatml", {.max_length = 10, .truncation = Truncation::left}).encode(chat, false);
  ASSERT_TRUE(left) << describe(left.error());
  EXPECT_EQ(left->truncated_tokens, n - 10);
  EXPECT_EQ(left->input_ids, std::vector<int64_t>(full->input_ids.end() - 10, full->input_ids.end()));
  EXPECT_EQ(left->loss_mask.back(), 0.f);

  // Right: keep up to two tokens of the first answer.
  const auto first = std::find(full->loss_mask.begin(), full->loss_mask.end(), 1.f) - full->loss_mask.begin();
  auto right = make("chatml", {.max_length = first + 3, .truncation = Truncation::right}).encode(chat, false);
  ASSERT_TRUE(right) << describe(right.error());
  EXPECT_EQ(right->input_ids, std::vector<int64_t>(full->input_ids.begin(), full->input_ids.begin() + first + 3));
  EXPECT_EQ(std::count(right->loss_mask.begin(), right->loss_mask.end(), 1.f), 2);

  // Cut before the first assistant token: nothing left to learn.
  auto nothing = make("chatml", {.max_length = first + 1, .truncation = Truncation::right}).encode(chat, false);
  ASSERT_FALSE(nothing);
  EXPECT_EQ(code_of(nothing.error()), errc::resource_exhausted);
  EXPECT_NE(describe(nothing.error()).find("no assistant token is left"), std::string::npos);
}

TEST(Template, BadInputIsAClearError) {
  auto t = make("chatml");
  EXPECT_FALSE(t.encode({}, false));
  std::vector<Message> role = {{"robot", "beep"}};
  EXPECT_NE(describe(t.encode(role, true).error()).find("role 'robot'"), std::string::npos);
  std::vector<Message> late = {{"user", "a"}, {"system", "b"}};
  EXPECT_NE(describe(t.encode(late, true).error()).find("only the first"), std::string::npos);
  std::vector<Message> no_answer = {{"user", "a"}};
  EXPECT_FALSE(t.encode(no_answer, false));
  auto name = Template::make(glint::testing::chat_tokenizer(), {.name = "vicuna"});
  ASSERT_FALSE(name);
  EXPECT_NE(describe(name.error()).find("chatml"), std::string::npos);
  EXPECT_FALSE(Template::make(glint::testing::chat_tokenizer(), {.max_length = -1}));
  // A tokenizer without ChatML's special tokens.
  std::vector<std::string> texts = {"hello"};
  auto plain = Tokenizer::parse(*train_bpe(texts, {.special_tokens = {}}));
  auto lacking = Template::make(std::make_shared<const Tokenizer>(*plain), {.name = "chatml"});
  ASSERT_FALSE(lacking);
  EXPECT_NE(describe(lacking.error()).find("<|im_start|>"), std::string::npos) << describe(lacking.error());
}


// --- The model's own chat template -----------------------------------------

std::string fixture(const std::string& name) {
  std::ifstream in{std::string{GLINT_TEST_SOURCE_DIR} + "/data/chat_templates/" + name};
  EXPECT_TRUE(in) << name;
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

std::shared_ptr<const Tokenizer> with_template(const std::string& jinja, std::map<std::string, std::string> special = {}) {
  TokenizerConfig config;
  config.special_tokens = std::move(special);
  config.chat_template = jinja;
  config.chat_template_origin = "tokenizer_config.json: chat_template";
  return glint::testing::chat_tokenizer(std::move(config));
}

TEST(ChatTemplate, RecognisesTheFormatsGlintRenders) {
  struct Case {
    const char* file;
    const char* name;
    std::optional<std::string> system;
  };
  for (const auto& c : {Case{"chatml_glint.jinja", "chatml", std::nullopt},
                        Case{"qwen2.jinja", "chatml", "You are a helpful assistant."},
                        Case{"qwen2.5.jinja", "qwen2.5", "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."},
                        Case{"qwen3.jinja", "qwen3", std::nullopt}, Case{"llama3.jinja", "llama3", std::nullopt}}) {
    auto info = detect_chat_template(fixture(c.file));
    EXPECT_EQ(info.name, c.name) << c.file << ": " << info.why;
    EXPECT_EQ(info.default_system, c.system) << c.file;
    auto t = Template::make(with_template(fixture(c.file)), {});
    ASSERT_TRUE(t) << describe(t.error());
    EXPECT_EQ(t->options().name, c.name);
  }
}

TEST(ChatTemplate, RunsATemplateItDoesNotRecogniseAndRefusesANameThatIsNotTheModels) {
  // Llama 3.1 puts a dated system header on every conversation: not one of
  // glint's C++ formats, so "auto" runs the template itself.
  auto auto_31 = Template::make(with_template(fixture("llama3.1.jinja")), {});
  ASSERT_TRUE(auto_31) << describe(auto_31.error());
  EXPECT_EQ(auto_31->options().name, "jinja");
  EXPECT_NE(auto_31->render(chat, false)->find("Cutting Knowledge Date"), std::string::npos);
  // Named explicitly, glint's own rendering is used (with a warning).
  EXPECT_TRUE(Template::make(with_template(fixture("llama3.1.jinja")), {.name = "llama3"}));
  // A Qwen3 model trained with plain ChatML would lose its <think> blocks.
  auto wrong = Template::make(with_template(fixture("qwen3.jinja")), {.name = "chatml"});
  ASSERT_FALSE(wrong);
  EXPECT_NE(describe(wrong.error()).find("is qwen3's; use auto or qwen3"), std::string::npos) << describe(wrong.error());
  // No template at all: name one.
  auto none = Template::make(glint::testing::chat_tokenizer(), {});
  ASSERT_FALSE(none);
  EXPECT_NE(describe(none.error()).find("no chat template"), std::string::npos);
  // Thinking is Qwen3's alone.
  auto thinking = Template::make(with_template(fixture("qwen2.5.jinja")), {.enable_thinking = false});
  ASSERT_FALSE(thinking);
  EXPECT_NE(describe(thinking.error()).find("enable_thinking"), std::string::npos);
  // Contents trimmed in a ChatML template: not what glint renders.
  EXPECT_EQ(detect_chat_template("{% for m in messages %}{{ '<|im_start|>' + m.role + '\\n' + m.content|trim + "
                                 "'<|im_end|>\\n' }}{% endfor %}")
                .name,
            "");
}

// The text Jinja2 renders for `cases` (as Hugging Face's apply_chat_template
// does: tests/support/jinja_reference.py), or nullopt where python3 with
// jinja2 is missing.
std::optional<std::vector<std::string>> reference(const std::string& jinja, const nlohmann::json& cases) {
  const auto dir = glint::testing::fresh_dir("chat-template");
  const std::string in = dir + "/job.json", out = dir + "/out.json";
  nlohmann::json variables = nlohmann::json::array();
  for (auto c : cases) {
    c["bos_token"] = "<|begin_of_text|>";
    variables.push_back(std::move(c));
  }
  std::ofstream{in} << nlohmann::json{{"template", jinja}, {"cases", variables}}.dump();
  const std::string cmd = "python3 " + std::string{GLINT_TEST_SOURCE_DIR} + "/support/jinja_reference.py < " + in +
                          " > " + out + " 2>/dev/null";
  if (std::system(cmd.c_str()) != 0) return std::nullopt;
  std::ifstream r{out};
  auto j = nlohmann::json::parse(r);
  std::vector<std::string> texts;
  for (const auto& x : j) texts.push_back(x.contains("text") ? x["text"].get<std::string>() : "error: " + x.dump());
  return texts;
}

TEST(ChatTemplate, RendersWhatJinjaRendersFromTheModelsTemplate) {
  using Chat = std::vector<Message>;
  const std::vector<Chat> chats = {
      {{"user", "Hi"}, {"assistant", "Hello!"}},
      {{"system", "Be brief."}, {"user", "2 + 2?"}, {"assistant", "4"}, {"user", "  and 3 + 3? "}, {"assistant", "6\n"}},
      {{"user", "Think first."}, {"assistant", "<think>\nplan it\n</think>\n\nThe answer."}},
      {{"user", "a"}, {"assistant", "<think>r1</think>a1"}, {"user", "b"}, {"assistant", "<think>\n\nr2\n</think>\n\n\na2"}},
      {{"user", "a"}, {"assistant", "<think>r1</think>a1"}, {"user", "b"}, {"assistant", "plain"}},
      {{"user", "Weather?"}, {"assistant", "Calling."}, {"tool", "22C"}, {"tool", "sunny"}, {"assistant", "22C, sunny."}},
      {{"user", "q"}, {"assistant", "<think>why</think>call"}, {"user", "<tool_response>\n1\n</tool_response>"},
       {"assistant", "<think>more</think>done"}},
  };
  for (const char* file : {"chatml_glint.jinja", "qwen2.jinja", "qwen2.5.jinja", "qwen3.jinja", "llama3.jinja"}) {
    const auto jinja = fixture(file);
    auto t = Template::make(with_template(jinja), {});
    ASSERT_TRUE(t) << describe(t.error());
    const bool think = t->options().name == "qwen3";
    nlohmann::json cases = nlohmann::json::array();
    std::vector<std::string> mine;
    for (const auto& chat : chats)
      for (int mode = 0; mode < (think ? 3 : 2); ++mode) {
        nlohmann::json ms = nlohmann::json::array();
        for (const auto& m : chat) ms.push_back({{"role", m.role}, {"content", m.content}});
        nlohmann::json c = {{"messages", ms}, {"add_generation_prompt", mode > 0}};
        auto opts = t->options();
        if (mode == 2) c["enable_thinking"] = false, opts.enable_thinking = false;
        cases.push_back(c);
        auto tm = Template::make(with_template(jinja), opts);
        ASSERT_TRUE(tm) << describe(tm.error());
        // Jinja renders the whole list; glint leaves out a trailing answer
        // for a generation prompt, so hand Jinja the same list.
        auto list = chat;
        if (mode > 0 && list.back().role == "assistant") list.pop_back();
        cases.back()["messages"] = nlohmann::json::array();
        for (const auto& m : list) cases.back()["messages"].push_back({{"role", m.role}, {"content", m.content}});
        auto text = tm->render(chat, mode > 0);
        mine.push_back(text ? *text : "error: " + describe(text.error()));
      }
    auto want = reference(jinja, cases);
    if (!want) GTEST_SKIP() << "python3 with jinja2 is not installed (scripts/setup.sh installs it)";
    ASSERT_EQ(want->size(), mine.size());
    for (size_t i = 0; i < mine.size(); ++i) EXPECT_EQ(mine[i], (*want)[i]) << file << ", case " << i;
  }
}

TEST(ChatTemplate, TheModelsDefaultSystemMessageIsUsedUnlessOneIsGiven) {
  auto t = Template::make(with_template(fixture("qwen2.5.jinja")), {});
  ASSERT_TRUE(t);
  std::vector<Message> m = {{"user", "Hi"}, {"assistant", "Hello"}};
  EXPECT_EQ(t->render(m, false)->rfind("<|im_start|>system\nYou are Qwen, created by Alibaba Cloud.", 0), 0u);
  auto none = Template::make(with_template(fixture("qwen2.5.jinja")), {.default_system = ""});
  EXPECT_EQ(none->render(m, false)->rfind("<|im_start|>user\nHi", 0), 0u) << "an explicit empty default: none";
}

// The C++ formats stay because they are the template's rows exactly (the
// interpreter gives the same ids and loss mask) and faster (glint bench
// template). Qwen3's template rewrites earlier turns, which the
// interpreter's prefix rendering refuses and the C++ format handles.
TEST(ChatTemplate, TheCppFormatsGiveTheInterpretersRows) {
  const std::vector<std::vector<Message>> chats = {
      {{"user", "Hi"}, {"assistant", "Hello!"}},
      {{"system", "Be brief."}, {"user", "2 + 2?"}, {"assistant", "4"}, {"user", "  and 3 + 3? "}, {"assistant", "6\n"}},
      {{"user", "Think first."}, {"assistant", "<think>\nplan it\n</think>\n\nThe answer."}},
      {{"user", "a"}, {"assistant", "<think>r1</think>a1"}, {"user", "b"}, {"assistant", "<think>\n\nr2\n</think>\n\n\na2"}},
      {{"user", "Weather?"}, {"assistant", "Calling."}, {"tool", "22C"}, {"tool", "sunny"}, {"assistant", "22C, sunny."}},
      {{"user", "Ünïcödé 😀?"}, {"assistant", "ja — 日本"}},
  };
  size_t compared = 0, refused = 0;
  for (const char* file : {"chatml_glint.jinja", "qwen2.jinja", "qwen2.5.jinja", "qwen3.jinja", "llama3.jinja"}) {
    // Llama 3's template writes bos_token, which the C++ format has built in.
    std::map<std::string, std::string> special;
    if (std::string{file} == "llama3.jinja") special["bos_token"] = "<|begin_of_text|>";
    auto cpp = Template::make(with_template(fixture(file), special), {});
    auto interp = Template::make(with_template(fixture(file), special), {.name = "jinja"});
    ASSERT_TRUE(cpp) << file << ": " << describe(cpp.error());
    ASSERT_TRUE(interp) << file << ": " << describe(interp.error());
    ASSERT_NE(cpp->options().name, "jinja");
    EXPECT_EQ(interp->options().name, "jinja");
    EXPECT_EQ(cpp->end_of_turn_id(), interp->end_of_turn_id()) << file;
    for (const auto& c : chats)
      for (bool prompt : {false, true}) {
        EXPECT_EQ(*cpp->render(c, prompt), *interp->render(c, prompt)) << file;
        auto a = cpp->encode(c, prompt), b = interp->encode(c, prompt);
        ASSERT_TRUE(a) << describe(a.error());
        if (!b) {
          EXPECT_EQ(std::string{cpp->options().name}, "qwen3") << file << ": " << describe(b.error());
          EXPECT_NE(describe(b.error()).find("rewrites earlier turns"), std::string::npos) << describe(b.error());
          ++refused;
          continue;
        }
        EXPECT_EQ(a->input_ids, b->input_ids) << file << " " << c.front().content;
        EXPECT_EQ(a->loss_mask, b->loss_mask) << file << " " << c.front().content << "\n"
                                              << learned_text(*cpp, *a) << "\nvs\n" << learned_text(*interp, *b);
        ++compared;
      }
  }
  // 5 templates x 6 chats x (training row, prompt): only Qwen3's
  // multi-turn chats are refused by the interpreter.
  EXPECT_EQ(compared + refused, 60u);
  EXPECT_LE(refused, 6u);
}

// A template none of the C++ formats is (Qwen3.5's, with its own tool and
// thinking markup) trains through the interpreter: the text is Jinja2's,
// the loss counts what the model writes after the generation prompt, and sampling
// stops at <|im_end|>.
TEST(ChatTemplate, AnyOtherTemplateTrainsThroughTheInterpreter) {
  const std::string jinja = fixture("qwen3.5.jinja");
  auto t = Template::make(with_template(jinja), {});
  ASSERT_TRUE(t) << describe(t.error());
  EXPECT_EQ(t->options().name, "jinja");
  const auto tok = with_template(jinja);
  EXPECT_EQ(t->end_of_turn_id(), tok->token_id("<|im_end|>"));
  const std::vector<Message> m = {{"system", "Be brief."}, {"user", "2 + 6?"}, {"assistant", "8"}};
  auto row = t->encode(m, false);
  ASSERT_TRUE(row) << describe(row.error());
  // Qwen3.5's generation prompt opens the <think> block, so what the model
  // writes (and the loss counts) starts inside it.
  EXPECT_EQ(learned_text(*t, *row), "\n</think>\n\n8<|im_end|>");
  auto prompt = t->render(m, true);
  ASSERT_TRUE(prompt);
  auto want = reference(jinja, nlohmann::json::array({{{"messages", {{{"role", "system"}, {"content", "Be brief."}},
                                                                      {{"role", "user"}, {"content", "2 + 6?"}}}},
                                                        {"add_generation_prompt", true}}}));
  ASSERT_TRUE(want);
  EXPECT_EQ(*prompt, (*want)[0]);
  auto no_think = Template::make(with_template(jinja), {.enable_thinking = false});
  ASSERT_TRUE(no_think) << describe(no_think.error());
  EXPECT_TRUE(no_think->render(m, true)->ends_with("<think>\n\n</think>\n\n")) << *no_think->render(m, true);
  // A template that does not parse is refused at make, naming its line.
  auto broken = Template::make(with_template("{% for m in messages %}\n{{ m.content | nope }}"), {});
  ASSERT_FALSE(broken);
  EXPECT_NE(describe(broken.error()).find("line 2"), std::string::npos) << describe(broken.error());
  // enable_thinking false for a template that never reads it changes nothing: refused.
  auto ignored = Template::make(with_template(fixture("llama3.1.jinja")), {.enable_thinking = false});
  ASSERT_FALSE(ignored);
  EXPECT_NE(describe(ignored.error()).find("never reads enable_thinking"), std::string::npos) << describe(ignored.error());
}

TEST(ChatTemplate, Qwen3LearnsTheThinkingBlockOfTheLastAnswer) {
  auto t = Template::make(with_template(fixture("qwen3.jinja")), {});
  ASSERT_TRUE(t);
  std::vector<Message> m = {{"user", "Hi"}, {"assistant", "Hello"}};
  auto row = t->encode(m, false);
  ASSERT_TRUE(row) << describe(row.error());
  EXPECT_EQ(learned_text(*t, *row), "<think>\n\n</think>\n\nHello<|im_end|>");
}

}  // namespace
}  // namespace glint::components
