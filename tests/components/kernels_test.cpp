// The oneDNN products equal ATen's, forward and backward.
#include "components/model/kernels.hpp"

#include <gtest/gtest.h>

#include <cstdlib>
#include <limits>

namespace glint::components {
namespace {

// Runs a test with oneDNN on, whatever this machine's choice is, and puts
// the choice back.
class Kernels : public ::testing::Test {
protected:
  void SetUp() override {
    small_ = onednn_matmul_enabled(1);
    large_ = onednn_matmul_enabled();
    if (!set_onednn_matmul(true)) GTEST_SKIP() << "this LibTorch has no oneDNN";
  }
  void TearDown() override { set_onednn_matmul(small_, large_); }
  bool small_ = false, large_ = false;
};

void expect_close(const at::Tensor& a, const at::Tensor& b, const char* what) {
  EXPECT_TRUE(at::allclose(a, b, 1e-4, 1e-4)) << what << ": max difference " << (a - b).abs().max().item<double>();
}

// Small and large products are chosen apart, and each choice holds.
TEST(KernelsChoice, SmallAndLargeProductsAreChosenApart) {
  const bool small = onednn_matmul_enabled(1), large = onednn_matmul_enabled(kLargeProductRows);
  if (!set_onednn_matmul(false, true)) GTEST_SKIP() << "this LibTorch has no oneDNN";
  EXPECT_FALSE(onednn_matmul_enabled(kLargeProductRows - 1));
  EXPECT_TRUE(onednn_matmul_enabled(kLargeProductRows));
  ASSERT_TRUE(set_onednn_matmul(true, false));
  EXPECT_TRUE(onednn_matmul_enabled(8));
  EXPECT_FALSE(onednn_matmul_enabled(4096));
  set_onednn_matmul(small, large);
}

// Without GLINT_MATMUL the choice is the rule's, never a timing: every run
// on a machine computes the same bits.
TEST(KernelsChoice, TheDefaultIsTheRuleNotATiming) {
  if (const char* env = std::getenv("GLINT_MATMUL"); env && *env) GTEST_SKIP() << "GLINT_MATMUL=" << env;
  for (int64_t rows : {int64_t{1}, int64_t{256}, kLargeProductRows, int64_t{4096}})
    EXPECT_EQ(onednn_matmul_enabled(rows), onednn_by_rule(rows)) << rows << " rows";
  EXPECT_FALSE(onednn_by_rule(1)) << "small products go to ATen on every CPU";
}

TEST_F(Kernels, LinearMatchesATenWithGradients) {
  at::manual_seed(1);
  for (bool bias : {false, true}) {
    auto x = at::randn({3, 70, 48}).requires_grad_(true);
    auto w = at::randn({96, 48}).requires_grad_(true);
    auto b = at::randn({96}).requires_grad_(true);
    auto x2 = x.detach().clone().requires_grad_(true), w2 = w.detach().clone().requires_grad_(true),
         b2 = b.detach().clone().requires_grad_(true);
    auto y = bias ? fast_linear(x, w, b) : fast_linear(x, w);
    auto ref = bias ? at::linear(x2, w2, b2) : at::linear(x2, w2);
    ASSERT_EQ(y.sizes(), ref.sizes());
    expect_close(y, ref, "forward");
    auto g = at::randn(y.sizes());
    (y * g).sum().backward();
    (ref * g).sum().backward();
    expect_close(x.grad(), x2.grad(), "grad x");
    expect_close(w.grad(), w2.grad(), "grad w");
    if (bias) expect_close(b.grad(), b2.grad(), "grad b");
  }
}

TEST_F(Kernels, BatchedProductMatchesATenWithGradients) {
  at::manual_seed(2);
  auto a = at::randn({4, 64, 32}).requires_grad_(true);
  auto b = at::randn({4, 32, 80}).requires_grad_(true);
  auto a2 = a.detach().clone().requires_grad_(true), b2 = b.detach().clone().requires_grad_(true);
  auto y = fast_bmm(a, b.transpose(1, 2).contiguous().transpose(1, 2));  // a non-contiguous operand too
  auto ref = at::matmul(a2, b2);
  expect_close(y, ref, "forward");
  auto g = at::randn(y.sizes());
  (y * g).sum().backward();
  (ref * g).sum().backward();
  expect_close(a.grad(), a2.grad(), "grad a");
  expect_close(b.grad(), b2.grad(), "grad b");
}

// fast_linear_into writes or adds a @ b^T in place, with oneDNN (this
// fixture) and with ATen, and with a transposed operand (a gradient's g^T).
TEST_F(Kernels, ProductIntoAnOutputWritesOrAddsInPlace) {
  at::manual_seed(3);
  auto a = at::randn({300, 64}), b = at::randn({80, 64}), start = at::randn({300, 80});
  for (bool onednn : {true, false}) {
    ASSERT_TRUE(set_onednn_matmul(onednn, onednn) || !onednn);
    SCOPED_TRACE(onednn ? "oneDNN" : "ATen");
    auto out = start.clone();
    const auto* data = out.data_ptr<float>();
    fast_linear_into(out, a, b, /*accumulate=*/true);
    expect_close(out, start + at::mm(a, b.t()), "accumulated");
    EXPECT_EQ(out.data_ptr<float>(), data);
    out.fill_(std::numeric_limits<float>::quiet_NaN());
    fast_linear_into(out, a, b, /*accumulate=*/false);
    expect_close(out, at::mm(a, b.t()), "written over NaN");
    auto t = at::empty({64, 80});
    fast_linear_into(t, a.t(), start.t(), /*accumulate=*/false);  // a^T start, as w's gradient g^T x
    expect_close(t, at::mm(a.t(), start), "transposed operands");
  }
}

TEST_F(Kernels, OtherDtypesFallBackToATen) {
  auto x = at::randn({8, 300}, at::kDouble), w = at::randn({200, 300}, at::kDouble);
  EXPECT_TRUE(at::equal(fast_linear(x, w), at::linear(x, w)));
}

}  // namespace
}  // namespace glint::components
