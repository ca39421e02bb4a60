#include "components/rl/losses.hpp"

#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <vector>

namespace glint::components::rl {
namespace {

constexpr int64_t B = 3, T = 5;
constexpr double nan = std::numeric_limits<double>::quiet_NaN();
constexpr double inf = std::numeric_limits<double>::infinity();

// Row 0 counts three tokens, row 1 one, row 2 all five.
at::Tensor standard_mask() {
  return at::tensor({1, 1, 1, 0, 0, 0, 0, 1, 0, 0, 1, 1, 1, 1, 1}).to(at::kBool).reshape({B, T});
}

struct Case {
  LossInputs in;                // advantages per sequence
  at::Tensor token_advantages;  // [B, T]
};

// Fresh random inputs; tokens outside the mask hold NaN / inf, which the losses must ignore.
Case random_case(uint64_t seed, at::ScalarType dtype, at::Tensor mask = standard_mask()) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  auto o = at::TensorOptions().dtype(at::kDouble);
  auto logps = -(at::rand({B, T}, gen, o) * 3 + 0.05);
  Case c;
  c.in.mask = mask;
  c.in.old_logps = (logps + 0.3 * at::randn({B, T}, gen, o)).masked_fill(mask.logical_not(), -inf).to(dtype);
  c.in.ref_logps = (logps + 0.5 * at::randn({B, T}, gen, o)).to(dtype);
  c.in.entropies = (at::rand({B, T}, gen, o) * 2).masked_fill(mask.logical_not(), nan).to(dtype);
  c.in.advantages = at::randn({B}, gen, o).to(dtype);
  c.token_advantages = at::randn({B, T}, gen, o).masked_fill(mask.logical_not(), nan).to(dtype);
  c.in.logps = logps.masked_fill(mask.logical_not(), nan).to(dtype);
  return c;
}

// -- the slow, obvious reference -------------------------------------------

using Mat = std::vector<std::vector<double>>;

Mat matrix(const at::Tensor& t) {
  auto d = t.detach().to(at::kDouble).contiguous();
  if (d.dim() == 1) d = d.unsqueeze(1).expand({B, T}).contiguous();
  Mat m(B, std::vector<double>(T));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t) m[b][t] = d[b][t].item<double>();
  return m;
}

struct Ref {
  Mat lp, old, ref, ent, adv, mask;
  bool has_ref = false, has_ent = false;
};

Ref reference_inputs(const LossInputs& in) {
  Ref r;
  r.lp = matrix(in.logps);
  r.old = in.old_logps.defined() ? matrix(in.old_logps) : r.lp;
  r.has_ref = in.ref_logps.defined();
  if (r.has_ref) r.ref = matrix(in.ref_logps);
  r.has_ent = in.entropies.defined();
  if (r.has_ent) r.ent = matrix(in.entropies);
  r.adv = matrix(in.advantages);
  r.mask = matrix(in.mask);
  return r;
}

struct RefOut {
  double loss = 0, clip_fraction = 0, ratio_mean = 0, kl = 0, entropy = 0;
};

enum class Kind { grpo, gspo, cispo };

