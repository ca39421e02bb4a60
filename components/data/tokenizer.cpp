#include "components/data/tokenizer.hpp"

#include <nlohmann/json.hpp>

#include <array>
#include <fstream>
#include <sstream>

namespace glint::components {

namespace {

// GPT-2's byte-level alphabet: printable bytes stand for themselves, the
// others for code points 256 + their rank. Inverted here: code point -> byte.
std::array<int, 512> byte_level_inverse() {
  std::array<int, 512> inv;
  inv.fill(-1);
  int extra = 0;
  for (int b = 0; b < 256; ++b) {
    bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
    inv[static_cast<size_t>(printable ? b : 256 + extra++)] = b;
  }
  return inv;
}

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
  static const auto inv = byte_level_inverse();
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
  if (auto added = j.find("added_tokens"); added != j.end() && added->is_array()) {
    for (const auto& a : *added) {
      auto id = a.at("id").get<int64_t>();
      if (auto ok = put(id, a.at("content").get<std::string>()); !ok) return ok.error();
      if (a.value("special", false)) t.special_.insert(id);
    }
  }
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
