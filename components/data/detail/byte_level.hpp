#pragma once
// GPT-2's byte-level alphabet: each byte is written as one printable
// character in tokenizer.json (printable bytes stand for themselves, the
// others for code points 256 + their rank).

#include <array>
#include <string>
#include <string_view>

namespace glint::components::detail {

/// The code point that stands for each byte.
inline const std::array<int, 256>& byte_level_code_points() {
  static const std::array<int, 256> map = [] {
    std::array<int, 256> m{};
    int extra = 0;
    for (int b = 0; b < 256; ++b) {
      bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
      m[static_cast<size_t>(b)] = printable ? b : 256 + extra++;
    }
    return m;
  }();
  return map;
}

/// Code point -> byte, -1 outside the alphabet.
inline const std::array<int, 512>& byte_level_inverse() {
  static const std::array<int, 512> inv = [] {
    std::array<int, 512> m;
    m.fill(-1);
    const auto& cps = byte_level_code_points();
    for (int b = 0; b < 256; ++b) m[static_cast<size_t>(cps[static_cast<size_t>(b)])] = b;
    return m;
  }();
  return inv;
}

/// `bytes` in byte-level characters (UTF-8), as tokenizer.json writes tokens.
inline std::string to_byte_level(std::string_view bytes) {
  std::string out;
  const auto& cps = byte_level_code_points();
  for (unsigned char c : bytes) {
    int cp = cps[c];
    if (cp < 0x80) {
      out.push_back(static_cast<char>(cp));
    } else {
      out.push_back(static_cast<char>(0xc0 | (cp >> 6)));
      out.push_back(static_cast<char>(0x80 | (cp & 0x3f)));
    }
  }
  return out;
}

}  // namespace glint::components::detail