// Per-token losses of each kind, then the reduction `aggregation`.
RefOut reference(const Ref& x, const PolicyOptions& o, Kind kind, const std::string& aggregation) {
  RefOut out;
  double tokens = 0, clipped = 0, ratio_sum = 0, kl_sum = 0, ent_sum = 0;
  Mat loss(B, std::vector<double>(T, 0));
  double seq_ratio_sum = 0;
  int sequences = 0;
  for (int64_t b = 0; b < B; ++b) {
    double n = 0, log_ratio_sum = 0;
    for (int64_t t = 0; t < T; ++t)
      if (x.mask[b][t] != 0) {
        n += 1;
        log_ratio_sum += x.lp[b][t] - x.old[b][t];
      }
    double seq_ratio = n > 0 ? std::exp(std::clamp(log_ratio_sum / n, -o.log_ratio_clamp, o.log_ratio_clamp)) : 1;
    if (n > 0) {
      seq_ratio_sum += seq_ratio;
      ++sequences;
    }
    for (int64_t t = 0; t < T; ++t) {
      if (x.mask[b][t] == 0) continue;
      double a = x.adv[b][t];
      double r = kind == Kind::gspo
                     ? seq_ratio
                     : std::exp(std::clamp(x.lp[b][t] - x.old[b][t], -o.log_ratio_clamp, o.log_ratio_clamp));
      double l;
      if (kind == Kind::cispo) {
        l = -std::min(r, 1 + o.epsilon_high) * a * x.lp[b][t];
        clipped += r > 1 + o.epsilon_high;
      } else {
        double clipped_ratio = std::min(std::max(r, 1 - o.epsilon), 1 + o.epsilon_high);
        l = -std::min(r * a, clipped_ratio * a);
        clipped += (r < 1 - o.epsilon && a < 0) || (r > 1 + o.epsilon_high && a > 0);
      }
      if (x.has_ref) {
        double d = x.ref[b][t] - x.lp[b][t];
        double k3 = std::exp(d) - d - 1;
        kl_sum += k3;
        l += o.beta * k3;
      }
      if (x.has_ent) {
        ent_sum += x.ent[b][t];
        l -= o.entropy_coef * x.ent[b][t];
      }
      loss[b][t] = l;
      tokens += 1;
      ratio_sum += r;
    }
  }
  out.clip_fraction = clipped / tokens;
  out.ratio_mean = kind == Kind::gspo ? seq_ratio_sum / sequences : ratio_sum / tokens;
  out.kl = kl_sum / tokens;
  out.entropy = ent_sum / tokens;
  double total = 0;
  if (aggregation == "seq_mean_token_mean") {
    for (int64_t b = 0; b < B; ++b) {
      double s = 0, n = 0;
      for (int64_t t = 0; t < T; ++t)
        if (x.mask[b][t] != 0) s += loss[b][t], n += 1;
      if (n > 0) total += s / n;
    }
    out.loss = total / sequences;
  } else {
    for (int64_t b = 0; b < B; ++b)
      for (int64_t t = 0; t < T; ++t) total += loss[b][t];
    out.loss = aggregation == "token_mean" ? total / tokens
                                           : total / static_cast<double>(B * (o.max_tokens ? o.max_tokens : T));
  }
  return out;
}

double value(const at::Tensor& t) { return t.detach().to(at::kDouble).item<double>(); }

void expect_matches(const Result<LossOutput>& got, const RefOut& want, bool has_ref, bool has_ent) {
  ASSERT_TRUE(got) << describe(got.error());
  EXPECT_EQ(got->loss.dim(), 0);
  EXPECT_NEAR(value(got->loss), want.loss, 1e-5);
  EXPECT_NEAR(got->metrics.at("clip_fraction"), want.clip_fraction, 1e-6);
  EXPECT_NEAR(got->metrics.at("ratio_mean"), want.ratio_mean, 1e-5);
  if (has_ref) EXPECT_NEAR(got->metrics.at("kl"), want.kl, 1e-5);
  else EXPECT_EQ(got->metrics.count("kl"), 0u);
  if (has_ent) EXPECT_NEAR(got->metrics.at("entropy"), want.entropy, 1e-5);
  else EXPECT_EQ(got->metrics.count("entropy"), 0u);
}

using PolicyLoss = std::function<Result<LossOutput>(const LossInputs&, const PolicyOptions&)>;

// Every combination of dtype, advantage shape and regulariser, on several seeds.
void compare_with_reference(const PolicyLoss& loss, Kind kind, PolicyOptions o, const std::string& aggregation) {
  for (auto dtype : {at::kFloat, at::kDouble})
    for (bool per_token : {false, true})
      for (bool regularised : {false, true})
        for (uint64_t seed : {1, 2, 3}) {
          SCOPED_TRACE(testing::Message() << c10::toString(dtype) << (per_token ? " per-token" : " per-sequence")
                                          << (regularised ? " with KL and entropy" : "") << " seed " << seed);
          auto c = random_case(seed, dtype);
          if (per_token) c.in.advantages = c.token_advantages;
          if (!regularised) c.in.ref_logps = c.in.entropies = at::Tensor{};
          o.beta = regularised ? 0.05 : 0.0;
          o.entropy_coef = regularised ? 0.01 : 0.0;
          auto x = reference_inputs(c.in);
          expect_matches(loss(c.in, o), reference(x, o, kind, aggregation), regularised, regularised);
        }
}

