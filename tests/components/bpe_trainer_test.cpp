// BPE trainer: known merges on a tiny corpus, frequency order, determinism,
// the vocabulary limit, and that what it writes loads and round-trips.
#include "components/data/bpe_trainer.hpp"
#include "components/data/tokenizer.hpp"

#include <gtest/gtest.h>

#include <random>

namespace glint::components {
namespace {

Tokenizer load(const std::string& json) {
  auto t = Tokenizer::parse(json, "trained");
  EXPECT_TRUE(t) << describe(t.error());
  return std::move(*t);
}

TEST(BpeTrainer, MergesTheMostFrequentPairFirstAndStopsBelowMinFrequency) {
  std::vector<std::string> texts = {"ab ab ab cd"};
  auto json = train_bpe(texts, {.vocab_size = 1000, .min_frequency = 2, .special_tokens = {"<|im_end|>"}});
  ASSERT_TRUE(json) << describe(json.error());
  auto t = load(*json);
  // Pieces "ab", " ab" x2, " cd": a+b (3 times), then " "+ab (twice); the rest occur once.
  EXPECT_EQ(t.vocab_size(), 256 + 2 + 1);
  EXPECT_EQ(t.token_bytes(256), "ab");
  EXPECT_EQ(t.token_bytes(257), " ab");
  EXPECT_EQ(t.token_id("<|im_end|>"), 258);
  EXPECT_TRUE(t.is_special(258));
  EXPECT_EQ(*t.encode("ab ab cd<|im_end|>"), (std::vector<int64_t>{256, 257, ' ', 'c', 'd', 258}));
}

TEST(BpeTrainer, FrequentWordsBecomeSingleTokensAndTheVocabularyLimitHolds) {
  std::vector<std::string> texts;
  for (int i = 0; i < 50; ++i) texts.push_back("the answer is " + std::to_string(i % 10) + "\nthe question is hard");
  auto json = train_bpe(texts, {.vocab_size = 256 + 12 + 3});
  ASSERT_TRUE(json) << describe(json.error());
  auto t = load(*json);
  EXPECT_EQ(t.vocab_size(), 256 + 12 + 3);
  auto ids = *t.encode("the answer");
  EXPECT_LT(ids.size(), std::string{"the answer"}.size()) << "merges shorten frequent text";
  // Digits stay single tokens under Qwen2's pattern.
  EXPECT_EQ(*t.encode("7"), (std::vector<int64_t>{'7'}));
  auto bigger = train_bpe(texts, {.vocab_size = 2000});
  ASSERT_TRUE(bigger);
  EXPECT_EQ(load(*bigger).encode("the question is hard")->size(), 4u) << "each word one token, spaces attached";
}

TEST(BpeTrainer, IsDeterministicAndRoundTripsAnyText) {
  std::mt19937 gen{11};
  std::vector<std::string> texts;
  const std::vector<std::string> words = {"alpha", "beta", "gamma", "δέλτα", "数字", "12", "+", "=", "\n", "  "};
  for (int i = 0; i < 200; ++i) {
    std::string s;
    for (int k = 0; k < 12; ++k) s += words[gen() % words.size()] + (gen() % 2 ? " " : "");
    texts.push_back(s);
  }
  auto a = train_bpe(texts, {.vocab_size = 400});
  auto b = train_bpe(texts, {.vocab_size = 400});
  ASSERT_TRUE(a && b);
  EXPECT_EQ(*a, *b);
  auto t = load(*a);
  for (const auto& s : texts) EXPECT_EQ(t.decode(*t.encode(s)), s);
  // Text the trainer never saw, random bytes included.
  for (int i = 0; i < 50; ++i) {
    std::string s;
    for (int k = 0; k < 30; ++k) s.push_back(static_cast<char>(gen() % 128));
    EXPECT_EQ(t.decode(*t.encode(s)), s);
  }
}

TEST(BpeTrainer, BadOptionsAreClearErrors) {
  std::vector<std::string> texts = {"x"};
  auto small = train_bpe(texts, {.vocab_size = 257, .special_tokens = {"<a>", "<b>"}});
  ASSERT_FALSE(small);
  EXPECT_NE(describe(small.error()).find("too small"), std::string::npos) << describe(small.error());
  auto regex = train_bpe(texts, {.pattern = "(unclosed"});
  ASSERT_FALSE(regex);
  EXPECT_NE(describe(regex.error()).find("does not compile"), std::string::npos);
  auto freq = train_bpe(texts, {.min_frequency = 0});
  EXPECT_FALSE(freq);
}

}  // namespace
}  // namespace glint::components
