// The fused kernels of components/kernels against LibTorch's unfused
// composition, forward and gradients, in float64.
#include "components/kernels/fused.hpp"

#include "components/kernels/cpu/common.hpp"

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

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

// The fused outputs: linear_logprob in chunks of `chunk` rows, or with chunk
// -1 logprob over the logits formed first (the model's path when it keeps
// them, or the LM head has an adapter).
LinearLogprob fused_outputs(const at::Tensor& x, const at::Tensor& w, const at::Tensor& targets, int64_t chunk,
                            bool entropies = true) {
  if (chunk < 0) return logprob(at::matmul(x, w.t()), targets, entropies);
  return linear_logprob(x, w, targets, entropies, chunk);
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
      auto out = fused_outputs(x, w, targets, chunk);
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

TEST(FusedLogprob, EqualsTheUnfusedReferenceInFloat64FromLogits) {
  expect_same(at::kDouble, -1, true, true, 1.0, 1e-12);
  expect_same(at::kDouble, -1, true, false, 1.0, 1e-12);
  expect_same(at::kDouble, -1, false, true, 1.0, 1e-12);
  expect_same(at::kDouble, -1, true, true, 30.0, 1e-10);  // logits in the hundreds
}

TEST(FusedLogprob, MaskedOutLogitsOfMinusInfinityAddNothingToTheEntropyOrItsGradient) {
  // A vocabulary mask's -inf logits: p log p -> 0 there, not 0 x -inf = NaN.
  // Against the same rows with those entries left out, for every dtype path.
  const double inf = std::numeric_limits<double>::infinity();
  auto full = at::tensor({0.0, -inf, 1.0, 0.5, -inf, -2.0}, at::kDouble).view({1, 6});
  auto kept = at::tensor({0.0, 1.0, 0.5, -2.0}, at::kDouble).view({1, 4});
  auto targets = at::tensor({2}, at::kLong), kept_targets = at::tensor({1}, at::kLong);
  for (auto dtype : {at::kDouble, at::kFloat, at::kBFloat16}) {
    auto z = full.to(dtype).detach().clone().requires_grad_(true);
    auto zk = kept.to(dtype).detach().clone().requires_grad_(true);
    auto out = logprob(z, targets), ref = logprob(zk, kept_targets);
    (out.logprobs + out.entropies).sum().backward();
    (ref.logprobs + ref.entropies).sum().backward();
    const double tol = dtype == at::kBFloat16 ? 0.03 : 1e-6;
    SCOPED_TRACE(c10::toString(dtype));
    EXPECT_TRUE(std::isfinite(out.entropies.item<double>()));
    EXPECT_NEAR(out.entropies.item<double>(), ref.entropies.item<double>(), tol);
    EXPECT_NEAR(out.logprobs.item<double>(), ref.logprobs.item<double>(), tol);
    auto g = z.grad().to(at::kDouble).view({6}), gk = zk.grad().to(at::kDouble).view({4});
    EXPECT_EQ(g[1].item<double>(), 0.0);
    EXPECT_EQ(g[4].item<double>(), 0.0);
    for (auto [i, k] : {std::pair{0, 0}, {2, 1}, {3, 2}, {5, 3}})
      EXPECT_NEAR(g[i].item<double>(), gk[k].item<double>(), tol) << "logit " << i;
  }
  // And logits with an empty vocabulary and no rows give empty outputs.
  auto none = logprob(at::zeros({0, 0}), at::zeros({0}, at::kLong));
  EXPECT_EQ(none.logprobs.numel(), 0);
}

TEST(FusedLogprob, BFloat16RunsLibTorchsComposition) {
  at::manual_seed(5);
  auto z64 = at::randn({6, 40}, at::kDouble) * 3;
  auto targets = at::randint(0, 40, {6}, at::kLong);
  auto z = z64.to(at::kBFloat16).requires_grad_(true);
  auto out = logprob(z, targets);
  out.logprobs.sum().backward();
  // Against float64 on the same (rounded) logits, within bfloat16's 8 bits.
  auto ref = unfused(z.detach().to(at::kDouble), at::eye(40, at::kDouble), targets);
  EXPECT_EQ(out.logprobs.scalar_type(), at::kBFloat16);
  EXPECT_TRUE(at::allclose(out.logprobs.detach().to(at::kDouble), ref.logprobs, 0.02, 0.05)) << out.logprobs;
  EXPECT_TRUE(at::allclose(out.entropies.detach().to(at::kDouble), ref.entropies, 0.02, 0.05)) << out.entropies;
  ASSERT_TRUE(z.grad().defined());
  // d sum(logp(t)) / dz = onehot(t) - p, whose rows sum to zero.
  EXPECT_LE(z.grad().to(at::kDouble).sum(1).abs().max().item<double>(), 0.05);
}

TEST(FusedLinearLogprob, IsAsAccurateAsTheUnfusedPathInFloat32WithLargeLogits) {
  // Logits in the hundreds: a naive exp would overflow; both sides subtract
  // the logsumexp. Against float64's answer, the fused float32 kernel's error
  // must be within a small factor of LibTorch's unfused float32
  // composition's (x4: on an AVX-512 machine, whose vectorised softmax rounds
  // less, the unfused gradients came out 2.5 to 3 times closer; the entropy
  // written as lse - E[z] was orders of magnitude off).
  at::manual_seed(11);
  auto x64 = at::randn({4, 9, 16}, at::kDouble) * 30, w64 = at::randn({50, 16}, at::kDouble);
  auto targets = at::randint(0, 50, {4, 9}, at::kLong);
  auto a = at::randn({4, 9}, at::kDouble), b = at::randn({4, 9}, at::kDouble);
  auto run = [&](at::ScalarType dtype, bool fused, int64_t chunk = 8) {
    auto x = x64.to(dtype).detach().clone().requires_grad_(true), w = w64.to(dtype).detach().clone().requires_grad_(true);
    auto out = fused ? fused_outputs(x, w, targets, chunk) : LinearLogprob{};
    if (!fused) {
      auto r = unfused(x, w, targets);
      out = {r.logprobs, r.entropies};
    }
    ((a.to(dtype) * out.logprobs).sum() + (b.to(dtype) * out.entropies).sum()).backward();
    return std::vector<at::Tensor>{out.logprobs.detach().to(at::kDouble), out.entropies.detach().to(at::kDouble),
                                   x.grad().to(at::kDouble), w.grad().to(at::kDouble)};
  };
  auto truth = run(at::kDouble, false), plain = run(at::kFloat, false);
  for (int64_t chunk : {8, -1}) {
    auto fused = run(at::kFloat, true, chunk);
    const char* names[] = {"logprobs", "entropies", "grad x", "grad w"};
    for (size_t i = 0; i < 4; ++i) {
      const double ef = (fused[i] - truth[i]).abs().max().item<double>();
      const double ep = (plain[i] - truth[i]).abs().max().item<double>();
      const double size = truth[i].abs().max().item<double>();
      EXPECT_LE(ef, 4 * ep + 1e-6 * size) << names[i] << " (chunk " << chunk << "): fused float32 is off by " << ef
                                          << ", unfused by " << ep;
    }
  }
}

TEST(FusedLinearLogprob, WithoutEntropiesGivesTheSameLogprobsAndGradients) {
  at::manual_seed(3);
  auto x0 = at::randn({2, 9, 16}, at::kDouble), w0 = at::randn({40, 16}, at::kDouble);
  auto targets = at::randint(0, 40, {2, 9}, at::kLong);
  for (int64_t chunk : {4, -1}) {
    auto run = [&](bool with) {
      auto x = x0.clone().requires_grad_(true), w = w0.clone().requires_grad_(true);
      auto out = fused_outputs(x, w, targets, chunk, with);
      EXPECT_EQ(out.entropies.defined(), with);
      (out.logprobs * at::arange(18, at::kDouble).view({2, 9})).sum().backward();
      return std::vector<at::Tensor>{out.logprobs.detach(), x.grad(), w.grad()};
    };
    auto with = run(true), without = run(false);
    for (size_t i = 0; i < 3; ++i) EXPECT_TRUE(at::allclose(with[i], without[i], 0, 1e-13)) << i << " chunk " << chunk;
  }
}

TEST(FusedLinearLogprob, RefusesShapesThatDoNotFit) {
  auto x = at::randn({2, 3, 8}), w = at::randn({10, 8});
  EXPECT_THROW(linear_logprob(x, at::randn({10, 7}), at::zeros({2, 3}, at::kLong)), c10::Error);
  EXPECT_THROW(linear_logprob(x, w, at::zeros({2, 4}, at::kLong)), c10::Error);
  EXPECT_THROW(logprob(at::randn({2, 3, 10}), at::zeros({2, 4}, at::kLong)), c10::Error);
}

TEST(FusedLinearLogprob, RefusesTargetsOutsideTheVocabulary) {
  // The kernels index rows with the targets: one past the end, or negative,
  // must be an error, not a read of another row's memory.
  auto x = at::randn({2, 3, 8}), w = at::randn({10, 8});
  auto past = at::zeros({2, 3}, at::kLong);
  past[1][2] = 10;
  auto negative = at::zeros({2, 3}, at::kLong);
  negative[0][0] = -1;
  for (const auto& t : {past, negative}) {
    EXPECT_THROW(linear_logprob(x, w, t), c10::Error);
    EXPECT_THROW(logprob(at::randn({2, 3, 10}), t), c10::Error);
  }
  try {
    logprob(at::randn({2, 3, 10}), past);
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string{e.what()}.find("targets run from 0 to 10; the vocabulary has 10 entries"), std::string::npos)
        << e.what();
  }
}