// -- values ------------------------------------------------------------------

TEST(LossCrossEntropy, IsTheMeanNegativeLogProbOfCountedTokens) {
  for (auto dtype : {at::kFloat, at::kDouble}) {
    auto c = random_case(4, dtype);
    auto x = reference_inputs(c.in);
    double sum = 0, n = 0;
    for (int64_t b = 0; b < B; ++b)
      for (int64_t t = 0; t < T; ++t)
        if (x.mask[b][t] != 0) sum -= x.lp[b][t], n += 1;
    auto got = cross_entropy(c.in);
    ASSERT_TRUE(got) << describe(got.error());
    EXPECT_NEAR(value(got->loss), sum / n, 1e-5);
    EXPECT_EQ(got->metrics.at("tokens"), 9);
  }
}

TEST(LossGrpo, MatchesTheScalarReferenceForEveryAggregation) {
  for (std::string aggregation : {"seq_mean_token_mean", "token_mean", "token_sum_norm"}) {
    SCOPED_TRACE(aggregation);
    PolicyOptions o;
    o.aggregation = aggregation;
    compare_with_reference(grpo, Kind::grpo, o, aggregation);
  }
}

TEST(LossGrpo, AsymmetricClipAndTightLogRatioClamp) {
  PolicyOptions o;
  o.epsilon = 0.1;
  o.epsilon_high = 0.28;
  o.log_ratio_clamp = 0.15;
  compare_with_reference(grpo, Kind::grpo, o, "seq_mean_token_mean");
}

TEST(LossGrpo, ClipsSomeTokensButNotAll) {
  auto c = random_case(1, at::kDouble);
  auto got = grpo(c.in, {});
  ASSERT_TRUE(got);
  EXPECT_GT(got->metrics.at("clip_fraction"), 0);
  EXPECT_LT(got->metrics.at("clip_fraction"), 1);
}

TEST(LossGrpo, SkipsSequencesWithoutCountedTokens) {
  auto mask = standard_mask();
  mask[1].fill_(false);
  auto c = random_case(5, at::kDouble, mask);
  PolicyOptions o;
  expect_matches(grpo(c.in, o), reference(reference_inputs(c.in), o, Kind::grpo, "seq_mean_token_mean"), true, true);
}

TEST(LossGrpo, AcceptsAFloatMaskAndNoOldLogps) {
  auto c = random_case(6, at::kFloat);
  auto with_bool = grpo(c.in, {});
  c.in.mask = c.in.mask.to(at::kFloat);
  auto with_float = grpo(c.in, {});
  ASSERT_TRUE(with_bool && with_float);
  EXPECT_EQ(value(with_bool->loss), value(with_float->loss));

  // On-policy: the ratio is 1 and the loss is minus the mean advantage.
  c.in.old_logps = at::Tensor{};
  auto on_policy = grpo(c.in, {});
  ASSERT_TRUE(on_policy);
  EXPECT_EQ(on_policy->metrics.at("ratio_mean"), 1);
  EXPECT_EQ(on_policy->metrics.at("clip_fraction"), 0);
  auto a = c.in.advantages.to(at::kDouble);
  EXPECT_NEAR(value(on_policy->loss), -a.mean().item<double>(), 1e-6);
}

TEST(LossDrGrpo, DividesTheTokenSumByBatchTimesMaxTokens) {
  for (int64_t max_tokens : {0, 8}) {
    SCOPED_TRACE(max_tokens);
    PolicyOptions o;
    o.max_tokens = max_tokens;
    o.aggregation = "ignored by dr_grpo";
    compare_with_reference(dr_grpo, Kind::grpo, o, "token_sum_norm");
  }
}

