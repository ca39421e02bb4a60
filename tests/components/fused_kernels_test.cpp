// The fused kernels of components/kernels against LibTorch's unfused
// composition, forward and gradients, in float64.
#include "components/kernels/fused.hpp"

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>

namespace glint::components::kernels {
namespace {

struct Reference {
  at::Tensor logprobs, entropies;
};

Reference unfused(const at::Tensor& x, const at::Tensor& w, const at::Tensor& targets) {
  auto logits = at::matmul(x, w.t());
  auto logp = at::log_softmax(logits, -1);
  return {logp.gather(-1, targets.unsqueeze(-1)).squeeze(-1), -(logp.exp() * logp).sum(-1)};
}

// Values and gradients in x and w of sum(a * logprobs + b * entropies),
// with either term left out (its output then gets no gradient).
void expect_same(at::ScalarType dtype, int64_t chunk, bool use_logprobs, bool use_entropies, double scale,
                 double tol) {
  at::manual_seed(7);
  auto opts = at::TensorOptions().dtype(dtype);
  auto x0 = at::randn({3, 7, 16}, opts) * scale, w0 = at::randn({50, 16}, opts);
  auto targets = at::randint(0, 50, {3, 7}, at::kLong);
  auto a = at::randn({3, 7}, opts), b = at::randn({3, 7}, opts);
  auto run = [&](bool fused) {
    auto x = x0.clone().requires_grad_(true), w = w0.clone().requires_grad_(true);
    at::Tensor lp, ent;
    if (fused) {
      auto out = linear_logprob(x, w, targets, true, chunk);
      lp = out.logprobs;
      ent = out.entropies;
    } else {
      auto out = unfused(x, w, targets);
      lp = out.logprobs;
      ent = out.entropies;
    }
    auto loss = at::zeros({}, opts);
    if (use_logprobs) loss = loss + (a * lp).sum();
    if (use_entropies) loss = loss + (b * ent).sum();
    loss.backward();
    return std::vector<at::Tensor>{lp.detach(), ent.detach(), x.grad(), w.grad()};
  };
  auto f = run(true), r = run(false);
  const char* names[] = {"logprobs", "entropies", "grad x", "grad w"};
  for (size_t i = 0; i < 4; ++i) {
    ASSERT_TRUE(f[i].defined()) << names[i];
    const double diff = (f[i] - r[i]).abs().max().item<double>();
    EXPECT_LE(diff, tol) << names[i] << " differs by " << diff << " (chunk " << chunk << ")";
  }
}

TEST(FusedLinearLogprob, EqualsTheUnfusedReferenceInFloat64ForEveryChunking) {
  for (int64_t chunk : {1, 4, 5, 21, 0})  // 21 rows: one chunk, and chunks that do not divide them
    expect_same(at::kDouble, chunk, true, true, 1.0, 1e-12);
}

TEST(FusedLinearLogprob, GradientsFlowThroughEitherOutputAlone) {
  expect_same(at::kDouble, 4, true, false, 1.0, 1e-12);
  expect_same(at::kDouble, 4, false, true, 1.0, 1e-12);
}

TEST(FusedLinearLogprob, IsAsAccurateAsTheUnfusedPathInFloat32WithLargeLogits) {
  // Logits in the hundreds: a naive exp would overflow; both sides subtract
  // the logsumexp. Against float64's answer, the fused float32 kernel's error
  // must be no larger than LibTorch's unfused float32 composition's (x2).
  at::manual_seed(11);
  auto x64 = at::randn({4, 9, 16}, at::kDouble) * 30, w64 = at::randn({50, 16}, at::kDouble);
  auto targets = at::randint(0, 50, {4, 9}, at::kLong);
  auto a = at::randn({4, 9}, at::kDouble), b = at::randn({4, 9}, at::kDouble);
  auto run = [&](at::ScalarType dtype, bool fused) {
    auto x = x64.to(dtype).detach().clone().requires_grad_(true), w = w64.to(dtype).detach().clone().requires_grad_(true);
    auto out = fused ? linear_logprob(x, w, targets, true, 8) : LinearLogprob{};
    if (!fused) {
      auto r = unfused(x, w, targets);
      out = {r.logprobs, r.entropies};
    }
    ((a.to(dtype) * out.logprobs).sum() + (b.to(dtype) * out.entropies).sum()).backward();
    return std::vector<at::Tensor>{out.logprobs.detach().to(at::kDouble), out.entropies.detach().to(at::kDouble),
                                   x.grad().to(at::kDouble), w.grad().to(at::kDouble)};
  };
  auto truth = run(at::kDouble, false), fused = run(at::kFloat, true), plain = run(at::kFloat, false);
  const char* names[] = {"logprobs", "entropies", "grad x", "grad w"};
  for (size_t i = 0; i < 4; ++i) {
    const double ef = (fused[i] - truth[i]).abs().max().item<double>();
    const double ep = (plain[i] - truth[i]).abs().max().item<double>();
    const double size = truth[i].abs().max().item<double>();
    EXPECT_LE(ef, 2 * ep + 1e-6 * size) << names[i] << ": fused float32 is off by " << ef << ", unfused by " << ep;
  }
}

TEST(FusedLinearLogprob, WithoutEntropiesGivesTheSameLogprobsAndGradients) {
  at::manual_seed(3);
  auto x0 = at::randn({2, 9, 16}, at::kDouble), w0 = at::randn({40, 16}, at::kDouble);
  auto targets = at::randint(0, 40, {2, 9}, at::kLong);
  auto run = [&](bool with) {
    auto x = x0.clone().requires_grad_(true), w = w0.clone().requires_grad_(true);
    auto out = linear_logprob(x, w, targets, with, 4);
    EXPECT_EQ(out.entropies.defined(), with);
    (out.logprobs * at::arange(18, at::kDouble).view({2, 9})).sum().backward();
    return std::vector<at::Tensor>{out.logprobs.detach(), x.grad(), w.grad()};
  };
  auto with = run(true), without = run(false);
  for (size_t i = 0; i < 3; ++i) EXPECT_TRUE(at::allclose(with[i], without[i], 0, 1e-13)) << i;
}

TEST(FusedLinearLogprob, RefusesShapesThatDoNotFit) {
  auto x = at::randn({2, 3, 8}), w = at::randn({10, 8});
  EXPECT_THROW(linear_logprob(x, at::randn({10, 7}), at::zeros({2, 3}, at::kLong)), c10::Error);
  EXPECT_THROW(linear_logprob(x, w, at::zeros({2, 4}, at::kLong)), c10::Error);
}

}  // namespace
}  // namespace glint::components::kernels