// -- RMSNorm, SwiGLU, RoPE, attention -------------------------------------------

// The largest difference between two lists of tensors, entry by entry, with
// the entry's name on failure.
void expect_close(const std::vector<at::Tensor>& got, const std::vector<at::Tensor>& want,
                  const std::vector<std::string>& names, double tol) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_TRUE(got[i].defined()) << names[i] << " is undefined";
    ASSERT_EQ(got[i].sizes(), want[i].sizes()) << names[i];
    const double diff = (got[i].to(at::kDouble) - want[i].to(at::kDouble)).abs().max().item<double>();
    const double size = want[i].abs().max().item<double>();
    EXPECT_LE(diff, tol * std::max(size, 1.0)) << names[i] << " differs by " << diff << " (largest entry " << size
                                                 << ")";
  }
}

// Runs f on fresh leaves cloned from `inputs` (each requiring a gradient when
// `grad` says so), backward through sum(out * weights); the output and each
// input's gradient.
template <typename F>
std::vector<at::Tensor> value_and_grads(const std::vector<at::Tensor>& inputs, const std::vector<bool>& grad,
                                        const at::Tensor& weights, F&& f) {
  std::vector<at::Tensor> leaves;
  for (size_t i = 0; i < inputs.size(); ++i) leaves.push_back(inputs[i].clone().requires_grad_(grad[i]));
  auto out = f(leaves);
  (out * weights).sum().backward();
  std::vector<at::Tensor> r{out.detach()};
  for (size_t i = 0; i < leaves.size(); ++i)
    if (grad[i]) r.push_back(leaves[i].grad());
  return r;
}

