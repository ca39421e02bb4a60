#include "components/model/gated_deltanet.hpp"

#include "components/comm/process_group_impl.hpp"  // throw_error
#include "components/tensor/torch_bridge.hpp"       // shape_of

#include <torch/csrc/autograd/custom_function.h>

#include <limits>
#include <string>
#include <vector>

namespace glint::components::gdn {

namespace {

[[noreturn]] void refuse(const std::string& why) {
  throw_error(make_error(errc::invalid_argument, "the gated delta rule: " + why));
}

// The shapes checked: (B, T, H, dk, dv).
struct Dims {
  int64_t B, T, H, dk, dv;
};
Dims check(const Inputs& in) {
  for (const auto* t : {&in.q, &in.k, &in.v, &in.g, &in.beta})
    if (!t->defined()) refuse("q, k, v, g and beta are all required");
  if (in.q.dim() != 4 || in.k.sizes() != in.q.sizes() || in.v.dim() != 4)
    refuse("q and k must be [B, T, H, dk] alike and v [B, T, H, dv]; got q " + shape_of(in.q) + ", k " + shape_of(in.k) +
           ", v " + shape_of(in.v));
  const Dims d{in.q.size(0), in.q.size(1), in.q.size(2), in.q.size(3), in.v.size(3)};
  if (in.v.size(0) != d.B || in.v.size(1) != d.T || in.v.size(2) != d.H)
    refuse("v " + shape_of(in.v) + " does not match q " + shape_of(in.q) + " in B, T or H");
  for (const auto* t : {&in.g, &in.beta})
    if (t->dim() != 3 || t->size(0) != d.B || t->size(1) != d.T || t->size(2) != d.H)
      refuse("g and beta must be [B, T, H] = [" + std::to_string(d.B) + ", " + std::to_string(d.T) + ", " +
             std::to_string(d.H) + "]; got g " + shape_of(in.g) + ", beta " + shape_of(in.beta));
  if (in.state.defined() && (in.state.dim() != 4 || in.state.size(0) != d.B || in.state.size(1) != d.H ||
                             in.state.size(2) != d.dk || in.state.size(3) != d.dv))
    refuse("the state must be [B, H, dk, dv] = [" + std::to_string(d.B) + ", " + std::to_string(d.H) + ", " +
           std::to_string(d.dk) + ", " + std::to_string(d.dv) + "]; got " + shape_of(in.state));
  if (in.resets.defined() && (in.resets.dim() != 2 || in.resets.size(0) != d.B || in.resets.size(1) != d.T))
    refuse("resets must be [B, T]; got " + shape_of(in.resets));
  const auto dtype = in.q.scalar_type();
  for (const auto* t : {&in.k, &in.v, &in.g, &in.beta, &in.state})
    if (t->defined() && t->scalar_type() != dtype) refuse("q, k, v, g, beta and the state must share one dtype");
  if (!at::isFloatingType(dtype)) refuse("the inputs must be floating point");
  return d;
}

// Each position's segment: the resets at or before it, counted ([B, T]).
at::Tensor segments_of(const at::Tensor& resets, int64_t B, int64_t T) {
  return resets.defined() ? resets.to(at::kLong).cumsum(1) : at::zeros({B, T}, at::kLong);
}

// silu'(x) = s (1 + x (1 - s)), s = sigmoid(x).
at::Tensor silu_grad(const at::Tensor& x) {
  auto s = at::sigmoid(x);
  return s * (1 + x * (1 - s));
}

at::Tensor initial_state(const Inputs& in, const Dims& d) {
  return in.state.defined() ? in.state : at::zeros({d.B, d.H, d.dk, d.dv}, in.q.options());
}

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// One chunk's quantities (heads first: [B, H, n, .]), recomputed in the
// backward pass from the chunk's inputs and incoming state.
struct Chunk {
  at::Tensor q, k, v, b, G;      // inputs; G the running sum of g
  at::Tensor Ms, Mi;             // e^{G_t - G_s} where allowed: s < t, s <= t (same segment)
  at::Tensor KK, QK, L, U;       // k.k, q.k, I + A, the writes
  at::Tensor eG, w, carried;     // e^G from the state; e^{G_n - G} to the end; e^{G_n} on the state
  at::Tensor KS, QS;             // K S0, Q S0
  at::Tensor o, S_out;
};

struct Masks {
  at::Tensor strict, incl, minus_inf;
};

// `outputs`: o and S_out too (the backward pass recomputes without them).
Chunk run_chunk(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& g,
                const at::Tensor& beta, const at::Tensor& seg, int64_t c, int64_t n, const at::Tensor& S,
                const Masks& m, bool outputs = true) {
  auto exp_where = [&](const at::Tensor& keep, const at::Tensor& x) { return at::where(keep, x, m.minus_inf).exp(); };
  const int64_t B = q.size(0), H = q.size(1);
  Chunk ch;
  ch.q = q.narrow(2, c * n, n);
  ch.k = k.narrow(2, c * n, n);
  ch.v = v.narrow(2, c * n, n);
  ch.b = beta.narrow(2, c * n, n).unsqueeze(-1);  // [B, H, n, 1]
  ch.G = g.narrow(2, c * n, n).cumsum(-1);
  auto sc = seg.narrow(2, c * n, n);  // [B, 1, n]
  auto prev = c == 0 ? at::zeros({B, 1, 1}, at::kLong) : seg.narrow(2, c * n - 1, 1);
  auto same = sc.unsqueeze(-1) == sc.unsqueeze(-2);
  auto diff = ch.G.unsqueeze(-1) - ch.G.unsqueeze(-2);
  ch.Ms = exp_where(m.strict & same, diff);
  ch.Mi = exp_where(m.incl & same, diff);
  auto kT = ch.k.transpose(-1, -2);
  ch.KK = at::matmul(ch.k, kT);
  ch.QK = at::matmul(ch.q, kT);
  ch.L = ch.b * ch.Ms * ch.KK + at::eye(n, q.options());
  ch.eG = exp_where(sc == prev, ch.G).unsqueeze(-1);
  ch.KS = at::matmul(ch.k, S);
  ch.QS = at::matmul(ch.q, S);
  ch.U = at::linalg_solve_triangular(ch.L, ch.b * (ch.v - ch.eG * ch.KS), /*upper=*/false, /*left=*/true,
                                     /*unitriangular=*/true);
  auto last = sc.narrow(2, n - 1, 1);
  auto Gn = ch.G.narrow(2, n - 1, 1);
  ch.w = exp_where(sc == last, Gn - ch.G).unsqueeze(-1);
  ch.carried = exp_where(last == prev, Gn).view({B, H, 1, 1});
  if (!outputs) return ch;
  ch.o = ch.eG * ch.QS + at::matmul(ch.Mi * ch.QK, ch.U);
  ch.S_out = ch.carried * S + at::matmul(kT, ch.w * ch.U);
  return ch;
}

Masks masks_of(int64_t n, const at::TensorOptions& o) {
  auto bools = o.dtype(at::kBool);
  return {at::ones({n, n}, bools).tril(-1), at::ones({n, n}, bools).tril(0),
          at::scalar_tensor(-std::numeric_limits<double>::infinity(), o)};
}

// The chunked rule over padded, heads-first inputs, its backward written by
// hand: the forward keeps the inputs and each chunk's incoming state (C x
// dk x dv per head) and nothing of size n x n; the backward recomputes a
// chunk at a time, last first.
struct ChunkedRule : torch::autograd::Function<ChunkedRule> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                               const at::Tensor& g, const at::Tensor& beta, const at::Tensor& S0,
                               const at::Tensor& seg, int64_t n) {
    const int64_t C = q.size(2) / n;
    const auto m = masks_of(n, q.options());
    auto S = S0;
    std::vector<at::Tensor> starts, outs;
    for (int64_t c = 0; c < C; ++c) {
      starts.push_back(S);
      auto ch = run_chunk(q, k, v, g, beta, seg, c, n, S, m);
      outs.push_back(ch.o);
      S = ch.S_out;
    }
    ctx->save_for_backward({q, k, v, g, beta, seg, C > 0 ? at::stack(starts) : at::Tensor{}});
    ctx->saved_data["n"] = n;
    return {C > 0 ? at::cat(outs, 2) : at::zeros_like(v), S};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const auto &q = saved[0], &k = saved[1], &v = saved[2], &g = saved[3], &beta = saved[4], &seg = saved[5],
               &starts = saved[6];
    const int64_t n = ctx->saved_data["n"].toInt(), C = q.size(2) / n;
    auto dO = grads[0].defined() ? grads[0] : at::zeros_like(v);
    auto dS = grads[1].defined() ? grads[1].clone() : at::zeros({q.size(0), q.size(1), q.size(3), v.size(3)}, q.options());
    auto dq = at::zeros_like(q), dk = at::zeros_like(k), dv = at::zeros_like(v), dg = at::zeros_like(g),
         db = at::zeros_like(beta);
    const auto m = masks_of(n, q.options());
    for (int64_t c = C - 1; c >= 0; --c) {
      const auto& S = starts[c];
      auto ch = run_chunk(q, k, v, g, beta, seg, c, n, S, m, /*outputs=*/false);
      auto dOc = dO.narrow(2, c * n, n);
      auto kT = ch.k.transpose(-1, -2);
      auto P = ch.Mi * ch.QK;
      // The state out: carried S and the writes K^T (w U).
      auto KdS = at::matmul(ch.k, dS);                                          // [n, dv]
      auto dU = at::matmul(P.transpose(-1, -2), dOc) + ch.w * KdS;
      auto dkc = at::matmul(ch.w * ch.U, dS.transpose(-1, -2));
      auto dw = (ch.U * KdS).sum(-1, true);
      auto dcarried = (S * dS).sum({-1, -2}, true);
      auto dS_in = ch.carried * dS + at::matmul(ch.q.transpose(-1, -2), ch.eG * dOc);
      // O = eG QS + P U.
      auto dP = at::matmul(dOc, ch.U.transpose(-1, -2));
      auto dQK = dP * ch.Mi;
      auto dMi = dP * ch.QK;
      auto deG = (dOc * ch.QS).sum(-1, true);
      auto dqc = at::matmul(ch.eG * dOc, S.transpose(-1, -2)) + at::matmul(dQK, ch.k);
      dkc = dkc + at::matmul(dQK.transpose(-1, -2), ch.q);
      // U = L^-1 R, R = b (v - eG KS).
      auto dR = at::linalg_solve_triangular(ch.L.transpose(-1, -2), dU, /*upper=*/true, /*left=*/true,
                                            /*unitriangular=*/true);
      auto dA = -at::matmul(dR, ch.U.transpose(-1, -2));
      auto resid = ch.v - ch.eG * ch.KS;
      auto dbc = (dA * ch.Ms * ch.KK).sum(-1) + (dR * resid).sum(-1);
      auto dMs = dA * ch.b * ch.KK;
      auto dKK = dA * ch.b * ch.Ms;
      auto dKS = -(ch.b * ch.eG) * dR;
      deG = deG - (ch.b * dR * ch.KS).sum(-1, true);
      dkc = dkc + at::matmul(dKS, S.transpose(-1, -2)) + at::matmul(dKK + dKK.transpose(-1, -2), ch.k);
      dS_in = dS_in + at::matmul(kT, dKS);
      // The decays, all functions of G.
      auto dD = dMs * ch.Ms + dMi * ch.Mi;
      auto dG = dD.sum(-1) - dD.sum(-2) + (deG * ch.eG).squeeze(-1) - (dw * ch.w).squeeze(-1);
      auto dGn = (dw * ch.w).sum({-2, -1}) + (dcarried * ch.carried).view({q.size(0), q.size(1)});
      dG.select(2, n - 1).add_(dGn);
      dq.narrow(2, c * n, n).copy_(dqc);
      dk.narrow(2, c * n, n).copy_(dkc);
      dv.narrow(2, c * n, n).copy_(ch.b * dR);
      db.narrow(2, c * n, n).copy_(dbc);
      dg.narrow(2, c * n, n).copy_(dG.flip(-1).cumsum(-1).flip(-1));  // G = cumsum(g)
      dS = dS_in;
    }
    return {dq, dk, dv, dg, db, dS, at::Tensor{}, at::Tensor{}};
  }
};

}  // namespace

