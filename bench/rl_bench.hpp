#pragma once
/// `glint bench rl`: what asynchronous RL gains on the GRPO example
/// (examples/grpo: the same task, model and step count as the demo; the
/// model group on the first core, the sampler group on the last). For each
/// seed it runs the example at --max-staleness 0, 1 and 2 in turn and reads
/// its GRPO phase's wall time, its sampling and training time, and its
/// greedy accuracy on 256 held-out prompts after GRPO:
///
/// - async_eta1_speedup, async_eta2_speedup: steps per hour over the
///   synchronous run's (median over seeds, each against its own seed's);
/// - async_ideal_speedup: (T_gen + T_train) / max(T_gen, T_train) from the
///   synchronous runs, the most that overlapping the two can give; and
///   async_eta2_of_ideal, the eta 2 speedup over it (goal >= 0.8);
/// - sync_accuracy, async_eta1_accuracy, async_eta2_accuracy: the mean
///   over seeds, and accuracy_seed_std, the spread of the synchronous runs'
///   across seeds: what "within noise" means here.

#include <string>

namespace glint::bench {

struct RlBenchArgs {
  int seeds = 3;    ///< runs per staleness, seeds 1..seeds
  int steps = 120;  ///< GRPO steps per run (the demo's)
  std::string grpo{};  ///< the example binary; empty: examples/grpo of this build
};

int rl(const RlBenchArgs& args);

}  // namespace glint::bench
