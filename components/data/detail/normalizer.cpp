#include "components/data/detail/normalizer.hpp"

#include "components/data/detail/unicode.hpp"

#include <nlohmann/json.hpp>

namespace glint::components::detail {

namespace {

using nlohmann::json;

std::string show(const json& v) { return v.is_string() ? "'" + v.get<std::string>() + "'" : v.dump(); }

// "<origin>: <field> <value> <why>", or "<origin>: <field> is missing
// (<why>)" when there is no value.
caf::error refuse(errc code, const std::string& origin, const std::string& field, const json* value,
                  std::string_view why) {
  std::string text = origin + ": " + field;
  if (value) text += " " + show(*value) + " " + std::string{why};
  else text += " is missing (" + std::string{why} + ")";
  return make_error(code, std::move(text));
}

// The value of `key` in `j`, or null.
const json* member(const json& j, const char* key) {
  auto it = j.find(key);
  return it == j.end() ? nullptr : &*it;
}

Result<void> parse_into(const json& j, const std::string& field, const std::string& origin,
                        std::vector<Normalizer::Step>& steps) {
  using Kind = Normalizer::Kind;
  if (!j.is_object())
    return refuse(errc::invalid_argument, origin, field, &j, "is not a normalizer (an object with a \"type\")");
  const json* type = member(j, "type");
  if (!type) return refuse(errc::invalid_argument, origin, field + ".type", nullptr, "a normalizer needs a type");
  if (!type->is_string())
    return refuse(errc::invalid_argument, origin, field + ".type", type, "is not a string");
  const auto& t = type->get_ref<const std::string&>();
  auto string_field = [&](const char* key, std::string_view what) -> Result<std::string> {
    const json* v = member(j, key);
    if (!v || !v->is_string())
      return refuse(errc::invalid_argument, origin, field + "." + key, v,
                    std::string{"must be a string: "} + std::string{what});
    return v->get<std::string>();
  };
  if (t == "NFC" || t == "NFD" || t == "NFKC" || t == "NFKD" || t == "Lowercase") {
    Normalizer::Step step;
    step.kind = t == "NFC"    ? Kind::nfc
                : t == "NFD"  ? Kind::nfd
                : t == "NFKC" ? Kind::nfkc
                : t == "NFKD" ? Kind::nfkd
                              : Kind::lowercase;
    steps.push_back(std::move(step));
    return {};
  }
  if (t == "Sequence") {
    const json* list = member(j, "normalizers");
    if (!list || !list->is_array())
      return refuse(errc::invalid_argument, origin, field + ".normalizers", list, "must be an array of normalizers");
    for (size_t i = 0; i < list->size(); ++i)
      if (auto ok = parse_into((*list)[i], field + ".normalizers[" + std::to_string(i) + "]", origin, steps); !ok)
        return ok;
    return {};
  }
  if (t == "Strip") {
    Normalizer::Step step;
    step.kind = Kind::strip;
    for (auto [key, flag] : {std::pair{"strip_left", &step.strip_left}, std::pair{"strip_right", &step.strip_right}}) {
      const json* v = member(j, key);
      if (!v || !v->is_boolean())
        return refuse(errc::invalid_argument, origin, field + "." + key, v, "must be true or false");
      *flag = v->get<bool>();
    }
    steps.push_back(std::move(step));
    return {};
  }
  if (t == "Prepend") {
    auto prefix = string_field("prepend", "the text put before every non-empty piece");
    if (!prefix) return prefix.error();
    Normalizer::Step step;
    step.kind = Kind::prepend;
    step.content = std::move(*prefix);
    steps.push_back(std::move(step));
    return {};
  }
  if (t == "Replace") {
    const json* pattern = member(j, "pattern");
    const bool one_string = pattern && pattern->is_object() && pattern->size() == 1 &&
                            (pattern->contains("String") || pattern->contains("Regex")) &&
                            pattern->begin()->is_string();
    if (!one_string)
      return refuse(errc::invalid_argument, origin, field + ".pattern", pattern,
                    "must be {\"String\": text} or {\"Regex\": pattern}");
    auto content = string_field("content", "the replacement text");
    if (!content) return content.error();
    const bool literal = pattern->contains("String");
    const auto& text = pattern->begin()->get_ref<const std::string&>();
    const std::string key = literal ? "String" : "Regex";
    auto regex = Regex::compile(literal ? quote(text) : text,
                                origin + ": " + field + ".pattern." + key + " " + show(*pattern->begin()));
    if (!regex) return regex.error();
    Normalizer::Step step;
    step.kind = Kind::replace;
    step.pattern = std::move(*regex);
    step.content = std::move(*content);
    steps.push_back(std::move(step));
    return {};
  }
  return refuse(errc::unimplemented, origin, field + ".type", type,
                "is not supported (supported: NFC, NFD, NFKC, NFKD, Lowercase, Strip, Replace, Prepend, Sequence)");
}

std::string strip(std::string s, bool left, bool right) {
  size_t begin = 0, end = s.size();
  if (left)
    for (size_t i = 0; i < s.size();) {
      if (!is_white_space(next_utf8(s, i))) break;
      begin = i;
    }
  if (right)
    while (end > begin) {
      size_t at = 0;
      if (!is_white_space(previous_utf8(s, end, at))) break;
      end = at;
    }
  return s.substr(begin, end - begin);
}

// Every match of `pattern` replaced by `content`. Matches are found as the
// Oniguruma binding Hugging Face uses finds them: after a non-empty match,
// the next empty match (wherever it is) is skipped, and the search steps one
// character past every empty match.
Result<std::string> replace(const std::string& s, const Regex& pattern, const std::string& content) {
  if (s.empty()) return s;  // Hugging Face finds no match, not even an empty one, in empty text
  std::string out;
  size_t search = 0, copied = 0;
  bool skip_next_empty = false;
  while (search <= s.size()) {
    auto m = pattern.find(s, search);
    if (!m) return m.error();
    if (!*m) break;
    auto [begin, end] = **m;
    search = end;
    if (begin == end) {
      if (search < s.size()) next_utf8(s, search);
      else ++search;
      if (skip_next_empty) {
        skip_next_empty = false;
        continue;
      }
    } else {
      skip_next_empty = true;
    }
    out.append(s, copied, begin - copied);
    out += content;
    copied = end;
  }
  out.append(s, copied);
  return out;
}

}  // namespace

Result<Normalizer> Normalizer::parse(const nlohmann::json& j, const std::string& origin) {
  Normalizer n;
  if (j.is_null()) return n;
  if (auto ok = parse_into(j, "normalizer", origin, n.steps_); !ok) return ok.error();
  return n;
}

Result<std::string> Normalizer::apply(std::string_view text) const {
  std::string s{text};
  for (const auto& step : steps_) {
    Result<std::string> next = std::string{};
    switch (step.kind) {
      case Kind::nfc: next = normalize(s, NormalForm::nfc); break;
      case Kind::nfd: next = normalize(s, NormalForm::nfd); break;
      case Kind::nfkc: next = normalize(s, NormalForm::nfkc); break;
      case Kind::nfkd: next = normalize(s, NormalForm::nfkd); break;
      case Kind::lowercase: next = lowercase_chars(s); break;
      case Kind::strip: next = strip(std::move(s), step.strip_left, step.strip_right); break;
      case Kind::replace: next = replace(s, *step.pattern, step.content); break;
      case Kind::prepend: next = s.empty() ? std::move(s) : step.content + s; break;
    }
    if (!next) return next.error();
    s = std::move(*next);
  }
  return s;
}

}  // namespace glint::components::detail