namespace {

// The recurrence without gradients (a sampler's decode step): the state
// updated in place with batched matrix products, no [B, H, dk, dv]
// temporaries: S *= e^g; r = S^T k; S += k (beta (v - r))^T; o = S^T q.
Outputs recurrent_in_place(const Inputs& in, const Dims& d) {
  const int64_t BH = d.B * d.H;
  auto S = in.state.defined() ? in.state.clone(at::MemoryFormat::Contiguous)
                              : at::zeros({d.B, d.H, d.dk, d.dv}, in.q.options());
  auto flat = S.view({BH, d.dk, d.dv});
  auto o = at::empty({d.B, d.T, d.H, d.dv}, in.v.options());
  for (int64_t t = 0; t < d.T; ++t) {
    auto row = [&](const at::Tensor& x, int64_t n) { return x.select(1, t).reshape({BH, 1, n}); };
    auto q = row(in.q, d.dk), k = row(in.k, d.dk), v = row(in.v, d.dv);
    flat.mul_(in.g.select(1, t).exp().reshape({BH, 1, 1}));
    auto u = (v - at::bmm(k, flat)).mul_(in.beta.select(1, t).reshape({BH, 1, 1}));
    flat.baddbmm_(k.transpose(1, 2), u);
    o.select(1, t).copy_(at::bmm(q, flat).view({d.B, d.H, d.dv}));
  }
  return {o, S};
}

}  // namespace

