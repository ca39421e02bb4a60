// kernels::rms_norm, swiglu and rope on the CPU: one pass over each row, no
// temporaries, with hand-written backward passes.
#include "components/kernels/cpu/common.hpp"
#include "components/kernels/cpu/matmul_holder.hpp"
#include "components/kernels/fused.hpp"

#include <torch/csrc/autograd/custom_function.h>

#include <cmath>
#include <tuple>
#include <utility>
#include <vector>

namespace glint::components::kernels {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// -- RMSNorm --------------------------------------------------------------------

// One row: y = (x * rstd) * w, in the unfused composition's order, so that
// both round alike; returns rstd.
template <typename T>
GLINT_KERNEL_CLONES T rms_row_forward(const T* x, const T* w, T* y, int64_t H, T eps) {
  T ss = 0;
#pragma omp simd reduction(+ : ss)
  for (int64_t i = 0; i < H; ++i) ss += x[i] * x[i];
  const T rstd = T{1} / std::sqrt(ss / static_cast<T>(H) + eps);
#pragma omp simd
  for (int64_t i = 0; i < H; ++i) y[i] = (x[i] * rstd) * w[i];
  return rstd;
}

// One row's gradients: with g = dy * w and xh = x * rstd,
// dx = rstd * (g - xh * mean(g * xh)); gw += dy * xh.
template <typename T>
GLINT_KERNEL_CLONES void rms_row_backward(const T* x, const T* w, const T* dy, T rstd, T* dx, T* gw, int64_t H) {
  T dot = 0;
#pragma omp simd reduction(+ : dot)
  for (int64_t i = 0; i < H; ++i) dot += dy[i] * w[i] * x[i];
  const T c = dot * rstd * rstd / static_cast<T>(H);
  if (dx) {
#pragma omp simd
    for (int64_t i = 0; i < H; ++i) dx[i] = rstd * (dy[i] * w[i] - x[i] * c);
  }
  if (gw) {
#pragma omp simd
    for (int64_t i = 0; i < H; ++i) gw[i] += dy[i] * (x[i] * rstd);
  }
}

struct RmsNormFn : torch::autograd::Function<RmsNormFn> {
  // x [N, H] contiguous, w [H] -> y [N, H].
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& w, double eps) {
    const int64_t N = x.size(0), H = x.size(1);
    auto y = at::empty_like(x);
    auto rstd = at::empty({N}, x.options());
    AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "rms_norm", [&] {
      const scalar_t* xp = x.data_ptr<scalar_t>();
      const scalar_t* wp = w.data_ptr<scalar_t>();
      scalar_t* yp = y.data_ptr<scalar_t>();
      scalar_t* rp = rstd.data_ptr<scalar_t>();
      at::parallel_for(0, N, cpu::grain_rows(H), [&](int64_t b, int64_t e) {
        for (int64_t r = b; r < e; ++r) rp[r] = rms_row_forward(xp + r * H, wp, yp + r * H, H, static_cast<scalar_t>(eps));
      });
    });
    ctx->save_for_backward({x, w, rstd});
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto saved = ctx->get_saved_variables();
    const auto &x = saved[0], &w = saved[1], &rstd = saved[2];
    auto dy = grads[0].contiguous();
    const int64_t N = x.size(0), H = x.size(1);
    const bool want_x = ctx->needs_input_grad(0), want_w = ctx->needs_input_grad(1);
    at::Tensor dx = want_x ? at::empty_like(x) : at::Tensor{};
    // Per-thread partial sums of the weight's gradient, added at the end.
    const int64_t threads = at::get_num_threads();
    at::Tensor partial = want_w ? at::zeros({threads, H}, x.options()) : at::Tensor{};
    AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "rms_norm_backward", [&] {
      const scalar_t* xp = x.data_ptr<scalar_t>();
      const scalar_t* wp = w.data_ptr<scalar_t>();
      const scalar_t* gp = dy.data_ptr<scalar_t>();
      const scalar_t* rp = rstd.data_ptr<scalar_t>();
      scalar_t* dxp = want_x ? dx.data_ptr<scalar_t>() : nullptr;
      scalar_t* pp = want_w ? partial.data_ptr<scalar_t>() : nullptr;
      at::parallel_for(0, N, cpu::grain_rows(H), [&](int64_t b, int64_t e) {
        scalar_t* gw = pp ? pp + at::get_thread_num() * H : nullptr;
        for (int64_t r = b; r < e; ++r)
          rms_row_backward(xp + r * H, wp, gp + r * H, rp[r], dxp ? dxp + r * H : nullptr, gw, H);
      });
    });
    return {dx, want_w ? partial.sum(0) : at::Tensor{}, at::Tensor{}};
  }
};

