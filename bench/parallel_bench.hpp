#pragma once
/// `glint bench parallel`: what each kind of model parallelism costs and
/// saves against data parallelism on the same ranks, batches and steps. Two
/// ranks (threads of this process, one libtorch thread each, a Gloo group
/// over loopback) train the bench model (`glint bench train`'s Qwen3) with
/// AdamW, full-parameter.
///
/// Prints `name: value` lines, medians of --repeats runs:
/// - dp2_state_bytes, fsdp2_state_bytes: the parameters, gradients and
///   optimizer state rank 0 holds (Trainer::state_bytes), and
///   fsdp2_state_bytes_vs_dp (goal <= 0.55);
/// - tp2_state_bytes and tp2_state_bytes_vs_dp (goal <= 0.6), pp2's alike;
/// - dp2_tokens_per_s, fsdp2_tokens_per_s, tp2_tokens_per_s,
///   pp2_tokens_per_s (the tokens a step trains over its wall time; tp2's
///   and pp2's ranks share one batch of twice the rows, pp2 in 4
///   micro-batches) and *_tokens_per_s_vs_dp;
/// - dp2_bytes_per_step, fsdp2_bytes_per_step: what rank 0's collectives
///   move per step over a ring (an all-reduce of n bytes moves 2 n (p-1)/p,
///   an all-gather of n bytes out (p-1)/p n), and the *_bytes_theory lines:
///   the least each scheme needs (DP: one all-reduce of the gradients;
///   FSDP: two all-gathers of the parameters, one reduce-scatter of the
///   gradients, so that the gap Gloo's emulated reduce-scatter costs shows;
///   TP: Megatron's four all-reduces of a layer's activations per layer;
///   PP: the activations across the cut and their gradients back; its
///   rank 0 is the first stage, which holds the embeddings).

#include <cstdint>
#include <string>

namespace glint::bench {

struct ParallelBenchArgs {
  int repeats = 3;     ///< timed runs per scheme; the median is printed
  int steps = 2;       ///< steps per timed run (after one warm-up step)
  int64_t batch = 4;   ///< sequences per rank
  int64_t seq = 128;   ///< tokens per sequence
  bool small = false;  ///< a ~0.1M-parameter model, for smoke runs
  /// qwen3 (the dense schemes), or qwen3_moe / qwen2_moe: expert
  /// parallelism, ep2 against dp2 on the MoE bench model ("ep1"), printing
  /// ep1_/ep2_state_bytes, _expert_bytes (the routed experts' parameters,
  /// gradients and optimizer state on rank 0), _tokens_per_s,
  /// _bytes_per_step, ep2_all_to_all_bytes_per_step (what the exchanges
  /// moved) beside ep2_all_to_all_bytes_even_routing (the least, were the
  /// routing even), ep2_state_bytes_vs_ep1, ep2_expert_bytes_vs_ep1 (goal
  /// <= 0.55) and ep2_tokens_per_s_vs_ep1.
  std::string arch = "qwen3";
};

int parallel(const ParallelBenchArgs& args);

}  // namespace glint::bench
