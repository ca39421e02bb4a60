#include "components/sampler/params.hpp"

#include <cmath>

namespace glint::components {

namespace {

caf::error bad(const std::string& what) { return make_error(errc::invalid_argument, what); }

std::string num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%g", v);
  return buf;
}

}  // namespace

Result<void> SamplingParams::validate() const {
  if (num_samples < 1) return bad("num_samples must be at least 1, not " + std::to_string(num_samples));
  if (max_tokens < 0) return bad("max_tokens must be >= 0, not " + std::to_string(max_tokens));
  if (!(temperature >= 0) || !std::isfinite(temperature))
    return bad("temperature must be >= 0 (0 is greedy), not " + num(temperature));
  if (top_k < -1) return bad("top_k must be >= 1, or 0 or -1 for all tokens, not " + std::to_string(top_k));
  if (!(top_p > 0 && top_p <= 1)) return bad("top_p must be in (0, 1], not " + num(top_p));
  if (!(min_p >= 0 && min_p <= 1)) return bad("min_p must be in [0, 1], not " + num(min_p));
  if (!(repetition_penalty > 0) || !std::isfinite(repetition_penalty))
    return bad("repetition_penalty must be > 0 (1 is none), not " + num(repetition_penalty));
  if (logprobs < -1) return bad("logprobs must be >= 0, or -1 for none, not " + std::to_string(logprobs));
  if (prompt_logprobs < -1)
    return bad("prompt_logprobs must be >= 0, or -1 for none, not " + std::to_string(prompt_logprobs));
  for (size_t i = 0; i < stop.size(); ++i)
    if (stop[i].empty()) return bad("stop string " + std::to_string(i) + " is empty");
  return {};
}

std::string_view to_string(UpdatePolicy p) {
  switch (p) {
    case UpdatePolicy::finish_old: return "finish_old";
    case UpdatePolicy::abort: return "abort";
    case UpdatePolicy::continue_new: return "continue_new";
  }
  return "unknown";
}

Result<UpdatePolicy> parse_update_policy(std::string_view name) {
  for (auto p : {UpdatePolicy::finish_old, UpdatePolicy::abort, UpdatePolicy::continue_new})
    if (name == to_string(p)) return p;
  return make_error(errc::invalid_argument,
                    "update policy '" + std::string{name} + "' is not finish_old, continue_new or abort");
}

std::string_view to_string(StopReason r) {
  switch (r) {
    case StopReason::none: return "none";
    case StopReason::length: return "length";
    case StopReason::stop: return "stop";
    case StopReason::abort: return "abort";
  }
  return "?";
}

Result<void> EngineConfig::validate() const {
  if (block_size < 1 || block_size > 1024) return bad("block_size must be in [1, 1024], not " + std::to_string(block_size));
  if (cache_bytes < 1) return bad("cache_bytes must be positive, not " + std::to_string(cache_bytes));
  if (max_num_seqs < 1) return bad("max_num_seqs must be at least 1, not " + std::to_string(max_num_seqs));
  if (max_num_batched_tokens < 1)
    return bad("max_num_batched_tokens must be at least 1, not " + std::to_string(max_num_batched_tokens));
  if (max_model_len < 0) return bad("max_model_len must be >= 0 (0: the model's), not " + std::to_string(max_model_len));
  return {};
}

}  // namespace glint::components
