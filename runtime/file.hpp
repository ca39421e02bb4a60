#pragma once
/// Reading a whole small file (a config, a tokenizer, a template) with a
/// bound on its size, so a wrong path to a 40 GB file is an error, not an
/// allocation that takes the machine down:
///
///   auto text = read_text_file(dir + "/config.json");   // Result<std::string>

#include "runtime/error.hpp"

#include <cstdint>
#include <string>

namespace glint {

/// 256 MiB: more than any config, tokenizer.json or template in use.
inline constexpr uint64_t kMaxTextFileBytes = uint64_t{256} << 20;

/// The bytes of `path`. Errors: not_found (missing, a directory, or
/// unreadable: the message says which), resource_exhausted (larger than
/// max_bytes: names both sizes).
Result<std::string> read_text_file(const std::string& path, uint64_t max_bytes = kMaxTextFileBytes);

}  // namespace glint
