#pragma once
/// `glint bench sample`: generation throughput of the sampler engine (paged
/// KV cache, continuous batching, prefix caching) against a plain Python
/// PyTorch generate loop (bench/python/sample_baseline.py: prompts batched
/// with left padding, a contiguous KV cache, torch.multinomial), on the same
/// model, weights, prompts and thread count, runs interleaved in one process
/// tree. A greedy cross-check first makes sure both sides compute the same
/// model.
///
/// Prints `name: value` lines (sample_tokens_per_s,
/// sample_python_tokens_per_s, sample_speedup_vs_python,
/// prefix_cache_hit_rate) after `# ...` comment lines; returns the process
/// exit code (1 on an error or when the greedy check disagrees).

#include <cstdint>
#include <string>

namespace glint::bench {

struct SampleBenchArgs {
  int repeats = 3;            ///< timed runs per side; medians are printed
  int64_t prompts = 64;
  int64_t samples = 4;        ///< completions per prompt
  int64_t max_tokens = 128;   ///< new tokens per completion
  int64_t min_prompt = 32;    ///< prompt lengths are uniform in [min_prompt, max_prompt]
  int64_t max_prompt = 256;
  int64_t shared_prefix = 32; ///< leading tokens every prompt shares (a system prompt)
  bool small = false;         ///< a ~0.1M-parameter model, for smoke runs
  std::string python = "/usr/bin/python3";
};

int sample(const SampleBenchArgs& args);

}  // namespace glint::bench
