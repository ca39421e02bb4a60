#include "components/rl/metrics.hpp"

#include <algorithm>
#include <cmath>

namespace glint::components::rl {

Result<void> CompletionRewardMetric::accumulate(std::span<const int64_t> completion_lengths,
                                                const std::map<std::string, std::vector<double>>& rewards) {
  for (const auto& [kind, r] : rewards)
    if (r.size() != completion_lengths.size())
      return make_error(errc::invalid_argument, "reward '" + kind + "' has " + std::to_string(r.size()) +
                                                    " values for " + std::to_string(completion_lengths.size()) +
                                                    " completions");
  lengths_.insert(lengths_.end(), completion_lengths.begin(), completion_lengths.end());
  for (const auto& [kind, r] : rewards) rewards_[kind].insert(rewards_[kind].end(), r.begin(), r.end());
  return {};
}

Metrics CompletionRewardMetric::calculate() const {
  Metrics m;
  for (const auto& [kind, r] : rewards_) {
    if (r.empty()) continue;
    double mean = 0;
    for (double x : r) mean += x;
    mean /= static_cast<double>(r.size());
    double var = 0;
    for (double x : r) var += (x - mean) * (x - mean);
    m["reward/" + kind + "/mean"] = mean;
    m["reward/" + kind + "/std"] = std::sqrt(var / static_cast<double>(r.size()));
  }
  if (!lengths_.empty()) {
    double total = 0;
    for (auto l : lengths_) total += static_cast<double>(l);
    m["completion_length/mean"] = total / static_cast<double>(lengths_.size());
    m["completion_length/min"] = static_cast<double>(*std::min_element(lengths_.begin(), lengths_.end()));
    m["completion_length/max"] = static_cast<double>(*std::max_element(lengths_.begin(), lengths_.end()));
    m["completions"] = static_cast<double>(lengths_.size());
    double secs = std::chrono::duration<double>(clock_->now() - since_).count();
    if (secs > 0) m["tokens_per_second"] = total / secs;
  }
  return m;
}

void CompletionRewardMetric::reset() {
  lengths_.clear();
  rewards_.clear();
  since_ = clock_->now();
}

}  // namespace glint::components::rl
