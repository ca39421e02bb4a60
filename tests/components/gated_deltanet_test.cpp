// The gated delta rule (components/model/gated_deltanet.hpp): the chunked
// form against the token-by-token definition, for chunk sizes that do and do
// not divide T, with a carried state and with packed segments, in f64 and
// f32; its gradients against finite differences.
#include "components/model/gated_deltanet.hpp"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/csrc/autograd/autograd.h>
#include <gtest/gtest.h>

#include <cmath>

namespace glint::components::gdn {
namespace {

double worst(const at::Tensor& a, const at::Tensor& b) { return (a - b).abs().max().item<double>(); }

// Inputs as the layer makes them: q, k l2-normalised (q scaled), beta in
// (0, 1), g <= 0 (some strongly decaying), in `dtype`.
Inputs random_inputs(int64_t B, int64_t T, int64_t H, int64_t dk, int64_t dv, uint64_t seed, at::ScalarType dtype,
                     bool with_state) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  auto o = at::TensorOptions().dtype(at::kDouble);
  auto l2 = [](const at::Tensor& x) { return x / (x.pow(2).sum(-1, true) + 1e-6).sqrt(); };
  Inputs in;
  in.q = l2(at::randn({B, T, H, dk}, gen, o)) / std::sqrt(static_cast<double>(dk));
  in.k = l2(at::randn({B, T, H, dk}, gen, o));
  in.v = at::randn({B, T, H, dv}, gen, o);
  in.beta = at::sigmoid(at::randn({B, T, H}, gen, o));
  in.g = -at::softplus(at::randn({B, T, H}, gen, o)) * at::rand({B, T, H}, gen, o) * 3;
  if (with_state) in.state = at::randn({B, H, dk, dv}, gen, o) * 0.5;
  for (auto* t : {&in.q, &in.k, &in.v, &in.beta, &in.g, &in.state})
    if (t->defined()) *t = t->to(dtype);
  return in;
}

// Chunked equals the recurrence in f64 to 1e-10 (in practice ~1e-14) for T
// = 13 and chunks of 1, 4 (not dividing), 13 (one chunk), 5 and 64 (one
// padded chunk), with and without a carried state; and the final states.
TEST(GatedDeltaRule, ChunkedEqualsTheRecurrenceInDoublePrecision) {
  for (bool with_state : {false, true}) {
    auto in = random_inputs(2, 13, 3, 8, 6, 11, at::kDouble, with_state);
    auto want = recurrent(in);
    ASSERT_EQ(want.o.sizes(), (std::vector<int64_t>{2, 13, 3, 6}));
    for (int64_t chunk : {1, 4, 5, 13, 64}) {
      auto got = chunked(in, {.chunk = chunk});
      EXPECT_LT(worst(got.o, want.o), 1e-10) << "chunk " << chunk << " state " << with_state;
      EXPECT_LT(worst(got.state, want.state), 1e-10) << "chunk " << chunk << " state " << with_state;
    }
  }
}

// Without gradients (a sampler's decode) the recurrence updates its state in
// place with batched products: the same outputs and state, and the caller's
// state is left as it was.
TEST(GatedDeltaRule, TheInPlaceRecurrenceEqualsTheDifferentiableOne) {
  for (bool with_state : {false, true}) {
    auto in = random_inputs(3, 5, 2, 8, 6, 21, at::kDouble, with_state);
    auto want = recurrent(in);
    const auto before = in.state.defined() ? in.state.clone() : at::Tensor{};
    c10::NoGradGuard no_grad;
    auto got = recurrent(in);
    EXPECT_LT(worst(got.o, want.o), 1e-12) << with_state;
    EXPECT_LT(worst(got.state, want.state), 1e-12) << with_state;
    if (with_state) EXPECT_TRUE(at::equal(in.state, before));
  }
}

// In f32 against the f64 recurrence: within 1e-5, as the model's logits need.
TEST(GatedDeltaRule, ChunkedInSinglePrecisionIsWithinOneInAHundredThousand) {
  auto in = random_inputs(1, 70, 2, 16, 16, 5, at::kDouble, true);
  auto want = recurrent(in);
  Inputs f = in;
  for (auto* t : {&f.q, &f.k, &f.v, &f.beta, &f.g, &f.state}) *t = t->to(at::kFloat);
  for (int64_t chunk : {16, 64}) {
    auto got = chunked(f, {.chunk = chunk});
    EXPECT_LT(worst(got.o.to(at::kDouble), want.o), 1e-5) << chunk;
    EXPECT_LT(worst(got.state.to(at::kDouble), want.state), 1e-5) << chunk;
  }
  EXPECT_LT(worst(recurrent(f).o.to(at::kDouble), want.o), 1e-5);
}

// A row packed from three segments (resets at 0, 5 and 9: 9 starts a chunk
// of 3, the others fall inside chunks) equals each segment run alone from a
// zero state (the given state belongs to no segment after the reset at 0);
// the final state is the last segment's.
TEST(GatedDeltaRule, APackedRowEqualsItsSegmentsRunAlone) {
  auto in = random_inputs(1, 12, 2, 4, 3, 3, at::kDouble, true);  // the carried state must not leak in
  in.resets = at::zeros({1, 12}, at::kBool);
  for (int64_t t : {0, 5, 9}) in.resets[0][t] = true;
  const std::vector<std::pair<int64_t, int64_t>> segments{{0, 5}, {5, 4}, {9, 3}};
  for (int64_t chunk : {3, 4, 64}) {
    auto packed = chunked(in, {.chunk = chunk});
    auto reference = recurrent(in);
    EXPECT_LT(worst(packed.o, reference.o), 1e-10) << chunk;
    for (auto [begin, len] : segments) {
      Inputs alone{.q = in.q.narrow(1, begin, len), .k = in.k.narrow(1, begin, len), .v = in.v.narrow(1, begin, len),
                   .g = in.g.narrow(1, begin, len), .beta = in.beta.narrow(1, begin, len)};
      auto want = recurrent(alone);
      EXPECT_LT(worst(packed.o.narrow(1, begin, len), want.o), 1e-10) << "chunk " << chunk << " segment at " << begin;
      EXPECT_LT(worst(reference.o.narrow(1, begin, len), want.o), 1e-10) << "recurrent, segment at " << begin;
      if (begin == 9) {
        EXPECT_LT(worst(packed.state, want.state), 1e-10) << chunk;
      }
    }
  }
}

// Gradients of the chunked form (autograd through its composition) match
// central finite differences in f64, for every input and the state, with a
// chunk size that does not divide T and a reset inside a chunk.
TEST(GatedDeltaRule, ChunkedGradientsMatchFiniteDifferences) {
  auto in = random_inputs(1, 7, 2, 3, 2, 9, at::kDouble, true);
  in.resets = at::zeros({1, 7}, at::kBool);
  in.resets[0][4] = true;
  std::vector<at::Tensor*> leaves{&in.q, &in.k, &in.v, &in.g, &in.beta, &in.state};
  for (auto* t : leaves) *t = t->detach().clone().requires_grad_(true);
  auto weights_o = at::randn({1, 7, 2, 2}, at::kDouble), weights_s = at::randn({1, 2, 3, 2}, at::kDouble);
  auto loss = [&](const Inputs& x) {
    auto out = chunked(x, {.chunk = 3});
    return (out.o * weights_o).sum() + (out.state * weights_s).sum();
  };
  loss(in).backward();
  const double h = 1e-6;
  for (size_t i = 0; i < leaves.size(); ++i) {
    auto& leaf = *leaves[i];
    auto grad = leaf.grad().clone();
    auto flat = leaf.detach().reshape({-1});
    for (int64_t e = 0; e < flat.numel(); e += 1) {
      Inputs plus = in, minus = in;
      auto p = leaf.detach().clone(), m = leaf.detach().clone();
      p.view({-1})[e] += h;
      m.view({-1})[e] -= h;
      *std::vector<at::Tensor*>{&plus.q, &plus.k, &plus.v, &plus.g, &plus.beta, &plus.state}[i] = p;
      *std::vector<at::Tensor*>{&minus.q, &minus.k, &minus.v, &minus.g, &minus.beta, &minus.state}[i] = m;
      c10::NoGradGuard no_grad;
      const double fd = (loss(plus).item<double>() - loss(minus).item<double>()) / (2 * h);
      EXPECT_NEAR(grad.view({-1})[e].item<double>(), fd, 1e-7 * (1 + std::abs(fd))) << "input " << i << " element " << e;
    }
  }
}

// A small mixer (H 6, 2 key heads of 3, 4 value heads of 2, kernel 3), f64.
MixerWeights random_mixer(uint64_t seed) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  auto o = at::TensorOptions().dtype(at::kDouble);
  MixerWeights w{.key_heads = 2, .key_dim = 3, .value_heads = 4, .value_dim = 2, .eps = 1e-6};
  const int64_t H = 6, conv_dim = 2 * 6 + 8;
  w.in_proj_qkv = at::randn({conv_dim, H}, gen, o) * 0.5;
  w.in_proj_z = at::randn({8, H}, gen, o) * 0.5;
  w.in_proj_b = at::randn({4, H}, gen, o) * 0.5;
  w.in_proj_a = at::randn({4, H}, gen, o) * 0.5;
  w.conv1d = at::randn({conv_dim, 1, 3}, gen, o) * 0.5;
  w.A_log = at::randn({4}, gen, o) * 0.3;
  w.dt_bias = at::randn({4}, gen, o) * 0.3;
  w.norm = 1 + at::randn({2}, gen, o) * 0.1;
  w.out_proj = at::randn({H, 8}, gen, o) * 0.5;
  return w;
}

