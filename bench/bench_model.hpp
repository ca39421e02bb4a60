#pragma once
// The model and tokens the training benchmarks share (bench train, bench
// parallel).

#include "components/model/config.hpp"
#include "runtime/tensor.hpp"

#include <algorithm>
#include <cstdio>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

namespace glint::bench {

/// ~27M parameters (Qwen3 with GQA and q/k norm, untied head), or ~0.1M
/// for smoke runs, for sequences of up to `seq` tokens. With `arch`
/// qwen3_moe: the same attention, and in every layer 8 experts of half the
/// dense width, 2 per token (the dense model's feed-forward width per
/// token: ~70M parameters, ~27M active). With qwen3_5: Gated DeltaNet
/// layers (heads / 2 key heads, heads value heads) and one gated attention
/// layer in four.
inline components::ModelConfig bench_model(bool small, int64_t seq,
                                           components::Architecture arch = components::Architecture::qwen3) {
  using components::Architecture;
  using components::ModelConfig;
  auto cfg = small ? ModelConfig::make(arch, 512, 64, 128, 2, 4, 2) : ModelConfig::make(arch, 8192, 512, 1536, 6, 8, 4);
  cfg.max_position_embeddings = std::max<int64_t>(cfg.max_position_embeddings, seq);
  if (components::is_moe(arch)) {
    cfg.moe.num_experts = 8;
    cfg.moe.num_experts_per_tok = 2;
    cfg.moe.moe_intermediate_size = cfg.intermediate_size / 2;
    cfg.moe.norm_topk_prob = true;
    cfg.moe.shared_expert_intermediate_size = arch != Architecture::qwen3_moe ? cfg.intermediate_size / 2 : 0;
  }
  if (components::is_hybrid(arch)) {
    // Qwen3.5's proportions: as many Gated DeltaNet key heads as attention
    // heads, twice as many value heads, of the attention's head size; every
    // fourth layer full attention (layer 3 of 6).
    const int64_t heads = cfg.num_attention_heads, d = cfg.head_dim;
    cfg.linear_attention = {.num_key_heads = heads / 2, .key_head_dim = d, .num_value_heads = heads, .value_head_dim = d,
                            .conv_kernel_dim = 4};
  }
  return cfg;
}

/// The parameters a token's forward pass multiplies by: all, less the
/// experts it is not routed to (num_experts - num_experts_per_tok per
/// sparse layer).
inline int64_t active_parameters(const components::ModelConfig& c) {
  int64_t n = c.num_parameters();
  for (int64_t l = 0; l < c.num_hidden_layers; ++l)
    if (c.feed_forward(l) == components::FeedForward::sparse)
      n -= (c.moe.num_experts - c.moe.num_experts_per_tok) * 3 * c.hidden_size * c.moe.moe_intermediate_size;
  return n;
}

/// What is wrong with the training benchmarks' size flags (empty: nothing).
inline std::string bad_sizes(int repeats, int steps, int64_t batch, int64_t seq) {
  if (repeats < 1 || steps < 1 || batch < 1 || seq < 2)
    return "--repeats, --steps and --batch must be at least 1, --seq at least 2";
  return {};
}

/// i64 [batch, seq] uniform token ids, the same for the same seed.
inline Tensor random_tokens(int64_t batch, int64_t seq, int64_t vocab, uint64_t seed) {
  std::mt19937_64 rng{seed};
  std::uniform_int_distribution<int64_t> pick{0, vocab - 1};
  std::vector<int64_t> ids(static_cast<size_t>(batch * seq));
  for (auto& id : ids) id = pick(rng);
  auto t = Tensor::from_values(ids, {batch, seq});
  if (!t) throw std::runtime_error("random_tokens: " + describe(t.error()));
  return std::move(*t);
}

/// "27.31M"
inline std::string millions(int64_t n) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.2fM", static_cast<double>(n) / 1e6);
  return buf;
}

}  // namespace glint::bench
