// Collectives over Gloo between threads, and data-parallel training: two
// ranks on halves of a batch take the same steps as one rank on all of it.
#include "components/comm/process_group_impl.hpp"
#include "components/model/trainer.hpp"
#include "components/model/transformer.hpp"

#include "runtime/process.hpp"
#include "support/tensors.hpp"

#include <gtest/gtest.h>

#include <thread>

namespace glint::components {
namespace {

using glint::testing::ids_of;

// Runs f(rank, group) on `world` threads, one process group rank each.
void on_ranks(int world, const std::function<void(int, ProcessGroup&)>& f) {
  auto port = pick_free_port();
  ASSERT_TRUE(port);
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r)
    threads.emplace_back([&, r] {
      auto pg = ProcessGroup::create({.store_port = *port, .rank = r, .world_size = world,
                                      .timeout = std::chrono::seconds(30)});
      ASSERT_TRUE(pg) << describe(pg.error());
      f(r, **pg);
    });
  for (auto& t : threads) t.join();
}

TEST(Comm, AllReduceBroadcastAndBarrier) {
  on_ranks(2, [](int r, ProcessGroup& pg) {
    EXPECT_EQ(pg.size(), 2);
    std::vector<Tensor> ts{glint::testing::vector_of(std::vector<float>{1.f * (r + 1), 10.f}),
                           glint::testing::vector_of(std::vector<int64_t>{r, 5})};
    ASSERT_TRUE(pg.all_reduce_sum(ts));
    EXPECT_EQ(ts[0], glint::testing::vector_of(std::vector<float>{3.f, 20.f}));
    EXPECT_EQ(ts[1], glint::testing::vector_of(std::vector<int64_t>{1, 10}));
    std::vector<Tensor> b{glint::testing::vector_of(std::vector<float>{static_cast<float>(r), 7.f * r})};
    ASSERT_TRUE(pg.broadcast(b, 1));
    EXPECT_EQ(b[0], glint::testing::vector_of(std::vector<float>{1.f, 7.f}));
    EXPECT_TRUE(pg.barrier());
    EXPECT_FALSE(pg.broadcast(b, 2));
  });
  auto bad = ProcessGroup::create({.store_port = 1, .rank = 2, .world_size = 2});
  ASSERT_FALSE(bad);
  EXPECT_NE(describe(bad.error()).find("rank 2 is outside a world of 2"), std::string::npos);
  EXPECT_FALSE(ProcessGroup::create({.backend = "mpi"}));
}

TEST(Comm, DataParallelStepsEqualOneRankOnTheWholeBatch) {
  auto cfg = ModelConfig::make(Architecture::qwen3, 31, 16, 32, 2, 4, 2);
  auto batch = ids_of({{1, 2, 3, 4, 5, 6}, {7, 8, 9, 0, 0, 0}, {4, 4, 4, 4, 0, 0}, {9, 8, 7, 6, 5, 4}});
  auto mask = ids_of({{1, 1, 1, 1, 1, 1}, {1, 1, 1, 0, 0, 0}, {1, 1, 1, 1, 0, 0}, {1, 1, 1, 1, 1, 1}});
  const int steps = 5;
  TrainConfig tc{.optimizer = {.lr = 1e-2}};

  auto single = Trainer::create(*CausalLM::init_random(cfg, 3), tc);
  ASSERT_TRUE(single);
  for (int s = 0; s < steps; ++s) {
    ASSERT_TRUE(single->forward_backward({.tokens = {.input_ids = batch, .attention_mask = mask}}, {}));
    ASSERT_TRUE(single->clip_grad_and_step());
  }

  std::vector<std::map<std::string, at::Tensor>> ranks(2);
  on_ranks(2, [&](int r, ProcessGroup& pg) {
    auto shared = std::shared_ptr<ProcessGroup>(&pg, [](ProcessGroup*) {});
    auto mine = tc;
    mine.dp_group = shared;
    auto tr = Trainer::create(*CausalLM::init_random(cfg, 3), mine);
    ASSERT_TRUE(tr);
    for (int s = 0; s < steps; ++s) {
      auto m = tr->forward_backward(
          {.tokens = {.input_ids = *batch.slice(2 * r, 2 * r + 2), .attention_mask = *mask.slice(2 * r, 2 * r + 2)}}, {});
      ASSERT_TRUE(m) << describe(m.error());
      auto st = tr->clip_grad_and_step();
      ASSERT_TRUE(st) << describe(st.error());
    }
    for (auto& [n, p] : tr->model().impl().params) ranks[static_cast<size_t>(r)][n] = p.detach().clone();
  });
  for (auto& [n, p] : single->model().impl().params) {
    EXPECT_TRUE(at::allclose(ranks[0].at(n), p, 1e-5, 1e-5)) << n;
    EXPECT_TRUE(at::equal(ranks[0].at(n), ranks[1].at(n))) << n << " differs between the dp ranks";
  }
}

TEST(Comm, ARankWhoseBatchFailedStillJoinsTheStep) {
  auto cfg = ModelConfig::make(Architecture::qwen3, 31, 16, 32, 1, 4, 2);
  std::vector<std::map<std::string, at::Tensor>> ranks(2);
  on_ranks(2, [&](int r, ProcessGroup& pg) {
    auto tr = Trainer::create(*CausalLM::init_random(cfg, 3),
                              {.optimizer = {.lr = 1e-2}, .dp_group = std::shared_ptr<ProcessGroup>(&pg, [](ProcessGroup*) {})});
    ASSERT_TRUE(tr);
    // Rank 1's batch is bad; its step adds zeros instead of leaving rank 0 waiting.
    auto ids = r == 0 ? ids_of({{1, 2, 3, 4}}) : ids_of({{1, 2, 99, 4}});
    EXPECT_EQ(static_cast<bool>(tr->forward_backward({.tokens = {.input_ids = ids}}, {})), r == 0);
    auto start = std::chrono::steady_clock::now();
    auto st = tr->clip_grad_and_step();
    ASSERT_TRUE(st) << describe(st.error());
    EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
    for (auto& [n, p] : tr->model().impl().params) ranks[static_cast<size_t>(r)][n] = p.detach().clone();
  });
  for (auto& [n, p] : ranks[0]) EXPECT_TRUE(at::equal(p, ranks[1].at(n))) << n;
}

}  // namespace
}  // namespace glint::components
