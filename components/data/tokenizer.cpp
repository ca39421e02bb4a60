#include "components/data/tokenizer.hpp"

#include "components/data/detail/added_tokens.hpp"
#include "components/data/detail/byte_level.hpp"
#include "components/data/detail/normalizer.hpp"
#include "components/data/detail/regex.hpp"
#include "components/data/detail/unicode.hpp"
#include "runtime/file.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <climits>
#include <cstdio>
#include <filesystem>
#include <initializer_list>
#include <optional>
#include <queue>
#include <sstream>
#include <tuple>
#include <utility>

namespace glint::components {

namespace {

// The next code point of valid UTF-8 `s` at `i` (advanced), or -1.
int32_t next_code_point(std::string_view s, size_t& i) {
  auto c = static_cast<unsigned char>(s[i]);
  int len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
  if (len == 0 || i + static_cast<size_t>(len) > s.size()) {
    ++i;
    return -1;
  }
  int32_t cp = len == 1 ? c : c & (0xff >> (len + 1));
  for (int k = 1; k < len; ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[i + static_cast<size_t>(k)]) & 0x3f);
  i += static_cast<size_t>(len);
  return cp;
}

Result<std::string> decode_byte_level(const std::string& token, const std::array<int, 512>& inv) {
  std::string out;
  for (size_t i = 0; i < token.size();) {
    auto cp = next_code_point(token, i);
    if (cp < 0 || cp >= 512 || inv[static_cast<size_t>(cp)] < 0)
      return make_error(errc::invalid_argument, "token '" + token + "' has a character outside the byte-level alphabet");
    out.push_back(static_cast<char>(inv[static_cast<size_t>(cp)]));
  }
  return out;
}

int hex_digit(char c) {
  return c >= '0' && c <= '9' ? c - '0' : c >= 'A' && c <= 'F' ? c - 'A' + 10 : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
}

std::string decode_metaspace(const std::string& token) {
  // <0x0A>: a byte-fallback token. "<0xZZ>" is not one, just text (std::stoi
  // threw on it, out of parse: found by fuzzing).
  if (token.size() == 6 && token.rfind("<0x", 0) == 0 && token[5] == '>' && hex_digit(token[3]) >= 0 &&
      hex_digit(token[4]) >= 0)
    return std::string(1, static_cast<char>(hex_digit(token[3]) * 16 + hex_digit(token[4])));
  std::string out;
  static const std::string meta = "\xe2\x96\x81";  // U+2581
  for (size_t i = 0; i < token.size();) {
    if (token.compare(i, meta.size(), meta) == 0) {
      out.push_back(' ');
      i += meta.size();
    } else {
      out.push_back(token[i++]);
    }
  }
  return out;
}

uint64_t pair_key(int64_t left, int64_t right) {
  return (static_cast<uint64_t>(left) << 32) | static_cast<uint64_t>(right);
}

}  // namespace

// A pre-tokenizer step, applied to each piece the steps before it made.
struct PreStep {
  bool prefix_space = false;           // ByteLevel's add_prefix_space: " " before a piece that lacks one
  std::optional<detail::Regex> regex;  // none: the piece goes on whole
};

struct Tokenizer::Encoder {
  std::unordered_map<std::string, int64_t> ids;    // a vocabulary token's bytes -> id
  struct Merge {
    int32_t rank;
    int64_t merged;  // the id of left + right
  };
  std::unordered_map<uint64_t, Merge> merges;  // pair_key(left id, right id)
  size_t max_word_bytes = TokenizerOptions{}.max_word_bytes;
  std::vector<std::pair<std::string, int64_t>> added;  // content -> id, for token_id
  detail::AddedTokenSet raw_added;         // normalized = false: matched on the text as given
  detail::AddedTokenSet normalized_added;  // normalized = true: matched on the normalized text
  detail::Normalizer normalizer;
  std::vector<PreStep> pre;
  bool ignore_merges = false;
  bool byte_fallback = false;
  bool fuse_unk = false;
  std::optional<std::string> unk_token;  // as tokenizer.json writes it
  std::string unk_bytes;                 // its bytes