at::Tensor rms_reference(const at::Tensor& x, const at::Tensor& w, double eps) {
  return x * at::rsqrt(x.pow(2).mean(-1, true) + eps) * w;
}

TEST(FusedRmsNorm, EqualsTheUnfusedReferenceInFloat64) {
  at::manual_seed(21);
  auto x = at::randn({3, 5, 48}, at::kDouble) * 3, w = at::randn({48}, at::kDouble);
  auto g = at::randn({3, 5, 48}, at::kDouble);
  for (bool weight_grad : {true, false}) {
    auto fused = value_and_grads({x, w}, {true, weight_grad}, g, [](auto& in) { return rms_norm(in[0], in[1], 1e-6); });
    auto ref = value_and_grads({x, w}, {true, weight_grad}, g,
                               [](auto& in) { return rms_reference(in[0], in[1], 1e-6); });
    std::vector<std::string> names{"y", "grad x", "grad weight"};
    names.resize(fused.size());
    expect_close(fused, ref, names, 1e-13);
  }
}

TEST(FusedRmsNorm, Float32IsAsCloseToFloat64AsTheUnfusedPath) {
  at::manual_seed(22);
  auto x = at::randn({64, 96}, at::kDouble) * 50, w = at::randn({96}, at::kDouble);
  auto g = at::randn({64, 96}, at::kDouble);
  auto truth = value_and_grads({x, w}, {true, true}, g, [](auto& in) { return rms_reference(in[0], in[1], 1e-5); });
  auto as32 = [](const at::Tensor& t) { return t.to(at::kFloat); };
  auto fused = value_and_grads({as32(x), as32(w)}, {true, true}, as32(g),
                               [](auto& in) { return rms_norm(in[0], in[1], 1e-5); });
  auto plain = value_and_grads({as32(x), as32(w)}, {true, true}, as32(g),
                               [](auto& in) { return rms_reference(in[0], in[1], 1e-5); });
  for (size_t i = 0; i < truth.size(); ++i) {
    const double ef = (fused[i].to(at::kDouble) - truth[i]).abs().max().item<double>();
    const double ep = (plain[i].to(at::kDouble) - truth[i]).abs().max().item<double>();
    EXPECT_LE(ef, 2 * ep + 1e-7 * truth[i].abs().max().item<double>()) << i << ": fused " << ef << ", unfused " << ep;
  }
}

TEST(FusedSwiglu, EqualsTheUnfusedReferenceInFloat64AndStaysFiniteFarOut) {
  at::manual_seed(23);
  auto gate = at::randn({4, 7, 33}, at::kDouble) * 4, up = at::randn({4, 7, 33}, at::kDouble);
  // Far in both tails: exp(-gate) overflows to inf on the negative side.
  gate[0][0][0] = -800.0;
  gate[0][0][1] = 800.0;
  auto g = at::randn({4, 7, 33}, at::kDouble);
  auto fused = value_and_grads({gate, up}, {true, true}, g, [](auto& in) { return swiglu(in[0], in[1]); });
  auto ref = value_and_grads({gate, up}, {true, true}, g, [](auto& in) { return at::silu(in[0]) * in[1]; });
  expect_close(fused, ref, {"y", "grad gate", "grad up"}, 1e-13);
  for (const auto& t : fused) EXPECT_TRUE(t.isfinite().all().item<bool>());
  // Float32, where exp(800) is inf already at -89.
  auto f32 = value_and_grads({gate.to(at::kFloat), up.to(at::kFloat)}, {true, true}, g.to(at::kFloat),
                             [](auto& in) { return swiglu(in[0], in[1]); });
  expect_close(f32, ref, {"y f32", "grad gate f32", "grad up f32"}, 1e-5);
  for (const auto& t : f32) EXPECT_TRUE(t.isfinite().all().item<bool>());
}

