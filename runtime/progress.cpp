#include "runtime/progress.hpp"

#include <unistd.h>

namespace glint {

Progress::Progress(std::string label, int total)
    : label_(std::move(label)), total_(total), tty_(isatty(fileno(stderr)) != 0),
      start_(std::chrono::steady_clock::now()) {}

void Progress::update(int done, const std::string& status) {
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  if (!tty_) {
    std::fprintf(stderr, "%s %d/%d %s\n", label_.c_str(), done, total_, status.c_str());
    return;
  }
  constexpr int width = 30;
  int filled = total_ > 0 ? done * width / total_ : width;
  std::string bar(static_cast<size_t>(filled), '#');
  bar.resize(width, '.');
  std::fprintf(stderr, "\r%s [%s] %d/%d %.1fs %s\033[K", label_.c_str(), bar.c_str(), done, total_, secs,
               status.c_str());
  std::fflush(stderr);
}

void Progress::finish(const std::string& status) {
  // Off a terminal every update is a line already; the last needs no repeat.
  if (!tty_ && status.empty()) return;
  update(total_, status);
  if (tty_) std::fprintf(stderr, "\n");
}

}  // namespace glint
