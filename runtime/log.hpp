#pragma once
/// `glint::log`: one line to standard error per message, filtered by level.
/// The level comes from GLINT_LOG (debug, info, warn, error, off; default
/// warn), read once:
///
///   log::debug("config.json: fields glint does not use: " + names);
///   if (log::enabled(log::Level::debug)) ...   // skip building a costly message
///
/// Thread-safe: a message is written with one call, so lines do not mix.

#include <string_view>

namespace glint::log {

enum class Level { debug, info, warn, error, off };

bool enabled(Level level);
void write(Level level, std::string_view message);

inline void debug(std::string_view m) { write(Level::debug, m); }
inline void info(std::string_view m) { write(Level::info, m); }
inline void warn(std::string_view m) { write(Level::warn, m); }
inline void error(std::string_view m) { write(Level::error, m); }

}  // namespace glint::log