TEST(FusedSwigluLinear, EqualsTheUnfusedReferenceInFloat64WithTheCallersMatmul) {
  at::manual_seed(27);
  auto gate = at::randn({3, 5, 24}, at::kDouble) * 3, up = at::randn({3, 5, 24}, at::kDouble);
  auto w = at::randn({10, 24}, at::kDouble);
  auto g = at::randn({3, 5, 10}, at::kDouble);
  int calls = 0;
  MatmulNT counted = [&](const at::Tensor& a, const at::Tensor& b) {
    ++calls;
    return at::mm(a, b.t());
  };
  for (bool weight_grad : {true, false}) {
    calls = 0;
    auto fused = value_and_grads({gate, up, w}, {true, true, weight_grad}, g,
                                 [&](auto& in) { return swiglu_linear(in[0], in[1], in[2], counted); });
    // Forward, the inputs' gradient, and the weight's when it needs one.
    EXPECT_EQ(calls, weight_grad ? 3 : 2);
    auto ref = value_and_grads({gate, up, w}, {true, true, weight_grad}, g,
                               [](auto& in) { return at::linear(at::silu(in[0]) * in[1], in[2]); });
    std::vector<std::string> names{"y", "grad gate", "grad up", "grad w"};
    names.resize(fused.size());
    expect_close(fused, ref, names, 1e-13);
  }
  // Without a matmul of the caller's, at::mm.
  auto plain = value_and_grads({gate, up, w}, {true, true, true}, g,
                               [](auto& in) { return swiglu_linear(in[0], in[1], in[2]); });
  auto ref = value_and_grads({gate, up, w}, {true, true, true}, g,
                             [](auto& in) { return at::linear(at::silu(in[0]) * in[1], in[2]); });
  expect_close(plain, ref, {"y", "grad gate", "grad up", "grad w"}, 1e-13);
  EXPECT_THROW(swiglu_linear(gate, up, at::randn({10, 23}, at::kDouble)), c10::Error);
}

at::Tensor lora_reference(const std::vector<at::Tensor>& in, double scale) {
  // x, w, a, b[, bias]
  auto base = in.size() > 4 ? at::linear(in[0], in[1], in[4]) : at::linear(in[0], in[1]);
  return base + at::linear(at::linear(in[0], in[2]), in[3]) * scale;
}

TEST(FusedLoraLinear, EqualsTheCompositionInFloat64AtEveryRankAndWithWhatNeedsGradients) {
  at::manual_seed(31);
  // 21 rows (the four-row blocks' tail), 300 columns in and out (past the
  // loops' column chunks); rank 1 in the row loops' run-time form, 4 to 32
  // in their fixed-rank forms, 40 through BLAS.
  for (int64_t r : {1, 4, 8, 16, 32, 40}) {
    for (int64_t in : {24, 300}) {
      const int64_t out = in == 24 ? 10 : 300;
      auto x = at::randn({3, 7, in}, at::kDouble), w = at::randn({out, in}, at::kDouble);
      auto a = at::randn({r, in}, at::kDouble), b = at::randn({out, r}, at::kDouble);
      auto bias = at::randn({out}, at::kDouble), g = at::randn({3, 7, out}, at::kDouble);
      const double scale = 2.0 / static_cast<double>(r);
      int calls = 0, accumulated = 0;
      MatmulIntoNT counted = [&](at::Tensor& out, const at::Tensor& p, const at::Tensor& q, bool accumulate) {
        ++calls;
        accumulated += accumulate ? 1 : 0;
        // What the kernel writes first must be there; otherwise whatever
        // the buffer held must not count.
        if (!accumulate) out.fill_(std::numeric_limits<double>::quiet_NaN());
        out.addmm_(p, q.t(), accumulate ? 1.0 : 0.0, 1.0);
      };
      // LoRA's case (x, a, b: the base frozen), everything, only the adapter.
      for (std::vector<bool> grads : {std::vector<bool>{true, false, true, true, false},
                                      std::vector<bool>{true, true, true, true, true},
                                      std::vector<bool>{false, false, true, true, false}}) {
        for (bool with_bias : {false, true}) {
          std::vector<at::Tensor> inputs{x, w, a, b};
          if (with_bias) inputs.push_back(bias);
          auto wanted = grads;
          wanted.resize(inputs.size());
          calls = accumulated = 0;
          auto fused = value_and_grads(inputs, wanted, g, [&](auto& t) {
            return lora_linear(t[0], t[1], t.size() > 4 ? c10::optional<at::Tensor>{t[4]} : c10::nullopt, t[2], t[3],
                               scale, counted);
          });
          // The base product forward; the input's gradient and w's when asked.
          EXPECT_EQ(calls, 1 + (wanted[0] ? 1 : 0) + (wanted[1] ? 1 : 0)) << "rank " << r;
          // The forward product and the input's gradient add themselves to
          // the adapter's part (and the bias); w's gradient is a product alone.
          EXPECT_EQ(accumulated, 1 + (wanted[0] ? 1 : 0)) << "rank " << r;
          auto ref = value_and_grads(inputs, wanted, g, [&](auto& t) { return lora_reference(t, scale); });
          std::vector<std::string> names{"y"};
          for (auto [i, name] : {std::pair{0, "grad x"}, {1, "grad w"}, {2, "grad a"}, {3, "grad b"}, {4, "grad bias"}})
            if (i < static_cast<int>(wanted.size()) && wanted[i]) names.push_back(name);
          SCOPED_TRACE("rank " + std::to_string(r) + ", in " + std::to_string(in) + (with_bias ? ", bias" : ""));
          expect_close(fused, ref, names, 1e-12);
        }
      }
    }
  }
}