TEST(LossGspo, MatchesTheScalarReference) {
  PolicyOptions o;
  compare_with_reference(gspo, Kind::gspo, o, "seq_mean_token_mean");
  o.epsilon = 3e-4;
  o.epsilon_high = 4e-4;
  compare_with_reference(gspo, Kind::gspo, o, "seq_mean_token_mean");
}

TEST(LossCispo, MatchesTheScalarReference) {
  PolicyOptions o;
  o.epsilon_high = 0.1;
  compare_with_reference(cispo, Kind::cispo, o, "token_mean");
}

// -- gradients ---------------------------------------------------------------------

// d loss / d logps by autograd, against central differences of the scalar reference in f64.
void expect_gradient_matches_finite_differences(const PolicyLoss& loss, Kind kind, const PolicyOptions& o,
                                                const std::string& aggregation, bool per_token) {
  for (uint64_t seed : {7, 8}) {
    SCOPED_TRACE(testing::Message() << "seed " << seed << (per_token ? " per-token" : " per-sequence"));
    auto c = random_case(seed, at::kDouble);
    if (per_token) c.in.advantages = c.token_advantages;
    c.in.logps = c.in.logps.clone().requires_grad_(true);
    auto got = loss(c.in, o);
    ASSERT_TRUE(got) << describe(got.error());
    got->loss.backward();
    auto grad = c.in.logps.grad();
    ASSERT_TRUE(grad.defined());
    auto x = reference_inputs(c.in);
    constexpr double h = 1e-6;
    for (int64_t b = 0; b < B; ++b)
      for (int64_t t = 0; t < T; ++t) {
        double g = grad[b][t].item<double>();
        if (x.mask[b][t] == 0) {
          EXPECT_EQ(g, 0) << "masked-out token " << b << "," << t;
          continue;
        }
        auto plus = x, minus = x;
        plus.lp[b][t] += h;
        minus.lp[b][t] -= h;
        double up = reference(plus, o, kind, aggregation).loss, down = reference(minus, o, kind, aggregation).loss;
        double fd = (up - down) / (2 * h);
        EXPECT_NEAR(g, fd, 1e-7) << "token " << b << "," << t;
      }
  }
}

TEST(LossGrpo, GradientMatchesFiniteDifferences) {
  PolicyOptions o;
  o.beta = 0.05;
  o.entropy_coef = 0.01;
  for (std::string aggregation : {"seq_mean_token_mean", "token_mean", "token_sum_norm"}) {
    SCOPED_TRACE(aggregation);
    o.aggregation = aggregation;
    for (bool per_token : {false, true})
      expect_gradient_matches_finite_differences(grpo, Kind::grpo, o, aggregation, per_token);
  }
}

TEST(LossGspo, GradientMatchesFiniteDifferencesOfTheSequenceRatio) {
  PolicyOptions o;
  o.beta = 0.05;
  expect_gradient_matches_finite_differences(gspo, Kind::gspo, o, "seq_mean_token_mean", false);
  o.epsilon = 3e-4;
  o.epsilon_high = 4e-4;  // most sequences leave the trust region: many zero surrogate gradients
  expect_gradient_matches_finite_differences(gspo, Kind::gspo, o, "seq_mean_token_mean", false);
}

