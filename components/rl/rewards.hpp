#pragma once
/// Rewards of completions and the advantages GRPO-family losses train on,
/// as plain functions on vectors (no tensors, no state):
///
///   auto acc = rl::gsm8k_accuracy(completions, solutions);   // 1 or 0 each
///   auto fmt = rl::gsm8k_format(completions);                // 1 or 0 each
///   auto adv = rl::advantages(total, {.group_size = 8, .scale = rl::Scale::group});
///
/// Groups are contiguous: rows [k * group_size, (k + 1) * group_size) are
/// the samples of prompt k, as the sampler returns num_samples per request.
/// Thread-safe (pure functions).

#include "runtime/error.hpp"

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace glint::components::rl {

/// The final answer a completion gives: the content of the last \boxed{...}
/// (braces balanced) or the text after the last "####", whichever comes
/// later; nullopt when there is neither.
std::optional<std::string> extract_final_answer(std::string_view completion);

/// A number written as people write answers: "1,234", "$5", "-3.50",
/// "7/2", "12." and "40%" all parse; nullopt for anything else.
std::optional<double> parse_number(std::string_view text);

/// 1 where the completion's final answer equals its solution within
/// `tolerance` (absolute, or relative to |solution| when that is larger
/// than 1), else 0. Non-numeric answers compare as trimmed text. Error:
/// the two spans differ in length.
Result<std::vector<double>> gsm8k_accuracy(std::span<const std::string> completions,
                                           std::span<const std::string> solutions, double tolerance = 1e-6);

/// 1 where the completion ends with its final answer in the asked form: a
/// last line "#### <number>" or a \boxed{<number>} (trailing whitespace
/// and an end-of-text token aside), else 0.
std::vector<double> gsm8k_format(std::span<const std::string> completions);

enum class Scale : uint8_t {
  group,  ///< (r - group mean) / (group std + eps): GRPO
  batch,  ///< (r - group mean) / (batch std + eps): Dr. GRPO-style, one scale for all
  none,   ///< r - group mean: no division
};
Result<Scale> parse_scale(std::string_view name);

struct AdvantageOptions {
  int64_t group_size = 1;
  Scale scale = Scale::group;
  double eps = 1e-6;
  /// RLOO: r minus the mean of the other samples of its group (unscaled;
  /// `scale` is not read). Needs group_size >= 2.
  bool leave_one_out = false;
};

/// One advantage per reward. Standard deviations are the sample std (n - 1),
/// as TRL's GRPO computes them; a group whose rewards are all equal gets 0.
/// Errors (invalid_argument): a size not a multiple of group_size, a group
/// size < 1 (< 2 for leave_one_out), a reward that is not finite.
Result<std::vector<double>> advantages(std::span<const double> rewards, const AdvantageOptions& options);

}  // namespace glint::components::rl