// -- SwiGLU ---------------------------------------------------------------------

// y = silu(g) * u over a span; silu(g) = g / (1 + exp(-g)), as ATen writes it.
template <typename T>
GLINT_KERNEL_CLONES void swiglu_span(const T* g, const T* u, T* y, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) y[i] = g[i] / (T{1} + cpu::exp(-g[i])) * u[i];
}

// The gradients over a span, into dg and du where not null. With s =
// sigmoid(g): d silu(g) / dg = s (1 + g (1 - s)).
template <typename T>
GLINT_KERNEL_CLONES void swiglu_grads_span(const T* g, const T* u, const T* d, T* dg, T* du, int64_t n) {
  if (dg && du) {
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) {
      const T s = T{1} / (T{1} + cpu::exp(-g[i]));
      dg[i] = d[i] * u[i] * (s * (T{1} + g[i] * (T{1} - s)));
      du[i] = d[i] * (g[i] * s);
    }
  } else if (dg) {
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) {
      const T s = T{1} / (T{1} + cpu::exp(-g[i]));
      dg[i] = d[i] * u[i] * (s * (T{1} + g[i] * (T{1} - s)));
    }
  } else if (du) {
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) du[i] = d[i] * (g[i] * (T{1} / (T{1} + cpu::exp(-g[i]))));
  }
}

// The gradients of silu(gate) * up in gate and up (those wanted) from dy.
std::pair<at::Tensor, at::Tensor> swiglu_grads(const at::Tensor& gate, const at::Tensor& up, const at::Tensor& dy,
                                               bool want_g, bool want_u) {
  at::Tensor dg = want_g ? at::empty_like(gate) : at::Tensor{};
  at::Tensor du = want_u ? at::empty_like(up) : at::Tensor{};
  const int64_t n = gate.numel();
  AT_DISPATCH_FLOATING_TYPES(gate.scalar_type(), "swiglu_backward", [&] {
    const scalar_t* g = gate.data_ptr<scalar_t>();
    const scalar_t* u = up.data_ptr<scalar_t>();
    const scalar_t* d = dy.data_ptr<scalar_t>();
    scalar_t* dgp = want_g ? dg.data_ptr<scalar_t>() : nullptr;
    scalar_t* dup = want_u ? du.data_ptr<scalar_t>() : nullptr;
    at::parallel_for(0, n, 32768, [&](int64_t b, int64_t e) {
      swiglu_grads_span(g + b, u + b, d + b, dgp ? dgp + b : nullptr, dup ? dup + b : nullptr, e - b);
    });
  });
  return {dg, du};
}

struct SwigluFn : torch::autograd::Function<SwigluFn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& gate, const at::Tensor& up) {
    auto y = at::empty_like(gate);
    const int64_t n = gate.numel();
    AT_DISPATCH_FLOATING_TYPES(gate.scalar_type(), "swiglu", [&] {
      const scalar_t* g = gate.data_ptr<scalar_t>();
      const scalar_t* u = up.data_ptr<scalar_t>();
      scalar_t* yp = y.data_ptr<scalar_t>();
      at::parallel_for(0, n, 32768, [&](int64_t b, int64_t e) { swiglu_span(g + b, u + b, yp + b, e - b); });
    });
    ctx->save_for_backward({gate, up});
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto saved = ctx->get_saved_variables();
    auto [dg, du] = swiglu_grads(saved[0], saved[1], grads[0].contiguous(), ctx->needs_input_grad(0),
                                 ctx->needs_input_grad(1));
    return {dg, du};
  }
};

// -- SwiGLU into the down projection ---------------------------------------------