TEST(FusedLoraLinear, AnAdapterInputOfItsOwnTakesTheAdaptersGradient) {
  // LoRA dropout's case: the adapter reads u (x masked), the base x.
  at::manual_seed(33);
  for (int64_t r : {3, 8}) {
    auto x = at::randn({2, 5, 20}, at::kDouble), u = at::randn({2, 5, 20}, at::kDouble);
    auto w = at::randn({12, 20}, at::kDouble), a = at::randn({r, 20}, at::kDouble), b = at::randn({12, r}, at::kDouble);
    auto g = at::randn({2, 5, 12}, at::kDouble);
    const std::vector<bool> grads{true, false, true, true, true};  // x, w, a, b, u
    auto fused = value_and_grads({x, w, a, b, u}, grads, g, [&](auto& t) {
      return lora_linear(t[0], t[1], c10::nullopt, t[2], t[3], 0.5, {}, t[4]);
    });
    auto ref = value_and_grads({x, w, a, b, u}, grads, g, [&](auto& t) {
      return at::linear(t[0], t[1]) + at::linear(at::linear(t[4], t[2]), t[3]) * 0.5;
    });
    SCOPED_TRACE("rank " + std::to_string(r));
    expect_close(fused, ref, {"y", "grad x", "grad a", "grad b", "grad u"}, 1e-12);
  }
  auto x = at::randn({4, 6});
  EXPECT_THROW(lora_linear(x, at::randn({5, 6}), c10::nullopt, at::randn({2, 6}), at::randn({5, 2}), 1.0, {},
                           at::randn({4, 7})),
               c10::Error);
}

TEST(FusedLoraLinear, Float32IsAsCloseToFloat64AsTheComposition) {
  at::manual_seed(32);
  auto x = at::randn({64, 512}), w = at::randn({384, 512}) * 0.05;
  auto a = at::randn({8, 512}) * 0.05, b = at::randn({384, 8}) * 0.05, g = at::randn({64, 384});
  const std::vector<bool> grads{true, false, true, true};
  auto run = [&](at::ScalarType dt, bool fused) {
    std::vector<at::Tensor> in{x.to(dt), w.to(dt), a.to(dt), b.to(dt)};
    return value_and_grads(in, grads, g.to(dt), [&](auto& t) {
      return fused ? lora_linear(t[0], t[1], c10::nullopt, t[2], t[3], 2.0) : lora_reference(t, 2.0);
    });
  };
  auto exact = run(at::kDouble, false), fused = run(at::kFloat, true), unfused = run(at::kFloat, false);
  const std::vector<std::string> names{"y", "grad x", "grad a", "grad b"};
  for (size_t i = 0; i < exact.size(); ++i) {
    const double f = (fused[i].to(at::kDouble) - exact[i]).abs().max().item<double>();
    const double u = (unfused[i].to(at::kDouble) - exact[i]).abs().max().item<double>();
    EXPECT_LE(f, 4 * u + 1e-6) << names[i] << ": fused float32 is " << f << " from float64, the composition " << u;
  }
}

TEST(FusedLoraLinear, RefusesShapesAndDtypesThatDoNotFit) {
  auto x = at::randn({4, 6}), w = at::randn({5, 6}), a = at::randn({2, 6}), b = at::randn({5, 2});
  EXPECT_NO_THROW(lora_linear(x, w, c10::nullopt, a, b, 1.0));
  EXPECT_THROW(lora_linear(x, w, c10::nullopt, at::randn({2, 7}), b, 1.0), c10::Error);  // a's in
  EXPECT_THROW(lora_linear(x, w, c10::nullopt, a, at::randn({5, 3}), 1.0), c10::Error);  // b's rank
  EXPECT_THROW(lora_linear(x, w, c10::nullopt, a, at::randn({4, 2}), 1.0), c10::Error);  // b's out
  EXPECT_THROW(lora_linear(x, w, at::randn({4}), a, b, 1.0), c10::Error);                 // bias
  EXPECT_THROW(lora_linear(x, w, c10::nullopt, a.to(at::kDouble), b, 1.0), c10::Error);   // mixed dtypes
  EXPECT_THROW(lora_linear(x.to(at::kBFloat16), w, c10::nullopt, a, b, 1.0), c10::Error);
  EXPECT_THROW(lora_linear(x, w, c10::nullopt, at::randn({0, 6}), at::randn({5, 0}), 1.0), c10::Error);  // rank 0
}