// The mixer written from the equations (model-families.md 3.3), one token
// and one head at a time, on one sequence h [T, H]: the reference the
// composition is checked against.
at::Tensor mixer_by_token(const MixerWeights& w, const at::Tensor& h) {
  const int64_t T = h.size(0), nk = w.key_heads, dk = w.key_dim, nv = w.value_heads, dv = w.value_dim;
  const int64_t K = w.conv1d.size(2), kd = nk * dk;
  auto c = at::matmul(h, w.in_proj_qkv.t());  // [T, conv_dim]
  std::vector<at::Tensor> S(static_cast<size_t>(nv), at::zeros({dk, dv}, at::kDouble));
  std::vector<at::Tensor> out;
  for (int64_t t = 0; t < T; ++t) {
    auto cc = at::zeros({c.size(1)}, at::kDouble);
    for (int64_t j = 0; j < K; ++j)  // tap j reads position t - (K-1) + j
      if (t - (K - 1) + j >= 0) cc = cc + w.conv1d.select(1, 0).select(1, j) * c[t - (K - 1) + j];
    cc = cc * at::sigmoid(cc);
    auto z = at::matmul(w.in_proj_z, h[t]);
    auto b = at::sigmoid(at::matmul(w.in_proj_b, h[t]));
    auto a = at::matmul(w.in_proj_a, h[t]);
    std::vector<at::Tensor> heads;
    for (int64_t j = 0; j < nv; ++j) {
      const int64_t kh = j / (nv / nk);
      auto q = cc.narrow(0, kh * dk, dk), k = cc.narrow(0, kd + kh * dk, dk), v = cc.narrow(0, 2 * kd + j * dv, dv);
      q = q / (q.dot(q) + 1e-6).sqrt() / std::sqrt(static_cast<double>(dk));
      k = k / (k.dot(k) + 1e-6).sqrt();
      auto g = -w.A_log[j].exp() * at::softplus(a[j] + w.dt_bias[j]);
      auto& s = S[static_cast<size_t>(j)];
      s = s * g.exp();
      auto u = b[j] * (v - at::matmul(s.t(), k));
      s = s + at::outer(k, u);
      auto o = at::matmul(s.t(), q);
      auto zj = z.narrow(0, j * dv, dv);
      heads.push_back(w.norm * o / (o.pow(2).mean() + w.eps).sqrt() * zj * at::sigmoid(zj));
    }
    out.push_back(at::matmul(w.out_proj, at::cat(heads)));
  }
  return at::stack(out);
}

