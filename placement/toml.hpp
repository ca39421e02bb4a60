#pragma once
// TOML for glint's config files (the job TOML, `glint serve`'s serve.toml):
// toml++ behind check_toml_text, which keeps it from its undefined
// behaviour. Include from .cpp files only (toml++ is a heavy header).

#include "placement/config.hpp"

#include <toml++/toml.h>

namespace glint::placement {

/// The table of `text`; invalid_argument naming source:line:column and
/// what is wrong otherwise.
Result<toml::table> parse_toml(std::string_view text, std::string_view source);

}  // namespace glint::placement