Outputs recurrent(const Inputs& in) {
  const auto d = check(in);
  if (!at::GradMode::is_enabled() && !in.resets.defined()) return recurrent_in_place(in, d);
  auto S = initial_state(in, d);
  std::vector<at::Tensor> outs;
  outs.reserve(static_cast<size_t>(d.T));
  for (int64_t t = 0; t < d.T; ++t) {
    if (in.resets.defined()) {
      auto keep = in.resets.select(1, t).logical_not().to(S.scalar_type()).view({d.B, 1, 1, 1});
      S = S * keep;
    }
    auto q = in.q.select(1, t), k = in.k.select(1, t), v = in.v.select(1, t);  // [B, H, d]
    S = S * in.g.select(1, t).exp().view({d.B, d.H, 1, 1});
    auto read = (S * k.unsqueeze(-1)).sum(-2);  // S^T k: [B, H, dv]
    auto u = in.beta.select(1, t).unsqueeze(-1) * (v - read);
    S = S + k.unsqueeze(-1) * u.unsqueeze(-2);
    outs.push_back((S * q.unsqueeze(-1)).sum(-2));
  }
  auto o = d.T > 0 ? at::stack(outs, 1) : at::empty({d.B, 0, d.H, d.dv}, in.v.options());
  return {o, S};
}

