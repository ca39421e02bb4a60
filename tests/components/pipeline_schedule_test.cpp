// The 1F1B schedule, run by a simulator of the whole pipeline: messages
// between stages are the only dependencies (activations forward, gradients
// back), sent without blocking as the executor posts them. For micro-batch
// counts 1, p - 1, p and 2p + 1 on 2, 3 and 4 stages: every op runs, none
// waits for good (no deadlock), each stage runs a micro-batch's forward
// before its backward, holds at most p - s activations, and the step takes
// the 2 (m + p - 1) ticks of 1F1B with unit-cost ops.
#include "components/parallel/pipeline_schedule.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <set>

namespace glint::components {
namespace {

using K = PipeOp::Kind;

struct Simulated {
  bool finished = false;
  int ticks = 0;
  std::string stuck;  // the stages' next ops when nothing could run
};

// Runs every stage's schedule in lockstep ticks: in a tick, each stage whose
// next op has its inputs (sent in an earlier tick) runs it.
Simulated simulate(int p, int m, const std::vector<std::vector<PipeOp>>& plan) {
  std::vector<size_t> next(static_cast<size_t>(p), 0);
  std::set<std::pair<int, int>> acts, grads, forwarded;  // (stage that sent/ran, micro)
  Simulated out;
  for (;;) {
    bool all_done = true;
    for (int s = 0; s < p; ++s) all_done = all_done && next[static_cast<size_t>(s)] == plan[static_cast<size_t>(s)].size();
    if (all_done) {
      out.finished = true;
      return out;
    }
    std::vector<std::pair<int, PipeOp>> ran;
    for (int s = 0; s < p; ++s) {
      const auto& mine = plan[static_cast<size_t>(s)];
      if (next[static_cast<size_t>(s)] == mine.size()) continue;
      const auto op = mine[next[static_cast<size_t>(s)]];
      const bool ready = op.kind == K::forward ? (s == 0 || acts.count({s - 1, op.micro}))
                                               : forwarded.count({s, op.micro}) &&
                                                     (s == p - 1 || grads.count({s + 1, op.micro}));
      if (ready) ran.push_back({s, op});
    }
    if (ran.empty()) {
      for (int s = 0; s < p; ++s)
        if (next[static_cast<size_t>(s)] < plan[static_cast<size_t>(s)].size())
          out.stuck += "stage " + std::to_string(s) + " waits at " +
                       describe_schedule({plan[static_cast<size_t>(s)][next[static_cast<size_t>(s)]]}) + "; ";
      return out;
    }
    ++out.ticks;
    for (auto [s, op] : ran) {  // what a tick produces is seen from the next one
      ++next[static_cast<size_t>(s)];
      if (op.kind == K::forward) {
        forwarded.insert({s, op.micro});
        acts.insert({s, op.micro});
      } else {
        grads.insert({s, op.micro});
      }
    }
  }
}

TEST(PipelineSchedule, OneFOneBRunsWithoutDeadlockInTheLeastTimeAndMemory) {
  for (int p : {2, 3, 4}) {
    for (int m : {1, p - 1, p, 2 * p + 1}) {
      if (m < 1) continue;
      std::vector<std::vector<PipeOp>> plan;
      for (int s = 0; s < p; ++s) {
        auto ops = one_f_one_b(p, s, m);
        ASSERT_TRUE(ops) << describe(ops.error());
        const std::string where = "p " + std::to_string(p) + " m " + std::to_string(m) + " stage " + std::to_string(s) +
                                  ": " + describe_schedule(*ops);
        ASSERT_EQ(ops->size(), 2u * static_cast<size_t>(m)) << where;
        // Each micro-batch once each way, forwards and backwards in order,
        // a forward before its backward, at most p - s activations held.
        int f = 0, b = 0, held = 0, most = 0;
        for (const auto& op : *ops) {
          if (op.kind == K::forward) {
            EXPECT_EQ(op.micro, f++) << where;
            most = std::max(most, ++held);
          } else {
            EXPECT_EQ(op.micro, b++) << where;
            EXPECT_LT(op.micro, f) << where << ": a backward before its forward";
            --held;
          }
        }
        EXPECT_EQ(f, m) << where;
        EXPECT_EQ(b, m) << where;
        EXPECT_LE(most, std::min(p - s, m)) << where;
        plan.push_back(std::move(*ops));
      }
      auto run = simulate(p, m, plan);
      ASSERT_TRUE(run.finished) << "p " << p << " m " << m << ": deadlock: " << run.stuck;
      EXPECT_EQ(run.ticks, 2 * (m + p - 1)) << "p " << p << " m " << m;
    }
  }
}

TEST(PipelineSchedule, TwoStagesFourMicroBatchesAsMegatronOrdersThem) {
  EXPECT_EQ(describe_schedule(*one_f_one_b(2, 0, 4)), "F0 F1 B0 F2 B1 F3 B2 B3");
  EXPECT_EQ(describe_schedule(*one_f_one_b(2, 1, 4)), "F0 B0 F1 B1 F2 B2 F3 B3");
  EXPECT_EQ(describe_schedule(*one_f_one_b(1, 0, 3)), "F0 B0 F1 B1 F2 B2") << "one stage: gradient accumulation";
  EXPECT_EQ(describe_schedule(*one_f_one_b(4, 0, 2)), "F0 F1 B0 B1") << "fewer micro-batches than warm-up";
  EXPECT_EQ(code_of(one_f_one_b(2, 2, 4).error()), errc::invalid_argument);
  EXPECT_EQ(code_of(one_f_one_b(2, 0, 0).error()), errc::invalid_argument);
  EXPECT_EQ(code_of(one_f_one_b(0, 0, 1).error()), errc::invalid_argument);
}

}  // namespace
}  // namespace glint::components
