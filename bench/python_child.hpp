#pragma once
// What the benchmarks with a Python baseline share: a scratch directory and
// the baseline script as a child process driven line by line.

#include "bench/line_child.hpp"
#include "runtime/error.hpp"
#include "runtime/process.hpp"

#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <string>
#include <thread>
#include <utility>
#include <vector>

extern char** environ;

#ifndef GLINT_SOURCE_DIR
#error "GLINT_SOURCE_DIR must name the source tree (bench/CMakeLists.txt sets it)"
#endif

namespace glint::bench {

using namespace std::chrono_literals;

/// A file a baseline needs: where `cmake --install` put it
/// (PREFIX/share/glint/`installed`, beside PREFIX/bin/glint), else
/// `in_source` in the source tree this binary was built from; an error
/// naming both when neither has it.
inline Result<std::string> shipped_file(const std::string& installed, const std::string& in_source) {
  const auto there = std::filesystem::path{self_executable()}.parent_path().parent_path() / "share" / "glint" / installed;
  if (std::filesystem::exists(there)) return there.string();
  auto path = std::filesystem::path{GLINT_SOURCE_DIR} / in_source;
  if (!std::filesystem::exists(path))
    return make_error(errc::not_found, "the baseline's " + installed + " is in neither " + there.string() +
                                           " (an installed glint) nor " + path.string() +
                                           " (the source tree it was built from)");
  return path.string();
}

/// A baseline script of bench/python.
inline Result<std::string> baseline_script(const char* file) {
  return shipped_file(std::string{"python/"} + file, std::string{"bench/python/"} + file);
}

// A directory under $TMPDIR removed with everything in it when this goes.
class TempDir {
public:
  static Result<TempDir> create() {
    auto pattern = (std::filesystem::temp_directory_path() / "glint-bench-XXXXXX").string();
    if (!::mkdtemp(pattern.data())) return make_error(errc::unavailable, "cannot create a directory like " + pattern);
    TempDir d;
    d.path_ = pattern;
    return d;
  }
  TempDir() = default;
  TempDir(TempDir&& o) noexcept : path_(std::exchange(o.path_, {})) {}
  TempDir& operator=(TempDir&&) = delete;
  ~TempDir() {
    std::error_code ec;
    if (!path_.empty()) std::filesystem::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }

private:
  std::string path_;
};

// The Python baseline: a child driven line by line (LineChild).
using PythonChild = LineChild;

}  // namespace glint::bench
