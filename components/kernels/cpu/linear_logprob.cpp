// kernels::linear_logprob on the CPU: chunks of rows through the LM head;
// kernels::logprob: the same rows from logits already formed.
#include "components/kernels/cpu/common.hpp"
#include "components/kernels/fused.hpp"

#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <cmath>
#include <limits>

namespace glint::components::kernels {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// 16 MiB of float32 logits per chunk: below glibc's largest mmap threshold
// (32 MiB), so after the first chunk the buffer comes from the heap instead
// of being mapped, faulted in and zeroed by the kernel on every call.
int64_t rows_per_chunk(int64_t vocab, int64_t asked) {
  if (asked > 0) return asked;
  constexpr int64_t budget = int64_t{16} << 20;  // bytes of f32 logits per chunk
  return std::max<int64_t>(16, budget / (4 * std::max<int64_t>(vocab, 1)));
}

// Each row's logsumexp, its target's log-probability and (when ent is
// given) the entropy -sum p log p, with log p = z - lse taken elementwise:
// with logits in the hundreds, lse - E[z] would cancel away float32's digits.
// An infinite maximum is not subtracted, as at::logsumexp does.
template <typename T>
GLINT_KERNEL_CLONES void logprob_rows(const T* Z, int64_t n, int64_t V, const int64_t* targets, T* lse, T* tlp,
                                      T* ent) {
  constexpr T neg_inf = -std::numeric_limits<T>::infinity();
  for (int64_t i = 0; i < n; ++i) {
    const T* z = Z + i * V;
    T mx = neg_inf;
#pragma omp simd reduction(max : mx)
    for (int64_t j = 0; j < V; ++j) mx = z[j] > mx ? z[j] : mx;
    const T shift = std::isinf(mx) ? T{0} : mx;
    T sum = 0;
#pragma omp simd reduction(+ : sum)
    for (int64_t j = 0; j < V; ++j) sum += cpu::exp(z[j] - shift);
    const T l = shift + std::log(sum);
    lse[i] = l;
    tlp[i] = z[targets[i]] - l;
    if (ent) {
      T h = 0;
#pragma omp simd reduction(+ : h)
      for (int64_t j = 0; j < V; ++j) {
        const T lp = z[j] - l;
        const T p = cpu::exp(lp);
        h -= p == T{0} ? T{0} : p * lp;  // p log p -> 0 as p -> 0: a -inf logit adds nothing, not NaN
      }
      ent[i] = h;
    }
  }
}

// The rows' gradient of sum(g_lp logprob + g_ent entropy) in their logits,
// into D (which may be Z itself): d logp(t)/dz = onehot(t) - p and
// dH/dz = -p (log p + H). A null g_lp or g_ent: that output had no gradient.
template <typename T>
GLINT_KERNEL_CLONES void logprob_grad_rows(const T* Z, T* D, int64_t n, int64_t V, const int64_t* targets,
                                           const T* lse, const T* ent, const T* g_lp, const T* g_ent) {
  for (int64_t i = 0; i < n; ++i) {
    const T* z = Z + i * V;
    T* d = D + i * V;
    const T l = lse[i];
    const T g = g_lp ? g_lp[i] : T{0};
    if (g_ent) {
      const T ge = g_ent[i], H = ent[i];
#pragma omp simd
      for (int64_t j = 0; j < V; ++j) {
        const T lp = z[j] - l;
        const T p = cpu::exp(lp);
        const T t = p == T{0} ? T{0} : p * (lp + H);  // as above: 0, not 0 x -inf
        d[j] = -(g * p) - ge * t;
      }
    } else {
#pragma omp simd
      for (int64_t j = 0; j < V; ++j) d[j] = -(g * cpu::exp(z[j] - l));
    }
    if (g_lp) d[targets[i]] += g;
  }
}

bool has_row_kernel(const at::Tensor& t) {
  return t.device().is_cpu() && (t.scalar_type() == at::kFloat || t.scalar_type() == at::kDouble);
}

// logprob_rows over z [n, V] into the slices lse, tlp, ent [n] (ent
// undefined: no entropies), split over LibTorch's threads; LibTorch's
// composition for a dtype without a kernel (bfloat16, half).
void rows_forward(const at::Tensor& z, const at::Tensor& targets, const at::Tensor& lse, const at::Tensor& tlp,
                  const at::Tensor& ent) {
  const int64_t n = z.size(0), V = z.size(1);
  if (!has_row_kernel(z)) {
    auto l = at::logsumexp(z, 1);
    lse.copy_(l);
    tlp.copy_(z.gather(1, targets.unsqueeze(1)).squeeze(1) - l);
    if (ent.defined()) {
      auto logp = z - l.unsqueeze(1);
      auto p = logp.exp();
      ent.copy_(-at::where(p == 0, at::zeros_like(p), p * logp).sum(1));
    }
    return;
  }
  AT_DISPATCH_FLOATING_TYPES(z.scalar_type(), "logprob_rows", [&] {
    const auto* zp = z.data_ptr<scalar_t>();
    const auto* tp = targets.data_ptr<int64_t>();
    auto* lp = lse.data_ptr<scalar_t>();
    auto* op = tlp.data_ptr<scalar_t>();
    auto* ep = ent.defined() ? ent.data_ptr<scalar_t>() : nullptr;
    at::parallel_for(0, n, cpu::grain_rows(V), [&](int64_t b, int64_t e) {
      logprob_rows<scalar_t>(zp + b * V, e - b, V, tp + b, lp + b, op + b, ep ? ep + b : nullptr);
    });
  });
}

// The logits' gradient for rows z [n, V] into d [n, V] (d may be z):
// logprob_grad_rows, or the composition for other dtypes. g_lp, g_ent [n]
// or undefined.
void rows_backward(const at::Tensor& z, const at::Tensor& d, const at::Tensor& targets, const at::Tensor& lse,
                   const at::Tensor& ent, const at::Tensor& g_lp, const at::Tensor& g_ent) {
  const int64_t n = z.size(0), V = z.size(1);
  if (!has_row_kernel(z)) {
    auto logp = z - lse.unsqueeze(1);
    auto p = logp.exp();
    auto dz = g_lp.defined() ? -g_lp.unsqueeze(1) * p : at::zeros_like(logp);
    if (g_lp.defined()) dz.scatter_add_(1, targets.unsqueeze(1), g_lp.unsqueeze(1));
    if (g_ent.defined())
      dz.sub_(g_ent.unsqueeze(1) * at::where(p == 0, at::zeros_like(p), p * (logp + ent.unsqueeze(1))));
    d.copy_(dz);
    return;
  }
  AT_DISPATCH_FLOATING_TYPES(z.scalar_type(), "logprob_grad_rows", [&] {
    const auto* zp = z.data_ptr<scalar_t>();
    auto* dp = d.data_ptr<scalar_t>();
    const auto* tp = targets.data_ptr<int64_t>();
    const auto* lp = lse.data_ptr<scalar_t>();
    const auto* ep = ent.defined() ? ent.data_ptr<scalar_t>() : nullptr;
    const auto* gl = g_lp.defined() ? g_lp.data_ptr<scalar_t>() : nullptr;
    const auto* ge = g_ent.defined() ? g_ent.data_ptr<scalar_t>() : nullptr;
    at::parallel_for(0, n, cpu::grain_rows(V), [&](int64_t b, int64_t e) {
      logprob_grad_rows<scalar_t>(zp + b * V, dp + b * V, e - b, V, tp + b, lp + b, ep ? ep + b : nullptr,
                                  gl ? gl + b : nullptr, ge ? ge + b : nullptr);
    });
  });
}

// The incoming gradient of an output, contiguous, or undefined when the
// output had none (or, for the entropies, was not asked for).
at::Tensor incoming(const at::Tensor& g, bool wanted = true) {
  return g.defined() && wanted ? g.contiguous() : at::Tensor{};
}

struct LinearLogprobFn : torch::autograd::Function<LinearLogprobFn> {
  // x [N, H], w [V, H], targets [N] -> {logprobs [N], entropies [N]}.
  static variable_list forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& w,
                               const at::Tensor& targets, int64_t chunk, bool entropies) {
    at::NoGradGuard no_grad;
    const int64_t N = x.size(0), V = w.size(0);
    auto lse = at::empty({N}, x.options()), target_logp = at::empty({N}, x.options()),
         entropy = entropies ? at::empty({N}, x.options()) : at::zeros({N}, x.options());
    // One buffer for every chunk's logits.
    auto z = at::empty({std::min(N, chunk), V}, x.options());
    for (int64_t r = 0; r < N; r += chunk) {
      const int64_t e = std::min(N, r + chunk);
      auto zr = z.slice(0, 0, e - r);
      at::mm_out(zr, x.slice(0, r, e), w.t());
      rows_forward(zr, targets.slice(0, r, e), lse.slice(0, r, e), target_logp.slice(0, r, e),
                   entropies ? entropy.slice(0, r, e) : at::Tensor{});
    }
    ctx->save_for_backward({x, w, targets, lse, entropy});
    // An output nobody used gets an undefined gradient, not zeros to multiply.
    ctx->set_materialize_grads(false);
    ctx->saved_data["chunk"] = chunk;
    ctx->saved_data["entropies"] = entropies;
    return {target_logp, entropy};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto saved = ctx->get_saved_variables();
    const auto &x = saved[0], &w = saved[1], &targets = saved[2], &lse = saved[3], &entropy = saved[4];
    const int64_t chunk = ctx->saved_data["chunk"].toInt();
    const bool entropy_wanted = ctx->saved_data["entropies"].toBool();
    const auto g_lp = incoming(grads[0]), g_ent = incoming(grads[1], entropy_wanted);
    const bool want_x = ctx->needs_input_grad(0), want_w = ctx->needs_input_grad(1);
    at::Tensor gx = want_x ? at::empty_like(x) : at::Tensor{};
    at::Tensor gw = want_w ? at::zeros_like(w) : at::Tensor{};
    const int64_t N = x.size(0);
    auto z = at::empty({std::min(N, chunk), w.size(0)}, x.options());  // the logits again, then their gradient
    for (int64_t r = 0; r < N; r += chunk) {
      const int64_t e = std::min(N, r + chunk);
      auto xr = x.slice(0, r, e);
      auto dz = z.slice(0, 0, e - r);
      at::mm_out(dz, xr, w.t());
      rows_backward(dz, dz, targets.slice(0, r, e), lse.slice(0, r, e), entropy.slice(0, r, e),
                    g_lp.defined() ? g_lp.slice(0, r, e) : at::Tensor{},
                    g_ent.defined() ? g_ent.slice(0, r, e) : at::Tensor{});
      if (want_x) {
        auto gxr = gx.slice(0, r, e);
        at::mm_out(gxr, dz, w);
      }
      if (want_w) gw.addmm_(dz.t(), xr);
    }
    return {gx, gw, at::Tensor{}, at::Tensor{}, at::Tensor{}};
  }
};

