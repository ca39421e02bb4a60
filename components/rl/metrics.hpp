#pragma once
/// `CompletionRewardMetric`: what an RL step reports about its completions,
/// as Twinkle's metric of the same name: per reward kind its mean and std,
/// the completion lengths, and tokens per second.
///
///   CompletionRewardMetric m;
///   m.accumulate(lengths, {{"total", total}, {"accuracy", acc}});
///   Metrics out = m.calculate();   // reward/total/mean, completion_length/mean, ...
///   m.reset();
///
/// Not thread-safe; one owner (the driver loop). Time comes from `clock`
/// (the machine's by default), which must outlive the metric.

#include "runtime/clock.hpp"
#include "runtime/error.hpp"
#include "runtime/types.hpp"

#include <chrono>
#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <vector>

namespace glint::components::rl {

class CompletionRewardMetric {
public:
  explicit CompletionRewardMetric(const Clock& clock = real_clock()) : clock_(&clock) { reset(); }
  /// Error: a reward list whose length differs from completion_lengths'
  /// (nothing is accumulated then).
  Result<void> accumulate(std::span<const int64_t> completion_lengths,
                          const std::map<std::string, std::vector<double>>& rewards);
  /// reward/<kind>/mean and /std (population std over everything since
  /// reset), completion_length/mean, /min, /max, completions, and
  /// tokens_per_second (completion tokens over the seconds since reset).
  Metrics calculate() const;
  void reset();

private:
  std::vector<int64_t> lengths_;
  std::map<std::string, std::vector<double>> rewards_;
  const Clock* clock_;
  Clock::time_point since_;
};

}  // namespace glint::components::rl
