#include "components/data/tokenizer.hpp"

#include "components/data/detail/byte_level.hpp"
#include "components/data/detail/regex.hpp"

#include <nlohmann/json.hpp>

#include <array>
#include <optional>
#include <climits>
#include <fstream>
#include <sstream>

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

std::string decode_metaspace(const std::string& token) {
  // <0x0A>: a byte-fallback token.
  if (token.size() == 6 && token.rfind("<0x", 0) == 0 && token[5] == '>')
    return std::string(1, static_cast<char>(std::stoi(token.substr(3, 2), nullptr, 16)));
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

std::string merge_key(std::string_view a, std::string_view b) {
  std::string k = std::to_string(a.size());
  k += ':';
  k += a;
  k += b;
  return k;
}

}  // namespace

struct Tokenizer::Encoder {
  std::unordered_map<std::string, int64_t> ids;    // a vocabulary token's bytes -> id
  std::unordered_map<std::string, int32_t> ranks;  // merge_key(left, right) -> rank
  std::vector<std::pair<std::string, int64_t>> added;
  std::optional<detail::Regex> regex;  // none: a segment is one piece
  bool add_prefix_space = false;
  bool ignore_merges = false;

  // BPE of one pre-tokenized piece, appended to `out`.
  Result<void> merge(std::string_view piece, std::vector<int64_t>& out) const {
    if (piece.empty()) return {};
    if (ignore_merges)
      if (auto it = ids.find(std::string{piece}); it != ids.end()) {
        out.push_back(it->second);
        return {};
      }
    std::vector<std::string> sym;
    for (char c : piece) sym.emplace_back(1, c);
    while (sym.size() > 1) {
      int32_t best = INT32_MAX;
      size_t at = 0;
      for (size_t i = 0; i + 1 < sym.size(); ++i)
        if (auto it = ranks.find(merge_key(sym[i], sym[i + 1])); it != ranks.end() && it->second < best) {
          best = it->second;
          at = i;
        }
      if (best == INT32_MAX) break;
      sym[at] += sym[at + 1];
      sym.erase(sym.begin() + static_cast<long>(at) + 1);
    }
    for (const auto& t : sym) {
      auto it = ids.find(t);
      if (it == ids.end()) {
        char hex[8];
        std::snprintf(hex, sizeof(hex), "%02x", static_cast<unsigned char>(t[0]));
        return make_error(errc::invalid_argument, "the vocabulary has no token for the bytes of '" + to_valid_utf8(t) +
                                                      "' (first byte 0x" + hex + ")");
      }
      out.push_back(it->second);
    }
    return {};
  }

  // A segment without added tokens: pre-tokenized, then merged.
  Result<void> encode_segment(std::string_view text, std::vector<int64_t>& out) const {
    std::string buf;
    if (add_prefix_space && !text.empty() && text[0] != ' ') {
      buf = " " + std::string{text};
      text = buf;
    }
    if (!regex) return merge(text, out);
    return regex->split(text, [&](std::string_view piece) { return merge(piece, out); });
  }
};

namespace {

// The regex and prefix-space setting of a tokenizer.json pre_tokenizer:
// ByteLevel (GPT-2's regex unless use_regex is false), Split (a regex,
// "Isolated": matches and the text between them are pieces), or a Sequence
// of them. An empty pattern: no split.
Result<void> read_pre_tokenizer(const nlohmann::json& p, std::string& pattern, bool& prefix_space,
                                const std::string& origin) {
  if (p.is_null()) return {};
  auto type = p.value("type", std::string{});
  if (type == "Sequence") {
    for (const auto& q : p.at("pretokenizers"))
      if (auto ok = read_pre_tokenizer(q, pattern, prefix_space, origin); !ok) return ok;
    return {};
  }
  if (type == "ByteLevel") {
    prefix_space = p.value("add_prefix_space", false);
    if (p.value("use_regex", true)) {
      if (!pattern.empty()) return make_error(errc::unimplemented, origin + ": two pre-tokenizer regexes in sequence");
      pattern = detail::kGpt2Pattern;
    }
    return {};
  }
  if (type == "Split") {
    const auto& pat = p.at("pattern");
    auto behavior = p.value("behavior", std::string{"Isolated"});
    if (behavior != "Isolated" || p.value("invert", false))
      return make_error(errc::unimplemented, origin + ": Split pre-tokenizer with behavior " + behavior +
                                                 " (only Isolated, not inverted, is supported)");
    if (!pattern.empty()) return make_error(errc::unimplemented, origin + ": two pre-tokenizer regexes in sequence");
    if (pat.contains("Regex")) pattern = pat.at("Regex").get<std::string>();
    else {
      // A literal string: quote it for PCRE2.
      pattern = "\\Q" + pat.at("String").get<std::string>() + "\\E";
    }
    return {};
  }
  return make_error(errc::unimplemented, origin + ": pre-tokenizer type '" + type + "' is not supported for encoding");
}

}  // namespace

Result<Tokenizer> Tokenizer::load(const std::string& path) {
  std::ifstream f{path};
  if (!f) return make_error(errc::not_found, "cannot read " + path);
  std::stringstream s;
  s << f.rdbuf();
  return parse(s.str(), path);
}