// logprob: logits [N, V], targets [N] -> {logprobs [N], entropies [N]}.
struct LogprobFn : torch::autograd::Function<LogprobFn> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& z, const at::Tensor& targets, bool entropies) {
    at::NoGradGuard no_grad;
    const int64_t N = z.size(0);
    auto lse = at::empty({N}, z.options()), target_logp = at::empty({N}, z.options()),
         entropy = entropies ? at::empty({N}, z.options()) : at::zeros({N}, z.options());
    rows_forward(z, targets, lse, target_logp, entropies ? entropy : at::Tensor{});
    ctx->save_for_backward({z, targets, lse, entropy});
    ctx->set_materialize_grads(false);
    ctx->saved_data["entropies"] = entropies;
    return {target_logp, entropy};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto saved = ctx->get_saved_variables();
    const auto &z = saved[0], &targets = saved[1], &lse = saved[2], &entropy = saved[3];
    const auto g_lp = incoming(grads[0]), g_ent = incoming(grads[1], ctx->saved_data["entropies"].toBool());
    if (!ctx->needs_input_grad(0)) return {at::Tensor{}, at::Tensor{}, at::Tensor{}};
    auto dz = at::empty_like(z);
    rows_backward(z, dz, targets, lse, entropy, g_lp, g_ent);
    return {dz, at::Tensor{}, at::Tensor{}};
  }
};

