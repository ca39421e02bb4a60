#pragma once
/// Rewards computed by a user's program, so that a reward needs no C++:
///
///   rl::RewardCommand cmd{.command = "python3 my_reward.py", .timeout_seconds = 60};
///   auto scores = rl::run_reward_command(cmd, {{.prompt = p, .completion = c, .fields = {{"solution", "42"}}}});
///
/// The command runs under /bin/sh -c, once per call, in its own process
/// group. Its standard input is one JSON object per completion, in order:
///
///   {"index": 0, "prompt": "...", "completion": "...", "solution": "42", ...}
///
/// (the prompt as rendered text, the completion's text, and each field of
/// the dataset row the prompt came from). It must write exactly one score
/// per input line to standard output, a finite number per line (JSON
/// numbers), in the same order, and exit 0. Its standard error passes
/// through. Blocking; thread-safe (each call has its own files).

#include "runtime/error.hpp"

#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <vector>

namespace glint::components::rl {

struct RewardCommand {
  std::string command;            ///< a shell command line
  double timeout_seconds = 600;   ///< the whole call; then its process group is killed
};

/// One completion to score.
struct RewardInput {
  std::string prompt;
  std::string completion;
  std::map<std::string, std::string> fields;  ///< the row's fields (solution, ...); "index", "prompt" and "completion" are not overwritten
};

/// One score per input. Errors: an empty command, one that cannot start,
/// exits non-zero or is killed (status named), runs past the timeout
/// (deadline_exceeded), writes a line that is not a finite number (the line
/// named), or writes fewer or more lines than it was given.
Result<std::vector<double>> run_reward_command(const RewardCommand& command, std::span<const RewardInput> inputs);

}  // namespace glint::components::rl
