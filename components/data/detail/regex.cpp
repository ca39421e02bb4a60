#include "components/data/detail/regex.hpp"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <cctype>

namespace glint::components::detail {

std::string quote(std::string_view literal) {
  std::string out;
  out.reserve(literal.size() * 2);
  for (char c : literal) {
    auto u = static_cast<unsigned char>(c);
    // A backslash before an ASCII non-alphanumeric always means the
    // character itself in PCRE2.
    if (u < 0x80 && !std::isalnum(u)) out.push_back('\\');
    out.push_back(c);
  }
  return out;
}

Result<Regex> Regex::compile(const std::string& pattern, std::string_view what) {
  int err = 0;
  PCRE2_SIZE where = 0;
  auto* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.c_str()), pattern.size(),
                             PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &err, &where, nullptr);
  if (!code) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(err, msg, sizeof(msg));
    return make_error(errc::invalid_argument, std::string{what} + " does not compile at offset " +
                                                  std::to_string(where) + ": " + reinterpret_cast<char*>(msg));
  }
  pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);  // optional speed-up; matching works without it
  Regex r;
  r.code_.reset(code, [](void* p) { pcre2_code_free(static_cast<pcre2_code*>(p)); });
  return r;
}

Result<void> Regex::split(std::string_view text, const std::function<Result<void>(std::string_view)>& piece) const {
  auto* code = static_cast<pcre2_code*>(code_.get());
  std::unique_ptr<pcre2_match_data, decltype(&pcre2_match_data_free)> md{
      pcre2_match_data_create_from_pattern(code, nullptr), pcre2_match_data_free};
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  auto emit = [&](size_t begin, size_t end) -> Result<void> {
    if (end > begin) return piece(text.substr(begin, end - begin));
    return {};
  };
  size_t offset = 0;
  while (offset < text.size()) {
    int rc = pcre2_match(code, subject, text.size(), offset, 0, md.get(), nullptr);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) return make_error(errc::internal, "the pre-tokenizer's regex failed with PCRE2 error " + std::to_string(rc));
    const auto* ov = pcre2_get_ovector_pointer(md.get());
    const size_t begin = ov[0], end = ov[1];
    if (auto ok = emit(offset, begin); !ok) return ok;
    if (end == begin) {  // an empty match: step over one byte
      if (auto ok = emit(begin, begin + 1); !ok) return ok;
      offset = begin + 1;
      continue;
    }
    if (auto ok = emit(begin, end); !ok) return ok;
    offset = end;
  }
  return emit(std::min(offset, text.size()), text.size());
}

Result<std::optional<std::pair<size_t, size_t>>> Regex::find(std::string_view text, size_t offset) const {
  auto* code = static_cast<pcre2_code*>(code_.get());
  std::unique_ptr<pcre2_match_data, decltype(&pcre2_match_data_free)> md{
      pcre2_match_data_create_from_pattern(code, nullptr), pcre2_match_data_free};
  int rc = pcre2_match(code, reinterpret_cast<PCRE2_SPTR>(text.data()), text.size(), offset, 0, md.get(), nullptr);
  if (rc == PCRE2_ERROR_NOMATCH) return std::optional<std::pair<size_t, size_t>>{};
  if (rc < 0) return make_error(errc::internal, "a regex failed with PCRE2 error " + std::to_string(rc));
  const auto* ov = pcre2_get_ovector_pointer(md.get());
  return std::optional<std::pair<size_t, size_t>>{std::pair<size_t, size_t>{ov[0], ov[1]}};
}

}  // namespace glint::components::detail
