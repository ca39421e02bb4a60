#pragma once
/// A one-line progress bar for long work on a terminal; plain lines otherwise.

#include <chrono>
#include <cstdio>
#include <string>

namespace glint {

class Progress {
public:
  Progress(std::string label, int total);
  /// Advances to `done` of `total`, with a short status after the bar.
  void update(int done, const std::string& status = {});
  void finish(const std::string& status = {});

private:
  std::string label_;
  int total_;
  bool tty_;
  std::chrono::steady_clock::time_point start_;
};

}  // namespace glint