at::Tensor rotate_half(const at::Tensor& x) {
  auto half = x.size(-1) / 2;
  return at::cat({-x.narrow(-1, half, half), x.narrow(-1, 0, half)}, -1);
}

TEST(FusedRope, EqualsTheUnfusedReferenceInFloat64) {
  at::manual_seed(24);
  // Angles of any kind (the model's have equal halves; the kernel must not
  // rely on it), 3 heads of 10.
  auto x = at::randn({2, 5, 3, 10}, at::kDouble), angles = at::randn({2, 5, 10}, at::kDouble) * 3;
  auto cos = angles.cos(), sin = angles.sin();
  auto g = at::randn({2, 5, 3, 10}, at::kDouble);
  auto fused = value_and_grads({x}, {true}, g, [&](auto& in) { return rope(in[0], cos, sin); });
  auto ref = value_and_grads({x}, {true}, g, [&](auto& in) {
    return in[0] * cos.unsqueeze(-2) + rotate_half(in[0]) * sin.unsqueeze(-2);
  });
  expect_close(fused, ref, {"y", "grad x"}, 1e-14);
}

// Attention the obvious way: every kv head repeated to its query heads, the
// full [B, heads, T, T] scores, masked to -inf, softmax, weighted values.
at::Tensor attention_reference(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& allowed,
                               double scale) {
  const int64_t B = q.size(0), T = q.size(1), H = q.size(2), D = q.size(3), group = H / k.size(2);
  auto qt = q.transpose(1, 2), kt = k.transpose(1, 2).repeat_interleave(group, 1),
       vt = v.transpose(1, 2).repeat_interleave(group, 1);
  auto scores = at::matmul(qt, kt.transpose(-1, -2)) * scale;
  scores = scores.masked_fill(allowed.logical_not().unsqueeze(1), -std::numeric_limits<double>::infinity());
  return at::matmul(at::softmax(scores, -1), vt).transpose(1, 2).reshape({B, T, H * D});
}

// Causal within segments, padding keys masked (a padding query attends to
// itself), and optionally a sliding window of `window` positions.
at::Tensor mask_of(int64_t B, int64_t T, int64_t window) {
  auto seg = at::zeros({B, T}, at::kLong);
  seg[0].narrow(0, T / 3, T - T / 3).fill_(1);  // row 0: two segments
  auto real = at::ones({B, T}, at::kBool);
  if (B > 1) real[1].narrow(0, T - 7, 7).fill_(false);  // row 1: right padding
  auto idx = at::arange(T, at::kLong);
  auto allowed = (idx.unsqueeze(1) >= idx.unsqueeze(0)).unsqueeze(0) &
                 (seg.unsqueeze(2) == seg.unsqueeze(1)) & real.unsqueeze(1);
  if (window > 0) allowed = allowed & (idx.unsqueeze(1) - idx.unsqueeze(0) < window).unsqueeze(0);
  return allowed | at::eye(T, at::kBool).unsqueeze(0);
}

TEST(FusedAttention, EqualsTheUnfusedReferenceInFloat64WithGroupedHeadsSegmentsPaddingAndWindows) {
  at::manual_seed(25);
  // 150 tokens: three query blocks of 64, the last one short. Groups of 2
  // query heads per kv head (stacked into one product) and of 6 (stacked 4,
  // then 2).
  for (auto [H, KV] : {std::pair<int64_t, int64_t>{4, 2}, {12, 2}}) {
    for (int64_t window : {0, 20}) {
      const int64_t B = 2, T = 150, D = 8;
      auto q = at::randn({B, T, H, D}, at::kDouble) * 2, k = at::randn({B, T, KV, D}, at::kDouble) * 2,
           v = at::randn({B, T, KV, D}, at::kDouble);
      auto g = at::randn({B, T, H * D}, at::kDouble);
      SCOPED_TRACE(std::to_string(H) + " heads, " + std::to_string(KV) + " kv heads, window " + std::to_string(window));
      auto allowed = mask_of(B, T, window);
      const double scale = 1 / std::sqrt(double(D));
      auto fused = value_and_grads({q, k, v}, {true, true, true}, g,
                                   [&](auto& in) { return attention(in[0], in[1], in[2], allowed, scale); });
      auto ref = value_and_grads({q, k, v}, {true, true, true}, g,
                                 [&](auto& in) { return attention_reference(in[0], in[1], in[2], allowed, scale); });
      expect_close(fused, ref, {"out", "grad q", "grad k", "grad v"}, 1e-12);
    }
  }
}

