// Tokenizer: known encodings on a hand-made vocabulary, round trips, the
// invalid UTF-8 rule, added tokens, the pre-tokenizer regex.
#include "components/data/tokenizer.hpp"
#include "support/tokenizers.hpp"

#include <gtest/gtest.h>

#include <random>

namespace glint::components {
namespace {

using glint::testing::bpe_tokenizer_json;

const nlohmann::json byte_level_pre = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}};

// Merges of "hello" and " world"; ids 256.. in this order.
const std::vector<std::pair<std::string, std::string>> merges = {
    {"h", "e"}, {"he", "l"}, {"l", "o"}, {"hel", "lo"}, {" ", "w"}, {"o", "r"}, {" w", "or"}, {"l", "d"},
    {" wor", "ld"}, {"b", "1"}};

Tokenizer make(nlohmann::json pre = byte_level_pre) {
  auto t = Tokenizer::parse(bpe_tokenizer_json(merges, {"<|im_start|>", "<|im_end|>"}, pre));
  EXPECT_TRUE(t) << describe(t.error());
  return std::move(*t);
}

std::vector<int64_t> enc(const Tokenizer& t, std::string_view s) {
  auto r = t.encode(s);
  EXPECT_TRUE(r) << describe(r.error());
  return r ? *r : std::vector<int64_t>{};
}

TEST(Tokenizer, EncodesByMergeRank) {
  auto t = make();
  EXPECT_EQ(enc(t, "hello"), (std::vector<int64_t>{259}));               // h e, he l, l o, hel lo
  EXPECT_EQ(enc(t, "hello world"), (std::vector<int64_t>{259, 264}));    // "hello", " world"
  EXPECT_EQ(enc(t, "help"), (std::vector<int64_t>{257, 'p'}));           // "hel" + "p"
  EXPECT_EQ(enc(t, "lo"), (std::vector<int64_t>{258}));
  EXPECT_EQ(enc(t, ""), std::vector<int64_t>{});
  EXPECT_EQ(t.token_id("hello"), 259);
  EXPECT_EQ(t.token_id("<|im_end|>"), 267);
  EXPECT_EQ(t.token_id("nope"), -1);
}

TEST(Tokenizer, TheRegexKeepsLettersAndDigitsApart) {
  // "b1" is a merge, but GPT-2's regex splits "ab12" into "ab" and "12".
  auto t = make();
  EXPECT_EQ(enc(t, "ab12"), (std::vector<int64_t>{'a', 'b', '1', '2'}));
  // Without a pre-tokenizer the merge applies.
  auto whole = make(nullptr);
  EXPECT_EQ(enc(whole, "ab12"), (std::vector<int64_t>{'a', 265, '2'}));
  // A Split regex (Qwen and Llama-3 put one before a regex-less ByteLevel).
  auto split = make({{"type", "Sequence"},
                     {"pretokenizers",
                      {{{"type", "Split"}, {"pattern", {{"Regex", "\\p{N}{1,3}|\\p{L}+|\\s+|[^\\s\\p{L}\\p{N}]+"}}},
                        {"behavior", "Isolated"}, {"invert", false}},
                       {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}}}});
  EXPECT_EQ(enc(split, "ab12"), (std::vector<int64_t>{'a', 'b', '1', '2'}));
  EXPECT_EQ(enc(split, "hello world"), (std::vector<int64_t>{259, ' ', 'w', 261, 263}));  // " " is its own piece: no " w"
}

TEST(Tokenizer, AddedTokensAreMatchedFirst) {
  auto t = make();
  auto ids = enc(t, "<|im_start|>hello<|im_end|>\n");
  EXPECT_EQ(ids, (std::vector<int64_t>{266, 259, 267, '\n'}));
  EXPECT_EQ(t.decode(ids, /*skip_special=*/false), "<|im_start|>hello<|im_end|>\n");
  EXPECT_EQ(t.decode(ids), "hello\n");
}

TEST(Tokenizer, AnyUtf8TextRoundTrips) {
  auto t = make();
  const std::vector<std::string> alphabet = {"a", "b", "1", " ", "  ", "\n", "\t", "é", "中文", "😀", "hello", " world",
                                             "'s", "!?", "\xd9\x85", "<|im_end|>", "l", "o"};
  std::mt19937 rng{5};
  for (int i = 0; i < 300; ++i) {
    std::string s;
    for (int k = static_cast<int>(rng() % 12); k > 0; --k) s += alphabet[rng() % alphabet.size()];
    EXPECT_EQ(t.decode(enc(t, s), false), s);
  }
}

TEST(Tokenizer, InvalidUtf8EncodesItsBytesAndDecodesToReplacementCharacters) {
  auto t = make();
  auto ids = enc(t, "a\xff" "b\xe2\x82");
  EXPECT_EQ(ids, (std::vector<int64_t>{'a', 0xff, 'b', 0xe2, 0x82}));
  EXPECT_EQ(t.decode(ids), "a\xef\xbf\xbd" "b\xef\xbf\xbd");
}

TEST(Tokenizer, DecodesByteLevelTokensAndSkipsSpecialOnes) {
  auto t = make();
  std::vector<int64_t> ids = {'h', 'i', ' ', 267, 0xe2, 0x82, 0xac};
  EXPECT_EQ(t.decode(ids), "hi \xe2\x82\xac");
  EXPECT_EQ(t.decode(ids, false), "hi <|im_end|>\xe2\x82\xac");
  EXPECT_EQ(t.decode(std::vector<int64_t>{'a', 0xe2, 0x82}), "a\xef\xbf\xbd");
  EXPECT_EQ(to_valid_utf8("\xc0\xaf" "b"), "\xef\xbf\xbd\xef\xbf\xbd" "b");
}

TEST(Tokenizer, BadFilesAndUnsupportedKindsAreClearErrors) {
  EXPECT_FALSE(Tokenizer::parse("{"));
  EXPECT_FALSE(Tokenizer::load("/nonexistent/tokenizer.json"));
  auto bad_regex = Tokenizer::parse(
      bpe_tokenizer_json(merges, {}, {{"type", "Split"}, {"pattern", {{"Regex", "(unclosed"}}}, {"behavior", "Isolated"}}));
  ASSERT_FALSE(bad_regex);
  EXPECT_NE(describe(bad_regex.error()).find("does not compile"), std::string::npos) << describe(bad_regex.error());
  // A SentencePiece-style vocabulary decodes but does not encode (yet).
  nlohmann::json sp = {{"model", {{"type", "BPE"}, {"vocab", {{"\xe2\x96\x81hi", 0}, {"<0x0A>", 1}}}, {"byte_fallback", true}}},
                       {"decoder", {{"type", "Sequence"}}}};
  auto t = Tokenizer::parse(sp.dump());
  ASSERT_TRUE(t);
  EXPECT_EQ(t->decode(std::vector<int64_t>{0, 1}), " hi\n");
  auto e = t->encode("hi");
  ASSERT_FALSE(e);
  EXPECT_NE(describe(e.error()).find("byte-level"), std::string::npos);
}

}  // namespace
}  // namespace glint::components
