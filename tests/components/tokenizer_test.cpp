// Tokenizer: known encodings on a hand-made vocabulary, round trips, the
// invalid UTF-8 rule, added tokens and their flags, the pre-tokenizer regex,
// normalizers, and the fields that are refused. Expected ids are worked out
// by hand from Hugging Face tokenizers' rules (its normalizers/*.rs,
// added_vocabulary.rs and models/bpe/model.rs).
#include "components/data/tokenizer.hpp"
#include "runtime/file.hpp"
#include "support/temp_dir.hpp"
#include "support/tokenizers.hpp"

#include <gtest/gtest.h>

#include <chrono>
#include <climits>
#include <filesystem>
#include <fstream>
#include <optional>
#include <random>
#include <set>

namespace glint::components {
namespace {

using glint::testing::bpe_tokenizer;
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

// Found by fuzz/targets/tokenizer.cpp: an added token's "id" was converted
// with get<int64_t>() whatever its type: 1e300 is undefined behaviour, 3.5
// became 3.
TEST(Tokenizer, AnAddedTokenIdThatIsNotAnIntegerIsRefused) {
  for (auto [id, shown] : {std::pair{"1e300", "1e+300"}, {"3.5", "3.5"}, {"\"7\"", "'7'"}}) {
    auto j = bpe_tokenizer(merges, {}, byte_level_pre);
    j["added_tokens"] = nlohmann::json::array();
    j["added_tokens"].push_back({{"content", "<x>"}, {"special", true}, {"id", nlohmann::json::parse(id)}});
    auto t = Tokenizer::parse(j.dump(), "t.json");
    ASSERT_FALSE(t) << id;
    EXPECT_EQ(code_of(t.error()), errc::invalid_argument);
    EXPECT_NE(describe(t.error()).find("added_tokens[0].id " + std::string{shown} + " is not an integer"),
              std::string::npos)
        << describe(t.error());
  }
}

// Found by fuzz/targets/tokenizer.cpp (and its corpus keeps the input): a
// SentencePiece token shaped like a byte-fallback token but not hex made
// std::stoi throw out of Tokenizer::parse.
TEST(Tokenizer, ATokenLikeAByteFallbackTokenButNotHexIsText) {
  nlohmann::json sp = {{"model", {{"type", "BPE"}, {"vocab", {{"<0xZZ>", 0}, {"<0x-1>", 1}, {"<0x4a>", 2}}}}},
                       {"decoder", {{"type", "Metaspace"}}}};
  auto t = Tokenizer::parse(sp.dump());
  ASSERT_TRUE(t) << describe(t.error());
  EXPECT_EQ(t->decode(std::vector<int64_t>{0, 1, 2}), "<0xZZ><0x-1>J");
}


// --- normalizers and added-token flags ------------------------------------

constexpr const char* kOrigin = "models/t/tokenizer.json";
using Merges = std::vector<std::pair<std::string, std::string>>;
using Ids = std::vector<int64_t>;

std::optional<Tokenizer> parsed(const nlohmann::json& j) {
  auto t = Tokenizer::parse(j.dump(), kOrigin);
  if (!t) {
    ADD_FAILURE() << describe(t.error());
    return std::nullopt;
  }
  return std::move(*t);
}

// The load error of `j`, or "" when it loads.
std::string load_error(const nlohmann::json& j) {
  auto t = Tokenizer::parse(j.dump(), kOrigin);
  return t ? std::string{} : describe(t.error());
}

// The encode error of `j` (which must load), or "" when "a" encodes.
std::string encode_error(const nlohmann::json& j) {
  auto t = parsed(j);
  if (!t) return "did not load";
  auto e = t->encode("a");
  return e ? std::string{} : describe(e.error());
}

// GPT-2's pre-tokenizer, `m` (ids 256.. in order) and `normalizer`.
nlohmann::json with_normalizer(nlohmann::json normalizer, const Merges& m = {},
                               const std::vector<std::string>& special = {}) {
  auto j = bpe_tokenizer(m, special, byte_level_pre);
  j["normalizer"] = std::move(normalizer);
  return j;
}

nlohmann::json replace(nlohmann::json pattern, std::string content) {
  return {{"type", "Replace"}, {"pattern", std::move(pattern)}, {"content", std::move(content)}};
}

// "é" is 256 and "fi" 257.
const Merges accents = {{"\xc3", "\xa9"}, {"f", "i"}};

TEST(TokenizerNormalizer, NfcComposesACombiningAccent) {
  auto t = parsed(with_normalizer({{"type", "NFC"}}, accents));
  ASSERT_TRUE(t);
  EXPECT_EQ(enc(*t, "e\xcc\x81"), (Ids{256}));  // e + U+0301 is é
  EXPECT_EQ(enc(*t, "\xc3\xa9"), (Ids{256}));
  // Without a normalizer the accent is a piece of its own (\p{M}, not \p{L}).
  auto raw = parsed(with_normalizer(nullptr, accents));
  ASSERT_TRUE(raw);
  EXPECT_EQ(enc(*raw, "e\xcc\x81"), (Ids{'e', 0xcc, 0x81}));
}

TEST(TokenizerNormalizer, NfdSplitsAnAccentedLetter) {
  auto t = parsed(with_normalizer({{"type", "NFD"}}, accents));
  ASSERT_TRUE(t);
  EXPECT_EQ(enc(*t, "\xc3\xa9"), (Ids{'e', 0xcc, 0x81}));  // é is e + U+0301
  EXPECT_EQ(enc(*t, "\xef\xac\x81"), (Ids{0xef, 0xac, 0x81}));  // the ligature ﬁ is no canonical pair
}

TEST(TokenizerNormalizer, NfkcFoldsCompatibilityCharacters) {
  auto t = parsed(with_normalizer({{"type", "NFKC"}}, accents));
  ASSERT_TRUE(t);
  EXPECT_EQ(enc(*t, "\xef\xac\x81"), (Ids{257}));                 // ﬁ is f + i
  EXPECT_EQ(enc(*t, "\xef\xbc\xa1\xef\xbc\xa2"), (Ids{'A', 'B'}));  // full-width ＡＢ
  EXPECT_EQ(enc(*t, "\xef\xac\x81" "e\xcc\x81"), (Ids{257, 256}));  // "fié", composed
}

TEST(TokenizerNormalizer, NfkdFoldsAndDecomposes) {
  auto t = parsed(with_normalizer({{"type", "NFKD"}}, accents));
  ASSERT_TRUE(t);
  // "ﬁé" is "fie" + U+0301: the accent is a pre-tokenizer piece of its own.
  EXPECT_EQ(enc(*t, "\xef\xac\x81\xc3\xa9"), (Ids{257, 'e', 0xcc, 0x81}));
  EXPECT_EQ(enc(*t, "\xef\xbc\xa1"), (Ids{'A'}));
}

TEST(TokenizerNormalizer, LowercaseMapsEachCharacterOnItsOwn) {
  // "σ" is 256, "α" 257. Hugging Face lowercases char by char (Rust's
  // char::to_lowercase), so a final Σ becomes σ, not ς (which would end in
  // the bytes 0xcf 0x82).
  auto t = parsed(with_normalizer({{"type", "Lowercase"}}, {{"\xcf", "\x83"}, {"\xce", "\xb1"}}));
  ASSERT_TRUE(t);
  EXPECT_EQ(enc(*t, "\xce\xa3\xce\x91\xce\xa3"), (Ids{256, 257, 256}));  // ΣΑΣ -> σασ
  // İ (U+0130) has a full mapping: i + U+0307, the mark a piece of its own.
  EXPECT_EQ(enc(*t, "\xc4\xb0"), (Ids{'i', 0xcc, 0x87}));
  EXPECT_EQ(enc(*t, "HeLLo WORLD"), (Ids{'h', 'e', 'l', 'l', 'o', ' ', 'w', 'o', 'r', 'l', 'd'}));
}

TEST(TokenizerNormalizer, StripRemovesUnicodeWhitespaceAtTheChosenEnds) {
  auto both = parsed(with_normalizer({{"type", "Strip"}, {"strip_left", true}, {"strip_right", true}}));
  auto left = parsed(with_normalizer({{"type", "Strip"}, {"strip_left", true}, {"strip_right", false}}));
  auto right = parsed(with_normalizer({{"type", "Strip"}, {"strip_left", false}, {"strip_right", true}}));
  ASSERT_TRUE(both && left && right);
  EXPECT_EQ(enc(*both, "\xe3\x80\x80 hi \t"), (Ids{'h', 'i'}));  // U+3000 is White_Space
  EXPECT_EQ(enc(*left, "  hi  "), (Ids{'h', 'i', ' ', ' '}));
  EXPECT_EQ(enc(*right, "  hi  "), (Ids{' ', ' ', 'h', 'i'}));
  EXPECT_EQ(enc(*both, " \n "), Ids{});
}

TEST(TokenizerNormalizer, ReplaceSubstitutesALiteralOrARegex) {
  // "▁" (U+2581, e2 96 81) is 257.
  const Merges bar = {{"\xe2", "\x96"}, {"\xe2\x96", "\x81"}};
  auto space = parsed(with_normalizer(replace({{"String", " "}}, "\xe2\x96\x81"), bar));
  ASSERT_TRUE(space);
  EXPECT_EQ(enc(*space, "a b"), (Ids{'a', 257, 'b'}));
  // A String pattern is literal: "." matches only a dot.
  auto literal = parsed(with_normalizer(replace({{"String", "a.b"}}, "X")));
  ASSERT_TRUE(literal);
  EXPECT_EQ(enc(*literal, "a.b axb"), (Ids{'X', ' ', 'a', 'x', 'b'}));
  auto regex = parsed(with_normalizer(replace({{"Regex", "\\s+"}}, " ")));
  ASSERT_TRUE(regex);
  EXPECT_EQ(enc(*regex, "a \t\n b"), (Ids{'a', ' ', 'b'}));
  // Empty matches as Oniguruma's iterator (which Hugging Face uses) gives
  // them: the first empty match after a non-empty one is skipped, so
  // "xxaxb" becomes "-a-b-" (Python's re.sub gives "--a--b-").
  auto empty = parsed(with_normalizer(replace({{"Regex", "x*"}}, "-")));
  ASSERT_TRUE(empty);
  EXPECT_EQ(enc(*empty, "xxaxb"), (Ids{'-', 'a', '-', 'b', '-'}));
}

TEST(TokenizerNormalizer, PrependGoesBeforeEachNonEmptyPieceBetweenSpecialTokens) {
  // "▁" is 257, "<s>" 258 (special, so matched on the raw text).
  auto t = parsed(with_normalizer({{"type", "Prepend"}, {"prepend", "\xe2\x96\x81"}},
                                  {{"\xe2", "\x96"}, {"\xe2\x96", "\x81"}}, {"<s>"}));
  ASSERT_TRUE(t);
  EXPECT_EQ(enc(*t, "<s>hi"), (Ids{258, 257, 'h', 'i'}));
  EXPECT_EQ(enc(*t, "hi<s>"), (Ids{257, 'h', 'i', 258}));
  EXPECT_EQ(enc(*t, "<s>"), (Ids{258}));
  EXPECT_EQ(enc(*t, ""), Ids{});
}

TEST(TokenizerNormalizer, SequenceAppliesItsNormalizersInOrder) {
  nlohmann::json lower = {{"type", "Lowercase"}};
  auto a_to_b = replace({{"String", "A"}}, "b");
  auto lower_first = parsed(with_normalizer({{"type", "Sequence"}, {"normalizers", {lower, a_to_b}}}));
  auto replace_first = parsed(with_normalizer({{"type", "Sequence"}, {"normalizers", {a_to_b, lower}}}));
  ASSERT_TRUE(lower_first && replace_first);
  EXPECT_EQ(enc(*lower_first, "Aa"), (Ids{'a', 'a'}));
  EXPECT_EQ(enc(*replace_first, "Aa"), (Ids{'b', 'a'}));
  // Llama-2's normalizer: Prepend "▁", then every space to "▁".
  auto llama = parsed(with_normalizer(
      {{"type", "Sequence"},
       {"normalizers", {{{"type", "Prepend"}, {"prepend", "_"}}, replace({{"String", " "}}, "_")}}}));
  ASSERT_TRUE(llama);
  EXPECT_EQ(enc(*llama, "a b"), (Ids{'_', 'a', '_', 'b'}));
}

TEST(TokenizerNormalizer, UnsupportedNormalizersAreRefusedAtLoadByFieldAndValue) {
  auto expect_named = [](const nlohmann::json& normalizer, std::vector<std::string> words) {
    auto e = load_error(with_normalizer(normalizer));
    ASSERT_FALSE(e.empty()) << normalizer.dump();
    words.push_back(kOrigin);
    for (const auto& w : words) EXPECT_NE(e.find(w), std::string::npos) << "'" << w << "' not in: " << e;
  };
  expect_named({{"type", "BertNormalizer"}, {"lowercase", true}}, {"normalizer.type", "BertNormalizer"});
  for (std::string type : {"StripAccents", "Precompiled", "ByteLevel", "Nmt", "Uppercase"})
    expect_named({{"type", "Sequence"}, {"normalizers", {{{"type", "NFC"}}, {{"type", type}}}}},
                 {"normalizer.normalizers[1].type", type});
  expect_named({{"lowercase", true}}, {"normalizer.type", "missing"});
  expect_named("NFC", {"normalizer", "'NFC'"});
  expect_named({{"type", "Strip"}, {"strip_left", true}}, {"normalizer.strip_right", "missing"});
  expect_named({{"type", "Prepend"}, {"prepend", 3}}, {"normalizer.prepend", "3"});
}

TEST(TokenizerNormalizer, MalformedReplaceIsRefusedAtLoadByFieldAndValue) {
  auto expect_named = [](const nlohmann::json& normalizer, std::vector<std::string> words) {
    auto e = load_error(with_normalizer(normalizer));
    ASSERT_FALSE(e.empty()) << normalizer.dump();
    words.push_back(kOrigin);
    for (const auto& w : words) EXPECT_NE(e.find(w), std::string::npos) << "'" << w << "' not in: " << e;
  };
  expect_named(replace({{"Glob", "a*"}}, "b"), {"normalizer.pattern", "Glob", "a*"});
  expect_named(replace({{"String", "a"}, {"Regex", "b"}}, "c"), {"normalizer.pattern"});
  expect_named(replace("a", "b"), {"normalizer.pattern", "'a'"});
  expect_named({{"type", "Replace"}, {"pattern", {{"String", "a"}}}}, {"normalizer.content", "missing"});
  expect_named(replace({{"Regex", "(x"}}, "y"), {"normalizer.pattern.Regex", "'(x'", "does not compile"});
  expect_named({{"type", "Sequence"},
                {"normalizers", {{{"type", "Replace"}, {"pattern", {{"String", "a"}}}, {"content", 5}}}}},
               {"normalizer.normalizers[0].content", "5"});
}

nlohmann::json with_added(nlohmann::json added, nlohmann::json normalizer = nullptr) {
  auto j = bpe_tokenizer({}, {}, byte_level_pre);
  j["added_tokens"] = std::move(added);
  j["normalizer"] = std::move(normalizer);
  return j;
}

nlohmann::json token(int64_t id, const std::string& content, nlohmann::json flags = nlohmann::json::object()) {
  flags["id"] = id;
  flags["content"] = content;
  return flags;
}

TEST(TokenizerAddedTokens, LstripTakesTheWhitespaceOnTheLeft) {
  auto t = parsed(with_added({token(256, "<m>", {{"special", true}, {"lstrip", true}}),
                              token(257, "<n>", {{"special", true}})}));
  ASSERT_TRUE(t);
  EXPECT_EQ(enc(*t, "a  <m>b"), (Ids{'a', 256, 'b'}));
  EXPECT_EQ(enc(*t, "a  <n>b"), (Ids{'a', ' ', ' ', 257, 'b'}));
  EXPECT_EQ(enc(*t, "a\xe3\x80\x80<m>"), (Ids{'a', 256}));  // U+3000 is whitespace too
  EXPECT_EQ(enc(*t, "<n> <m>"), (Ids{257, 256}));
}

TEST(TokenizerAddedTokens, RstripTakesTheWhitespaceOnTheRight) {
  auto t = parsed(with_added({token(256, "<m>", {{"special", true}, {"rstrip", true}}),
                              token(257, "<n>", {{"special", true}})}));
  ASSERT_TRUE(t);
  EXPECT_EQ(enc(*t, "a<m>  b"), (Ids{'a', 256, 'b'}));
  EXPECT_EQ(enc(*t, "a<n>  b"), (Ids{'a', 257, ' ', ' ', 'b'}));
  EXPECT_EQ(enc(*t, "<m> \n"), (Ids{256}));
}

TEST(TokenizerAddedTokens, SingleWordMatchesOnlyOutsideWords) {
  auto t = parsed(with_added({token(256, "ing", {{"single_word", true}}), token(257, "ong")}));
  ASSERT_TRUE(t);
  // The "ing" inside "sing" is skipped; the search goes on after it.
  EXPECT_EQ(enc(*t, "sing ing"), (Ids{'s', 'i', 'n', 'g', ' ', 256}));
  EXPECT_EQ(enc(*t, "ing,"), (Ids{256, ','}));  // punctuation is not a word character
  EXPECT_EQ(enc(*t, "\xc3\xa9ing"), (Ids{0xc3, 0xa9, 'i', 'n', 'g'}));  // é is
  EXPECT_EQ(enc(*t, "1ing"), (Ids{'1', 'i', 'n', 'g'}));                // and so is a digit
  EXPECT_EQ(enc(*t, "song"), (Ids{'s', 257}));                          // without the flag, any match
}

TEST(TokenizerAddedTokens, NormalizedTokensMatchTheNormalizedText) {
  auto t = parsed(
      with_added({token(256, "Hello", {{"normalized", true}}), token(257, "World", {{"normalized", false}})},
                 {{"type", "Lowercase"}}));
  ASSERT_TRUE(t);
  // "Hello" is matched as "hello" in the lowercased text; "World" only as
  // itself in the raw text, so " WORLD" is lowercased and merged.
  EXPECT_EQ(enc(*t, "HELLO World WORLD"), (Ids{256, ' ', 257, ' ', 'w', 'o', 'r', 'l', 'd'}));
  EXPECT_EQ(enc(*t, "hello"), (Ids{256}));
}

TEST(TokenizerAddedTokens, SpecialTokensDefaultToRawMatchingAndOthersToNormalized) {
  auto t = parsed(with_added({token(256, "Hi", {{"special", false}}), token(257, "<S>", {{"special", true}})},
                             {{"type", "Lowercase"}}));
  ASSERT_TRUE(t);
  EXPECT_EQ(enc(*t, "HI<S><s>"), (Ids{256, 257, '<', 's', '>'}));
  EXPECT_TRUE(t->is_special(257));
  EXPECT_FALSE(t->is_special(256));
}

// --- other fields that change the ids ---------------------------------------

TEST(Tokenizer, UnknownBytesUseTheUnknownTokenOrByteFallback) {
  // A vocabulary without "z"; "<unk>" is 256 and "<0x7A>" 257.
  auto base = bpe_tokenizer({}, {}, byte_level_pre);
  base["model"]["vocab"].erase("z");
  base["model"]["vocab"]["<unk>"] = 256;
  base["model"]["vocab"]["<0x7A>"] = 257;
  auto unk = base;
  unk["model"]["unk_token"] = "<unk>";
  auto t = parsed(unk);
  ASSERT_TRUE(t);
  EXPECT_EQ(enc(*t, "azz"), (Ids{'a', 256, 256}));
  unk["model"]["fuse_unk"] = true;
  auto fused = parsed(unk);
  ASSERT_TRUE(fused);
  EXPECT_EQ(enc(*fused, "azz"), (Ids{'a', 256}));
  EXPECT_EQ(enc(*fused, "zaz"), (Ids{256, 'a', 256}));
  auto fallback = base;
  fallback["model"]["byte_fallback"] = true;
  auto f = parsed(fallback);
  ASSERT_TRUE(f);
  EXPECT_EQ(enc(*f, "az"), (Ids{'a', 257}));
  // Neither: Hugging Face drops the byte; this says so instead.
  auto none = parsed(base);
  ASSERT_TRUE(none);
  auto e = none->encode("az");
  ASSERT_FALSE(e);
  EXPECT_NE(describe(e.error()).find("0x7a"), std::string::npos) << describe(e.error());
  auto missing = base;
  missing["model"]["unk_token"] = "<nope>";
  auto m = parsed(missing);
  ASSERT_TRUE(m);
  auto me = m->encode("z");
  ASSERT_FALSE(me);
  EXPECT_NE(describe(me.error()).find("model.unk_token '<nope>'"), std::string::npos) << describe(me.error());
}

TEST(Tokenizer, ByteLevelPrefixSpaceAppliesToEachPieceOfAnEarlierSplit) {
  auto t = parsed(bpe_tokenizer(
      {}, {},
      {{"type", "Sequence"},
       {"pretokenizers",
        {{{"type", "Split"}, {"pattern", {{"Regex", "\\p{L}+"}}}, {"behavior", "Isolated"}, {"invert", false}},
         {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"use_regex", false}}}}}));
  ASSERT_TRUE(t);
  // Pieces "a", " ", "b"; each that does not start with a space gets one.
  EXPECT_EQ(enc(*t, "a b"), (Ids{' ', 'a', ' ', ' ', 'b'}));
}

// A vocabulary whose ids collide would train distinct tokens as one (the
// loss still falls), and one far beyond its size would make a table of
// that size before anything refuses it: both are refused at load.
TEST(Tokenizer, CollidingAndFarOutIdsAreRefusedAtLoad) {
  auto j = bpe_tokenizer({}, {}, byte_level_pre);
  auto same = j;
  int64_t n = 0;
  for (auto& [_, id] : same["model"]["vocab"].items()) id = n++ < 2 ? 7 : id.get<int64_t>() + 1000;
  auto t = Tokenizer::parse(same.dump(), kOrigin);
  ASSERT_FALSE(t);
  EXPECT_NE(describe(t.error()).find("the same id 7"), std::string::npos) << describe(t.error());
  auto far = j;
  far["model"]["vocab"]["far"] = int64_t{1} << 24;
  t = Tokenizer::parse(far.dump(), kOrigin);
  ASSERT_FALSE(t);
  EXPECT_NE(describe(t.error()).find("out of range"), std::string::npos) << describe(t.error());
  EXPECT_TRUE(Tokenizer::parse(j.dump(), kOrigin)) << "the vocabulary itself loads";
}

TEST(Tokenizer, FieldsThatWouldChangeTheIdsAreRefusedByName) {
  auto expect_encode_refused = [](const nlohmann::json& j, std::vector<std::string> words) {
    auto e = encode_error(j);
    ASSERT_FALSE(e.empty()) << j.dump();
    words.push_back(kOrigin);
    for (const auto& w : words) EXPECT_NE(e.find(w), std::string::npos) << "'" << w << "' not in: " << e;
    // Decoding still works.
    auto t = Tokenizer::parse(j.dump(), kOrigin);
    ASSERT_TRUE(t);
    EXPECT_EQ(t->decode(std::vector<int64_t>{'h', 'i'}), "hi");
  };
  auto j = bpe_tokenizer({}, {}, byte_level_pre);
  auto dropout = j;
  dropout["model"]["dropout"] = 0.1;
  expect_encode_refused(dropout, {"model.dropout", "0.1"});
  dropout["model"]["dropout"] = 0.0;
  EXPECT_EQ(encode_error(dropout), "");
  auto prefix = j;
  prefix["model"]["continuing_subword_prefix"] = "##";
  expect_encode_refused(prefix, {"model.continuing_subword_prefix", "'##'"});
  prefix["model"]["continuing_subword_prefix"] = "";
  EXPECT_EQ(encode_error(prefix), "");
  auto suffix = j;
  suffix["model"]["end_of_word_suffix"] = "</w>";
  expect_encode_refused(suffix, {"model.end_of_word_suffix", "'</w>'"});
  auto metaspace = j;
  metaspace["pre_tokenizer"] = {{"type", "Metaspace"}, {"replacement", "_"}};
  expect_encode_refused(metaspace, {"pre_tokenizer.type", "'Metaspace'"});
  auto removed = j;
  removed["pre_tokenizer"] = {
      {"type", "Sequence"},
      {"pretokenizers", {{{"type", "Split"}, {"pattern", {{"String", " "}}}, {"behavior", "Removed"}}}}};
  expect_encode_refused(removed, {"pre_tokenizer.pretokenizers[0].behavior", "'Removed'"});
  auto after = j;
  after["pre_tokenizer"] = {{"type", "Sequence"},
                            {"pretokenizers", {byte_level_pre, {{"type", "Split"}, {"pattern", {{"String", " "}}}}}}};
  expect_encode_refused(after, {"pre_tokenizer.pretokenizers[1].type", "'Split'", "after a ByteLevel"});
  // Hugging Face numbers added tokens itself (from the vocabulary's size up)
  // and ignores "id"; a file whose ids disagree would encode differently.
  auto renumbered = j;
  renumbered["added_tokens"] = {token(300, "<x>", {{"special", true}})};
  expect_encode_refused(renumbered, {"added_tokens[0].id", "300", "'<x>'", "(256"});
  // Two normalized tokens that normalize alike: Hugging Face picks either.
  auto clash = j;
  clash["normalizer"] = {{"type", "Lowercase"}};
  clash["added_tokens"] = {token(256, "<s>"), token(257, "<S>")};
  expect_encode_refused(clash, {"added_tokens[1].content", "'<S>'", "added_tokens[0].content", "'<s>'"});
  // A model type other than BPE does not even decode right: refused at load.
  auto wordpiece = j;
  wordpiece["model"]["type"] = "WordPiece";
  auto e = load_error(wordpiece);
  for (std::string w : {std::string{kOrigin}, std::string{"model.type"}, std::string{"'WordPiece'"}})
    EXPECT_NE(e.find(w), std::string::npos) << "'" << w << "' not in: " << e;
}


// --- tokenizer_config.json ---------------------------------------------------

// A model directory: tokenizer.json with ChatML's tokens and `config` as its
// tokenizer_config.json.
std::string model_dir(const nlohmann::json& config) {
  auto dir = glint::testing::fresh_dir("tokcfg");
  std::ofstream{dir + "/tokenizer.json"} << bpe_tokenizer_json(merges, {"<|im_start|>", "<|im_end|>"}, byte_level_pre);
  std::ofstream{dir + "/tokenizer_config.json"} << config.dump();
  return dir;
}

TEST(TokenizerConfigFile, CleanUpTokenizationSpacesIsHonouredInDecode) {
  // Hugging Face's clean_up_tokenization, rule by rule.
  EXPECT_EQ(clean_up_tokenization("Hello , world ! Is it ? Yes . I do n't , I 'm , it 's , we 've , they 're ' x"),
            "Hello, world! Is it? Yes. I don't, I'm, it's, we've, they're'x");
  EXPECT_EQ(clean_up_tokenization("a ' b"), "a'b");
  auto on = Tokenizer::load(model_dir({{"clean_up_tokenization_spaces", true}}));
  ASSERT_TRUE(on) << describe(on.error());
  auto ids = on->encode("hello .");
  ASSERT_TRUE(ids);
  EXPECT_EQ(on->decode(*ids), "hello.");
  auto off = Tokenizer::load(model_dir({{"clean_up_tokenization_spaces", false}}));
  EXPECT_EQ(off->decode(*ids), "hello .");
  auto absent = Tokenizer::load(model_dir(nlohmann::json::object()));
  EXPECT_EQ(absent->decode(*ids), "hello .") << "absent: false, as current transformers";
}

TEST(TokenizerConfigFile, LoadReadsTheChatTemplateAndTheJinjaFileWins) {
  auto dir = model_dir({{"chat_template", "{{ 'json' }}"}, {"eos_token", "<|im_end|>"}});
  auto from_json = Tokenizer::load(dir + "/tokenizer.json");
  ASSERT_TRUE(from_json) << describe(from_json.error());
  EXPECT_EQ(from_json->config().chat_template, "{{ 'json' }}");
  EXPECT_NE(from_json->config().chat_template_origin.find("tokenizer_config.json: chat_template"), std::string::npos);
  std::ofstream{dir + "/chat_template.jinja"} << "{{ 'file' }}";
  auto from_file = Tokenizer::load(dir);
  ASSERT_TRUE(from_file);
  EXPECT_EQ(from_file->config().chat_template, "{{ 'file' }}");
  // A list of named templates: the default one.
  auto listed = Tokenizer::load(model_dir(
      {{"chat_template", nlohmann::json::array({{{"name", "tool_use"}, {"template", "T"}}, {{"name", "default"}, {"template", "D"}}})}}));
  ASSERT_TRUE(listed) << describe(listed.error());
  EXPECT_EQ(listed->config().chat_template, "D");
}

TEST(TokenizerConfigFile, FieldsThatWouldChangeTheIdsAreRefusedByFileFieldAndValue) {
  struct Case {
    nlohmann::json config;
    std::string says;
  };
  const std::vector<Case> cases = {
      {{{"split_special_tokens", true}}, "split_special_tokens true"},
      {{{"errors", "strict"}}, "errors \"strict\""},
      {{{"add_prefix_space", true}}, "add_prefix_space true"},
      {{{"do_lower_case", true}}, "do_lower_case true"},
      {{{"eos_token", "<|eot|>"}}, "eos_token '<|eot|>' is not a token"},
      {{{"pad_token", {{"content", "<pad>"}, {"__type", "AddedToken"}}}}, "pad_token '<pad>' is not a token"},
      {{{"added_tokens_decoder", {{"258", {{"content", "<|im_end|>"}}}}}}, "added_tokens_decoder says token 258"},
      {{{"clean_up_tokenization_spaces", "yes"}}, "clean_up_tokenization_spaces \"yes\""},
      {{{"chat_template", 3}}, "chat_template 3"},
  };
  for (const auto& c : cases) {
    auto t = Tokenizer::load(model_dir(c.config));
    ASSERT_FALSE(t) << c.config.dump();
    const auto msg = describe(t.error());
    EXPECT_NE(msg.find("tokenizer_config.json"), std::string::npos) << msg;
    EXPECT_NE(msg.find(c.says), std::string::npos) << msg;
  }
  // What matches the vocabulary loads.
  auto ok = Tokenizer::load(model_dir({{"eos_token", "<|im_end|>"}, {"bos_token", nullptr}, {"errors", "replace"},
                                       {"split_special_tokens", false}, {"add_prefix_space", false},
                                       {"padding_side", "left"}, {"model_max_length", 32768}}));
  EXPECT_TRUE(ok) << describe(ok.error());
}

TEST(TokenizerConfigFile, ATokenizerFileTooLargeIsRefusedBeforeItIsRead) {
  auto dir = glint::testing::fresh_dir("tokbig");
  {
    std::ofstream f{dir + "/tokenizer.json"};
    f.seekp(static_cast<std::streamoff>(kMaxTextFileBytes) + 1);
    f.put('x');
  }
  auto t = Tokenizer::load(dir);
  ASSERT_FALSE(t);
  EXPECT_EQ(code_of(t.error()), errc::resource_exhausted);
  EXPECT_NE(describe(t.error()).find("more than the"), std::string::npos) << describe(t.error());
}


// --- BPE merging -------------------------------------------------------------

// The rule merging follows, written the slow, obvious way: merge the pair of
// lowest rank, the leftmost among equals, until no pair has a merge.
std::vector<int64_t> naive_bpe(const std::string& word, const std::vector<std::pair<std::string, std::string>>& ms) {
  std::map<std::pair<std::string, std::string>, int> rank;
  std::map<std::string, int64_t> id;
  for (int b = 0; b < 256; ++b) id[std::string(1, static_cast<char>(b))] = b;
  for (size_t i = 0; i < ms.size(); ++i) {
    rank.emplace(ms[i], static_cast<int>(i));
    id.emplace(ms[i].first + ms[i].second, 256 + static_cast<int64_t>(i));
  }
  std::vector<std::string> sym;
  for (char c : word) sym.emplace_back(1, c);
  for (;;) {
    int best = INT_MAX;
    size_t at = 0;
    for (size_t i = 0; i + 1 < sym.size(); ++i)
      if (auto it = rank.find({sym[i], sym[i + 1]}); it != rank.end() && it->second < best) best = it->second, at = i;
    if (best == INT_MAX) break;
    sym[at] += sym[at + 1];
    sym.erase(sym.begin() + static_cast<long>(at) + 1);
  }
  std::vector<int64_t> out;
  for (const auto& x : sym) out.push_back(id.at(x));
  return out;
}

TEST(TokenizerBpe, MergesAsTheLowestRankLeftmostRuleOnRandomVocabularies) {
  std::mt19937 rng{7};
  for (int round = 0; round < 20; ++round) {
    // Random merges over a, b, c: pairs of tokens made so far, each new.
    std::vector<std::string> tokens = {"a", "b", "c"};
    std::set<std::string> seen(tokens.begin(), tokens.end());
    std::vector<std::pair<std::string, std::string>> ms;
    while (ms.size() < 40) {
      auto& x = tokens[rng() % tokens.size()];
      auto& y = tokens[rng() % tokens.size()];
      if (x.size() + y.size() > 8 || !seen.insert(x + y).second) continue;
      ms.emplace_back(x, y);
      tokens.push_back(x + y);
    }
    auto t = Tokenizer::parse(bpe_tokenizer_json(ms, {}, byte_level_pre));
    ASSERT_TRUE(t) << describe(t.error());
    for (int k = 0; k < 20; ++k) {
      std::string word;
      for (size_t n = 1 + rng() % 60; n-- > 0;) word += "abc"[rng() % 3];
      auto ids = t->encode(word);
      ASSERT_TRUE(ids) << describe(ids.error());
      EXPECT_EQ(*ids, naive_bpe(word, ms)) << word;
    }
  }
}

TEST(TokenizerBpe, ALongWordEncodesInTimeLinearithmicInItsLength) {
  // 400 kB of one letter: merging by scanning for the best pair took ~40 s
  // per 100 kB; the heap takes well under a second.
  auto t = Tokenizer::parse(bpe_tokenizer_json({{"a", "a"}, {"aa", "aa"}, {"aaaa", "aaaa"}}, {}, byte_level_pre));
  ASSERT_TRUE(t);
  const std::string word(400000, 'a');
  const auto start = std::chrono::steady_clock::now();
  auto ids = t->encode(word);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ASSERT_TRUE(ids) << describe(ids.error());
  EXPECT_EQ(ids->size(), 50000u);
  EXPECT_TRUE(std::all_of(ids->begin(), ids->end(), [](int64_t id) { return id == 258; }));
  EXPECT_LT(s, 10.0);
}

TEST(TokenizerBpe, AWordLongerThanTheCapIsRefusedAndShorterWordsAreNot) {
  auto t = Tokenizer::parse(bpe_tokenizer_json(merges, {}, byte_level_pre), "tokenizer.json", {},
                            {.max_word_bytes = 1000});
  ASSERT_TRUE(t);
  EXPECT_TRUE(t->encode(std::string(1000, 'x')));
  auto long_word = t->encode(std::string(1001, 'x'));
  ASSERT_FALSE(long_word);
  EXPECT_EQ(code_of(long_word.error()), errc::resource_exhausted);
  EXPECT_NE(describe(long_word.error()).find("max_word_bytes 1000"), std::string::npos) << describe(long_word.error());
  std::string words;
  for (int i = 0; i < 100; ++i) words += " hello world";
  EXPECT_TRUE(t->encode(words)) << "a long text of short words is not a long word";
  EXPECT_FALSE(Tokenizer::parse(bpe_tokenizer_json(merges, {}, byte_level_pre), "tokenizer.json", {},
                                {.max_word_bytes = 0}));
}

TEST(TokenizerBpe, AMergeOutsideTheVocabularyCannotEncodeAndARepeatedMergeTakesItsLastRank) {
  auto j = bpe_tokenizer(merges, {}, byte_level_pre);
  j["model"]["merges"].push_back(glint::testing::byte_level("x") + " " + glint::testing::byte_level("yz"));
  auto t = Tokenizer::parse(j.dump());
  ASSERT_TRUE(t) << "it still decodes";
  auto ids = t->encode("hello");
  ASSERT_FALSE(ids);
  EXPECT_NE(describe(ids.error()).find("model.merges[10]"), std::string::npos) << describe(ids.error());
  EXPECT_NE(describe(ids.error()).find("not in model.vocab"), std::string::npos);
  // "b c" ranked before "a b" and again after it: the last rank wins, as in
  // Hugging Face's merge map (later entries replace earlier ones), so "abc"
  // merges a+b first.
  auto r = bpe_tokenizer({{"a", "b"}, {"b", "c"}}, {}, byte_level_pre);
  r["model"]["merges"] = {"b c", "a b", "b c"};
  auto rt = Tokenizer::parse(r.dump());
  ASSERT_TRUE(rt);
  EXPECT_EQ(*rt->encode("abc"), (std::vector<int64_t>{256, 'c'}));
}

}  // namespace
}  // namespace glint::components
