#pragma once
// A fresh, empty directory under the test temp dir, private to this process:
// ctest runs tests in parallel processes, and two of them must never share
// a directory (a fixed name once let one test's save overwrite another's).

#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <string>

namespace glint::testing {

inline std::string fresh_dir(const std::string& name) {
  static std::atomic<int> counter{0};
  auto d = std::filesystem::path{::testing::TempDir()} /
           ("glint-" + name + "-" + std::to_string(::getpid()) + "-" + std::to_string(counter++));
  std::filesystem::remove_all(d);
  std::filesystem::create_directories(d);
  return d.string();
}

}  // namespace glint::testing
