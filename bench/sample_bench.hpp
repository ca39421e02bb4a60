#pragma once
/// `glint bench sample`: generation throughput of the sampler engine (paged
/// KV cache, continuous batching, prefix caching) against two baselines on
/// the same model, weights, prompts and thread count, runs interleaved in
/// one process tree:
/// - a plain Python PyTorch generate loop (bench/python/sample_baseline.py:
///   prompts batched with left padding, a contiguous KV cache,
///   torch.multinomial);
/// - llama.cpp (node-llama-cpp's prebuilt CPU build, driven by
///   bench/llamacpp/llamacpp_child.mjs) on the model exported by `glint
///   export gguf` in f32: one context with a sequence per sample, batched
///   into shared llama_decode calls.
/// Greedy cross-checks first make sure every side computes the same model.
///
/// Prints `name: value` lines (sample_tokens_per_s,
/// sample_python_tokens_per_s, sample_speedup_vs_python,
/// sample_llamacpp_tokens_per_s, sample_speedup_vs_llamacpp,
/// prefix_cache_hit_rate) after `# ...` comment lines; returns the process
/// exit code (1 on an error or when a greedy check disagrees).

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
  /// The llama.cpp baseline: "auto" (installs node-llama-cpp from npm with
  /// scripts/setup_llamacpp.sh when missing), "installed" (only when there
  /// already), "none".
  std::string llamacpp = "auto";
  /// llama.cpp's parallel sequences (llama-server's slots): each takes the
  /// next prompt when done and generates its samples one after another,
  /// reusing the prompt's KV cache.
  int64_t llamacpp_parallel = 64;
  /// "qwen3", or an MoE family ("qwen3_moe", "qwen2_moe": bench_model.hpp's
  /// 8 experts, 2 per token): then glint's engine on the MoE model against
  /// the same engine on the dense model of the same active size
  /// (moe_sample_tokens_per_s, moe_sample_dense_tokens_per_s,
  /// moe_sample_vs_dense_same_active), and for qwen3_moe llama.cpp on the
  /// MoE model exported to GGUF (moe_sample_llamacpp_tokens_per_s,
  /// moe_sample_speedup_vs_llamacpp; --llamacpp none leaves it out). No
  /// Python baseline (its generate loop is dense); llama.cpp's qwen2moe
  /// does not renormalise the bench model's expert weights, so qwen2_moe
  /// has none either. "qwen3_5" / "qwen3_5_moe": glint's engine on the
  /// Qwen3.5 bench model against the same-size Qwen3, decoding --min-prompt
  /// token prompts at 64 sequences and at 1 (qwen35_decode_tokens_per_s_N,
  /// qwen3_decode_tokens_per_s_N, qwen35_decode_vs_qwen3_N), and the bytes
  /// each keeps per sequence (qwen35_state_bytes_per_sequence,
  /// qwen35_kv_bytes_per_sequence_4k, qwen3_kv_bytes_per_sequence_4k).
  std::string arch = "qwen3";
};

int sample(const SampleBenchArgs& args);

}  // namespace glint::bench
