// The pipeline executor on 2 and 3 stages (threads, Gloo over loopback)
// against gradient accumulation on one process: the same gradients, bitwise
// (each micro-batch's ops and the accumulation run in the same order), for
// 1, p - 1, p and 2p + 1 micro-batches of uneven sizes.
#include "components/parallel/pipeline.hpp"

#include "components/model/trainer.hpp"
#include "components/model/transformer.hpp"
#include "components/tensor/torch_bridge.hpp"

#include "support/tensors.hpp"
#include "support/near.hpp"
#include "support/thread_ranks.hpp"

#include <gtest/gtest.h>

#include <array>
#include <chrono>
#include <stdexcept>
#include <map>
#include <thread>

namespace glint::components {
namespace {

using glint::testing::borrowed;
using glint::testing::ids_of;
using glint::testing::near;
using glint::testing::on_ranks;

struct Toy {
  std::vector<at::Tensor> w;  // three layers: [8, 6], [8, 8], [3, 8]
  at::Tensor x, y;            // [9, 6], [9, 3]
  static Toy make() {
    at::manual_seed(11);
    Toy t;
    for (auto shape : {std::vector<int64_t>{8, 6}, {8, 8}, {3, 8}}) t.w.push_back(at::randn(shape, at::kDouble));
    t.x = at::randn({9, 6}, at::kDouble);
    t.y = at::randn({9, 3}, at::kDouble);
    return t;
  }
  std::vector<at::Tensor> params() const {
    std::vector<at::Tensor> out;
    for (const auto& p : w) out.push_back(p.clone().set_requires_grad(true));
    return out;
  }
  static at::Tensor layer(size_t l, const std::vector<at::Tensor>& p, const at::Tensor& h) {
    auto z = at::matmul(h, p[l].t());
    return l < 2 ? at::tanh(z) : z;
  }
};

// Micro-batch m's rows [begin, begin + n) of 9 split into `m` uneven runs.
std::pair<int64_t, int64_t> rows(int m, int count) {
  const int64_t begin = 9 * m / count, end = 9 * (m + 1) / count;
  return {begin, end - begin};
}

TEST(Pipeline, StagesTrainAsGradientAccumulationOnOneProcess) {
  const auto toy = Toy::make();
  for (int stages : {2, 3})
    for (int micro : {1, stages - 1, stages, 2 * stages + 1}) {
      auto whole = toy.params();
      for (int m = 0; m < micro; ++m) {
        auto [b, n] = rows(m, micro);
        auto h = toy.x.narrow(0, b, n);
        for (size_t l = 0; l < 3; ++l) h = Toy::layer(l, whole, h);
        ((h - toy.y.narrow(0, b, n)).pow(2).sum() / 9).backward();
      }
      // Stage s runs layers first[s] .. first[s + 1) - 1.
      const std::vector<size_t> first = stages == 2 ? std::vector<size_t>{0, 2, 3} : std::vector<size_t>{0, 1, 2, 3};
      on_ranks(stages, [&](int s, ProcessGroup& pp) {
        auto mine = toy.params();
        PipelineStage st;
        st.dtype = at::kDouble;
        st.activation_shape = [&](int m) { return std::vector<int64_t>{rows(m, micro).second, 8}; };
        st.forward = [&](int m, const at::Tensor& in) {
          auto [b, n] = rows(m, micro);
          auto h = s == 0 ? toy.x.narrow(0, b, n) : in;
          for (size_t l = first[static_cast<size_t>(s)]; l < first[static_cast<size_t>(s) + 1]; ++l)
            h = Toy::layer(l, mine, h);
          return s == stages - 1 ? (h - toy.y.narrow(0, b, n)).pow(2).sum() / 9 : h;
        };
        auto ok = run_pipeline(pp, micro, st);
        ASSERT_TRUE(ok) << describe(ok.error());
        for (size_t l = first[static_cast<size_t>(s)]; l < first[static_cast<size_t>(s) + 1]; ++l)
          EXPECT_TRUE(at::equal(mine[l].grad(), whole[l].grad()))
              << stages << " stages, " << micro << " micro-batches, layer " << l << " on stage " << s;
      });
    }
}

// Three decoder layers (stage 0 takes two, stage 1 one), in f64, weights
// scaled up so that the attention is sharp.
CausalLM stage_model(bool tied) {
  auto cfg = ModelConfig::make(Architecture::qwen3, 32, 16, 24, 3, 4, 2);
  cfg.tie_word_embeddings = tied;
  auto lm = CausalLM::init_random(cfg, 5);
  EXPECT_TRUE(lm);
  for (auto& [n, t] : lm->impl().params) t = (n.find("norm") == std::string::npos ? t * 6.0 : t).to(at::kDouble);
  return std::move(*lm);
}

// A model cut into 2 pipeline stages (2 + 1 layers) and into 3 (a middle
// stage with neither embeddings nor head) trains as one process does with
// gradient accumulation over the same 4 micro-batches (7 rows, 2 per
// micro-batch): three AdamW steps with clipping, the same losses and global
// gradient norms, and each stage's parameters equal to the same ones of the
// single process; with tied embeddings too (the first stage's lookup and the
// last one's head both add to their gradient, the middle stage adds zeros). Within 1e-12 relative: the
// passes are the same ops in the same order, only the norm's squares are
// summed per stage, which moves the clipping factor in its last bits.
TEST(Pipeline, APipelineTrainsAsGradientAccumulation) {
  const auto ids = ids_of({{1, 2, 3, 4, 5, 6}, {7, 8, 9, 10, 0, 0}, {31, 30, 4, 4, 2, 1}, {5, 5, 6, 7, 8, 9},
                           {11, 12, 13, 14, 15, 16}, {3, 1, 4, 1, 5, 9}, {2, 7, 1, 8, 2, 8}});
  const auto mask = ids_of({{1, 1, 1, 1, 1, 1}, {1, 1, 1, 1, 0, 0}, {1, 1, 1, 1, 1, 1}, {1, 1, 1, 0, 0, 0},
                            {1, 1, 1, 1, 1, 1}, {1, 1, 1, 1, 1, 1}, {1, 1, 1, 1, 1, 0}});
  const TrainBatch batch{.tokens = {.input_ids = ids, .attention_mask = mask}};
  const TrainConfig tc{.optimizer = {.lr = 2e-2, .weight_decay = 0.1, .max_grad_norm = 0.5}, .micro_batch_rows = 2};
  for (int stages : {2, 3})
  for (bool tied : {false, true}) {
    SCOPED_TRACE(std::to_string(stages) + " stages, " + (tied ? "tied embeddings" : "untied"));
    auto single = Trainer::create(stage_model(tied), tc);
    ASSERT_TRUE(single);
    std::vector<double> losses, norms, counts;
    std::vector<at::Tensor> logps;
    for (int s = 0; s < 3; ++s) {
      Tensor lp;
      auto m = single->forward_backward(batch, {}, &lp);
      ASSERT_TRUE(m);
      auto st = single->clip_grad_and_step();
      ASSERT_TRUE(st);
      losses.push_back(m->at("loss"));
      counts.push_back(m->at("loss_count"));
      norms.push_back(st->at("grad_norm"));
      logps.push_back(to_torch(lp));
      EXPECT_GT(norms.back(), 0.5) << "clipping takes part";
    }
    on_ranks(stages, [&](int r, ProcessGroup& pg) {
      auto mine = tc;
      mine.pp_group = borrowed(pg);
      auto tr = Trainer::create(stage_model(tied), mine);
      ASSERT_TRUE(tr) << describe(tr.error());
      const auto& held = tr->model().impl().params;
      const int last = stages - 1;
      EXPECT_EQ(held.count("model.layers.0.mlp.up_proj.weight"), r == 0 ? 1u : 0u);
      EXPECT_EQ(held.count("model.layers.1.mlp.up_proj.weight"), r == (stages == 2 ? 0 : 1) ? 1u : 0u);
      EXPECT_EQ(held.count("model.layers.2.mlp.up_proj.weight"), r == last ? 1u : 0u);
      EXPECT_EQ(held.count("model.embed_tokens.weight"), r == 0 || (tied && r == last) ? 1u : 0u);
      EXPECT_EQ(held.count("model.norm.weight"), r == last ? 1u : 0u);
      for (int s = 0; s < 3; ++s) {
        Tensor lp;
        auto m = tr->forward_backward(batch, {}, &lp);
        ASSERT_TRUE(m) << describe(m.error());
        auto st = tr->clip_grad_and_step();
        ASSERT_TRUE(st) << describe(st.error());
        EXPECT_NEAR(m->at("loss"), losses[s], 1e-12 * losses[s]) << "step " << s << " on stage " << r;
        EXPECT_EQ(m->at("loss_count"), counts[s]) << "every stage answers the last one's count";
        EXPECT_NEAR(st->at("grad_norm"), norms[s], 1e-12 * norms[s]) << "step " << s;
        EXPECT_TRUE(near(to_torch(lp), logps[static_cast<size_t>(s)], 1e-12)) << "step " << s << " on stage " << r;
      }
      for (const auto& [n, p] : held)
        EXPECT_TRUE(near(p, single->model().impl().params.at(n), 1e-12)) << n << " on stage " << r;
      // forward_only through the stages: the whole model's log-probs on every stage.
      auto whole = single->model().forward(batch.tokens);
      ASSERT_TRUE(whole);
      auto lp = tr->forward_only(batch.tokens);
      ASSERT_TRUE(lp) << describe(lp.error());
      EXPECT_TRUE(near(to_torch(*lp).to(at::kDouble), to_torch(whole->logprobs).to(at::kDouble), 1e-6)) << "stage " << r;
      EXPECT_FALSE(tr->forward_only(batch.tokens, "some-adapter")) << "stages run the full model only";
      // The model alone is one stage: reading it whole, or adapting it, is
      // refused, not wrong; its optimizer state names its stage.
      auto fwd = tr->model().forward(batch.tokens);
      ASSERT_FALSE(fwd);
      EXPECT_NE(describe(fwd.error()).find("pipeline stage"), std::string::npos) << describe(fwd.error());
      auto lora = tr->model().add_adapter("a", {.r = 2, .alpha = 4, .target_modules = {"q_proj"}}, 1);
      ASSERT_FALSE(lora);
      EXPECT_NE(describe(lora.error()).find("pipeline-parallel"), std::string::npos) << describe(lora.error());
      const auto tag = "pp" + std::to_string(r) + "of" + std::to_string(stages) + ".";
      for (const auto& [n, t] : tr->optimizer_state())
        if (n.find("model.") != std::string::npos) EXPECT_NE(n.find(tag), std::string::npos) << n;
    });
  }
}

// Pipeline stages replicated over data parallelism: 4 ranks, 2 stages x 2
// replicas, each replica a half of the batch, against one process on the
// whole batch: the same global gradient norms and weights on every rank,
// within 1e-11 relative in f64 (the gradients add up in another order).
TEST(Pipeline, StagesReplicatedOverDataParallelTrainAsOneProcess) {
  const auto ids = ids_of({{1, 2, 3, 4, 5, 6}, {7, 8, 9, 10, 0, 0}, {31, 30, 4, 4, 2, 1}, {5, 5, 6, 7, 8, 9},
                           {11, 12, 13, 14, 15, 16}, {3, 1, 4, 1, 5, 9}});
  const TrainConfig tc{.optimizer = {.lr = 2e-2, .weight_decay = 0.1, .max_grad_norm = 0.5}};
  auto single = Trainer::create(stage_model(true), tc);
  ASSERT_TRUE(single);
  std::vector<double> norms;
  for (int s = 0; s < 3; ++s) {
    ASSERT_TRUE(single->forward_backward({.tokens = {.input_ids = ids}}, {}));
    auto st = single->clip_grad_and_step();
    ASSERT_TRUE(st);
    norms.push_back(st->at("grad_norm"));
  }
  std::array<std::map<std::string, at::Tensor>, 4> finals;
  // Stages within dp: rank = d * 2 + stage.
  glint::testing::on_grid(2, 2, [&](int rank, ProcessGroup& pp, ProcessGroup& dp) {
    const int d = rank / 2;
    auto mine = tc;
    mine.pp_group = borrowed(pp);
    mine.dp_group = borrowed(dp);
    auto tr = Trainer::create(stage_model(true), mine);
    ASSERT_TRUE(tr) << describe(tr.error());
    for (int s = 0; s < 3; ++s) {
      ASSERT_TRUE(tr->forward_backward({.tokens = {.input_ids = *ids.slice(3 * d, 3 * d + 3)}}, {}));
      auto st = tr->clip_grad_and_step();
      ASSERT_TRUE(st) << describe(st.error());
      EXPECT_NEAR(st->at("grad_norm"), norms[static_cast<size_t>(s)], 1e-11 * norms[static_cast<size_t>(s)]);
    }
    for (auto& [n, p] : tr->model().impl().params) finals[static_cast<size_t>(rank)][n] = p.detach().clone();
  });
  for (size_t r = 0; r < 4; ++r)
    for (auto& [n, p] : finals[r]) EXPECT_TRUE(near(p, single->model().impl().params.at(n), 1e-11)) << n << " on rank " << r;
}

// A loss that fails on the last stage (not finite there) fails the call on
// every stage, and every stage's gradients are as the good call before it
// left them; a batch that differs between the stages is refused by both
// before any pass.
TEST(Pipeline, AFailureOnTheLastStageFailsEveryStage) {
  const auto ids = ids_of({{1, 2, 3, 4}, {5, 6, 7, 8}, {9, 10, 11, 12}});
  on_ranks(2, [&](int r, ProcessGroup& pg) {
    auto tr = Trainer::create(stage_model(false), {.pp_group = borrowed(pg), .micro_batch_rows = 1});
    ASSERT_TRUE(tr) << describe(tr.error());
    ASSERT_TRUE(tr->forward_backward({.tokens = {.input_ids = ids}}, {}));
    std::map<std::string, at::Tensor> before;
    for (const auto& [n, p] : tr->model().impl().params) {
      ASSERT_TRUE(p.grad().defined()) << n;
      before[n] = p.grad().clone();
    }
    at::Tensor kept;
    if (r == 1) {
      c10::NoGradGuard no_grad;
      auto& w = tr->model().impl().params.at("model.norm.weight");
      kept = w.clone();
      w.fill_(std::numeric_limits<double>::quiet_NaN());
    }
    auto m = tr->forward_backward({.tokens = {.input_ids = ids}}, {});
    ASSERT_FALSE(m);
    EXPECT_NE(describe(m.error()).find("not finite"), std::string::npos) << describe(m.error());
    if (r == 0)
      EXPECT_NE(describe(m.error()).find("on the last pipeline stage"), std::string::npos) << describe(m.error());
    for (const auto& [n, p] : tr->model().impl().params)
      EXPECT_TRUE(at::equal(p.grad(), before.at(n))) << n << ": the failed call's gradients were kept";
    if (r == 1) {
      c10::NoGradGuard no_grad;
      tr->model().impl().params.at("model.norm.weight").copy_(kept);
    }
    auto ok = tr->forward_backward({.tokens = {.input_ids = ids}}, {});
    ASSERT_TRUE(ok) << describe(ok.error());
    auto other = r == 0 ? ids : ids_of({{1, 2, 3, 4}, {5, 6, 7, 8}, {9, 10, 11, 13}});
    auto refused = tr->forward_backward({.tokens = {.input_ids = other}}, {});
    ASSERT_FALSE(refused);
    EXPECT_NE(describe(refused.error()).find("pipeline-parallel group were given different batches"), std::string::npos)
        << describe(refused.error());
    auto st = tr->clip_grad_and_step();
    ASSERT_TRUE(st) << describe(st.error());
  });
}

TEST(Pipeline, MoreStagesThanLayersIsRefused) {
  on_ranks(2, [&](int, ProcessGroup& pg) {
    auto lm = CausalLM::init_random(ModelConfig::make(Architecture::qwen3, 32, 16, 24, 1, 4, 2), 1);
    ASSERT_TRUE(lm);
    auto tr = Trainer::create(std::move(*lm), {.pp_group = borrowed(pg)});
    ASSERT_FALSE(tr);
    EXPECT_NE(describe(tr.error()).find("fewer than the 2 pipeline stages"), std::string::npos) << describe(tr.error());
  });
}

// A forward that throws on the first stage (memory running out there) does
// not leave the next stage waiting: the schedule runs to its end with zeros
// in its place, the failing stage answers the error and the other finishes
// (the trainer then has them agree that the call failed).
TEST(Pipeline, AStageThatThrowsStillRunsTheScheduleToItsEnd) {
  const auto toy = Toy::make();
  on_ranks(2, [&](int s, ProcessGroup& pp) {
    auto mine = toy.params();
    PipelineStage st;
    st.dtype = at::kDouble;
    st.activation_shape = [&](int m) { return std::vector<int64_t>{rows(m, 4).second, 8}; };
    st.forward = [&](int m, const at::Tensor& in) {
      auto [b, n] = rows(m, 4);
      if (s == 0 && m == 1) throw std::runtime_error("out of memory (a test's)");
      auto h = s == 0 ? toy.x.narrow(0, b, n) : in;
      for (size_t l = s == 0 ? 0 : 2; l < (s == 0 ? 2u : 3u); ++l) h = Toy::layer(l, mine, h);
      return s == 1 ? (h - toy.y.narrow(0, b, n)).pow(2).sum() / 9 : h;
    };
    const auto start = std::chrono::steady_clock::now();
    auto ok = run_pipeline(pp, 4, st);
    EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10)) << "no stage waited out a timeout";
    if (s == 0) {
      ASSERT_FALSE(ok);
      EXPECT_NE(describe(ok.error()).find("out of memory"), std::string::npos) << describe(ok.error());
      EXPECT_EQ(code_of(ok.error()), errc::resource_exhausted) << describe(ok.error());
    } else {
      EXPECT_TRUE(ok) << describe(ok.error());
    }
  });
}

TEST(Pipeline, NoMicroBatchesIsRefused) {
  on_ranks(2, [&](int, ProcessGroup& pp) {
    auto r = run_pipeline(pp, 0, {});
    ASSERT_FALSE(r);
  });
}

}  // namespace
}  // namespace glint::components
