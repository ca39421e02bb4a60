#include "components/data/detail/unicode.hpp"

#include <unicode/locid.h>
#include <unicode/normalizer2.h>
#include <unicode/uchar.h>
#include <unicode/unistr.h>
#include <unicode/ustring.h>
#include <unicode/utf16.h>

#include <algorithm>

namespace glint::components::detail {

namespace {

bool is_ascii(std::string_view text) {
  return std::all_of(text.begin(), text.end(), [](char c) { return static_cast<unsigned char>(c) < 0x80; });
}


caf::error icu_error(std::string_view what, UErrorCode status) {
  return make_error(errc::internal, std::string{what} + " failed in ICU: " + u_errorName(status));
}

// Calls `valid` on each maximal run of valid UTF-8 and appends the bytes
// between runs (invalid ones) to `out` as they are.
template <class F>
Result<void> for_each_valid_run(std::string_view text, std::string& out, F&& valid) {
  size_t run = 0;
  for (size_t i = 0; i < text.size();) {
    const size_t at = i;
    if (next_utf8(text, i) >= 0) continue;
    if (at > run)
      if (auto ok = valid(text.substr(run, at - run)); !ok) return ok;
    out.append(text.substr(at, i - at));
    run = i;
  }
  if (text.size() > run) return valid(text.substr(run));
  return {};
}

}  // namespace

int32_t next_utf8(std::string_view s, size_t& i) {
  auto c = static_cast<unsigned char>(s[i]);
  if (c < 0x80) {
    ++i;
    return c;
  }
  // The length and the allowed range of the second byte, as the Unicode
  // standard's table of well-formed sequences gives them.
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
  if (len == 0) {
    ++i;
    return -1;
  }
  int32_t cp = c & (0xff >> (len + 1));
  size_t k = 1;
  for (; k < static_cast<size_t>(len) && i + k < s.size(); ++k) {
    auto b = static_cast<unsigned char>(s[i + k]);
    if (k == 1 ? (b < lo || b > hi) : (b < 0x80 || b > 0xbf)) break;
    cp = (cp << 6) | (b & 0x3f);
  }
  i += k;
  return k == static_cast<size_t>(len) ? cp : -1;
}

int32_t previous_utf8(std::string_view s, size_t end, size_t& begin) {
  begin = end - 1;
  for (size_t k = 1; k <= 4 && k <= end; ++k) {
    auto b = static_cast<unsigned char>(s[end - k]);
    if (b >= 0x80 && b <= 0xbf) continue;  // a continuation byte: look further back
    size_t i = end - k;
    int32_t cp = next_utf8(s, i);
    if (cp < 0 || i != end) return -1;
    begin = end - k;
    return cp;
  }
  return -1;
}

Result<std::string> normalize(std::string_view text, NormalForm form) {
  if (is_ascii(text)) return std::string{text};  // ASCII is invariant under all four forms
  UErrorCode status = U_ZERO_ERROR;
  const icu::Normalizer2* n = nullptr;
  switch (form) {
    case NormalForm::nfc: n = icu::Normalizer2::getNFCInstance(status); break;
    case NormalForm::nfd: n = icu::Normalizer2::getNFDInstance(status); break;
    case NormalForm::nfkc: n = icu::Normalizer2::getNFKCInstance(status); break;
    case NormalForm::nfkd: n = icu::Normalizer2::getNFKDInstance(status); break;
  }
  if (U_FAILURE(status) || !n) return icu_error("loading a Unicode normaliser", status);
  std::string out;
  out.reserve(text.size());
  auto ok = for_each_valid_run(text, out, [&](std::string_view run) -> Result<void> {
    auto src = icu::UnicodeString::fromUTF8(icu::StringPiece(run.data(), static_cast<int32_t>(run.size())));
    auto dst = n->normalize(src, status);
    if (U_FAILURE(status)) return icu_error("Unicode normalisation", status);
    dst.toUTF8String(out);
    return {};
  });
  if (!ok) return ok.error();
  return out;
}

void append_utf8(std::string& out, int32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xc0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3f)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xe0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3f)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3f)));
  } else {
    out.push_back(static_cast<char>(0xf0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3f)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3f)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3f)));
  }
}

Result<std::string> change_case(std::string_view text, bool upper) {
  std::string out;
  out.reserve(text.size());
  auto ok = for_each_valid_run(text, out, [&](std::string_view run) -> Result<void> {
    auto u = icu::UnicodeString::fromUTF8(icu::StringPiece(run.data(), static_cast<int32_t>(run.size())));
    if (upper)
      u.toUpper(icu::Locale::getRoot());
    else
      u.toLower(icu::Locale::getRoot());
    u.toUTF8String(out);
    return {};
  });
  if (!ok) return ok.error();
  return out;
}

Result<std::string> lowercase_chars(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  auto ok = for_each_valid_run(text, out, [&](std::string_view run) -> Result<void> {
    for (size_t i = 0; i < run.size();) {
      int32_t cp = next_utf8(run, i);
      if (cp < 0x80) {
        out.push_back(static_cast<char>(cp >= 'A' && cp <= 'Z' ? cp + ('a' - 'A') : cp));
        continue;
      }
      // One character at a time, so that no context (final sigma) applies;
      // the root locale, so that no language rule (Turkish dotless i) does.
      UChar src[2];
      int32_t src_len = 0;
      U16_APPEND_UNSAFE(src, src_len, cp);
      UChar dst[8];
      UErrorCode status = U_ZERO_ERROR;
      int32_t n = u_strToLower(dst, 8, src, src_len, "", &status);
      if (U_FAILURE(status)) return icu_error("lowercasing", status);
      for (int32_t k = 0; k < n;) {
        UChar32 c;
        U16_NEXT(dst, k, n, c);
        append_utf8(out, c);
      }
    }
    return {};
  });
  if (!ok) return ok.error();
  return out;
}

bool is_white_space(int32_t cp) {
  if (cp < 0) return false;
  return u_isUWhiteSpace(cp) != 0;
}

bool is_word_char(int32_t cp) {
  if (cp < 0) return false;
  if (cp < 0x80) return (cp >= 'a' && cp <= 'z') || (cp >= 'A' && cp <= 'Z') || (cp >= '0' && cp <= '9') || cp == '_';
  return u_hasBinaryProperty(cp, UCHAR_ALPHABETIC) || u_hasBinaryProperty(cp, UCHAR_JOIN_CONTROL) ||
         (U_GET_GC_MASK(cp) & (U_GC_M_MASK | U_GC_ND_MASK | U_GC_PC_MASK)) != 0;
}

}  // namespace glint::components::detail