// Throws unless every target is a row of a vocabulary of V (the kernels
// index with them).
void check_targets(const at::Tensor& targets, int64_t V, const char* op) {
  if (targets.numel() == 0) return;
  auto [lo, hi] = at::aminmax(targets);
  const int64_t a = lo.item<int64_t>(), b = hi.item<int64_t>();
  TORCH_CHECK(a >= 0 && b < V, op, ": targets run from ", a, " to ", b, "; the vocabulary has ", V, " entries");
}

}  // namespace

LinearLogprob logprob(const at::Tensor& logits, const at::Tensor& targets, bool entropies) {
  TORCH_CHECK(logits.dim() >= 1 && targets.sizes() == logits.sizes().slice(0, logits.dim() - 1), "logprob: targets ",
              targets.sizes(), " do not match logits ", logits.sizes());
  TORCH_CHECK(logits.device().is_cpu(), "logprob: no kernel for ", logits.device(),
              " yet (components/kernels/cpu only)");
  const int64_t V = logits.size(-1);
  auto flat_targets = targets.reshape({-1}).to(at::kLong).contiguous();
  check_targets(flat_targets, V, "logprob");
  auto lead = targets.sizes().vec();
  // Rows counted, not reshape's -1: that cannot tell them when V is 0.
  auto out = LogprobFn::apply(logits.reshape({flat_targets.numel(), V}).contiguous(), flat_targets, entropies);
  return {out[0].view(lead), entropies ? out[1].view(lead) : at::Tensor{}};
}

LinearLogprob linear_logprob(const at::Tensor& x, const at::Tensor& w, const at::Tensor& targets, bool entropies,
                             int64_t chunk_rows) {
  TORCH_CHECK(x.size(-1) == w.size(1), "linear_logprob: x has ", x.size(-1), " features, w ", w.size(1));
  TORCH_CHECK(targets.sizes() == x.sizes().slice(0, x.dim() - 1), "linear_logprob: targets ", targets.sizes(),
              " do not match x ", x.sizes());
  TORCH_CHECK(x.device().is_cpu() && w.device().is_cpu(), "linear_logprob: no kernel for ", x.device(),
              " yet (components/kernels/cpu only)");
  TORCH_CHECK(x.scalar_type() == w.scalar_type(), "linear_logprob: x is ", x.scalar_type(), ", w ", w.scalar_type());
  auto flat_targets = targets.reshape({-1}).to(at::kLong).contiguous();
  check_targets(flat_targets, w.size(0), "linear_logprob");
  auto lead = targets.sizes().vec();
  auto out = LinearLogprobFn::apply(x.reshape({-1, x.size(-1)}).contiguous(), w.contiguous(), flat_targets,
                                    rows_per_chunk(w.size(0), chunk_rows), entropies);
  return {out[0].view(lead), entropies ? out[1].view(lead) : at::Tensor{}};
}

}  // namespace glint::components::kernels