TEST(FusedAttention, AnyMaskAndOneHeadPerKvHeadInFloat32) {
  at::manual_seed(26);
  const int64_t B = 1, T = 70, H = 3, D = 16;
  auto allowed = at::rand({B, T, T}) < 0.3;  // no structure: spans are whole rows
  allowed = allowed | at::eye(T, at::kBool).unsqueeze(0);
  auto q = at::randn({B, T, H, D}), k = at::randn({B, T, H, D}), v = at::randn({B, T, H, D});
  auto g = at::randn({B, T, H * D});
  auto fused = value_and_grads({q, k, v}, {true, true, true}, g,
                               [&](auto& in) { return attention(in[0], in[1], in[2], allowed, 0.25); });
  auto ref = value_and_grads({q.to(at::kDouble), k.to(at::kDouble), v.to(at::kDouble)}, {true, true, true},
                             g.to(at::kDouble),
                             [&](auto& in) { return attention_reference(in[0], in[1], in[2], allowed, 0.25); });
  expect_close(fused, ref, {"out", "grad q", "grad k", "grad v"}, 1e-5);
}

TEST(FusedKernels, RefuseWhatTheyCannotCompute) {
  auto x = at::randn({2, 3, 4, 8});
  EXPECT_THROW(rms_norm(x, at::ones({7}), 1e-6), c10::Error);
  EXPECT_THROW(rms_norm(x.to(at::kHalf), at::ones({8}, at::kHalf), 1e-6), c10::Error);
  EXPECT_THROW(swiglu(x, at::randn({2, 3, 4, 7})), c10::Error);
  EXPECT_THROW(rope(x, at::randn({2, 3, 7}), at::randn({2, 3, 7})), c10::Error);
  EXPECT_THROW(rope(at::randn({2, 3, 4, 7}), at::randn({2, 3, 7}), at::randn({2, 3, 7})), c10::Error);  // odd
  auto allowed = at::ones({2, 3, 3}, at::kBool);
  EXPECT_THROW(attention(x, at::randn({2, 3, 3, 8}), at::randn({2, 3, 3, 8}), allowed, 1.0), c10::Error);  // 4 % 3
  EXPECT_THROW(attention(x, x, x, allowed.to(at::kFloat), 1.0), c10::Error);
  auto none = allowed.clone();
  none[1][2].fill_(false);  // a query with no key
  EXPECT_THROW(attention(x, x, x, none, 1.0), c10::Error);
}

TEST(FusedExp, Float32IsWithinTwoUlpOfExpAndKeepsItsSpecialValues) {
  // Every 2^-12 over the whole float range of e^x, the subnormals included.
  double worst = 0;
  float worst_at = 0;
  for (float x = -110.0f; x < 90.0f; x += 1.0f / 4096) {
    const double ref = std::exp(static_cast<double>(x));
    const float want = static_cast<float>(ref), got = cpu::exp_f32(x);
    if (std::isinf(want)) {
      EXPECT_EQ(got, want) << "exp(" << x << ")";
      continue;
    }
    if (want < std::numeric_limits<float>::min()) {
      // Underflow to zero and the subnormals: within one subnormal step.
      EXPECT_LE(std::abs(static_cast<double>(got) - ref), std::numeric_limits<float>::denorm_min())
          << "exp(" << x << ") = " << got << ", not " << want;
      continue;
    }
    const double ulp = std::nextafter(want, std::numeric_limits<float>::infinity()) - want;
    if (const double e = std::abs(static_cast<double>(got) - ref) / ulp; e > worst) {
      worst = e;
      worst_at = x;
    }
  }
  EXPECT_LE(worst, 2.0) << "at x = " << worst_at;
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(cpu::exp_f32(-inf), 0.0f);
  EXPECT_EQ(cpu::exp_f32(inf), inf);
  EXPECT_EQ(cpu::exp_f32(89.0f), inf);
  EXPECT_EQ(cpu::exp_f32(0.0f), 1.0f);
  EXPECT_EQ(cpu::exp_f32(-0.0f), 1.0f);
  EXPECT_TRUE(std::isnan(cpu::exp_f32(std::numeric_limits<float>::quiet_NaN())));
}

// The unfused AdamW step of components/model/optim.cpp, as a reference.
void adamw_composition(at::Tensor& p, const at::Tensor& g, at::Tensor& m, at::Tensor& v, const at::Tensor& mask,
                       const AdamwStep& s) {
  if (mask.defined())
    p.mul_(at::where(mask, at::scalar_tensor(s.decay, p.options()), at::scalar_tensor(1.0, p.options())));
  else
    p.mul_(s.decay);
  m.mul_(s.beta1).add_(g, 1.0 - s.beta1);
  v.mul_(s.beta2).addcmul_(g, g, 1.0 - s.beta2);
  auto denom = (v / s.correction2).sqrt_().add_(s.eps);
  p.addcdiv_(m, denom, -s.lr / s.correction1);
}