at::Tensor swiglu_raw(const at::Tensor& gate, const at::Tensor& up) {
  at::NoGradGuard no_grad;
  return SwigluFn::apply(gate, up);
}

struct SwigluLinearFn : torch::autograd::Function<SwigluLinearFn> {
  // gate, up [N, I], w [H, I] -> [N, H].
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& gate, const at::Tensor& up, const at::Tensor& w,
                            const MatmulNT& mm) {
    auto y = mm(swiglu_raw(gate, up), w);  // the product is a temporary
    ctx->save_for_backward({gate, up, w});
    cpu::save_matmul(ctx, mm);
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto saved = ctx->get_saved_variables();
    const auto &gate = saved[0], &up = saved[1], &w = saved[2];
    const auto& mm = cpu::saved_matmul<MatmulNT>(ctx);
    auto dy = grads[0].contiguous();
    at::Tensor dw;
    if (ctx->needs_input_grad(2)) dw = mm(dy.t(), swiglu_raw(gate, up).t());  // dy^T @ product
    at::Tensor dgate, dup;
    if (ctx->needs_input_grad(0) || ctx->needs_input_grad(1)) {
      auto da = mm(dy, w.t().contiguous()).contiguous();  // dy @ w
      std::tie(dgate, dup) = swiglu_grads(gate, up, da, ctx->needs_input_grad(0), ctx->needs_input_grad(1));
    }
    return {dgate, dup, dw, at::Tensor{}};
  }
};

// -- RoPE -----------------------------------------------------------------------

// One row of `heads` heads of D: y = x * cos + rotate_half(x) * sin, or its
// transpose (the backward pass): dx = dy * cos + rotate_half^T(dy * sin),
// rotate_half^T(z) = [z2, -z1] for z = [z1, z2].
template <typename T, bool Backward>
GLINT_KERNEL_CLONES void rope_row(const T* x, const T* cos, const T* sin, T* y, int64_t heads, int64_t D) {
  const int64_t half = D / 2;
  for (int64_t h = 0; h < heads; ++h) {
    const T* xh = x + h * D;
    T* yh = y + h * D;
    if constexpr (!Backward) {
#pragma omp simd
      for (int64_t i = 0; i < half; ++i) yh[i] = xh[i] * cos[i] + (-xh[i + half]) * sin[i];
#pragma omp simd
      for (int64_t i = half; i < D; ++i) yh[i] = xh[i] * cos[i] + xh[i - half] * sin[i];
    } else {
#pragma omp simd
      for (int64_t i = 0; i < half; ++i) yh[i] = xh[i] * cos[i] + xh[i + half] * sin[i + half];
#pragma omp simd
      for (int64_t i = half; i < D; ++i) yh[i] = xh[i] * cos[i] - xh[i - half] * sin[i - half];
    }
  }
}

template <bool Backward>
at::Tensor rope_apply(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  // x [N, heads, D], cos and sin [N, D], all contiguous.
  const int64_t N = x.size(0), heads = x.size(1), D = x.size(2);
  auto y = at::empty_like(x);
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "rope", [&] {
    const scalar_t* xp = x.data_ptr<scalar_t>();
    const scalar_t* cp = cos.data_ptr<scalar_t>();
    const scalar_t* sp = sin.data_ptr<scalar_t>();
    scalar_t* yp = y.data_ptr<scalar_t>();
    at::parallel_for(0, N, cpu::grain_rows(heads * D), [&](int64_t b, int64_t e) {
      for (int64_t r = b; r < e; ++r)
        rope_row<scalar_t, Backward>(xp + r * heads * D, cp + r * D, sp + r * D, yp + r * heads * D, heads, D);
    });
  });
  return y;
}

struct RopeFn : torch::autograd::Function<RopeFn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
    ctx->save_for_backward({cos, sin});
    return rope_apply<false>(x, cos, sin);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto saved = ctx->get_saved_variables();
    at::Tensor dx;
    if (ctx->needs_input_grad(0)) dx = rope_apply<true>(grads[0].contiguous(), saved[0], saved[1]);
    return {dx, at::Tensor{}, at::Tensor{}};
  }
};

}  // namespace