// With per-token advantages GSPO-token is not the gradient of its own value (the paper's choice):
// token t of sequence i gets -s_i * A_t / (n_i * sequences), or 0 where its clipped term is taken.
TEST(LossGspo, PerTokenAdvantagesFollowTheGspoTokenGradient) {
  for (double eps : {0.2, 3e-4}) {
    SCOPED_TRACE(eps);
    auto c = random_case(15, at::kDouble);
    c.in.advantages = c.token_advantages;
    c.in.logps = c.in.logps.clone().requires_grad_(true);
    PolicyOptions o;
    o.epsilon = o.epsilon_high = eps;
    auto got = gspo(c.in, o);
    ASSERT_TRUE(got) << describe(got.error());
    got->loss.backward();
    auto x = reference_inputs(c.in);
    for (int64_t b = 0; b < B; ++b) {
      double n = 0, sum = 0;
      for (int64_t t = 0; t < T; ++t)
        if (x.mask[b][t] != 0) n += 1, sum += x.lp[b][t] - x.old[b][t];
      double s = std::exp(sum / n);
      for (int64_t t = 0; t < T; ++t) {
        double a = x.adv[b][t], want = 0;
        bool clipped = (s < 1 - eps && a < 0) || (s > 1 + eps && a > 0);
        if (x.mask[b][t] != 0 && !clipped) want = -s * a / (n * B);
        EXPECT_NEAR(c.in.logps.grad()[b][t].item<double>(), want, 1e-12) << b << "," << t;
      }
    }
  }
}

TEST(LossCispo, GradientIsTheCappedWeightTimesAdvantage) {
  auto c = random_case(9, at::kDouble);
  c.in.logps = c.in.logps.clone().requires_grad_(true);
  PolicyOptions o;
  o.epsilon_high = 0.1;
  auto got = cispo(c.in, o);
  ASSERT_TRUE(got);
  got->loss.backward();
  auto x = reference_inputs(c.in);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t) {
      double want = 0;
      if (x.mask[b][t] != 0) want = -std::min(std::exp(x.lp[b][t] - x.old[b][t]), 1.1) * x.adv[b][t] / 9;
      EXPECT_NEAR(c.in.logps.grad()[b][t].item<double>(), want, 1e-12) << b << "," << t;
    }
}

TEST(LossPolicy, GradientsAreFiniteInFloat32WithGarbageOutsideTheMask) {
  std::vector<std::pair<const char*, PolicyLoss>> losses = {
      {"grpo", grpo}, {"dr_grpo", dr_grpo}, {"gspo", gspo}, {"cispo", cispo},
      {"cross_entropy", [](const LossInputs& in, const PolicyOptions&) { return cross_entropy(in); }}};
  for (auto& [name, loss] : losses) {
    SCOPED_TRACE(name);
    auto c = random_case(10, at::kFloat);
    c.in.logps = c.in.logps.clone().requires_grad_(true);
    c.in.entropies = c.in.entropies.clone().requires_grad_(true);
    PolicyOptions o;
    o.beta = 0.05;
    o.entropy_coef = 0.01;
    auto got = loss(c.in, o);
    ASSERT_TRUE(got) << describe(got.error());
    EXPECT_TRUE(std::isfinite(value(got->loss)));
    got->loss.backward();
    auto grad = c.in.logps.grad();
    ASSERT_TRUE(grad.defined());
    EXPECT_TRUE(at::isfinite(grad).all().item<bool>()) << grad;
    EXPECT_TRUE(grad.masked_select(c.in.mask).ne(0).any().item<bool>());
    EXPECT_TRUE(grad.masked_select(c.in.mask.logical_not()).eq(0).all().item<bool>());
    if (std::string{name} != "cross_entropy") {
      // The entropy bonus lowers the loss where entropy rises.
      auto eg = c.in.entropies.grad();
      ASSERT_TRUE(eg.defined());
      EXPECT_TRUE(eg.masked_select(c.in.mask).lt(0).all().item<bool>()) << eg;
    }
  }
}

// -- DPO --------------------------------------------------------------------------

struct Pairs {
  DpoInputs in;
  std::vector<double> chosen, rejected, ref_chosen, ref_rejected;
};

Pairs random_pairs(uint64_t seed, at::ScalarType dtype) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  auto o = at::TensorOptions().dtype(at::kDouble);
  auto draw = [&](at::Tensor& t, std::vector<double>& v) {
    t = (-(at::rand({4}, gen, o) * 40 + 5)).to(dtype);
    // The reference reads the values the loss sees, rounded to dtype.
    for (int64_t i = 0; i < 4; ++i) v.push_back(t[i].item<double>());
  };
  Pairs p;
  draw(p.in.chosen_logps, p.chosen);
  draw(p.in.rejected_logps, p.rejected);
  draw(p.in.ref_chosen_logps, p.ref_chosen);
  draw(p.in.ref_rejected_logps, p.ref_rejected);
  return p;
}