Result<Tokenizer> Tokenizer::parse(const std::string& text, const std::string& origin) try {
  auto j = nlohmann::json::parse(text);
  auto vocab = j.at("model").at("vocab");
  if (!vocab.is_object()) return make_error(errc::invalid_argument, origin + ": model.vocab is not an object");
  // Byte-level unless the decoder says otherwise.
  bool byte_level = true;
  if (auto d = j.find("decoder"); d != j.end() && d->is_object()) {
    auto type = d->value("type", std::string{});
    if (type == "Sequence" || type == "Metaspace" || type == "Replace" || type == "ByteFallback") byte_level = false;
  } else if (auto m = j.at("model").find("byte_fallback"); m != j.at("model").end() && m->is_boolean() && m->get<bool>()) {
    byte_level = false;
  }
  const auto& inv = detail::byte_level_inverse();
  Tokenizer t;
  auto put = [&](int64_t id, std::string bytes) -> Result<void> {
    if (id < 0 || id > (int64_t{1} << 24))
      return make_error(errc::invalid_argument, origin + ": token id " + std::to_string(id) + " is out of range");
    if (static_cast<size_t>(id) >= t.bytes_.size()) t.bytes_.resize(static_cast<size_t>(id) + 1);
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
    if (auto ok = put(id.get<int64_t>(), std::move(bytes)); !ok) return ok.error();
  }
  std::vector<std::pair<std::string, int64_t>> added_tokens;
  if (auto added = j.find("added_tokens"); added != j.end() && added->is_array()) {
    for (const auto& a : *added) {
      auto id = a.at("id").get<int64_t>();
      if (auto ok = put(id, a.at("content").get<std::string>()); !ok) return ok.error();
      if (a.value("special", false)) t.special_.insert(id);
      added_tokens.emplace_back(a.at("content").get<std::string>(), id);
    }
  }
  if (!byte_level) {
    t.encode_error_ = origin + " is a SentencePiece-style tokenizer; encoding supports byte-level BPE only";
    return t;
  }
  auto enc = std::make_shared<Encoder>();
  enc->added = std::move(added_tokens);
  for (auto& [token, id] : vocab.items()) enc->ids.emplace(*decode_byte_level(token, inv), id.get<int64_t>());
  const auto& model = j.at("model");
  enc->ignore_merges = model.value("ignore_merges", false);
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
      enc->ranks.emplace(merge_key(*ra, *rb), rank++);
    }
  }
  std::string pattern;
  if (auto ok = read_pre_tokenizer(j.value("pre_tokenizer", nlohmann::json{}), pattern, enc->add_prefix_space, origin);
      !ok) {
    t.encode_error_ = describe(ok.error());
    return t;
  }
  if (!pattern.empty()) {
    auto regex = detail::Regex::compile(pattern);
    if (!regex) return with_context(regex.error(), origin);
    enc->regex = std::move(*regex);
  }
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
  return to_valid_utf8(out);
}

Result<std::vector<int64_t>> Tokenizer::encode(std::string_view text) const {
  if (!encoder_) return make_error(errc::unimplemented, encode_error_);
  std::vector<int64_t> out;
  // Added tokens first, leftmost and then longest.
  size_t pos = 0;
  while (pos < text.size()) {
    size_t best = std::string_view::npos, len = 0;
    int64_t id = -1;
    for (const auto& [content, tid] : encoder_->added) {
      if (content.empty()) continue;
      auto at = text.find(content, pos);
      if (at != std::string_view::npos && (at < best || (at == best && content.size() > len))) {
        best = at;
        len = content.size();
        id = tid;
      }
    }
    const auto stop = best == std::string_view::npos ? text.size() : best;
    if (auto ok = encoder_->encode_segment(text.substr(pos, stop - pos), out); !ok) return ok.error();
    if (best == std::string_view::npos) break;
    out.push_back(id);
    pos = best + len;
  }
  return out;
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
    auto c = static_cast<unsigned char>(s[i]);
    if (c < 0x80) {
      out.push_back(static_cast<char>(c));
      ++i;
      continue;
    }
    // Lead byte: length and the allowed range of the second byte (no
    // overlongs, no surrogates, nothing above U+10FFFF).
    int len = 0;
    unsigned char lo = 0x80, hi = 0xbf;
    if (c >= 0xc2 && c <= 0xdf) len = 2;
    else if (c >= 0xe0 && c <= 0xef) {
      len = 3;
      if (c == 0xe0) lo = 0xa0;
      if (c == 0xed) hi = 0x9f;
    } else if (c >= 0xf0 && c <= 0xf4) {
      len = 4;
      if (c == 0xf0) lo = 0x90;
      if (c == 0xf4) hi = 0x8f;
    }
    size_t k = 1;
    if (len > 0) {
      for (; k < static_cast<size_t>(len) && i + k < s.size(); ++k) {
        auto b = static_cast<unsigned char>(s[i + k]);
        if (k == 1 ? (b < lo || b > hi) : (b < 0x80 || b > 0xbf)) break;
      }
    }
    if (len > 0 && k == static_cast<size_t>(len)) {
      out.append(s.substr(i, k));
    } else {
      out += "\xef\xbf\xbd";  // U+FFFD for the maximal invalid subpart
      k = std::max<size_t>(k, 1);
    }
    i += k;
  }
  return out;
}

}  // namespace glint::components
