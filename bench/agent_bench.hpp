#pragma once
/// `glint bench rl --env builtin:calculator`: what keeping an episode's
/// tokens buys in multi-turn rollouts. It makes the calculator agent of
/// docs/recipes.md ("Agents": calculator data, a tiny model with a tool
/// template, an SFT warm-up through this binary), then runs the same
/// episodes (prompts x generations, seeded alike) through two loops in
/// turn, --repeats times:
///
/// - multiturn: actors::AgentRunner as glint grpo --env runs it: the
///   model's tokens kept, only the environment's messages rendered and
///   appended, each episode's turns on one sampler rank with the prefix
///   cache on;
/// - naive: each turn re-renders the whole conversation, re-tokenises it
///   and prefills it again (AgentOptions::rerender, prefix cache off).
///
/// - rerender_cached: the naive loop on the multiturn loop's sampler, its
///   prefix cache on: what the cache alone recovers of re-rendering.
///
/// Prints multiturn_tokens_per_s and naive_tokens_per_s (the model's
/// sampled tokens over the wall time of a call; medians),
/// multiturn_vs_naive (the median of each repeat's ratio; goal >= 2),
/// prefix_cache_hit_rate (the share of later turns' context the cache
/// served), rerender_cached_tokens_per_s, multiturn_vs_rerender_cached,
/// rerender_cached_hit_rate and the turns per episode of each loop.

#include <cstdint>
#include <string>

namespace glint::bench {

struct AgentBenchArgs {
  std::string env = "builtin:calculator";
  int repeats = 5;
  int64_t prompts = 64;
  int64_t generations = 8;
  int64_t sft_steps = 300;
};

int agents(const AgentBenchArgs& args);

}  // namespace glint::bench
