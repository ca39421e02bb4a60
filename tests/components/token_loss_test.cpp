// The token-level losses as Tinker defines them (rl::token_loss and the
// Trainer's reduction sum): each loss's value and gradient against a scalar
// float64 reference written from its formula, and the trainer's contract
// for sums (never divided, split batches add up, data-parallel ranks add up,
// the step's log-probs answered).
#include "components/model/optim_impl.hpp"
#include "components/model/trainer.hpp"
#include "components/model/transformer.hpp"
#include "components/rl/losses.hpp"
#include "components/tensor/torch_bridge.hpp"

#include "support/fake_process_group.hpp"
#include "support/tensors.hpp"

#include <ATen/CPUGeneratorImpl.h>
#include <c10/core/GradMode.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>

#include <algorithm>
#include <cmath>
#include <vector>

namespace glint::components {
namespace {

using glint::testing::ids_of;
using rl::TokenLoss;

constexpr int64_t B = 3, T = 6;

struct Inputs {
  at::Tensor logps, old, adv, weights, mask;
};

// Random inputs in float64; logps and the sampler's differ by up to ~0.6
// so that ratios fall inside and outside [0.8, 1.2].
Inputs random_inputs(uint64_t seed) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  auto o = at::TensorOptions().dtype(at::kDouble);
  Inputs in;
  in.logps = -(at::rand({B, T}, gen, o) * 3 + 0.05);
  in.old = in.logps + 0.6 * (at::rand({B, T}, gen, o) - 0.5);
  in.adv = at::randn({B, T}, gen, o);
  in.weights = at::randn({B, T}, gen, o);  // any sign, as forward_backward_custom sends
  in.mask = at::rand({B, T}, gen, o).gt(0.25);
  in.mask[0][0] = true;
  return in;
}

// The per-token loss and its derivative in logp, from the formulas of
// docs/losses.md ("Token-level losses"), one scalar at a time.
std::pair<double, double> scalar_loss(TokenLoss kind, double lp, double q, double a, double w, double lo, double hi,
                                      double beta) {
  const double r = std::exp(lp - q);
  switch (kind) {
    case TokenLoss::cross_entropy: return {-w * lp, -w};
    case TokenLoss::importance_sampling: return {-r * a, -r * a};
    case TokenLoss::ppo: {
      const double clipped = std::clamp(r, lo, hi);
      const double u = r * a, c = clipped * a;
      if (u <= c) return {-u, -r * a};
      // The clipped term is taken: its gradient is zero outside the bounds.
      return {-c, (r > lo && r < hi) ? -r * a : 0.0};
    }
    case TokenLoss::cispo: {
      const double clipped = std::clamp(r, lo, hi);
      return {-clipped * lp * a, -clipped * a};
    }
    case TokenLoss::dro: return {-(lp * a - 0.5 * beta * (lp - q) * (lp - q)), -a + beta * (lp - q)};
  }
  return {0, 0};
}

class TokenLossFormula : public ::testing::TestWithParam<TokenLoss> {};

TEST_P(TokenLossFormula, ValueAndGradientEqualTheScalarReference) {
  const auto kind = GetParam();
  for (uint64_t seed : {1, 2, 3}) {
    auto in = random_inputs(seed);
    rl::LossInputs li;
    li.logps = in.logps.clone().requires_grad_(true);
    li.mask = in.mask;
    if (kind == TokenLoss::cross_entropy) {
      li.weights = in.weights;
    } else {
      li.old_logps = in.old;
      li.advantages = in.adv;
    }
    rl::TokenLossOptions o{.clip_low = 0.8, .clip_high = 1.2, .beta = 0.05};
    for (bool sum : {true, false}) {
      o.sum = sum;
      auto out = rl::token_loss(kind, li, o);
      ASSERT_TRUE(out) << describe(out.error());
      auto grad = torch::autograd::grad({out->loss}, {li.logps})[0];
      double total = 0, count = 0;
      for (int64_t b = 0; b < B; ++b)
        for (int64_t t = 0; t < T; ++t) {
          if (!in.mask[b][t].item<bool>()) {
            EXPECT_EQ(grad[b][t].item<double>(), 0.0) << "a masked token has no gradient";
            continue;
          }
          ++count;
          total += scalar_loss(kind, in.logps[b][t].item<double>(), in.old[b][t].item<double>(),
                               in.adv[b][t].item<double>(), in.weights[b][t].item<double>(), 0.8, 1.2, 0.05)
                       .first;
        }
      const double divisor = sum ? 1.0 : count;
      EXPECT_NEAR(out->loss.item<double>(), total / divisor, 1e-12) << "seed " << seed << " sum " << sum;
      for (int64_t b = 0; b < B; ++b)
        for (int64_t t = 0; t < T; ++t) {
          if (!in.mask[b][t].item<bool>()) continue;
          auto [v, d] = scalar_loss(kind, in.logps[b][t].item<double>(), in.old[b][t].item<double>(),
                                    in.adv[b][t].item<double>(), in.weights[b][t].item<double>(), 0.8, 1.2, 0.05);
          EXPECT_NEAR(grad[b][t].item<double>(), d / divisor, 1e-12) << "seed " << seed << " at " << b << "," << t;
        }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Tinker, TokenLossFormula,
                         ::testing::Values(TokenLoss::cross_entropy, TokenLoss::importance_sampling, TokenLoss::ppo,
                                           TokenLoss::cispo, TokenLoss::dro));

TEST(TokenLoss, BadInputIsRefusedNamingIt) {
  auto in = random_inputs(7);
  rl::LossInputs li{.logps = in.logps, .mask = in.mask, .advantages = in.adv};
  auto e = rl::token_loss(TokenLoss::ppo, li, {});
  ASSERT_FALSE(e);
  EXPECT_NE(describe(e.error()).find("old_logps"), std::string::npos) << describe(e.error());
  li.old_logps = in.old;
  e = rl::token_loss(TokenLoss::ppo, li, {.clip_low = 1.3, .clip_high = 1.2});
  ASSERT_FALSE(e);
  EXPECT_NE(describe(e.error()).find("clip_low <= clip_high"), std::string::npos);
  e = rl::token_loss(TokenLoss::dro, li, {.beta = -1});
  ASSERT_FALSE(e);
  EXPECT_NE(describe(e.error()).find("beta"), std::string::npos);
  li.weights = in.weights;
  e = rl::token_loss(TokenLoss::importance_sampling, li, {});
  ASSERT_FALSE(e);
  EXPECT_NE(describe(e.error()).find("weights apply to cross_entropy only"), std::string::npos);
  rl::LossInputs ce{.logps = in.logps, .mask = in.mask, .weights = in.weights.clone()};
  ce.weights[0][0] = std::nan("");
  e = rl::token_loss(TokenLoss::cross_entropy, ce, {});
  ASSERT_FALSE(e);
  EXPECT_NE(describe(e.error()).find("NaN"), std::string::npos);
}

// -- the trainer -------------------------------------------------------------

ModelConfig small() { return ModelConfig::make(Architecture::qwen3, 23, 16, 32, 2, 4, 2); }

Tensor f32(const std::vector<std::vector<float>>& rows) {
  std::vector<float> flat;
  for (const auto& r : rows) flat.insert(flat.end(), r.begin(), r.end());
  return *Tensor::from_values(flat, {static_cast<int64_t>(rows.size()), static_cast<int64_t>(rows.front().size())});
}

TrainBatch weighted_batch() {
  return TrainBatch{.tokens = {.input_ids = ids_of({{1, 2, 3, 4, 5, 6}, {6, 5, 4, 3, 2, 1}, {7, 8, 9, 10, 11, 12}})},
                    .loss_weights = f32({{0, 1, 0.5, 1, 1, 0}, {1, -0.5, 1, 0, 2, 0}, {0, 0, 1, 1, 1, 0}})};
}

const LossSpec sum_ce{.kind = LossKind::cross_entropy, .reduction = LossReduction::sum};
const OptimizerConfig sgd{.kind = OptimizerConfig::Kind::sgd, .lr = 0.1, .weight_decay = 0, .max_grad_norm = 0};

std::map<std::string, at::Tensor> params_of(Trainer& t) {
  std::map<std::string, at::Tensor> out;
  for (auto& [n, p] : t.model().impl().params) out[n] = p.detach().clone();
  return out;
}

void expect_same_params(Trainer& a, Trainer& b, double rtol, double atol) {
  auto pa = params_of(a), pb = params_of(b);
  for (auto& [n, p] : pa) EXPECT_TRUE(at::allclose(p, pb.at(n), rtol, atol)) << n;
}

// Reduction sum is never divided: one step of SGD moves the weights by lr
// times the gradient of the plain sum, which equals the mean loss's
// gradient times its token count.
TEST(TinkerTraining, ASumIsNotDividedAtTheStep) {
  TrainBatch ones{.tokens = {.input_ids = ids_of({{1, 2, 3, 4, 5, 6}, {6, 5, 4, 3, 2, 1}})}};
  ones.loss_weights = f32({{1, 1, 1, 1, 1, 0}, {1, 1, 1, 1, 1, 0}});  // the last position has no target
  const double tokens = 10;
  auto summed = *Trainer::create(*CausalLM::init_random(small(), 4), {.optimizer = sgd});
  auto meaned = *Trainer::create(*CausalLM::init_random(small(), 4),
                                 {.optimizer = {.kind = OptimizerConfig::Kind::sgd, .lr = 0.1 * tokens,
                                                .weight_decay = 0, .max_grad_norm = 0}});
  auto s = summed.forward_backward(ones, sum_ce);
  ASSERT_TRUE(s) << describe(s.error());
  TrainBatch plain{.tokens = ones.tokens};
  auto m = meaned.forward_backward(plain, {});
  ASSERT_TRUE(m) << describe(m.error());
  EXPECT_NEAR(s->at("loss"), m->at("loss") * tokens, 1e-4);
  EXPECT_EQ(s->at("loss_sum"), s->at("loss"));
  EXPECT_EQ(s->at("loss_count"), 0);
  ASSERT_TRUE(summed.clip_grad_and_step());
  ASSERT_TRUE(meaned.clip_grad_and_step());
  expect_same_params(summed, meaned, 1e-4, 1e-6);
}

// A batch sent in two calls (as the SDK's chunks) accumulates to the same
// step as one call; so do memory slices of one call.
TEST(TinkerTraining, ChunksAndSlicesAddUpToTheWholeBatch) {
  auto batch = weighted_batch();
  auto whole = *Trainer::create(*CausalLM::init_random(small(), 4), {.optimizer = sgd});
  auto chunks = *Trainer::create(*CausalLM::init_random(small(), 4), {.optimizer = sgd});
  auto sliced = *Trainer::create(*CausalLM::init_random(small(), 4), {.optimizer = sgd, .micro_batch_rows = 1});
  auto w = whole.forward_backward(batch, sum_ce);
  ASSERT_TRUE(w) << describe(w.error());
  double parts = 0;
  for (auto [begin, n] : {std::pair<int64_t, int64_t>{0, 2}, {2, 1}}) {
    TrainBatch part{.tokens = {.input_ids = *batch.tokens.input_ids.slice(begin, begin + n)},
                    .loss_weights = *batch.loss_weights.slice(begin, begin + n)};
    auto r = chunks.forward_backward(part, sum_ce);
    ASSERT_TRUE(r) << describe(r.error());
    parts += r->at("loss");
  }
  auto s = sliced.forward_backward(batch, sum_ce);
  ASSERT_TRUE(s) << describe(s.error());
  EXPECT_NEAR(parts, w->at("loss"), 1e-4);
  EXPECT_NEAR(s->at("loss"), w->at("loss"), 1e-4);
  for (auto* t : {&whole, &chunks, &sliced}) ASSERT_TRUE(t->clip_grad_and_step());
  expect_same_params(whole, chunks, 1e-5, 1e-6);
  expect_same_params(whole, sliced, 1e-5, 1e-6);
}

// The log-probs answered are the targets' under the weights before the
// update (what forward_only answers), in row order, also when sliced.
TEST(TinkerTraining, TheAnsweredLogProbsAreForwardOnlysBeforeTheUpdate) {
  auto batch = weighted_batch();
  for (int64_t rows : {0, 1}) {
    auto tr = *Trainer::create(*CausalLM::init_random(small(), 4), {.optimizer = sgd, .micro_batch_rows = rows});
    auto before = tr.model().forward(batch.tokens, {});
    ASSERT_TRUE(before) << describe(before.error());
    Tensor lp;
    auto m = tr.forward_backward(batch, sum_ce, &lp);
    ASSERT_TRUE(m) << describe(m.error());
    ASSERT_EQ(lp.shape(), (std::vector<int64_t>{B, T}));
    auto want = to_torch(before->logprobs).to(at::kFloat);
    auto got = to_torch(lp);
    // The last position predicts nothing: 0.
    EXPECT_TRUE(at::allclose(got.narrow(1, 0, T - 1), want.narrow(1, 0, T - 1), 1e-5, 1e-6)) << "rows " << rows;
    EXPECT_EQ(got.narrow(1, T - 1, 1).abs().sum().item<double>(), 0.0);
    // And the loss is -sum(w * logp) of them.
    auto w = to_torch(batch.loss_weights).to(at::kDouble);
    EXPECT_NEAR(m->at("loss"), -(w * got.to(at::kDouble)).sum().item<double>(), 1e-4);
  }
}

// With data parallelism the sums of the ranks add up, never divided: a
// rank of a (fake) group of 2 whose peer sent the same batch steps as one
// trainer that saw the batch twice.
TEST(TinkerTraining, DataParallelRanksAddTheirSums) {
  auto batch = weighted_batch();
  TrainBatch twice{.tokens = {.input_ids = *Tensor::concat(std::vector<Tensor>{batch.tokens.input_ids,
                                                                                batch.tokens.input_ids})},
                   .loss_weights = *Tensor::concat(std::vector<Tensor>{batch.loss_weights, batch.loss_weights})};
  auto one = *Trainer::create(*CausalLM::init_random(small(), 4), {.optimizer = sgd});
  ASSERT_TRUE(one.forward_backward(twice, sum_ce));
  ASSERT_TRUE(one.clip_grad_and_step());
  auto pg = std::make_shared<glint::testing::FakeProcessGroup>(0, 2);
  auto rank = *Trainer::create(*CausalLM::init_random(small(), 4), {.optimizer = sgd, .dp_group = pg});
  ASSERT_TRUE(rank.forward_backward(batch, sum_ce));
  auto s = rank.clip_grad_and_step();
  ASSERT_TRUE(s) << describe(s.error());
  expect_same_params(one, rank, 1e-5, 1e-6);
}

TEST(TinkerTraining, ASumAndAMeanNeverShareAStep) {
  auto tr = *Trainer::create(*CausalLM::init_random(small(), 4), {.optimizer = sgd});
  auto batch = weighted_batch();
  ASSERT_TRUE(tr.forward_backward(batch, sum_ce));
  auto e = tr.forward_backward(TrainBatch{.tokens = batch.tokens}, {});
  ASSERT_FALSE(e);
  EXPECT_NE(describe(e.error()).find("reduction sum"), std::string::npos) << describe(e.error());
  ASSERT_TRUE(tr.clip_grad_and_step());
  ASSERT_TRUE(tr.forward_backward(TrainBatch{.tokens = batch.tokens}, {})) << "a new step may";
  // loss_weights are read by cross_entropy with reduction sum only.
  tr.zero_grad();
  e = tr.forward_backward(batch, {});
  ASSERT_FALSE(e);
  EXPECT_NE(describe(e.error()).find("loss_weights"), std::string::npos);
  // Reduction sum is refused for the losses with their own normalisation,
  // and what a kind does not read is refused.
  EXPECT_FALSE((LossSpec{.kind = LossKind::grpo, .reduction = LossReduction::sum}.validate()));
  EXPECT_FALSE((LossSpec{.kind = LossKind::importance_sampling, .epsilon = 0.1}.validate()));
  EXPECT_FALSE((LossSpec{.kind = LossKind::ppo, .reduction = LossReduction::sum, .beta = 0.1}.validate()));
  EXPECT_FALSE((LossSpec{.kind = LossKind::dro, .reduction = LossReduction::sum, .beta = -1}.validate()));
  EXPECT_FALSE((LossSpec{.kind = LossKind::cispo, .reduction = LossReduction::sum, .epsilon = 1.5}.validate()));
  EXPECT_TRUE((LossSpec{.kind = LossKind::cispo, .reduction = LossReduction::sum, .epsilon = 1, .epsilon_high = 3}
                   .validate()));
  EXPECT_FALSE((LossSpec{.kind = LossKind::cispo, .epsilon = 0.5}.validate())) << "glint's cispo has no lower clip";
}

// An RL loss through the trainer equals the formula on the model's own
// log-probs: importance sampling's loss is -sum(exp(lp - q) * A).
TEST(TinkerTraining, APolicyLossThroughTheTrainerEqualsItsFormula) {
  TrainBatch b{.tokens = {.input_ids = ids_of({{1, 2, 3, 4, 5, 6}, {6, 5, 4, 3, 2, 1}})}};
  b.advantages = f32({{0, 1, 1, -1, 0.5, 0}, {1, 1, 0, 0, -2, 0}});
  b.old_logps = f32({{-3, -3.1, -2.9, -3.2, -3, 0}, {-3, -2.8, -3.3, -3, -3.05, 0}});
  for (auto kind : {LossKind::importance_sampling, LossKind::ppo, LossKind::cispo, LossKind::dro}) {
    auto tr = *Trainer::create(*CausalLM::init_random(small(), 4), {.optimizer = sgd});
    LossSpec spec{.kind = kind, .reduction = LossReduction::sum};
    if (kind == LossKind::dro) spec.beta = 0.05;
    Tensor lp;
    auto m = tr.forward_backward(b, spec, &lp);
    ASSERT_TRUE(m) << to_string(kind) << ": " << describe(m.error());
    double want = 0;
    auto l = to_torch(lp).to(at::kDouble), q = to_torch(b.old_logps).to(at::kDouble),
         a = to_torch(b.advantages).to(at::kDouble);
    const TokenLoss tk = kind == LossKind::importance_sampling ? TokenLoss::importance_sampling
                         : kind == LossKind::ppo               ? TokenLoss::ppo
                         : kind == LossKind::cispo             ? TokenLoss::cispo
                                                               : TokenLoss::dro;
    for (int64_t r = 0; r < 2; ++r)
      for (int64_t t = 0; t < T - 1; ++t)
        want += scalar_loss(tk, l[r][t].item<double>(), q[r][t].item<double>(), a[r][t].item<double>(), 0, 0.8,
                            1.2, 0.05)
                    .first;
    EXPECT_NEAR(m->at("loss"), want, 1e-4) << to_string(kind);
  }
}

// set_optimizer with keep_state and the same kind keeps the moments and the
// step count: re-sending the same AdamW settings every step (as Tinker's
// optim_step does) trains as setting them once. Without it, a fresh one.
TEST(TinkerTraining, SetOptimizerWithKeepStateKeepsTheMoments) {
  const OptimizerConfig adam{.lr = 1e-2, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .keep_state = true};
  auto once = *Trainer::create(*CausalLM::init_random(small(), 4), {.optimizer = adam});
  auto each = *Trainer::create(*CausalLM::init_random(small(), 4), {.optimizer = adam});
  auto batch = weighted_batch();
  for (int step = 0; step < 3; ++step) {
    ASSERT_TRUE(each.set_optimizer(adam));
    for (auto* t : {&once, &each}) {
      ASSERT_TRUE(t->forward_backward(batch, sum_ce));
      ASSERT_TRUE(t->clip_grad_and_step());
    }
  }
  EXPECT_EQ(each.step(), 3);
  expect_same_params(once, each, 0, 0);
  ASSERT_TRUE(each.set_optimizer({.kind = OptimizerConfig::Kind::sgd, .keep_state = true}));
  EXPECT_EQ(each.step(), 0) << "another kind starts afresh";
  auto fresh = adam;
  fresh.keep_state = false;
  ASSERT_TRUE(once.set_optimizer(fresh));
  EXPECT_EQ(once.step(), 0) << "without keep_state, a fresh optimizer (Twinkle's set_optimizer)";
}

}  // namespace
}  // namespace glint::components

namespace glint::components {
namespace {

// decoupled_ppo through the trainer: old_logps are the behaviour policy's,
// the proximal policy is the weights at the start of the step (the
// answered log-probs), so the loss is -mean(w * A) over the counted
// tokens with w = exp(prox - behav), masked above the cap.
TEST(AsyncTraining, DecoupledPpoThroughTheTrainerUsesTheStepsWeightsAsProximal) {
  TrainBatch b{.tokens = {.input_ids = ids_of({{1, 2, 3, 4, 5, 6}, {6, 5, 4, 3, 2, 1}})}};
  b.advantages = *Tensor::from_values(std::vector<float>{0.5f, -1.f}, {2});
  b.loss_mask = f32({{0, 1, 1, 1, 1, 0}, {0, 0, 1, 1, 1, 0}});
  for (auto mode : {LossSpec::CapMode::mask, LossSpec::CapMode::clamp}) {
    auto tr = *Trainer::create(*CausalLM::init_random(small(), 4), {.optimizer = sgd});
    // The behaviour log-probs: the trainer's own, moved so that some
    // weights exceed the cap of 2.
    Tensor lp0;
    {
      auto probe = *Trainer::create(*CausalLM::init_random(small(), 4), {.optimizer = sgd});
      ASSERT_TRUE(probe.forward_backward(b, {.kind = LossKind::grpo}, &lp0));
    }
    auto behav = to_torch(lp0).clone();
    behav[0][1] -= 1.5;  // weight e^1.5 = 4.5: above the cap
    behav[1][3] += 0.3;  // weight e^-0.3
    b.old_logps = *from_torch(behav);
    LossSpec spec{.kind = LossKind::decoupled_ppo, .weight_cap = 2, .cap_mode = mode};
    Tensor lp;
    auto m = tr.forward_backward(b, spec, &lp);
    ASSERT_TRUE(m) << describe(m.error());
    auto prox = to_torch(lp).to(at::kDouble), q = behav.to(at::kDouble), mask = to_torch(b.loss_mask).to(at::kDouble);
    double sum = 0, n = 0, capped = 0;
    const double adv[2] = {0.5, -1};
    for (int64_t r = 0; r < 2; ++r)
      for (int64_t t = 0; t < T - 1; ++t) {
        if (mask[r][t].item<double>() == 0) continue;
        double w = std::exp(prox[r][t].item<double>() - q[r][t].item<double>());
        if (w > 2) {
          ++capped;
          w = mode == LossSpec::CapMode::mask ? 0 : 2;
        }
        sum += -w * adv[r];
        ++n;
      }
    EXPECT_NEAR(m->at("loss"), sum / n, 1e-5);
    EXPECT_NEAR(m->at("capped_fraction"), capped / n, 1e-6);  // an f32 mean
    EXPECT_EQ(capped, 1);
    EXPECT_EQ(m->at("loss_count"), n) << "normalised over the original token count";
    // The gradient is the weighted policy gradient -sum(w A grad logp) / N:
    // one SGD step moves the weights as cross_entropy with reduction sum and
    // those weights does (were the proximal log-probs not detached, the
    // gradient would be zero, the value the same).
    auto w = at::exp(prox - q).to(at::kFloat);
    auto keep = mode == LossSpec::CapMode::mask ? w.masked_fill(w > 2, 0) : w.clamp_max(2);
    auto per_row = at::tensor({0.5f, -1.f}).unsqueeze(1);
    TrainBatch ce{.tokens = b.tokens, .loss_mask = b.loss_mask};
    ce.loss_weights = *from_torch((keep * per_row * mask.to(at::kFloat) / n).contiguous());
    auto reference = *Trainer::create(*CausalLM::init_random(small(), 4), {.optimizer = sgd});
    ASSERT_TRUE(reference.forward_backward(ce, sum_ce));
    ASSERT_TRUE(reference.clip_grad_and_step());
    ASSERT_TRUE(tr.clip_grad_and_step());
    expect_same_params(tr, reference, 1e-4, 1e-7);
  }
  // Without the behaviour log-probs, or with columns it does not read: refused.
  auto tr = *Trainer::create(*CausalLM::init_random(small(), 4), {.optimizer = sgd});
  TrainBatch no_behav = b;
  no_behav.old_logps = Tensor{};
  auto e = tr.forward_backward(no_behav, {.kind = LossKind::decoupled_ppo});
  ASSERT_FALSE(e);
  EXPECT_NE(describe(e.error()).find("needs old_logps"), std::string::npos) << describe(e.error());
  TrainBatch with_ref = b;
  with_ref.ref_logps = b.old_logps;
  e = tr.forward_backward(with_ref, {.kind = LossKind::decoupled_ppo});
  ASSERT_FALSE(e);
  EXPECT_NE(describe(e.error()).find("ref_logps"), std::string::npos) << describe(e.error());
  EXPECT_FALSE((LossSpec{.kind = LossKind::decoupled_ppo, .weight_cap = 1}.validate()));
  EXPECT_FALSE((LossSpec{.kind = LossKind::decoupled_ppo, .beta = 0.1}.validate()));
  EXPECT_FALSE((LossSpec{.kind = LossKind::grpo, .weight_cap = 2}.validate())) << "grpo does not read weight_cap";
  EXPECT_FALSE((LossSpec{.kind = LossKind::ppo, .cap_mode = LossSpec::CapMode::clamp}.validate()));
  EXPECT_FALSE((LossSpec{.kind = LossKind::decoupled_ppo, .cap_mode = static_cast<LossSpec::CapMode>(5)}.validate()));
  EXPECT_EQ(*parse_loss_kind("decoupled_ppo"), LossKind::decoupled_ppo);
}

}  // namespace
}  // namespace glint::components
