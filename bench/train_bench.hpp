#pragma once
/// `glint bench train`: training throughput (tokens/s of forward_backward +
/// clip_grad_and_step) of a Qwen3-shaped model against the same model, weights,
/// tokens and step written in plain Python PyTorch (bench/python/
/// train_baseline.py, run with Debian's python3-torch: the same libtorch and
/// thread count), interleaved in one run. Also checks that both sides compute
/// the same initial loss (a cross-check of glint's model against an
/// independent implementation) and reports the model FLOP utilisation against
/// this machine's at::matmul FLOP/s, measured in the same run.
///
/// Prints `name: value` lines (train_tokens_per_s, train_python_tokens_per_s,
/// train_speedup_vs_python, train_mfu; with an MoE --arch also
/// moe_train_speedup_vs_python, moe_dense_experts_tokens_per_s and
/// moe_grouped_vs_dense_experts; with a Qwen3.5 --arch also
/// qwen35_train_speedup_vs_python and gdn_chunked_vs_recurrent_train) after
/// `# ...` comment lines, and
/// returns the process exit code: 0, or 1 on an error or when the two sides'
/// initial losses disagree (a `# warning: ...` line says by how much).

#include <cstdint>
#include <string>

namespace glint::bench {

/// What is trained. A LoRA mode (adapters on a frozen base) will be added as
/// another value; both sides take it (the Python script as `--mode`).
/// full: every weight trains. lora: a LoRA adapter (r 8, alpha 16, every
/// projection) trains on the frozen base, as PEFT's all-linear.
enum class TrainMode : uint8_t { full, lora };

struct TrainBenchArgs {
  int repeats = 3;       ///< timed runs per side; the median is printed
  int steps = 1;         ///< training steps per timed run (the Python side takes ~2 min per step here)
  int64_t batch = 8;     ///< sequences per batch
  int64_t seq = 256;     ///< tokens per sequence
  bool small = false;    ///< a ~0.1M-parameter model instead of ~27M, for smoke runs
  std::string python = "/usr/bin/python3";  ///< an interpreter that can `import torch`
  TrainMode mode = TrainMode::full;
  /// "qwen3" (dense), or "qwen3_moe" / "qwen2_moe": the same attention with
  /// 8 experts, 2 per token, in every layer (bench_model.hpp). An MoE run
  /// also prints moe_train_speedup_vs_python and moe_grouped_vs_dense_experts
  /// (glint's grouped block against every expert on every token). "qwen3_5"
  /// / "qwen3_5_moe": Gated DeltaNet layers and gated attention, with
  /// qwen35_train_speedup_vs_python and gdn_chunked_vs_recurrent_train.
  std::string arch = "qwen3";
};

int train(const TrainBenchArgs& args);

}  // namespace glint::bench
