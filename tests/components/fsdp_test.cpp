// Fully sharded data parallelism (FSDP) in the trainer, against data
// parallelism on the same ranks and batches: the same losses, gradient
// norms and weights, with each rank holding about half the state.
#include "components/model/trainer.hpp"
#include "components/model/transformer.hpp"
#include "components/parallel/fsdp.hpp"
#include "components/tensor/torch_bridge.hpp"

#include "support/fake_process_group.hpp"
#include "support/tensors.hpp"
#include "support/near.hpp"
#include "support/thread_ranks.hpp"

#include <gtest/gtest.h>

#include <array>

namespace glint::components {
namespace {

using glint::testing::borrowed;
using glint::testing::ids_of;
using glint::testing::near;
using glint::testing::on_ranks;

// Every layer's parameter count is odd (593), so each shard of 2 is padded;
// qk-norm weights and norms sit in the same flat shards as decaying weights.
ModelConfig uneven() { return ModelConfig::make(Architecture::qwen3, 31, 9, 13, 2, 2, 1, 4); }

const Tensor kIds = ids_of({{1, 2, 3, 4, 5, 6}, {7, 8, 9, 0, 0, 0}, {4, 4, 4, 4, 0, 0}, {9, 8, 7, 6, 5, 4}});
const Tensor kMask = ids_of({{1, 1, 1, 1, 1, 1}, {1, 1, 1, 0, 0, 0}, {1, 1, 1, 1, 0, 0}, {1, 1, 1, 1, 1, 1}});

// Rank r's rows: rank 0 three, rank 1 one (with micro_batch_rows 2, rank 0
// runs two passes and rank 1 one: under FSDP it joins rank 0's second).
TrainBatch rows_of_rank(int r) {
  const int64_t begin = r == 0 ? 0 : 3, end = r == 0 ? 3 : 4;
  return {.tokens = {.input_ids = *kIds.slice(begin, end), .attention_mask = *kMask.slice(begin, end)}};
}

// In f64, so that what differs is the order of the sums alone, far below
// f32's rounding (which AdamW amplifies where a gradient is near zero).
Result<CausalLM> f64_model() {
  auto lm = CausalLM::init_random(uneven(), 3);
  if (lm)
    for (auto& [n, t] : lm->impl().params) t = t.to(at::kDouble).contiguous();
  return lm;
}

struct Run {
  std::vector<double> losses, norms;
  std::map<std::string, at::Tensor> params;  // the base's, gathered
  std::map<std::string, at::Tensor> adapter;
  int64_t state_bytes = 0;
};

// `steps` AdamW steps on rank r's rows, data-parallel (fsdp false) or
// sharded over the group.
void train(int r, ProcessGroup& pg, bool fsdp, int steps, const std::string& adapter, Run& out) {
  TrainConfig tc{.optimizer = {.lr = 2e-2, .weight_decay = 0.1, .max_grad_norm = 0.5}, .micro_batch_rows = 2};
  (fsdp ? tc.fsdp_group : tc.dp_group) = borrowed(pg);
  auto lm = f64_model();
  ASSERT_TRUE(lm);
  if (!adapter.empty()) {
    tc.adapter = adapter;
    ASSERT_TRUE(lm->add_adapter(adapter, {.r = 2, .alpha = 4, .target_modules = {"q_proj", "v_proj", "down_proj"}, .layers_to_transform = {1}}, 7));
  }
  auto tr = Trainer::create(std::move(*lm), tc);
  ASSERT_TRUE(tr) << describe(tr.error());
  for (int s = 0; s < steps; ++s) {
    auto m = tr->forward_backward(rows_of_rank(r), {});
    ASSERT_TRUE(m) << describe(m.error());
    auto st = tr->clip_grad_and_step();
    ASSERT_TRUE(st) << describe(st.error());
    out.losses.push_back(m->at("loss"));
    out.norms.push_back(st->at("grad_norm"));
  }
  out.state_bytes = tr->state_bytes();
  ASSERT_TRUE(tr->gather_parameters());
  for (auto& [n, p] : tr->model().impl().params) out.params[n] = p.detach().clone();
  if (!adapter.empty())
    for (auto& [n, a] : tr->model().impl().adapters.at(adapter).weights) {
      out.adapter[n + ".A"] = a.first.detach().clone();
      out.adapter[n + ".B"] = a.second.detach().clone();
    }
}

// |a - b| <= rel * max |b|, elementwise: "within rel relative" of a tensor.
std::array<Run, 2> on_two(bool fsdp, int steps, const std::string& adapter = {}) {
  std::array<Run, 2> runs;
  on_ranks(2, [&](int r, ProcessGroup& pg) { train(r, pg, fsdp, steps, adapter, runs[static_cast<size_t>(r)]); });
  return runs;
}

// Ten AdamW steps with weight decay and clipping at every step: FSDP over 2
// ranks against data parallelism over 2, the ranks' batches uneven. Not
// bitwise: the gradients of rank 0's two micro-batches are summed with rank
// 1's one pass at a time (data parallelism sums each rank's first), and the
// global norm adds its squares in another order. Within 1e-12 relative in
// f64 (1e-14 measured); in f32 AdamW amplifies the same reordering to about
// 5e-6 where a gradient is near zero.
TEST(Fsdp, TwoShardedRanksTrainAsTwoDataParallelRanks) {
  const int steps = 10;
  auto dp = on_two(false, steps);
  auto fsdp = on_two(true, steps);
  for (size_t r = 0; r < 2; ++r)
    for (int s = 0; s < steps; ++s) {
      EXPECT_NEAR(fsdp[r].losses[s], dp[r].losses[s], 1e-12 * std::abs(dp[r].losses[s])) << "rank " << r << " step " << s;
      EXPECT_NEAR(fsdp[r].norms[s], dp[r].norms[s], 1e-12 * dp[r].norms[s]) << "step " << s;
      EXPECT_GT(dp[r].norms[s], 0.5) << "the clip acts at every step";
    }
  ASSERT_EQ(fsdp[0].params.size(), dp[0].params.size());
  for (auto& [n, p] : dp[0].params) {
    EXPECT_TRUE(near(fsdp[0].params.at(n), p, 1e-12)) << n;
    EXPECT_TRUE(at::equal(fsdp[0].params.at(n), fsdp[1].params.at(n))) << n << " differs between the fsdp ranks";
    EXPECT_FALSE(at::equal(p, f64_model()->impl().params.at(n))) << n << " was trained";
  }
  // Parameters, gradients and AdamW's two moments: each rank holds half of
  // each (and its padding), against the whole of each.
  const double ratio = static_cast<double>(fsdp[0].state_bytes) / static_cast<double>(dp[0].state_bytes);
  EXPECT_LT(ratio, 0.55) << fsdp[0].state_bytes << " bytes against " << dp[0].state_bytes;
}

// LoRA on a sharded base (the adapter on layer 1 only: the backward gathers
// layer 1 and stops there): the adapter trains data-parallel over the fsdp
// ranks, bitwise as under data parallelism (the same sums in the same
// order), and nothing of the frozen base changes.
TEST(Fsdp, AnAdapterTrainsOnAShardedBase) {
  const int steps = 5;
  auto dp = on_two(false, steps, "tenant");
  auto fsdp = on_two(true, steps, "tenant");
  for (int s = 0; s < steps; ++s) EXPECT_EQ(fsdp[0].norms[s], dp[0].norms[s]) << s;
  ASSERT_FALSE(dp[0].adapter.empty());
  for (auto& [n, a] : dp[0].adapter) EXPECT_TRUE(at::equal(fsdp[0].adapter.at(n), a)) << n;
  auto base = f64_model();
  for (auto& [n, p] : fsdp[1].params) EXPECT_TRUE(at::equal(p, base->impl().params.at(n))) << n << " is frozen";
}

// A rank whose batch is bad joins the others' passes (without it they would
// wait in the layers' gathers) and its step; the sharded model refuses to
// be read until its parameters are gathered.
TEST(Fsdp, ABadBatchOnOneRankStillJoinsAndTheShardedModelRefusesReads) {
  on_ranks(2, [&](int r, ProcessGroup& pg) {
    auto tr = Trainer::create(*CausalLM::init_random(uneven(), 3),
                              {.optimizer = {.lr = 1e-2}, .fsdp_group = borrowed(pg)});
    ASSERT_TRUE(tr);
    auto batch = rows_of_rank(0);
    if (r == 1) batch.tokens.input_ids = ids_of({{1, 2, 99, 4, 5, 6}, {7, 8, 9, 0, 0, 0}, {4, 4, 4, 4, 0, 0}});
    auto m = tr->forward_backward(batch, {});
    EXPECT_EQ(static_cast<bool>(m), r == 0);
    if (!m) {
      EXPECT_NE(describe(m.error()).find("99"), std::string::npos) << describe(m.error());
    }
    ASSERT_TRUE(tr->clip_grad_and_step());
    auto read = tr->model().forward({.input_ids = ids_of({{1, 2, 3}})});
    ASSERT_FALSE(read);
    EXPECT_NE(describe(read.error()).find("gather them first"), std::string::npos) << describe(read.error());
    EXPECT_FALSE(tr->model().save("/nonexistent"));
    ASSERT_TRUE(tr->gather_parameters());
    auto again = tr->model().forward({.input_ids = ids_of({{1, 2, 3}})});
    ASSERT_TRUE(again) << describe(again.error());
    tr->release_parameters();
    EXPECT_FALSE(tr->model().forward({.input_ids = ids_of({{1, 2, 3}})}));
    // A second call still works (its passes free what the gather held).
    EXPECT_EQ(static_cast<bool>(tr->forward_backward(rows_of_rank(r), {})), true);
    ASSERT_TRUE(tr->clip_grad_and_step());
  });
}

// HSDP: shards over fsdp 2, replicated over dp 2 (4 ranks, Twinkle's
// default mesh), against one process on the whole batch: within 1e-11
// relative in f64 (2e-13 measured).
TEST(Fsdp, ShardsReplicatedOverDataParallelTrainAsOneProcess) {
  const int steps = 4;
  TrainConfig tc{.optimizer = {.lr = 2e-2, .weight_decay = 0.1, .max_grad_norm = 0.5}};
  auto single = Trainer::create(*f64_model(), tc);
  ASSERT_TRUE(single);
  std::vector<double> norms;
  for (int s = 0; s < steps; ++s) {
    ASSERT_TRUE(single->forward_backward({.tokens = {.input_ids = kIds, .attention_mask = kMask}}, {}));
    auto st = single->clip_grad_and_step();
    ASSERT_TRUE(st);
    norms.push_back(st->at("grad_norm"));
  }
  std::array<std::map<std::string, at::Tensor>, 4> finals;
  // fsdp within dp: rank = dp * 2 + fsdp.
  glint::testing::on_grid(2, 2, [&](int rank, ProcessGroup& fsdp, ProcessGroup& dp) {
    auto mine = tc;
    mine.fsdp_group = borrowed(fsdp);
    mine.dp_group = borrowed(dp);
    auto tr = Trainer::create(*f64_model(), mine);
    ASSERT_TRUE(tr) << describe(tr.error());
    for (int s = 0; s < steps; ++s) {
      ASSERT_TRUE(tr->forward_backward(
          {.tokens = {.input_ids = *kIds.slice(rank, rank + 1), .attention_mask = *kMask.slice(rank, rank + 1)}}, {}));
      auto st = tr->clip_grad_and_step();
      ASSERT_TRUE(st) << describe(st.error());
      EXPECT_NEAR(st->at("grad_norm"), norms[static_cast<size_t>(s)], 1e-11 * norms[static_cast<size_t>(s)]);
    }
    ASSERT_TRUE(tr->gather_parameters());
    for (auto& [n, p] : tr->model().impl().params) finals[static_cast<size_t>(rank)][n] = p.detach().clone();
  });
  for (auto& [n, p] : single->model().impl().params)
    for (size_t r = 0; r < 4; ++r) EXPECT_TRUE(near(finals[r].at(n), p, 1e-11)) << n << " on rank " << r;
}

// Two calls where a rank's slices differ (micro-batches of one row, rank 0
// with two): log-probs asked for a slice with no counted token (a forward
// without gradients inside the group's passes), then a call whose second
// slice on rank 0 has a loss that is not finite. That call fails on both
// ranks and leaves nothing behind: the next call and step give the weights
// of a run that never made it.
TEST(Fsdp, ASliceWithoutTargetsAndAFailedSliceKeepTheRanksInStep) {
  auto run = [&](bool with_failure) {
    std::array<std::map<std::string, at::Tensor>, 2> finals;
    on_ranks(2, [&](int r, ProcessGroup& pg) {
      auto tr = Trainer::create(*CausalLM::init_random(uneven(), 3),
                                {.optimizer = {.lr = 1e-2}, .fsdp_group = borrowed(pg), .micro_batch_rows = 1});
      ASSERT_TRUE(tr);
      const auto ids = r == 0 ? ids_of({{1, 2, 3, 4}, {5, 6, 7, 8}}) : ids_of({{9, 8, 7, 6}});
      const auto none = r == 0 ? ids_of({{1, 1, 1, 1}, {0, 0, 0, 0}}) : ids_of({{1, 1, 1, 1}});
      Tensor logps;
      auto m = tr->forward_backward({.tokens = {.input_ids = ids}, .loss_mask = none}, {}, &logps);
      ASSERT_TRUE(m) << describe(m.error());
      EXPECT_EQ(logps.shape(), ids.shape());
      ASSERT_TRUE(tr->clip_grad_and_step());
      if (with_failure) {
        // Weights of 3e38 overflow the loss's f32 sum on rank 0's second row only.
        std::vector<float> w(r == 0 ? 8 : 4, 1.f);
        if (r == 0) std::fill(w.begin() + 4, w.end(), 3e38f);
        auto weights = Tensor::from_values(w, {r == 0 ? 2 : 1, 4});
        ASSERT_TRUE(weights);
        auto bad = tr->forward_backward({.tokens = {.input_ids = ids}, .loss_weights = *weights},
                                        {.reduction = LossReduction::sum});
        ASSERT_FALSE(bad) << "rank " << r;
        EXPECT_NE(describe(bad.error()).find(r == 0 ? "not finite" : "failed on a rank of the fsdp group"),
                  std::string::npos)
            << describe(bad.error());
      }
      ASSERT_TRUE(tr->forward_backward({.tokens = {.input_ids = ids}}, {}));
      ASSERT_TRUE(tr->clip_grad_and_step());
      ASSERT_TRUE(tr->gather_parameters());
      for (auto& [n, p] : tr->model().impl().params) finals[static_cast<size_t>(r)][n] = p.detach().clone();
    });
    return finals;
  };
  auto clean = run(false);
  auto failed = run(true);
  for (auto& [n, p] : clean[0]) EXPECT_TRUE(at::equal(failed[0].at(n), p)) << n << ": the failed call left something";
}

// Reading a gathered model: copies that outlive the next pass, the step
// frees what was gathered (its values are the weights before it), writes
// are refused (lost at the next pass), and one rank's optimizer state is
// not another's.
TEST(Fsdp, TheGatheredModelIsReadOnlyAndItsCopiesOutliveIt) {
  std::array<NamedTensors, 2> states;
  on_ranks(2, [&](int r, ProcessGroup& pg) {
    auto lm = CausalLM::init_random(uneven(), 3);
    ASSERT_TRUE(lm);
    ASSERT_TRUE(lm->add_adapter("a", {.r = 2, .alpha = 4}, 1));
    auto tr = Trainer::create(std::move(*lm), {.optimizer = {.lr = 1e-2}, .fsdp_group = borrowed(pg)});
    ASSERT_TRUE(tr);
    ASSERT_TRUE(tr->forward_backward(rows_of_rank(r), {}));
    ASSERT_TRUE(tr->gather_parameters());
    auto before = tr->model().named_parameters();
    ASSERT_TRUE(before);
    std::vector<at::Tensor> snapshot;
    for (auto& [n, t] : *before) snapshot.push_back(to_torch(t).clone());
    auto merge = tr->model().merge_adapter("a");
    ASSERT_FALSE(merge);
    EXPECT_NE(describe(merge.error()).find("would be lost"), std::string::npos) << describe(merge.error());
    ASSERT_TRUE(tr->clip_grad_and_step());
    EXPECT_FALSE(tr->model().forward({.input_ids = ids_of({{1, 2}})})) << "the step freed the gathered weights";
    ASSERT_TRUE(tr->forward_backward(rows_of_rank(r), {}));  // frees and refills the buffers
    for (size_t i = 0; i < snapshot.size(); ++i)
      EXPECT_TRUE(at::equal(to_torch((*before)[i].second), snapshot[i])) << (*before)[i].first << " is a copy";
    states[static_cast<size_t>(r)] = tr->optimizer_state();
    ASSERT_TRUE(pg.barrier());  // both states written
    auto other = r == 0 ? 1 : 0;
    std::map<std::string, Tensor> theirs(states[static_cast<size_t>(other)].begin(),
                                         states[static_cast<size_t>(other)].end());
    auto loaded = tr->load_optimizer_state(theirs);
    EXPECT_FALSE(loaded) << "rank " << r << " took rank " << other << "'s optimizer state";
  });
}

// A gather of the whole model (forward_only, a read) that fails part way
// leaves the ranks out of step, as a failed unit read does: the group says
// so at the next call instead of running collectives that no longer pair,
// and says why (the first failure, naming the peer), not only that.
TEST(Fsdp, AFailedGatherOfTheWholeModelBreaksTheGroup) {
  auto pg = std::make_shared<glint::testing::FakeProcessGroup>(0, 2);
  auto lm = CausalLM::init_random(uneven(), 3);
  ASSERT_TRUE(lm);
  auto tr = Trainer::create(std::move(*lm), {.fsdp_group = pg});
  ASSERT_TRUE(tr) << describe(tr.error());
  pg->script({caf::error{}, make_error(errc::unavailable, "a peer is gone")});  // the second unit's gather fails
  auto failed = tr->gather_parameters();
  ASSERT_FALSE(failed);
  EXPECT_NE(describe(failed.error()).find("a peer is gone"), std::string::npos) << describe(failed.error());
  auto next = tr->gather_parameters();
  ASSERT_FALSE(next);
  EXPECT_NE(describe(next.error()).find("out of step"), std::string::npos) << describe(next.error());
  EXPECT_NE(describe(next.error()).find("a peer is gone"), std::string::npos) << describe(next.error());
  EXPECT_FALSE(tr->forward_only({.input_ids = ids_of({{1, 2}})}));
}

TEST(Fsdp, ShardingIsRefusedWhereItCannotWork) {
  on_ranks(2, [&](int r, ProcessGroup& pg) {
    auto lm = CausalLM::init_random(uneven(), 3);
    ASSERT_TRUE(lm);
    auto f = Fsdp::shard(lm->impl(), borrowed(pg), true);
    ASSERT_TRUE(f);
    auto again = Fsdp::shard(lm->impl(), borrowed(pg), true);
    ASSERT_FALSE(again);
    EXPECT_NE(describe(again.error()).find("sharded already"), std::string::npos);
    EXPECT_FALSE(Fsdp::shard(lm->impl(), nullptr, true));
    (void)r;
  });
}

}  // namespace
}  // namespace glint::components