double log_sigmoid(double x) { return x >= 0 ? -std::log1p(std::exp(-x)) : x - std::log1p(std::exp(x)); }

TEST(LossDpo, SigmoidAndIpoMatchTheScalarReference) {
  for (auto dtype : {at::kFloat, at::kDouble})
    for (auto [kind, ls] : {std::pair{"sigmoid", 0.0}, std::pair{"sigmoid", 0.1}, std::pair{"ipo", 0.0}})
      for (uint64_t seed : {1, 2}) {
        SCOPED_TRACE(testing::Message() << c10::toString(dtype) << " " << kind << " ls " << ls << " seed " << seed);
        auto p = random_pairs(seed, dtype);
        DpoOptions o;
        o.kind = kind;
        o.label_smoothing = ls;
        o.beta = 0.2;
        double loss = 0, chosen = 0, rejected = 0, correct = 0;
        for (size_t i = 0; i < 4; ++i) {
          double cr = p.chosen[i] - p.ref_chosen[i], rr = p.rejected[i] - p.ref_rejected[i];
          double logits = o.beta * (cr - rr);
          loss += std::string{kind} == "ipo" ? std::pow(cr - rr - 1 / (2 * o.beta), 2)
                                             : -(1 - ls) * log_sigmoid(logits) - ls * log_sigmoid(-logits);
          chosen += o.beta * cr;
          rejected += o.beta * rr;
          correct += cr > rr;
        }
        auto got = dpo(p.in, o);
        ASSERT_TRUE(got) << describe(got.error());
        EXPECT_NEAR(value(got->loss), loss / 4, 1e-5 * std::max(1.0, loss / 4));
        EXPECT_NEAR(got->metrics.at("reward_chosen"), chosen / 4, 1e-5);
        EXPECT_NEAR(got->metrics.at("reward_rejected"), rejected / 4, 1e-5);
        EXPECT_NEAR(got->metrics.at("reward_margin"), (chosen - rejected) / 4, 1e-5);
        EXPECT_EQ(got->metrics.at("reward_accuracy"), correct / 4);
      }
}

TEST(LossDpo, GradientReachesThePolicyOnly) {
  auto p = random_pairs(3, at::kDouble);
  p.in.chosen_logps.requires_grad_(true);
  p.in.rejected_logps.requires_grad_(true);
  p.in.ref_chosen_logps.requires_grad_(true);
  auto got = dpo(p.in, {});
  ASSERT_TRUE(got);
  got->loss.backward();
  auto gc = p.in.chosen_logps.grad(), gr = p.in.rejected_logps.grad();
  ASSERT_TRUE(gc.defined() && gr.defined());
  EXPECT_FALSE(p.in.ref_chosen_logps.grad().defined());
  // d/dchosen of -logsigmoid(beta * m) / B = -beta * sigmoid(-beta * m) / B; the rejected one is its negative.
  for (int64_t i = 0; i < 4; ++i) {
    double m = (p.chosen[i] - p.ref_chosen[i]) - (p.rejected[i] - p.ref_rejected[i]);
    double want = -0.1 / (1 + std::exp(0.1 * m)) / 4;
    EXPECT_NEAR(gc[i].item<double>(), want, 1e-12);
    EXPECT_NEAR(gr[i].item<double>(), -want, 1e-12);
  }
}

// -- bad input -------------------------------------------------------------------

void expect_invalid(const Result<LossOutput>& r, const std::string& text) {
  ASSERT_FALSE(r) << "expected an error containing: " << text;
  EXPECT_EQ(code_of(r.error()), errc::invalid_argument) << describe(r.error());
  EXPECT_NE(context_of(r.error()).find(text), std::string::npos) << describe(r.error());
}

