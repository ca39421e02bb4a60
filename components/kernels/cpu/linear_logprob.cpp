// kernels::linear_logprob on the CPU: chunks of rows through the LM head.
#include "components/kernels/fused.hpp"

#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>

namespace glint::components::kernels {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

int64_t rows_per_chunk(int64_t vocab, int64_t asked) {
  if (asked > 0) return asked;
  constexpr int64_t budget = int64_t{32} << 20;  // bytes of f32 logits per chunk
  return std::max<int64_t>(16, budget / (4 * std::max<int64_t>(vocab, 1)));
}

struct LinearLogprobFn : torch::autograd::Function<LinearLogprobFn> {
  // x [N, H], w [V, H], targets [N] -> {logprobs [N], entropies [N]}.
  static variable_list forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& w,
                               const at::Tensor& targets, int64_t chunk, bool entropies) {
    at::NoGradGuard no_grad;
    const int64_t N = x.size(0);
    auto lse = at::empty({N}, x.options()), target_logp = at::empty({N}, x.options()),
         entropy = entropies ? at::empty({N}, x.options()) : at::zeros({N}, x.options());
    for (int64_t r = 0; r < N; r += chunk) {
      const int64_t e = std::min(N, r + chunk);
      auto z = at::mm(x.slice(0, r, e), w.t());  // [n, V]
      auto l = at::logsumexp(z, 1);
      lse.slice(0, r, e).copy_(l);
      target_logp.slice(0, r, e).copy_(z.gather(1, targets.slice(0, r, e).unsqueeze(1)).squeeze(1) - l);
      if (entropies) {
        // log p = z - lse elementwise, then H = -sum p log p: with logits in
        // the hundreds, lse - E[z] would cancel away float32's digits.
        auto logp = z.sub_(l.unsqueeze(1));
        entropy.slice(0, r, e).copy_(-(logp.exp() * logp).sum(1));
      }
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
    const auto& g_lp = grads[0];
    const auto& g_ent = grads[1];
    const bool want_x = ctx->needs_input_grad(0), want_w = ctx->needs_input_grad(1);
    at::Tensor gx = want_x ? at::empty_like(x) : at::Tensor{};
    at::Tensor gw = want_w ? at::zeros_like(w) : at::Tensor{};
    const int64_t N = x.size(0);
    for (int64_t r = 0; r < N; r += chunk) {
      const int64_t e = std::min(N, r + chunk);
      auto xr = x.slice(0, r, e);
      auto logp = at::mm(xr, w.t()).sub_(lse.slice(0, r, e).unsqueeze(1));  // [n, V], again
      auto p = logp.exp();
      // d logp(t)/dz = onehot(t) - p;  dH/dz = -p (z - E[z]) = -p (log p + H).
      at::Tensor dz;
      if (g_lp.defined()) {
        auto g = g_lp.slice(0, r, e).unsqueeze(1);
        dz = -g * p;
        dz.scatter_add_(1, targets.slice(0, r, e).unsqueeze(1), g);
      } else {
        dz = at::zeros_like(logp);
      }
      if (g_ent.defined() && entropy_wanted)
        dz.sub_(g_ent.slice(0, r, e).unsqueeze(1) * p * (logp + entropy.slice(0, r, e).unsqueeze(1)));
      if (want_x) gx.slice(0, r, e).copy_(at::mm(dz, w));
      if (want_w) gw.addmm_(dz.t(), xr);
    }
    return {gx, gw, at::Tensor{}, at::Tensor{}, at::Tensor{}};
  }
};

}  // namespace

LinearLogprob linear_logprob(const at::Tensor& x, const at::Tensor& w, const at::Tensor& targets, bool entropies,
                             int64_t chunk_rows) {
  TORCH_CHECK(x.size(-1) == w.size(1), "linear_logprob: x has ", x.size(-1), " features, w ", w.size(1));
  TORCH_CHECK(targets.sizes() == x.sizes().slice(0, x.dim() - 1), "linear_logprob: targets ", targets.sizes(),
              " do not match x ", x.sizes());
  TORCH_CHECK(x.device().is_cpu() && w.device().is_cpu(), "linear_logprob: no kernel for ", x.device(),
              " yet (components/kernels/cpu only)");
  TORCH_CHECK(x.scalar_type() == w.scalar_type(), "linear_logprob: x is ", x.scalar_type(), ", w ", w.scalar_type());
  auto lead = targets.sizes().vec();
  auto out = LinearLogprobFn::apply(x.reshape({-1, x.size(-1)}).contiguous(), w.contiguous(),
                                    targets.reshape({-1}).to(at::kLong).contiguous(),
                                    rows_per_chunk(w.size(0), chunk_rows), entropies);
  return {out[0].view(lead), entropies ? out[1].view(lead) : at::Tensor{}};
}

}  // namespace glint::components::kernels
