#pragma once
// How a child process ended, in words, for the errors of the programs glint
// runs for a user (reward commands, environments).

#include <sys/wait.h>

#include <cstring>
#include <string>

namespace glint::components::rl::detail {

inline std::string status_text(int status) {
  if (WIFEXITED(status)) return "exited with status " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return std::string{"was killed by signal "} + strsignal(WTERMSIG(status));
  return "ended with wait status " + std::to_string(status);
}

}  // namespace glint::components::rl::detail