  // BPE of one pre-tokenized piece, appended to `out`. A byte without a
  // vocabulary token becomes, as in Hugging Face's BPE::merge_word, <0xNN>
  // tokens (byte_fallback) or the unknown token (fused with a neighbouring
  // one under fuse_unk); with neither, Hugging Face drops the byte silently
  // and this refuses. A piece longer than max_word_bytes is refused
  // (resource_exhausted) before any work.
  Result<void> merge(std::string_view piece, std::vector<int64_t>& out) const {
    if (piece.empty()) return {};
    if (piece.size() > max_word_bytes)
      return make_error(errc::resource_exhausted,
                        "a word of " + std::to_string(piece.size()) + " bytes (no space or punctuation to split it) is " +
                            "longer than the tokenizer's max_word_bytes " + std::to_string(max_word_bytes));
    if (ignore_merges)
      if (auto it = ids.find(std::string{piece}); it != ids.end()) {
        out.push_back(it->second);
        return {};
      }
    std::vector<int64_t> sym;
    std::optional<int64_t> unk;  // an unknown-token symbol not yet placed
    std::string one(1, '\0');
    for (char c : piece) {
      one[0] = c;
      if (auto it = ids.find(one); it != ids.end()) {
        if (unk) sym.push_back(*std::exchange(unk, std::nullopt));
        sym.push_back(it->second);
        continue;
      }
      if (byte_fallback) {
        // The <0xNN> tokens of the UTF-8 bytes of the byte-level character
        // that stands for this byte, if the vocabulary has them all (an
        // unknown token still pending goes after them, as in Hugging Face).
        std::vector<int64_t> codes;
        for (unsigned char u : detail::to_byte_level(one)) {
          char code[8];
          std::snprintf(code, sizeof(code), "<0x%02X>", u);
          if (auto it = ids.find(code); it != ids.end()) codes.push_back(it->second);
        }
        if (codes.size() == detail::to_byte_level(one).size()) {
          sym.insert(sym.end(), codes.begin(), codes.end());
          continue;
        }
      }
      if (unk_token) {
        auto it = ids.find(unk_bytes);
        if (it == ids.end())
          return make_error(errc::invalid_argument,
                            "model.unk_token '" + *unk_token + "' is not in the vocabulary, and a byte needs it");
        if (unk && !fuse_unk) sym.push_back(*unk);
        unk = it->second;
        continue;
      }
      char hex[8];
      std::snprintf(hex, sizeof(hex), "%02x", static_cast<unsigned char>(c));
      return make_error(errc::invalid_argument, std::string{"the vocabulary has no token for the byte 0x"} + hex +
                                                    " and model.unk_token is null (Hugging Face would drop it silently)");
    }
    if (unk) sym.push_back(*unk);
    merge_symbols(sym);
    out.insert(out.end(), sym.begin(), sym.end());
    return {};
  }