namespace {

// The padded, heads-first inputs of the chunked form and each position's
// segment ([B, 1, T + padding]).
struct Padded {
  at::Tensor q, k, v, g, beta, S0, seg;
};

Padded pad_for_chunks(const Inputs& in, const Dims& d, int64_t n) {
  if (n < 1) refuse("the chunk size must be at least 1, not " + std::to_string(n));
  const int64_t C = (d.T + n - 1) / n, pad = C * n - d.T;
  // [B, H, T, .], padded with positions that change nothing (k = v = 0,
  // beta = 0, g = 0) and belong to the last position's segment.
  auto heads_first = [&](const at::Tensor& t) {
    auto x = t.dim() == 4 ? t.permute({0, 2, 1, 3}) : t.permute({0, 2, 1});
    if (pad == 0) return x.contiguous();
    std::vector<int64_t> p(static_cast<size_t>(2 * x.dim()), 0);
    p[t.dim() == 4 ? 3 : 1] = pad;  // the time dimension's end (pairs from the last dimension backwards)
    return at::constant_pad_nd(x, p, 0).contiguous();
  };
  Padded out{heads_first(in.q), heads_first(in.k), heads_first(in.v), heads_first(in.g), heads_first(in.beta),
             initial_state(in, d), {}};
  auto seg = segments_of(in.resets, d.B, d.T);
  if (pad > 0) {
    auto last = d.T > 0 ? seg.narrow(1, d.T - 1, 1) : at::zeros({d.B, 1}, at::kLong);
    seg = at::cat({seg, last.expand({d.B, pad})}, 1);
  }
  out.seg = seg.unsqueeze(1).contiguous();  // every head alike
  return out;
}

Outputs unpadded(const at::Tensor& o, const at::Tensor& S, const Dims& d) {
  return {o.narrow(2, 0, d.T).permute({0, 2, 1, 3}).contiguous(), S};
}

}  // namespace

