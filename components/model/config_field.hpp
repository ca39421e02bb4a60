#pragma once
/// Reading one typed field of a config.json object, for config.cpp and
/// moe_config.cpp.

#include "runtime/error.hpp"

#include <nlohmann/json.hpp>

#include <string>
#include <type_traits>

namespace glint::components::model_detail {

/// Reads optional field `key` of `j` into `out` (absent or null: `out`
/// unchanged), checking its JSON type; the error names `origin` and the field.
template <class T>
caf::error read_field(const nlohmann::json& j, const char* key, T& out, const std::string& origin) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return caf::none;
  bool ok = false;
  if constexpr (std::is_same_v<T, bool>) ok = it->is_boolean();
  else if constexpr (std::is_integral_v<T>) ok = it->is_number_integer();
  else if constexpr (std::is_floating_point_v<T>) ok = it->is_number();
  else ok = it->is_string();
  if (!ok)
    return make_error(errc::invalid_argument,
                      origin + ": field '" + key + "' should be a " +
                          (std::is_same_v<T, bool>         ? "boolean"
                           : std::is_integral_v<T>         ? "integer"
                           : std::is_floating_point_v<T> ? "number"
                                                           : "string") +
                          ", not " + it->dump());
  out = it->template get<T>();
  return caf::none;
}

}  // namespace glint::components::model_detail