// Five steps of each on the same gradients, from the same state.
std::vector<at::Tensor> adamw_run(at::ScalarType dtype, bool fused, bool with_mask, double weight_decay) {
  at::manual_seed(31);
  const int64_t n = 100003;  // several tasks, and a tail that is not a vector's width
  auto p = at::randn({n}, at::kDouble).to(dtype), m = at::zeros_like(p), v = at::zeros_like(p);
  auto mask = with_mask ? at::rand({n}, at::kDouble) < 0.5 : at::Tensor{};
  const double lr = 1e-3, b1 = 0.9, b2 = 0.999;
  for (int step = 1; step <= 5; ++step) {
    auto g = (at::randn({n}, at::kDouble) * std::pow(10.0, step - 3)).to(dtype);
    AdamwStep s{.lr = lr, .beta1 = b1, .beta2 = b2, .eps = 1e-8, .decay = 1.0 - lr * weight_decay,
                .correction1 = 1.0 - std::pow(b1, step), .correction2 = 1.0 - std::pow(b2, step)};
    if (fused) adamw_step(p, g, m, v, mask, s);
    else adamw_composition(p, g, m, v, mask, s);
  }
  return {p, m, v};
}

TEST(FusedAdamw, EqualsTheUnfusedStepInFloat64WithAndWithoutDecayAndMask) {
  for (bool mask : {false, true})
    for (double wd : {0.0, 0.1}) {
      auto f = adamw_run(at::kDouble, true, mask, wd), r = adamw_run(at::kDouble, false, mask, wd);
      const char* names[] = {"p", "m", "v"};
      for (size_t i = 0; i < 3; ++i)
        // Relative: v reaches the hundreds, where FMA moves its last bit.
        EXPECT_LE(((f[i] - r[i]).abs() / r[i].abs().clamp_min(1)).max().item<double>(), 1e-14)
            << names[i] << " (mask " << mask << ", weight decay " << wd << ")";
    }
}

TEST(FusedAdamw, Float32IsAsCloseToFloat64AsTheUnfusedStep) {
  auto ref = adamw_run(at::kDouble, false, true, 0.1);
  auto fused = adamw_run(at::kFloat, true, true, 0.1), unfused = adamw_run(at::kFloat, false, true, 0.1);
  const char* names[] = {"p", "m", "v"};
  for (size_t i = 0; i < 3; ++i) {
    const double f = (fused[i].to(at::kDouble) - ref[i]).abs().max().item<double>();
    const double u = (unfused[i].to(at::kDouble) - ref[i]).abs().max().item<double>();
    EXPECT_LE(f, 2 * u + 1e-12) << names[i] << ": fused " << f << " from float64, unfused " << u;
  }
}

TEST(FusedAdamw, TakesOnlyWhatItCanUpdateInPlace) {
  auto p = at::zeros({4, 6}), g = at::zeros({4, 6}), m = at::zeros({4, 6}), v = at::zeros({4, 6});
  EXPECT_TRUE(adamw_step_fits(p, g, m, v, at::Tensor{}));
  EXPECT_TRUE(adamw_step_fits(p, g, m, v, at::ones({4, 6}, at::kBool)));
  EXPECT_FALSE(adamw_step_fits(p, g.t().contiguous().t(), m, v, at::Tensor{}));  // strided gradient
  EXPECT_FALSE(adamw_step_fits(p, g.to(at::kDouble), m, v, at::Tensor{}));
  EXPECT_FALSE(adamw_step_fits(p, g, m, v.view({6, 4}), at::Tensor{}));
  EXPECT_FALSE(adamw_step_fits(p, g, m, v, at::ones({4, 6})));  // a float mask
  EXPECT_FALSE(adamw_step_fits(p.to(at::kHalf), g.to(at::kHalf), m.to(at::kHalf), v.to(at::kHalf), at::Tensor{}));
  EXPECT_THROW(adamw_step(p, g.t(), m, v, at::Tensor{}, {}), c10::Error);
}

TEST(FusedSumOfSquares, EqualsTheFloat64CompositionForAnyLayout) {
  at::manual_seed(5);
  auto x = at::randn({300, 517}) * 3;
  const double ref = x.to(at::kDouble).pow(2).sum().item<double>();
  EXPECT_NEAR(sum_of_squares(x), ref, 1e-12 * ref);
  EXPECT_NEAR(sum_of_squares(x.t()), ref, 1e-12 * ref);  // not contiguous
  EXPECT_NEAR(sum_of_squares(x.to(at::kDouble)), ref, 1e-12 * ref);
  EXPECT_EQ(sum_of_squares(at::zeros({0})), 0.0);
  EXPECT_THROW(sum_of_squares(at::zeros({3}, at::kInt)), c10::Error);
}

}  // namespace
}  // namespace glint::components::kernels