Outputs chunked(const Inputs& in, const ChunkOptions& opt) {
  const auto d = check(in);
  auto p = pad_for_chunks(in, d, opt.chunk);
  auto r = ChunkedRule::apply(p.q, p.k, p.v, p.g, p.beta, p.S0, p.seg, opt.chunk);
  return unpadded(r[0], r[1], d);
}

Outputs chunked_by_autograd(const Inputs& in, const ChunkOptions& opt) {
  const auto d = check(in);
  const int64_t n = opt.chunk;
  auto p = pad_for_chunks(in, d, n);
  const auto m = masks_of(n, p.q.options());
  auto S = p.S0;
  std::vector<at::Tensor> outs;
  for (int64_t c = 0; c < p.q.size(2) / n; ++c) {
    auto ch = run_chunk(p.q, p.k, p.v, p.g, p.beta, p.seg, c, n, S, m);
    outs.push_back(ch.o);
    S = ch.S_out;
  }
  return unpadded(outs.empty() ? at::zeros_like(p.v) : at::cat(outs, 2), S, d);
}

namespace {

// silu(conv(x)) over the padded input xp [B, K-1+T, C] (the state's rows in
// front), taps w [C, K], `valid` [K, B, T, 1] (tap K-1-j may read j back;
// no elements: every tap): the backward pass recomputes the convolution
// instead of keeping it, and keeps no per-tap product.
at::Tensor conv_taps(const at::Tensor& xp, const at::Tensor& w, const at::Tensor& valid, int64_t T) {
  const int64_t K = w.size(1);
  auto y = at::zeros({xp.size(0), T, xp.size(2)}, xp.options());
  for (int64_t j = 0; j < K; ++j) {
    auto term = xp.narrow(1, K - 1 - j, T) * w.select(1, K - 1 - j);
    y.add_(valid.numel() > 0 ? term * valid[j] : term);
  }
  return y;
}

struct ConvSiluFn : torch::autograd::Function<ConvSiluFn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& xp, const at::Tensor& w, const at::Tensor& valid,
                            int64_t T) {
    ctx->save_for_backward({xp, w, valid});
    ctx->saved_data["T"] = T;
    return at::silu(conv_taps(xp, w, valid, T));
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const auto &xp = saved[0], &w = saved[1], &valid = saved[2];
    const int64_t T = ctx->saved_data["T"].toInt(), K = w.size(1);
    auto y = conv_taps(xp, w, valid, T);
    auto dy = grads[0] * silu_grad(y);
    auto dxp = at::zeros_like(xp), dw = at::zeros_like(w);
    for (int64_t j = 0; j < K; ++j) {
      auto d = valid.numel() > 0 ? dy * valid[j] : dy;
      dxp.narrow(1, K - 1 - j, T).add_(d * w.select(1, K - 1 - j));
      dw.select(1, K - 1 - j).copy_((d * xp.narrow(1, K - 1 - j, T)).sum(at::IntArrayRef{0, 1}));
    }
    return {dxp, dw, at::Tensor{}, at::Tensor{}};
  }
};