at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  cpu::check_floating_cpu(x, "rms_norm", "x");
  cpu::check_floating_cpu(weight, "rms_norm", "weight");
  TORCH_CHECK(weight.dim() == 1 && x.dim() >= 1 && x.size(-1) == weight.size(0), "rms_norm: x is ", x.sizes(),
              ", weight ", weight.sizes());
  TORCH_CHECK(x.scalar_type() == weight.scalar_type(), "rms_norm: x is ", x.scalar_type(), ", weight ",
              weight.scalar_type());
  TORCH_CHECK(eps >= 0, "rms_norm: eps ", eps, " is negative");
  const int64_t H = x.size(-1);
  auto y = RmsNormFn::apply(x.reshape({-1, H}).contiguous(), weight.contiguous(), eps);
  return y.view(x.sizes());
}

at::Tensor swiglu(const at::Tensor& gate, const at::Tensor& up) {
  cpu::check_floating_cpu(gate, "swiglu", "gate");
  cpu::check_floating_cpu(up, "swiglu", "up");
  TORCH_CHECK(gate.sizes() == up.sizes() && gate.scalar_type() == up.scalar_type(), "swiglu: gate is ", gate.sizes(),
              " ", gate.scalar_type(), ", up ", up.sizes(), " ", up.scalar_type());
  return SwigluFn::apply(gate.contiguous(), up.contiguous());
}

at::Tensor swiglu_linear(const at::Tensor& gate, const at::Tensor& up, const at::Tensor& w, const MatmulNT& mm) {
  cpu::check_floating_cpu(gate, "swiglu_linear", "gate");
  cpu::check_floating_cpu(up, "swiglu_linear", "up");
  cpu::check_floating_cpu(w, "swiglu_linear", "w");
  const int64_t I = gate.size(-1);
  TORCH_CHECK(gate.sizes() == up.sizes() && w.dim() == 2 && w.size(1) == I, "swiglu_linear: gate is ", gate.sizes(),
              ", up ", up.sizes(), ", w ", w.sizes());
  TORCH_CHECK(gate.scalar_type() == up.scalar_type() && gate.scalar_type() == w.scalar_type(), "swiglu_linear: gate is ",
              gate.scalar_type(), ", up ", up.scalar_type(), ", w ", w.scalar_type());
  MatmulNT product = mm ? mm : MatmulNT{[](const at::Tensor& a, const at::Tensor& b) { return at::mm(a, b.t()); }};
  auto y = SwigluLinearFn::apply(gate.reshape({-1, I}).contiguous(), up.reshape({-1, I}).contiguous(), w.contiguous(),
                                 product);
  auto sizes = gate.sizes().vec();
  sizes.back() = w.size(0);
  return y.view(sizes);
}

at::Tensor rope(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  cpu::check_floating_cpu(x, "rope", "x");
  cpu::check_floating_cpu(cos, "rope", "cos");
  cpu::check_floating_cpu(sin, "rope", "sin");
  TORCH_CHECK(x.dim() >= 2, "rope: x ", x.sizes(), " needs [..., heads, head_dim]");
  const int64_t heads = x.size(-2), D = x.size(-1);
  TORCH_CHECK(D % 2 == 0, "rope: head_dim ", D, " is odd");
  auto lead = x.sizes().slice(0, x.dim() - 2).vec();
  auto table = lead;
  table.push_back(D);
  TORCH_CHECK(cos.sizes() == c10::IntArrayRef{table} && sin.sizes() == c10::IntArrayRef{table}, "rope: x is ",
              x.sizes(), " so cos and sin must be ", c10::IntArrayRef{table}, ", not ", cos.sizes(), " and ",
              sin.sizes());
  TORCH_CHECK(cos.scalar_type() == x.scalar_type() && sin.scalar_type() == x.scalar_type(), "rope: x is ",
              x.scalar_type(), ", cos ", cos.scalar_type(), ", sin ", sin.scalar_type());
  auto y = RopeFn::apply(x.reshape({-1, heads, D}).contiguous(), cos.reshape({-1, D}).contiguous(),
                         sin.reshape({-1, D}).contiguous());
  return y.view(x.sizes());
}

}  // namespace glint::components::kernels
