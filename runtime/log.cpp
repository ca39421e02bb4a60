#include "runtime/log.hpp"

#include <cstdio>
#include <cstdlib>
#include <string>

namespace glint::log {

namespace {

Level level_from_env() {
  const char* v = std::getenv("GLINT_LOG");
  if (!v) return Level::warn;
  const std::string_view s{v};
  if (s == "debug") return Level::debug;
  if (s == "info") return Level::info;
  if (s == "error") return Level::error;
  if (s == "off") return Level::off;
  return Level::warn;
}

const char* name(Level l) {
  switch (l) {
    case Level::debug: return "debug";
    case Level::info: return "info";
    case Level::warn: return "warning";
    case Level::error: return "error";
    case Level::off: break;
  }
  return "";
}

}  // namespace

bool enabled(Level level) {
  static const Level threshold = level_from_env();
  return level != Level::off && level >= threshold;
}

void write(Level level, std::string_view message) {
  if (!enabled(level)) return;
  std::string line = "glint ";
  line += name(level);
  line += ": ";
  line += message;
  line += '\n';
  std::fwrite(line.data(), 1, line.size(), stderr);
}

}  // namespace glint::log
