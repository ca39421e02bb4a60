#pragma once
// A fresh, empty directory under the test temp dir.

#include <gtest/gtest.h>

#include <filesystem>
#include <string>

namespace glint::testing {

inline std::string fresh_dir(const std::string& name) {
  auto d = std::filesystem::path{::testing::TempDir()} / ("glint-" + name);
  std::filesystem::remove_all(d);
  std::filesystem::create_directories(d);
  return d.string();
}

}  // namespace glint::testing