// w * o / sqrt(mean(o^2) + eps) * silu(z) over the last dimension, keeping
// o, z and w only.
struct GatedNormFn : torch::autograd::Function<GatedNormFn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& o, const at::Tensor& z, const at::Tensor& w,
                            double eps) {
    ctx->save_for_backward({o, z, w});
    ctx->saved_data["eps"] = eps;
    return w * (o * (o.pow(2).mean(-1, true) + eps).rsqrt()) * at::silu(z);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const auto &o = saved[0], &z = saved[1], &w = saved[2];
    const double eps = ctx->saved_data["eps"].toDouble();
    const auto& dout = grads[0];
    auto r = (o.pow(2).mean(-1, true) + eps).rsqrt();
    auto a = o * r;
    auto gz = at::silu(z);
    auto da = dout * w * gz;
    auto dO = r * (da - a * (da * a).mean(-1, true));
    auto dz = dout * w * a * silu_grad(z);
    auto dw = (dout * a * gz).reshape({-1, w.size(0)}).sum(0);
    return {dO, dz, dw, at::Tensor{}};
  }
};

// x / sqrt(sum(x^2) + eps) * scale over the last dimension of x [B, T, nk,
// d], each head then repeated `r` times in place ([B, T, nk r, d]: key head
// j serves value heads j r .. j r + r - 1). Keeps the normed x and the
// inverse norm; the backward sums each head's repeats, then
// dx = r (dy' - x' sum(dy' x')), dy' the scaled gradient.
struct L2NormRepeatFn : torch::autograd::Function<L2NormRepeatFn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, double scale, int64_t repeat) {
    auto inv = (x.pow(2).sum(-1, true) + 1e-6).rsqrt();
    auto normed = x * inv;
    ctx->save_for_backward({normed, inv});
    ctx->saved_data["scale"] = scale;
    ctx->saved_data["repeat"] = repeat;
    auto y = scale == 1.0 ? normed : normed * scale;
    return repeat > 1 ? y.repeat_interleave(repeat, 2) : y;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const auto &normed = saved[0], &inv = saved[1];
    const double scale = ctx->saved_data["scale"].toDouble();
    const int64_t repeat = ctx->saved_data["repeat"].toInt();
    auto dy = grads[0];
    if (repeat > 1) {
      const auto n = normed.sizes();
      dy = dy.view({n[0], n[1], n[2], repeat, n[3]}).sum(3);
    }
    if (scale != 1.0) dy = dy * scale;
    auto dx = inv * (dy - normed * (dy * normed).sum(-1, true));
    return {dx, at::Tensor{}, at::Tensor{}};
  }
};

// The decay g = -exp(A_log) softplus(a + dt_bias) and the write strength
// beta = sigmoid(b), a and b [B, T, H], A_log and dt_bias [H], in one pass
// each way.
struct GatesFn : torch::autograd::Function<GatesFn> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& a, const at::Tensor& b, const at::Tensor& A_log,
                               const at::Tensor& dt_bias) {
    auto x = a + dt_bias;
    auto decay = A_log.exp();
    auto g = -decay * at::softplus(x);
    auto beta = at::sigmoid(b);
    ctx->save_for_backward({x, decay, g, beta});
    return {g, beta};
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const auto &x = saved[0], &decay = saved[1], &g = saved[2], &beta = saved[3];
    at::Tensor da, dA_log, ddt, db;
    if (grads[0].defined()) {
      da = -grads[0] * decay * at::sigmoid(x);  // softplus' = sigmoid
      const int64_t H = decay.size(0);
      ddt = da.reshape({-1, H}).sum(0);
      dA_log = (grads[0] * g).reshape({-1, H}).sum(0);  // d(-e^A s)/dA = g
    }
    if (grads[1].defined()) db = grads[1] * beta * (1 - beta);
    return {da, db, dA_log, ddt};
  }
};

}  // namespace