// The mixer (chunked with chunks of 4, or token by token) equals the
// per-token reference within 1e-10 in f64 on two sequences of 9.
TEST(GatedDeltaNetMixer, EqualsTheEquationsTokenByToken) {
  auto w = random_mixer(21);
  auto h = at::randn({2, 9, 6}, at::kDouble);
  for (int64_t chunk : {0, 4, 64}) {
    auto [y, st] = mix(w, h, {}, {}, chunk);
    ASSERT_EQ(y.sizes(), h.sizes());
    for (int64_t b = 0; b < 2; ++b) EXPECT_LT(worst(y[b], mixer_by_token(w, h[b])), 1e-10) << "chunk " << chunk;
  }
}

// Run in two calls (5 positions, then 1, then 3), carrying the conv and
// recurrent state, the mixer gives what one call gives: the sampler's
// prefill then decode.
TEST(GatedDeltaNetMixer, CarriedStateContinuesASequence) {
  auto w = random_mixer(4);
  auto h = at::randn({2, 9, 6}, at::kDouble);
  auto [whole, end] = mix(w, h);
  MixerState st;
  std::vector<at::Tensor> parts;
  int64_t at_ = 0;
  for (int64_t len : {5, 1, 3}) {
    auto [y, next] = mix(w, h.narrow(1, at_, len), st, {}, len == 1 ? 0 : 64);
    parts.push_back(y);
    st = next;
    at_ += len;
  }
  EXPECT_LT(worst(at::cat(parts, 1), whole), 1e-10);
  EXPECT_LT(worst(st.recurrent, end.recurrent), 1e-10);
  EXPECT_LT(worst(st.conv, end.conv), 1e-10);
  // A piece shorter than the kernel's window keeps the earlier state's rows
  // (here zeros) in front of its own pre-convolution row.
  auto [y1, s1] = mix(w, h.narrow(1, 0, 1));
  ASSERT_EQ(s1.conv.sizes(), (std::vector<int64_t>{2, 2, 20}));
  EXPECT_EQ(s1.conv.narrow(1, 0, 1).abs().max().item<double>(), 0);
  EXPECT_LT(worst(s1.conv.narrow(1, 1, 1), at::linear(h.narrow(1, 0, 1), w.in_proj_qkv)), 1e-14);
}

