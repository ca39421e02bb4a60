#pragma once
/// Small text helpers for messages and reports.

#include <string>
#include <string_view>
#include <type_traits>

namespace glint {

/// Joins the elements of `range` with `sep`; numbers are written in decimal.
template <class Range>
std::string join(const Range& range, std::string_view sep = ", ") {
  std::string out;
  for (const auto& x : range) {
    if (!out.empty()) out += sep;
    if constexpr (std::is_arithmetic_v<std::decay_t<decltype(x)>>) out += std::to_string(x);
    else out += x;
  }
  return out;
}

/// `s` without leading and trailing spaces, tabs and line breaks.
inline std::string_view trim(std::string_view s) {
  auto b = s.find_first_not_of(" \t\r\n");
  if (b == std::string_view::npos) return {};
  return s.substr(b, s.find_last_not_of(" \t\r\n") - b + 1);
}

}  // namespace glint
