// The decoupled PPO objective (rl::decoupled_ppo, issue 17's off-policy
// correction): PPO-clip exactly when the behaviour policy is the proximal
// one, capped tokens without gradient, and value and gradient against a
// scalar float64 reference in both cap modes.
#include "components/rl/losses.hpp"

#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>

#include <algorithm>
#include <cmath>

namespace glint::components::rl {
namespace {

constexpr int64_t B = 3, T = 7;

struct Case {
  at::Tensor logps, prox, behav, adv, mask;
};

// Log-probs whose ratios to the proximal policy fall inside and outside the
// clip range, and behaviour weights on both sides of a cap of 2.
Case random_case(uint64_t seed) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  auto o = at::TensorOptions().dtype(at::kDouble);
  Case c;
  c.prox = -(at::rand({B, T}, gen, o) * 3 + 0.05);
  c.logps = c.prox + 0.5 * (at::rand({B, T}, gen, o) - 0.5);
  c.behav = c.prox - 1.6 * (at::rand({B, T}, gen, o) - 0.3);  // weights exp(prox - behav) in ~[0.6, 3.1]
  c.adv = at::randn({B, T}, gen, o);
  c.mask = at::rand({B, T}, gen, o).gt(0.2);
  c.mask[0][0] = true;
  return c;
}

LossInputs inputs(const Case& c) {
  LossInputs in;
  in.logps = c.logps.clone().requires_grad_(true);
  in.mask = c.mask;
  in.old_logps = c.prox;
  in.behavior_logps = c.behav;
  in.advantages = c.adv;
  return in;
}

TEST(DecoupledPpo, EqualsPpoClipWhenTheBehaviourPolicyIsTheProximalOne) {
  auto c = random_case(1);
  auto in = inputs(c);
  in.behavior_logps = c.prox;
  auto d = decoupled_ppo(in, {.epsilon = 0.2, .epsilon_high = 0.28});
  ASSERT_TRUE(d) << describe(d.error());
  LossInputs plain = in;
  plain.behavior_logps = at::Tensor{};
  auto g = grpo(plain, {.epsilon = 0.2, .epsilon_high = 0.28, .aggregation = "token_mean"});
  ASSERT_TRUE(g) << describe(g.error());
  EXPECT_NEAR(d->loss.item<double>(), g->loss.item<double>(), 1e-14);
  auto gd = torch::autograd::grad({d->loss}, {in.logps}, {}, true)[0];
  auto gg = torch::autograd::grad({g->loss}, {in.logps})[0];
  EXPECT_TRUE(at::allclose(gd, gg, 0, 1e-14));
  EXPECT_EQ(d->metrics.at("capped_fraction"), 0.0);
  EXPECT_NEAR(d->metrics.at("behavior_weight_mean"), 1.0, 1e-14);
}

TEST(DecoupledPpo, ValueAndGradientEqualTheScalarReferenceInBothCapModes) {
  for (const std::string mode : {"mask", "clamp"})
    for (uint64_t seed : {2, 3, 4}) {
      auto c = random_case(seed);
      auto in = inputs(c);
      const double cap = 2.0, lo = 0.8, hi = 1.28;
      auto d = decoupled_ppo(in, {.epsilon = 0.2, .epsilon_high = 0.28, .weight_cap = cap, .cap_mode = mode});
      ASSERT_TRUE(d) << describe(d.error());
      auto grad = torch::autograd::grad({d->loss}, {in.logps})[0];
      double total = 0, count = 0, capped = 0;
      std::vector<std::vector<double>> want(B, std::vector<double>(T, 0.0));
      for (int64_t b = 0; b < B; ++b)
        for (int64_t t = 0; t < T; ++t) {
          if (!c.mask[b][t].item<bool>()) continue;
          ++count;
          const double lp = c.logps[b][t].item<double>(), q = c.prox[b][t].item<double>(),
                       be = c.behav[b][t].item<double>(), a = c.adv[b][t].item<double>();
          double w = std::exp(q - be);
          if (w > cap) {
            ++capped;
            w = mode == "mask" ? 0.0 : cap;
          }
          const double r = std::exp(lp - q), u = r * a, k = std::clamp(r, lo, hi) * a;
          total += -w * std::min(u, k);
          // d/dlogp: the unclipped branch's r * a, the clipped one's only inside the range.
          want[b][t] = u <= k ? -w * r * a : (r > lo && r < hi ? -w * r * a : 0.0);
        }
      ASSERT_GT(capped, 0) << "the case has tokens above the cap";
      EXPECT_NEAR(d->loss.item<double>(), total / count, 1e-12) << mode << " seed " << seed;
      EXPECT_NEAR(d->metrics.at("capped_fraction"), capped / count, 1e-12);
      for (int64_t b = 0; b < B; ++b)
        for (int64_t t = 0; t < T; ++t) {
          EXPECT_NEAR(grad[b][t].item<double>(), want[b][t] / count, 1e-12) << mode << " at " << b << "," << t;
          if (mode == "mask" && c.mask[b][t].item<bool>() &&
              std::exp(c.prox[b][t].item<double>() - c.behav[b][t].item<double>()) > cap)
            EXPECT_EQ(grad[b][t].item<double>(), 0.0) << "a masked token has no gradient";
        }
    }
}

TEST(DecoupledPpo, BadOptionsAndInputsAreRefusedNamingThem) {
  auto c = random_case(5);
  auto in = inputs(c);
  auto refused = [&](const LossInputs& x, const DecoupledOptions& o, const std::string& needle) {
    auto r = decoupled_ppo(x, o);
    ASSERT_FALSE(r) << needle;
    EXPECT_NE(describe(r.error()).find(needle), std::string::npos) << describe(r.error());
  };
  refused(in, {.weight_cap = 1.0}, "weight_cap");
  refused(in, {.cap_mode = "truncate"}, "cap_mode");
  auto no_behav = in;
  no_behav.behavior_logps = at::Tensor{};
  refused(no_behav, {}, "behavior_logps");
  auto no_prox = in;
  no_prox.old_logps = at::Tensor{};
  refused(no_prox, {}, "proximal");
  auto with_ref = in;
  with_ref.ref_logps = c.prox;
  refused(with_ref, {}, "ref_logps");
}

}  // namespace
}  // namespace glint::components::rl