// A packed row (segments of 4, 2 and 3) equals its segments run alone: the
// convolution's window and the state reset at each segment start.
TEST(GatedDeltaNetMixer, APackedRowEqualsItsSegmentsRunAlone) {
  auto w = random_mixer(8);
  auto h = at::randn({1, 9, 6}, at::kDouble);
  auto resets = at::zeros({1, 9}, at::kBool);
  for (int64_t t : {0, 4, 6}) resets[0][t] = true;
  for (int64_t chunk : {0, 3, 64}) {
    auto [y, st] = mix(w, h, {}, resets, chunk);
    for (auto [begin, len] : std::vector<std::pair<int64_t, int64_t>>{{0, 4}, {4, 2}, {6, 3}}) {
      auto [alone, s] = mix(w, h.narrow(1, begin, len), {}, {}, chunk);
      EXPECT_LT(worst(y.narrow(1, begin, len), alone), 1e-10) << "chunk " << chunk << " segment at " << begin;
      if (begin == 6) {
        EXPECT_LT(worst(st.recurrent, s.recurrent), 1e-10);
        EXPECT_LT(worst(st.conv, s.conv), 1e-10);
      }
    }
  }
}

// The hand-written backward equals autograd's through the same
// composition within 1e-10 (f64), for every input and the incoming state,
// with chunk sizes that do and do not divide T, packed segments (a reset on
// a chunk boundary and one inside) and an output that is only partly used.
TEST(GatedDeltaRule, TheHandWrittenBackwardEqualsAutograds) {
  for (int64_t chunk : {1, 3, 4, 16}) {
    for (bool packed : {false, true}) {
      auto in = random_inputs(2, 11, 3, 4, 5, 13 + static_cast<uint64_t>(chunk), at::kDouble, true);
      if (packed) {
        in.resets = at::zeros({2, 11}, at::kBool);
        in.resets[0][4] = true;
        in.resets[1][3] = true;
        in.resets[1][8] = true;
      }
      auto wo = at::randn({2, 11, 3, 5}, at::kDouble), ws = at::randn({2, 3, 4, 5}, at::kDouble);
      std::vector<at::Tensor> mine, theirs;
      for (int which = 0; which < 2; ++which) {
        Inputs x = in;
        std::vector<at::Tensor*> leaves{&x.q, &x.k, &x.v, &x.g, &x.beta, &x.state};
        for (auto* t : leaves) *t = t->detach().clone().requires_grad_(true);
        auto out = which == 0 ? chunked(x, {.chunk = chunk}) : chunked_by_autograd(x, {.chunk = chunk});
        ((out.o * wo).narrow(1, 0, 9).sum() + (out.state * ws).sum()).backward();
        for (auto* t : leaves) (which == 0 ? mine : theirs).push_back(t->grad());
        if (which == 1) {
          auto hand = chunked(in, {.chunk = chunk});
          EXPECT_LT(worst(hand.o, out.o.detach()), 1e-12);
          EXPECT_LT(worst(hand.state, out.state.detach()), 1e-12);
        }
      }
      for (size_t i = 0; i < mine.size(); ++i)
        EXPECT_LT(worst(mine[i], theirs[i]), 1e-10) << "input " << i << " chunk " << chunk << " packed " << packed;
    }
  }
}

