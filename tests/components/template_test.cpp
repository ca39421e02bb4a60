// Chat templates: the text ChatML and Llama-3 render, the loss mask on
// assistant turns only, the generation prompt, truncation and bad input.
#include "components/data/template.hpp"
#include "support/tokenizers.hpp"

#include <gtest/gtest.h>

#include <algorithm>

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
  auto lacking = Template::make(std::make_shared<const Tokenizer>(*plain), {});
  ASSERT_FALSE(lacking);
  EXPECT_NE(describe(lacking.error()).find("<|im_start|>"), std::string::npos) << describe(lacking.error());
}

}  // namespace
}  // namespace glint::components