  // Hugging Face's Word::merge_all: the symbols form a linked list, and a
  // heap holds each adjacent pair that has a merge, lowest rank first, the
  // leftmost first among equal ranks; an entry whose pair has changed since
  // it was pushed is skipped when it comes up. O(n log n) in the symbols,
  // where merging the best pair by scanning is O(n^2): that is kept for
  // short words only, where it is faster.
  void merge_symbols(std::vector<int64_t>& sym) const {
    const size_t n = sym.size();
    if (n < 2 || merges.empty()) return;
    if (n <= 24) {
      // Most words: scanning for the best pair is cheaper than a heap.
      for (;;) {
        const Merge* best = nullptr;
        size_t at = 0;
        for (size_t i = 0; i + 1 < sym.size(); ++i)
          if (auto it = merges.find(pair_key(sym[i], sym[i + 1]));
              it != merges.end() && (!best || it->second.rank < best->rank)) {
            best = &it->second;
            at = i;
          }
        if (!best) return;
        sym[at] = best->merged;
        sym.erase(sym.begin() + static_cast<long>(at) + 1);
      }
    }
    struct Node {
      int64_t id;
      int64_t prev, next;  // -1: none
      bool live;
    };
    std::vector<Node> nodes(n);
    for (size_t i = 0; i < n; ++i)
      nodes[i] = {sym[i], static_cast<int64_t>(i) - 1, i + 1 < n ? static_cast<int64_t>(i + 1) : -1, true};
    struct Entry {
      int32_t rank;
      int64_t pos;
      int64_t merged;
      bool operator>(const Entry& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
    };
    std::priority_queue<Entry, std::vector<Entry>, std::greater<>> heap;
    auto push = [&](int64_t pos) {
      const auto& a = nodes[static_cast<size_t>(pos)];
      if (a.next < 0) return;
      if (auto it = merges.find(pair_key(a.id, nodes[static_cast<size_t>(a.next)].id)); it != merges.end())
        heap.push({it->second.rank, pos, it->second.merged});
    };
    for (size_t i = 0; i + 1 < n; ++i) push(static_cast<int64_t>(i));
    while (!heap.empty()) {
      const auto top = heap.top();
      heap.pop();
      auto& a = nodes[static_cast<size_t>(top.pos)];
      if (!a.live || a.next < 0) continue;
      auto& b = nodes[static_cast<size_t>(a.next)];
      auto it = merges.find(pair_key(a.id, b.id));
      if (it == merges.end() || it->second.merged != top.merged) continue;  // stale
      a.id = top.merged;
      b.live = false;
      a.next = b.next;
      if (a.next >= 0) nodes[static_cast<size_t>(a.next)].prev = top.pos;
      if (a.prev >= 0) push(a.prev);
      push(top.pos);
    }
    sym.clear();
    for (int64_t i = 0; i >= 0; i = nodes[static_cast<size_t>(i)].next) sym.push_back(nodes[static_cast<size_t>(i)].id);
  }

  // Pre-tokenizer steps from `step` on, then BPE.
  Result<void> pre_tokenize(std::string_view text, size_t step, std::vector<int64_t>& out) const {
    if (step == pre.size()) return merge(text, out);
    const auto& s = pre[step];
    std::string buf;
    if (s.prefix_space && !text.empty() && text[0] != ' ') {
      buf = " " + std::string{text};
      text = buf;
    }
    if (!s.regex) return pre_tokenize(text, step + 1, out);
    return s.regex->split(text, [&](std::string_view piece) { return pre_tokenize(piece, step + 1, out); });
  }

  // A piece of the raw text between tokens matched on it: normalized, cut
  // at the normalized added tokens, and the rest pre-tokenized and merged.
  // As in Hugging Face's AddedVocabulary::extract_and_normalize.
  Result<void> encode_piece(std::string_view raw, std::vector<int64_t>& out) const {
    std::string normalized;
    std::string_view text = raw;
    if (!normalizer.empty()) {
      auto n = normalizer.apply(raw);
      if (!n) return n.error();
      normalized = std::move(*n);
      text = normalized;
    }
    return normalized_added.split(text, [&](std::string_view piece, int64_t id) -> Result<void> {
      if (id >= 0) {
        out.push_back(id);
        return {};
      }
      return pre_tokenize(piece, 0, out);
    });
  }
};

namespace {

std::string show(const nlohmann::json& v) { return v.is_string() ? "'" + v.get<std::string>() + "'" : v.dump(); }

// The steps of a tokenizer.json pre_tokenizer at `field`: ByteLevel (GPT-2's
// regex unless use_regex is false; add_prefix_space), Split (a regex or a
// literal, "Isolated": matches and the text between them are pieces), or a
// Sequence of them, in order. ByteLevel must come last: after it, Hugging
// Face works on byte-level characters, which this encoder never makes. An
// unimplemented error says why this tokenizer cannot encode; an
// invalid_argument one (a regex that does not compile) refuses the file.
Result<void> read_pre_tokenizer(const nlohmann::json& p, const std::string& field, const std::string& origin,
                                std::vector<PreStep>& steps, bool& byte_level) {
  if (p.is_null() && field == "pre_tokenizer") return {};
  auto type_it = p.is_object() ? p.find("type") : p.end();
  if (!p.is_object() || type_it == p.end() || !type_it->is_string())
    return make_error(errc::invalid_argument, origin + ": " + field + " " + show(p) + " is not a pre-tokenizer");
  const auto type = type_it->get<std::string>();
  if (type == "Sequence") {
    auto list = p.find("pretokenizers");
    if (list == p.end() || !list->is_array())
      return make_error(errc::invalid_argument, origin + ": " + field + ".pretokenizers is not an array");
    for (size_t i = 0; i < list->size(); ++i)
      if (auto ok = read_pre_tokenizer((*list)[i], field + ".pretokenizers[" + std::to_string(i) + "]", origin,
                                       steps, byte_level);
          !ok)
        return ok;
    return {};
  }
  if (byte_level)
    return make_error(errc::unimplemented, origin + ": " + field + ".type '" + type +
                                               "' after a ByteLevel pre-tokenizer is not supported for encoding "
                                               "(it would work on byte-level characters)");
  if (type == "ByteLevel") {
    byte_level = true;
    PreStep step;
    step.prefix_space = p.value("add_prefix_space", false);
    if (p.value("use_regex", true)) {
      auto regex = detail::Regex::compile(detail::kGpt2Pattern);
      if (!regex) return with_context(regex.error(), origin + ": " + field);
      step.regex = std::move(*regex);
    }
    steps.push_back(std::move(step));
    return {};
  }
  if (type == "Split") {
    auto behavior = p.value("behavior", std::string{"Isolated"});
    if (behavior != "Isolated")
      return make_error(errc::unimplemented, origin + ": " + field + ".behavior '" + behavior +
                                                 "' is not supported for encoding (only Isolated)");
    if (p.value("invert", false))
      return make_error(errc::unimplemented,
                        origin + ": " + field + ".invert true is not supported for encoding (only false)");
    auto pat = p.find("pattern");
    if (pat == p.end() || !pat->is_object() || pat->size() != 1 || !pat->begin()->is_string() ||
        !(pat->contains("Regex") || pat->contains("String")))
      return make_error(errc::invalid_argument, origin + ": " + field + ".pattern " +
                                                    (pat == p.end() ? "(missing)" : show(*pat)) +
                                                    " must be {\"String\": text} or {\"Regex\": pattern}");
    const auto& text = pat->begin()->get_ref<const std::string&>();
    const bool literal = pat->contains("String");
    auto regex = detail::Regex::compile(literal ? detail::quote(text) : text,
                                        origin + ": " + field + ".pattern." + pat->begin().key() + " " + show(text));
    if (!regex) return regex.error();
    steps.push_back({false, std::move(*regex)});
    return {};
  }
  return make_error(errc::unimplemented, origin + ": " + field + ".type '" + type +
                                             "' is not supported for encoding (supported: ByteLevel, Split, Sequence)");
}

// A boolean field of `j` at `field`, `fallback` when absent.
Result<bool> flag(const nlohmann::json& j, const char* key, bool fallback, const std::string& field,
                  const std::string& origin) {
  auto it = j.find(key);
  if (it == j.end()) return fallback;
  if (!it->is_boolean())
    return make_error(errc::invalid_argument,
                      origin + ": " + field + "." + key + " " + show(*it) + " is not true or false");
  return it->get<bool>();
}

struct AddedEntry {
  std::string field;  // "added_tokens[3]", for errors
  std::string content;
  int64_t id;
  bool special, normalized, lstrip, rstrip, single_word;
};

}  // namespace

Result<Tokenizer> Tokenizer::load(const std::string& path, const TokenizerOptions& options) {
  namespace fs = std::filesystem;
  auto file = fs::is_directory(path) ? (fs::path{path} / "tokenizer.json").string() : path;
  auto text = read_text_file(file);
  if (!text) return text.error();
  auto config = TokenizerConfig::load_dir(fs::path{file}.parent_path().string());
  if (!config) return config.error();
  return parse(*text, file, std::move(*config), options);
}

Result<Tokenizer> Tokenizer::parse(const std::string& text, const std::string& origin, TokenizerConfig config,
                                   const TokenizerOptions& options) {
  if (options.max_word_bytes == 0) return make_error(errc::invalid_argument, "max_word_bytes must be more than 0");
  auto t = parse_vocabulary(text, origin, options);
  if (!t) return t.error();
  // The roles' tokens and added_tokens_decoder must be the tokenizer's own:
  // Hugging Face would add a missing one as a new token, with a new id.
  auto has = [&](const std::string& content) {
    if (t->token_id(content) >= 0) return true;
    return std::find(t->bytes_.begin(), t->bytes_.end(), content) != t->bytes_.end();
  };
  for (const auto& [role, content] : config.special_tokens)
    if (!has(content))
      return make_error(errc::invalid_argument, config.origin + ": " + role + " '" + content + "' is not a token of " +
                                                    origin + "; Hugging Face would add it as a new token");
  for (const auto& [id, content] : config.added_tokens)
    if (t->token_bytes(id) != content)
      return make_error(errc::invalid_argument,
                        config.origin + ": added_tokens_decoder says token " + std::to_string(id) + " is '" + content +
                            "', but " + origin + " has " +
                            (id < t->vocab_size() ? "'" + t->token_bytes(id) + "'" : std::string{"no such id"}));
  t->config_ = std::make_shared<const TokenizerConfig>(std::move(config));
  return t;
}

Result<Tokenizer> Tokenizer::parse_vocabulary(const std::string& text, const std::string& origin,
                                             const TokenizerOptions& options) try {
  auto j = nlohmann::json::parse(text);
  const auto& model = j.at("model");
  if (auto type = model.find("type"); type != model.end() && *type != "BPE")
    return make_error(errc::unimplemented, origin + ": model.type " + show(*type) + " is not supported (only BPE)");
  auto vocab = model.at("vocab");
  if (!vocab.is_object()) return make_error(errc::invalid_argument, origin + ": model.vocab is not an object");
  // Byte-level unless the decoder says otherwise.
  bool byte_level = true;
  std::string sentence_piece_why;
  if (auto d = j.find("decoder"); d != j.end() && d->is_object()) {
    auto type = d->value("type", std::string{});
    if (type == "Sequence" || type == "Metaspace" || type == "Replace" || type == "ByteFallback") {
      byte_level = false;
      sentence_piece_why = "decoder.type '" + type + "'";
    }
  } else if (auto m = model.find("byte_fallback"); m != model.end() && m->is_boolean() && m->get<bool>()) {
    byte_level = false;
    sentence_piece_why = "model.byte_fallback true without a decoder";
  }
  const auto& inv = detail::byte_level_inverse();
  Tokenizer t;
  // Ids are (nearly) dense: at most twice the entries the file has, so that
  // one id of 16,777,216 is refused before a table of that size is made.
  const auto listed = j.find("added_tokens");
  const int64_t entries = static_cast<int64_t>(vocab.size()) +
                          (listed != j.end() && listed->is_array() ? static_cast<int64_t>(listed->size()) : 0);
  const int64_t max_id = std::min<int64_t>(2 * entries + 1024, int64_t{1} << 24);
  std::vector<std::string> owner;  // the model.vocab token that holds each id, to name a second one
  // `token` empty: an added token, which may stand in model.vocab under its id too.
  auto put = [&](int64_t id, std::string bytes, const std::string& token = {}) -> Result<void> {
    if (id < 0 || id >= max_id)
      return make_error(errc::invalid_argument, origin + ": token '" + (token.empty() ? "(added)" : token.substr(0, 40)) + "' has id " +
                                                    std::to_string(id) + ", out of range for a vocabulary of " +
                                                    std::to_string(entries) + " entries");
    if (static_cast<size_t>(id) >= t.bytes_.size()) {
      t.bytes_.resize(static_cast<size_t>(id) + 1);
      owner.resize(static_cast<size_t>(id) + 1);
    }
    // Two tokens with one id would train as one token: refused.
    if (!token.empty()) {
      auto& first = owner[static_cast<size_t>(id)];
      if (!first.empty())
        return make_error(errc::invalid_argument, origin + ": model.vocab gives tokens '" + first.substr(0, 40) +
                                                      "' and '" + token.substr(0, 40) + "' the same id " +
                                                      std::to_string(id));
      first = token;
    }
    t.bytes_[static_cast<size_t>(id)] = std::move(bytes);
    return {};
  };
  for (auto& [token, id] : vocab.items()) {
    if (!id.is_number_integer())
      return make_error(errc::invalid_argument, origin + ": the id of token '" + token + "' is not an integer");
    std::string bytes;
    if (byte_level) {
      auto b = decode_byte_level(token, inv);
      if (!b) return with_context(b.error(), origin);
      bytes = std::move(*b);
    } else {
      bytes = decode_metaspace(token);
    }
    if (auto ok = put(id.get<int64_t>(), std::move(bytes), token); !ok) return ok.error();
  }
  // Refused at load even for a tokenizer that only decodes: a normalizer
  // this cannot apply means the vocabulary was made for other text.
  auto normalizer = detail::Normalizer::parse(j.contains("normalizer") ? j["normalizer"] : nlohmann::json{}, origin);
  if (!normalizer) return normalizer.error();
  std::vector<AddedEntry> added;
  std::unordered_map<std::string, int64_t> hf_ids;  // content -> the id Hugging Face gives it
  auto next_hf_id = static_cast<int64_t>(vocab.size());
  std::string id_mismatch;  // the first added token whose id Hugging Face would not give it
  if (auto list = j.find("added_tokens"); list != j.end() && list->is_array()) {
    for (size_t i = 0; i < list->size(); ++i) {
      const auto& a = (*list)[i];
      const std::string field = "added_tokens[" + std::to_string(i) + "]";
      if (!a.is_object() || !a.contains("content") || !a["content"].is_string())
        return make_error(errc::invalid_argument, origin + ": " + field + " " + show(a) + " has no string content");
      // An integer: a float id (1e300) has no int64 (undefined behaviour
      // in the conversion, found by fuzzing), and 3.5 is no id either.
      auto id = a.find("id");
      if (id == a.end() || !id->is_number_integer())
        return make_error(errc::invalid_argument, origin + ": " + field + ".id " +
                                                      (id == a.end() ? std::string{"(missing)"} : show(*id)) +
                                                      " is not an integer");
      AddedEntry e{field, a["content"].get<std::string>(), id->get<int64_t>(), false, false, false, false, false};
      auto special = flag(a, "special", false, field, origin);
      if (!special) return special.error();
      e.special = *special;
      // Hugging Face's AddedToken defaults: special tokens match the raw
      // text, others the normalized text.
      for (auto [key, fallback, out] : {std::tuple{"normalized", !e.special, &e.normalized},
                                        std::tuple{"lstrip", false, &e.lstrip}, std::tuple{"rstrip", false, &e.rstrip},
                                        std::tuple{"single_word", false, &e.single_word}}) {
        auto v = flag(a, key, fallback, field, origin);
        if (!v) return v.error();
        *out = *v;
      }
      if (auto ok = put(e.id, e.content); !ok) return ok.error();
      if (e.special) t.special_.insert(e.id);
      // Hugging Face ignores "id" when it reads the file: it numbers the
      // added tokens itself (AddedVocabulary::add_tokens), and the ids it
      // writes follow that rule. Where this file's do not, encode refuses.
      if (!e.content.empty()) {
        auto [it, fresh] = hf_ids.try_emplace(e.content, 0);
        if (fresh) {
          auto v = vocab.find(e.content);
          it->second = v != vocab.end() ? v->get<int64_t>() : next_hf_id++;
        }
        if (it->second != e.id && id_mismatch.empty())
          id_mismatch = field + ".id " + std::to_string(e.id) + " is not the id Hugging Face gives '" + e.content +
                        "' (" + std::to_string(it->second) +
                        ": the vocabulary's id of that text, else the next one from the vocabulary's size up)";
        if (!fresh) {
          // The same content again: Hugging Face keeps one token, with
          // the later flags.
          auto earlier =
              std::find_if(added.begin(), added.end(), [&](const AddedEntry& a) { return a.content == e.content; });
          *earlier = std::move(e);
          continue;
        }
      }
      added.push_back(std::move(e));
    }
  }
  if (!byte_level) {
    t.encode_error_ = origin + ": " + sentence_piece_why +
                      " marks a SentencePiece-style vocabulary, which decodes only; encoding supports byte-level BPE";
    return t;
  }
  auto enc = std::make_shared<Encoder>();
  enc->max_word_bytes = options.max_word_bytes;
  // Why this tokenizer cannot encode: the first field it does not honour.
  auto cannot_encode = [&](std::string why) {
    if (t.encode_error_.empty()) t.encode_error_ = origin + ": " + std::move(why);
  };
  if (!id_mismatch.empty()) cannot_encode(std::move(id_mismatch));
  for (auto& [token, id] : vocab.items()) {
    auto bytes = decode_byte_level(token, inv);
    if (!bytes) return with_context(bytes.error(), origin + ": model.vocab");
    enc->ids.emplace(std::move(*bytes), id.get<int64_t>());
  }
  for (auto [key, out] : std::initializer_list<std::pair<const char*, bool*>>{
           {"ignore_merges", &enc->ignore_merges}, {"byte_fallback", &enc->byte_fallback}, {"fuse_unk", &enc->fuse_unk}}) {
    auto v = flag(model, key, false, "model", origin);
    if (!v) return v.error();
    *out = *v;
  }
  if (auto u = model.find("unk_token"); u != model.end() && !u->is_null()) {
    if (!u->is_string())
      return make_error(errc::invalid_argument, origin + ": model.unk_token " + show(*u) + " is not a string");
    enc->unk_token = u->get<std::string>();
    if (auto b = decode_byte_level(*enc->unk_token, inv)) enc->unk_bytes = std::move(*b);
  }
  if (auto d = model.find("dropout"); d != model.end() && !d->is_null()) {
    if (!d->is_number())
      return make_error(errc::invalid_argument, origin + ": model.dropout " + show(*d) + " is not a number");
    if (d->get<double>() > 0)
      cannot_encode("model.dropout " + d->dump() +
                    " is not supported for encoding (BPE dropout skips merges at random)");
  }
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"})
    if (auto v = model.find(key);
        v != model.end() && !v->is_null() && !(v->is_string() && v->get<std::string>().empty()))
      cannot_encode(std::string{"model."} + key + " " + show(*v) + " is not supported for encoding");
  if (auto merges = model.find("merges"); merges != model.end() && merges->is_array()) {
    int32_t rank = 0;
    for (const auto& m : *merges) {
      std::string a, b;
      if (m.is_string()) {
        auto text = m.get<std::string>();
        auto space = text.find(' ');
        if (space == std::string::npos)
          return make_error(errc::invalid_argument, origin + ": merge '" + text + "' is not two tokens");
        a = text.substr(0, space);
        b = text.substr(space + 1);
      } else {
        a = m.at(0).get<std::string>();
        b = m.at(1).get<std::string>();
      }
      auto ra = decode_byte_level(a, inv), rb = decode_byte_level(b, inv);
      if (!ra || !rb) return with_context(ra ? rb.error() : ra.error(), origin + ": merge " + std::to_string(rank));
      // As Hugging Face's BpeBuilder: both sides and their concatenation
      // must be tokens, and a repeated merge takes its last rank.
      auto ia = enc->ids.find(*ra), ib = enc->ids.find(*rb), im = enc->ids.find(*ra + *rb);
      if (ia == enc->ids.end() || ib == enc->ids.end() || im == enc->ids.end()) {
        cannot_encode("model.merges[" + std::to_string(rank) + "] '" + a + " " + b + "' has a token (" +
                      (ia == enc->ids.end() ? a : ib == enc->ids.end() ? b : a + b) +
                      ") that is not in model.vocab (Hugging Face refuses to load it)");
        ++rank;
        continue;
      }
      enc->merges.insert_or_assign(pair_key(ia->second, ib->second), Encoder::Merge{rank++, im->second});
    }
  }
  bool byte_level_step = false;
  if (auto ok = read_pre_tokenizer(j.contains("pre_tokenizer") ? j["pre_tokenizer"] : nlohmann::json{},
                                   "pre_tokenizer", origin, enc->pre, byte_level_step);
      !ok) {
    if (code_of(ok.error()) != errc::unimplemented) return ok.error();
    if (t.encode_error_.empty()) t.encode_error_ = context_of(ok.error());
  }
  // Added tokens: the two matching sets. A normalized token is matched by
  // its content normalized, as Hugging Face's refresh_added_tokens does.
  // Hugging Face skips a token with empty content.
  std::vector<detail::AddedToken> raw, normalized;
  std::unordered_map<std::string, std::string> pattern_of;  // normalized pattern -> the field that has it
  for (const auto& e : added) {
    enc->added.emplace_back(e.content, e.id);
    if (e.content.empty()) continue;
    detail::AddedToken token{e.content, e.id, e.single_word, e.lstrip, e.rstrip};
    if (e.normalized) {
      auto n = normalizer->apply(e.content);
      if (!n) return with_context(n.error(), origin + ": " + e.field);
      if (n->empty())
        cannot_encode(e.field + ".content '" + e.content + "' normalizes to nothing, which would match everywhere");
      // Which of two tokens matches the same text is left to hash order in
      // Hugging Face.
      if (auto [it, fresh] = pattern_of.try_emplace(*n, e.field); !fresh)
        cannot_encode(e.field + ".content '" + e.content + "' and " + it->second +
                      ".content normalize to the same text '" + *n + "'; Hugging Face matches either");
      token.pattern = std::move(*n);
    }
    (e.normalized ? normalized : raw).push_back(std::move(token));
  }
  enc->raw_added = detail::AddedTokenSet{std::move(raw)};
  enc->normalized_added = detail::AddedTokenSet{std::move(normalized)};
  enc->normalizer = std::move(*normalizer);
  if (!t.encode_error_.empty()) return t;
  t.encoder_ = std::move(enc);
  return t;
} catch (const nlohmann::json::exception& e) {
  return make_error(errc::invalid_argument, origin + " is not a tokenizer.json: " + e.what());
}

const std::string& Tokenizer::token_bytes(int64_t id) const {
  static const std::string none;
  return id >= 0 && id < vocab_size() ? bytes_[static_cast<size_t>(id)] : none;
}

std::string Tokenizer::decode(std::span<const int64_t> ids, bool skip_special) const {
  std::string out;
  for (auto id : ids)
    if (!(skip_special && is_special(id))) out += token_bytes(id);
  return finish_text(out);
}

Result<std::vector<int64_t>> Tokenizer::encode(std::string_view text) const {
  if (!encoder_) return make_error(errc::unimplemented, encode_error_);
  std::vector<int64_t> out;
  // Tokens matched on the raw text first; the pieces between them are
  // normalized and go on (Encoder::encode_piece).
  auto ok = encoder_->raw_added.split(text, [&](std::string_view piece, int64_t id) -> Result<void> {
    if (id >= 0) {
      out.push_back(id);
      return {};
    }
    return encoder_->encode_piece(piece, out);
  });
  if (!ok) return ok.error();
  return out;
}

std::string Tokenizer::finish_text(std::string_view bytes) const {
  auto text = to_valid_utf8(bytes);
  return config_ && config_->clean_up_tokenization_spaces ? clean_up_tokenization(std::move(text)) : text;
}

const TokenizerConfig& Tokenizer::config() const {
  static const TokenizerConfig none;
  return config_ ? *config_ : none;
}

int64_t Tokenizer::token_id(std::string_view token) const {
  if (encoder_) {
    for (const auto& [content, id] : encoder_->added)
      if (content == token) return id;
    if (auto it = encoder_->ids.find(std::string{token}); it != encoder_->ids.end()) return it->second;
  }
  return -1;
}

std::string to_valid_utf8(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    const size_t start = i;
    if (detail::next_utf8(s, i) >= 0) out.append(s.substr(start, i - start));
    else out += "\xef\xbf\xbd";  // U+FFFD for the maximal invalid subpart
  }
  return out;
}

}  // namespace glint::components