// The l2 norm of q and k (with the key heads repeated for the value heads)
// and the gates, whose backward passes are written by hand, against their
// ATen compositions differentiated by autograd: values and every gradient
// within 1e-12 in f64.
TEST(GatedDeltaNetMixer, TheL2NormAndTheGatesBackwardsEqualAutograds) {
  auto leaf = [](at::Tensor t) { return t.detach().clone().requires_grad_(true); };
  for (int64_t repeat : {1, 3}) {
    auto x = leaf(at::randn({2, 5, 2, 4}, at::kDouble));
    const double scale = 0.5;
    auto got = l2_norm_heads(x, scale, repeat);
    auto want = (x * (x.pow(2).sum(-1, true) + 1e-6).rsqrt() * scale).repeat_interleave(repeat, 2);
    ASSERT_EQ(got.sizes(), want.sizes());
    EXPECT_LT(worst(got, want), 1e-12);
    auto wy = at::randn(want.sizes(), at::kDouble);
    auto mine = torch::autograd::grad({(got * wy).sum()}, {x});
    auto theirs = torch::autograd::grad({(want * wy).sum()}, {x});
    EXPECT_LT(worst(mine[0], theirs[0]), 1e-12) << "repeat " << repeat;
  }
  auto a = leaf(at::randn({2, 5, 3}, at::kDouble)), b = leaf(at::randn({2, 5, 3}, at::kDouble));
  auto A_log = leaf(at::randn({3}, at::kDouble) * 0.5), dt = leaf(at::randn({3}, at::kDouble) * 0.5);
  auto [g, beta] = gates(a, b, A_log, dt);
  auto want_g = -A_log.exp() * at::softplus(a + dt), want_beta = at::sigmoid(b);
  EXPECT_LT(worst(g, want_g), 1e-12);
  EXPECT_LT(worst(beta, want_beta), 1e-12);
  auto wg = at::randn({2, 5, 3}, at::kDouble), wb = at::randn({2, 5, 3}, at::kDouble);
  auto mine = torch::autograd::grad({(g * wg).sum() + (beta * wb).sum()}, {a, b, A_log, dt});
  auto theirs = torch::autograd::grad({(want_g * wg).sum() + (want_beta * wb).sum()}, {a, b, A_log, dt});
  for (size_t i = 0; i < mine.size(); ++i) EXPECT_LT(worst(mine[i], theirs[i]), 1e-12) << "input " << i;
  // beta alone used (g's gradient undefined in the backward pass).
  auto beta_only = gates(a, b, A_log, dt).second;
  auto db = torch::autograd::grad({(beta_only * wb).sum()}, {b});
  EXPECT_LT(worst(db[0], theirs[1]), 1e-12);
}