at::Tensor l2_norm_heads(const at::Tensor& x, double scale, int64_t repeat) {
  if (x.dim() != 4 || repeat < 1) refuse("the l2 norm takes x [B, T, heads, d] and a repeat >= 1; got x " + shape_of(x));
  return L2NormRepeatFn::apply(x, scale, repeat);
}

std::pair<at::Tensor, at::Tensor> gates(const at::Tensor& a, const at::Tensor& b, const at::Tensor& A_log,
                                        const at::Tensor& dt_bias) {
  if (a.dim() != 3 || a.sizes() != b.sizes() || A_log.dim() != 1 || dt_bias.sizes() != A_log.sizes() ||
      a.size(2) != A_log.size(0))
    refuse("the gates take a and b [B, T, H] and A_log, dt_bias [H]; got a " + shape_of(a) + ", b " + shape_of(b) +
           ", A_log " + shape_of(A_log) + ", dt_bias " + shape_of(dt_bias));
  auto out = GatesFn::apply(a, b, A_log, dt_bias);
  return {out[0], out[1]};
}

std::pair<at::Tensor, at::Tensor> causal_conv_silu(const at::Tensor& x, const at::Tensor& weight,
                                                   const at::Tensor& state, const at::Tensor& resets) {
  if (x.dim() != 3 || weight.dim() != 3 || weight.size(0) != x.size(2) || weight.size(1) != 1 || weight.size(2) < 1)
    refuse("the convolution takes x [B, T, C] and a weight [C, 1, K]; got x " + shape_of(x) + ", weight " + shape_of(weight));
  const int64_t B = x.size(0), T = x.size(1), C = x.size(2), K = weight.size(2);
  if (state.defined() && (state.dim() != 3 || state.size(0) != B || state.size(1) != K - 1 || state.size(2) != C))
    refuse("the convolution's state must be [B, K-1, C] = [" + std::to_string(B) + ", " + std::to_string(K - 1) +
           ", " + std::to_string(C) + "]; got " + shape_of(state));
  if (resets.defined() && (resets.dim() != 2 || resets.size(0) != B || resets.size(1) != T))
    refuse("resets must be [B, T]; got " + shape_of(resets));
  auto before = state.defined() ? state : at::zeros({B, K - 1, C}, x.options());
  auto xp = at::cat({before, x}, 1);  // [B, K-1+T, C]
  // The segment of each padded position: the state's rows are segment 0's
  // (before any reset).
  auto seg = segments_of(resets, B, T);
  auto segp = at::cat({at::zeros({B, K - 1}, at::kLong), seg}, 1);
  // Tap K-1-j reads j positions back, where that position is in the same
  // segment.
  at::Tensor valid = at::empty({0}, x.options());
  if (resets.defined()) {
    std::vector<at::Tensor> taps;
    for (int64_t j = 0; j < K; ++j) taps.push_back((segp.narrow(1, K - 1 - j, T) == seg).unsqueeze(-1));
    valid = at::stack(taps).to(x.scalar_type());  // [K, B, T, 1]
  }
  auto y = ConvSiluFn::apply(xp, weight.squeeze(1), valid, T);
  // The next call's state: the last K-1 positions, zero where before the
  // last position's segment.
  auto next = xp.narrow(1, T, K - 1);
  if (resets.defined() && K > 1) {
    auto last = segp.narrow(1, K - 1 + T - 1, 1);
    next = next * (segp.narrow(1, T, K - 1) == last).unsqueeze(-1).to(x.scalar_type());
  }
  return {y, next};
}

at::Tensor gated_rms_norm(const at::Tensor& o, const at::Tensor& z, const at::Tensor& w, double eps) {
  if (o.sizes() != z.sizes() || w.dim() != 1 || o.dim() < 1 || w.size(0) != o.size(-1))
    refuse("the gated norm takes o and z of one shape [..., d] and w [d]; got o " + shape_of(o) + ", z " + shape_of(z) +
           ", w " + shape_of(w));
  return GatedNormFn::apply(o, z, w, eps);
}