TEST(LossErrors, ShapeMismatchNamesBothShapes) {
  auto c = random_case(11, at::kFloat);
  auto in = c.in;
  in.old_logps = in.old_logps.narrow(1, 0, 4);
  expect_invalid(grpo(in, {}), "grpo: old_logps is [3, 4] but logps is [3, 5]");
  in = c.in;
  in.mask = in.mask.narrow(0, 0, 2);
  expect_invalid(cross_entropy(in), "cross_entropy: mask is [2, 5] but logps is [3, 5]");
  in = c.in;
  in.advantages = at::zeros({4});
  expect_invalid(gspo(in, {}), "advantages are [4] but must be [B] or [B, T] with logps [3, 5]");
  in = c.in;
  in.logps = in.logps.flatten();
  expect_invalid(cispo(in, {}), "logps must be [B, T], got [15]");

  auto p = random_pairs(1, at::kFloat);
  p.in.ref_rejected_logps = at::zeros({3});
  expect_invalid(dpo(p.in, {}), "ref_rejected_logps is [3] but chosen_logps is [4]");
}

TEST(LossErrors, NonFiniteAdvantageNamesTheRow) {
  auto c = random_case(12, at::kFloat);
  c.in.advantages[1] = nan;
  expect_invalid(grpo(c.in, {}), "advantages[1] is nan");
  c.in.advantages = c.token_advantages.clone();
  c.in.advantages[2][3] = inf;
  expect_invalid(cispo(c.in, {}), "advantages row 2 is inf at token 3");
  // Where the mask is 0 the value does not count (token_advantages hold NaN there).
  c.in.advantages = c.token_advantages;
  EXPECT_TRUE(dr_grpo(c.in, {}));
}

TEST(LossErrors, EmptyOrNonBinaryMask) {
  auto c = random_case(13, at::kFloat);
  c.in.mask = at::zeros({B, T}, at::kFloat);
  expect_invalid(grpo(c.in, {}), "mask [3, 5] selects no token");
  expect_invalid(cross_entropy(c.in), "selects no token");
  c.in.mask[0][0] = 2;
  expect_invalid(gspo(c.in, {}), "holds values other than 0 and 1");
}

TEST(LossErrors, UnknownOrInvalidOptions) {
  auto c = random_case(14, at::kFloat);
  PolicyOptions o;
  o.aggregation = "seq_sum";
  expect_invalid(grpo(c.in, o), "unknown aggregation 'seq_sum'");
  o = {};
  o.epsilon = -0.1;
  expect_invalid(grpo(c.in, o), "epsilon must be finite and >= 0");
  o = {};
  o.max_tokens = -1;
  expect_invalid(dr_grpo(c.in, o), "max_tokens must be >= 0");
  o = {};
  o.beta = 0.1;
  c.in.ref_logps = at::Tensor{};
  expect_invalid(gspo(c.in, o), "beta is 0.1 but ref_logps is missing");
  o = {};
  o.entropy_coef = 0.01;
  c.in.entropies = at::Tensor{};
  expect_invalid(cispo(c.in, o), "entropy_coef is 0.01 but entropies are missing");
  c.in.advantages = at::Tensor{};
  expect_invalid(grpo(c.in, {}), "advantages are missing");

  auto p = random_pairs(2, at::kFloat);
  DpoOptions d;
  d.kind = "hinge";
  expect_invalid(dpo(p.in, d), "unknown kind 'hinge' (sigmoid, ipo)");
  d = {};
  d.beta = 0;
  expect_invalid(dpo(p.in, d), "beta must be finite and > 0, got 0");
  d = {};
  d.label_smoothing = 0.7;
  expect_invalid(dpo(p.in, d), "label_smoothing must be in [0, 0.5], got 0.7");
  d.kind = "ipo";
  d.label_smoothing = 0.1;
  expect_invalid(dpo(p.in, d), "label_smoothing applies to kind 'sigmoid' only");
}

}  // namespace
}  // namespace glint::components::rl