// The convolution and the gated norm, whose backward passes are written by
// hand, against the same functions composed of ATen operations here (autograd
// differentiates those): values and every gradient within 1e-12 in f64. The
// convolution with a carried state and with resets (one inside the first
// kernel window).
TEST(GatedDeltaNetMixer, TheConvolutionAndTheGatedNormBackwardsEqualAutograds) {
  const int64_t B = 2, T = 7, C = 5, K = 4;
  auto leaf = [](at::Tensor t) { return t.detach().clone().requires_grad_(true); };
  for (bool packed : {false, true}) {
    auto x = leaf(at::randn({B, T, C}, at::kDouble)), w = leaf(at::randn({C, 1, K}, at::kDouble));
    auto st = leaf(at::randn({B, K - 1, C}, at::kDouble));
    at::Tensor resets;
    if (packed) {
      resets = at::zeros({B, T}, at::kBool);
      resets[0][2] = true;
      resets[1][5] = true;
    }
    auto [y, next] = causal_conv_silu(x, w, st, resets);
    // The composition: each position's window over the state and x, taps
    // before its segment's start left out.
    auto xp = at::cat({st, x}, 1);
    auto seg = packed ? resets.to(at::kLong).cumsum(1) : at::zeros({B, T}, at::kLong);
    auto segp = at::cat({at::zeros({B, K - 1}, at::kLong), seg}, 1);
    std::vector<at::Tensor> rows;
    for (int64_t t = 0; t < T; ++t) {
      auto acc = at::zeros({B, C}, at::kDouble);
      for (int64_t j = 0; j < K; ++j) {  // tap j reads position t - (K-1) + j, at xp row t + j
        auto keep = (segp.select(1, t + j) == seg.select(1, t)).to(at::kDouble).unsqueeze(-1);
        acc = acc + xp.select(1, t + j) * w.select(1, 0).select(1, j) * keep;
      }
      rows.push_back(at::silu(acc));
    }
    auto want = at::stack(rows, 1);
    EXPECT_LT(worst(y, want), 1e-12) << packed;
    auto wy = at::randn({B, T, C}, at::kDouble), wn = at::randn({B, K - 1, C}, at::kDouble);
    auto grads = [&](const at::Tensor& out) {
      auto g = torch::autograd::grad({(out * wy).sum() + (next * wn).sum()}, {x, w, st}, {}, true);
      return g;
    };
    auto mine = grads(y), theirs = grads(want);
    for (size_t i = 0; i < mine.size(); ++i) EXPECT_LT(worst(mine[i], theirs[i]), 1e-12) << "input " << i << " packed " << packed;
  }
  auto o = leaf(at::randn({3, 4, 6}, at::kDouble)), z = leaf(at::randn({3, 4, 6}, at::kDouble)),
       nw = leaf(1 + at::randn({6}, at::kDouble) * 0.1);
  auto got = gated_rms_norm(o, z, nw, 1e-6);
  auto want = nw * o / (o.pow(2).mean(-1, true) + 1e-6).sqrt() * z * at::sigmoid(z);
  EXPECT_LT(worst(got, want), 1e-12);
  auto wg = at::randn({3, 4, 6}, at::kDouble);
  auto mine = torch::autograd::grad({(got * wg).sum()}, {o, z, nw});
  auto theirs = torch::autograd::grad({(want * wg).sum()}, {o, z, nw});
  for (size_t i = 0; i < mine.size(); ++i) EXPECT_LT(worst(mine[i], theirs[i]), 1e-12) << "gated norm input " << i;
}

// The mixer's projections go through the caller's `project` when given
// (the model's LoRA path), each named as PEFT targets it; bad layouts are
// refused before any work, naming the fields.
TEST(GatedDeltaNetMixer, ProjectionsGoThroughTheCallersAndBadLayoutsAreRefused) {
  auto w = random_mixer(2);
  auto h = at::randn({1, 5, 6}, at::kDouble);
  auto [plain, s0] = mix(w, h);
  std::vector<std::string> seen;
  w.project = [&](const char* name, const at::Tensor& weight, const at::Tensor& x) {
    seen.emplace_back(name);
    auto y = at::linear(x, weight);
    return std::string{name} == "out_proj" ? y * 2 : y;
  };
  auto [doubled, s1] = mix(w, h);
  EXPECT_EQ(seen, (std::vector<std::string>{"in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a", "out_proj"}));
  EXPECT_LT(worst(doubled, plain * 2), 1e-12);
  auto refused = [&](MixerWeights bad, const std::string& want) {
    try {
      (void)mix(bad, h);
      ADD_FAILURE() << "ran: " << want;
    } catch (const std::exception& e) {
      EXPECT_NE(std::string{e.what()}.find(want), std::string::npos) << e.what();
    }
  };
  auto odd = random_mixer(2);
  odd.value_heads = 3;  // not a multiple of the 2 key heads
  refused(odd, "linear_num_value_heads (3) must be a multiple of linear_num_key_heads (2)");
  auto no_kernel = random_mixer(2);
  no_kernel.conv1d = at::zeros({20, 1, 0}, at::kDouble);
  refused(no_kernel, "weight [C, 1, K]");
  auto missing = random_mixer(2);
  missing.A_log = at::Tensor{};
  refused(missing, "a linear_attn tensor is missing");
}

// Shapes that do not fit are refused, naming what was expected.
TEST(GatedDeltaRule, MismatchedShapesAreRefused) {
  auto in = random_inputs(1, 4, 2, 3, 2, 1, at::kDouble, false);
  auto bad = in;
  bad.g = bad.g.narrow(1, 0, 3);
  try {
    (void)chunked(bad);
    ADD_FAILURE() << "a g of the wrong length ran";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string{e.what()}.find("g and beta must be [B, T, H] = [1, 4, 2]"), std::string::npos) << e.what();
  }
  EXPECT_THROW((void)chunked(in, {.chunk = 0}), std::exception);
  bad = in;
  bad.state = at::zeros({1, 2, 2, 2}, at::kDouble);
  EXPECT_THROW((void)recurrent(bad), std::exception);
}

}  // namespace
}  // namespace glint::components::gdn
