#pragma once
// Whether JSON text nests deeper than `max` lists and objects. nlohmann's
// parser is iterative, but copying and writing a value recurse: text from a
// dataset row or a model's output that nests deeper is refused before it is
// parsed.

#include <string_view>

namespace glint::components::detail {

inline bool json_nests_deeper(std::string_view text, int max) {
  int depth = 0;
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\') ++i;
      else if (c == '"') in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '{' || c == '[') {
      if (++depth > max) return true;
    } else if (c == '}' || c == ']') {
      --depth;
    }
  }
  return false;
}

}  // namespace glint::components::detail