namespace {

// Checks the weights are there and the head counts fit; answers w.project
// or a plain product.
void check_weights(const MixerWeights& w) {
  const int64_t nk = w.key_heads, nv = w.value_heads;
  if (nk < 1 || nv < 1 || nv % nk != 0)
    refuse("linear_num_value_heads (" + std::to_string(nv) + ") must be a multiple of linear_num_key_heads (" +
           std::to_string(nk) + ")");
  for (const auto* t : {&w.in_proj_qkv, &w.in_proj_z, &w.in_proj_b, &w.in_proj_a, &w.conv1d, &w.A_log, &w.dt_bias,
                        &w.norm, &w.out_proj})
    if (!t->defined()) refuse("a linear_attn tensor is missing (in_proj_qkv, in_proj_z, in_proj_b, in_proj_a, "
                              "conv1d, A_log, dt_bias, norm and out_proj are all required)");
}

at::Tensor apply(const MixerWeights& w, const char* name, const at::Tensor& weight, const at::Tensor& x) {
  return w.project ? w.project(name, weight, x) : at::linear(x, weight);
}

}  // namespace

Projected project_in(const MixerWeights& w, const at::Tensor& h) {
  check_weights(w);
  return {apply(w, "in_proj_qkv", w.in_proj_qkv, h), apply(w, "in_proj_z", w.in_proj_z, h),
          apply(w, "in_proj_b", w.in_proj_b, h), apply(w, "in_proj_a", w.in_proj_a, h)};
}

std::pair<at::Tensor, MixerState> mix_projected(const MixerWeights& w, const Projected& in, const MixerState& state,
                                                const at::Tensor& resets, int64_t chunk) {
  check_weights(w);
  const auto& c = in.qkv;
  if (c.dim() != 3) refuse("the mixer's projections must be [B, T, .]; got " + shape_of(c));
  const int64_t B = c.size(0), T = c.size(1), nk = w.key_heads, dk = w.key_dim, nv = w.value_heads, dv = w.value_dim;
  const int64_t key_dim = nk * dk, value_dim = nv * dv;
  if (c.size(2) != 2 * key_dim + value_dim)
    refuse("in_proj_qkv gives " + std::to_string(c.size(2)) + " channels, expected 2 x " + std::to_string(key_dim) +
           " + " + std::to_string(value_dim));
  auto [conv, conv_state] = causal_conv_silu(c, w.conv1d, state.conv, resets);
  auto q = conv.narrow(2, 0, key_dim).view({B, T, nk, dk});
  auto k = conv.narrow(2, key_dim, key_dim).view({B, T, nk, dk});
  auto v = conv.narrow(2, 2 * key_dim, value_dim).reshape({B, T, nv, dv});
  q = l2_norm_heads(q, 1.0 / std::sqrt(static_cast<double>(dk)), nv / nk);
  k = l2_norm_heads(k, 1.0, nv / nk);
  auto [g, beta] = gates(in.a, in.b, w.A_log, w.dt_bias);
  Inputs rule_in{.q = q, .k = k, .v = v, .g = g, .beta = beta, .state = state.recurrent, .resets = resets};
  auto rule = chunk > 0 ? chunked(rule_in, {.chunk = chunk}) : recurrent(rule_in);
  auto z = in.z.reshape({B, T, nv, dv});
  auto o = gated_rms_norm(rule.o, z, w.norm, w.eps).reshape({B, T, value_dim});
  return {o, MixerState{conv_state, rule.state}};
}

std::pair<at::Tensor, MixerState> mix(const MixerWeights& w, const at::Tensor& h, const MixerState& state,
                                      const at::Tensor& resets, int64_t chunk) {
  if (h.dim() != 3) refuse("the mixer's input must be [B, T, H]; got " + shape_of(h));
  auto [o, out_state] = mix_projected(w, project_in(w, h), state, resets, chunk);
  return {apply(w, "out_proj", w.out_proj, o), std::move(out_state)};
}

}  // namespace glint::components::gdn
