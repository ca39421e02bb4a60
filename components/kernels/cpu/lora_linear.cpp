// kernels::lora_linear on the CPU: a linear layer and its LoRA adapter in
// one autograd node, the adapter's rank-r products in row loops.
#include "components/kernels/cpu/common.hpp"
#include "components/kernels/cpu/matmul_holder.hpp"
#include "components/kernels/fused.hpp"

#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <type_traits>
#include <utility>
#include <vector>

namespace glint::components::kernels {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Up to this rank the row loops below run the adapter's products; above it
// the products have enough columns for BLAS to do better, and go there.
constexpr int64_t kLoopRank = 32;

// The loops take the rank as a template argument R for the usual ranks, so
// that a row's R values live in vector registers (R = 0: any rank up to
// kLoopRank, read at run time).
template <int R>
constexpr int64_t rank_or(int64_t r) {
  return R > 0 ? R : r;
}

// Rows project_rows takes at a time: as many as keep their r sums in eight
// 256-bit registers (at most 8): each row of vt then serves them all, and
// their sums make that many independent chains of FMAs.
template <typename T, int R>
constexpr int64_t project_block() {
  if constexpr (R <= 0) {
    return 4;
  } else {
    constexpr int64_t b = 256 / (R * static_cast<int64_t>(sizeof(T)));
    return b >= 8 ? 8 : b >= 4 ? 4 : b >= 2 ? 2 : 1;
  }
}

// out[i, :] = sum_d x[i, d] vt[d, :], rows [i0, i1): x [N, D], vt [D, r]
// (v^T), out [N, r]. project_block rows at a time, then one at a time.
template <typename T, int R>
GLINT_KERNEL_CLONES void project_rows(const T* x, const T* vt, T* out, int64_t i0, int64_t i1, int64_t D,
                                      int64_t r_) {
  const int64_t r = rank_or<R>(r_);
  constexpr int64_t n = R > 0 ? R : kLoopRank;
  constexpr int64_t B = project_block<T, R>();
  int64_t i = i0;
  for (; i + B <= i1; i += B) {
    const T* xb = x + i * D;
    T a[B][n] = {};
    for (int64_t d = 0; d < D; ++d) {
      const T* vd = vt + d * r;
      for (int64_t b = 0; b < B; ++b) {
        const T e = xb[b * D + d];
#pragma omp simd
        for (int64_t k = 0; k < r; ++k) a[b][k] += e * vd[k];
      }
    }
    for (int64_t b = 0; b < B; ++b)
      for (int64_t k = 0; k < r; ++k) out[(i + b) * r + k] = a[b][k];
  }
  for (; i < i1; ++i) {
    const T* xi = x + i * D;
    T a[n] = {};
    for (int64_t d = 0; d < D; ++d) {
      const T* vd = vt + d * r;
      const T e = xi[d];
#pragma omp simd
      for (int64_t k = 0; k < r; ++k) a[k] += e * vd[k];
    }
    for (int64_t k = 0; k < r; ++k) out[i * r + k] = a[k];
  }
}

// y[i, :] = bias + alpha sum_k u[i, k] v[k, :], rows [i0, i1): y [N, D],
// u [N, r], v [r, D], bias [D] or null (none). y is only written, once; the
// [N, D] product is never formed. At a fixed rank the k loop unrolls and
// each vector of y takes its r terms in a register; at another rank y's row
// takes them one v row at a time (it stays in L1).
template <typename T, int R, bool Bias>
GLINT_KERNEL_CLONES void write_low_rank_rows(T* __restrict y, const T* __restrict u, const T* __restrict v,
                                             const T* __restrict bias, T alpha, int64_t i0, int64_t i1, int64_t D,
                                             int64_t r_) {
  const int64_t r = rank_or<R>(r_);
  T c[R > 0 ? R : kLoopRank];
  for (int64_t i = i0; i < i1; ++i) {
    T* __restrict yi = y + i * D;
    for (int64_t k = 0; k < r; ++k) c[k] = alpha * u[i * r + k];
    if constexpr (R > 0) {
#pragma omp simd
      for (int64_t d = 0; d < D; ++d) {
        T t = Bias ? bias[d] : T(0);
        for (int64_t k = 0; k < R; ++k) t += c[k] * v[k * D + d];
        yi[d] = t;
      }
    } else {
#pragma omp simd
      for (int64_t d = 0; d < D; ++d) yi[d] = Bias ? bias[d] : T(0);
      for (int64_t k = 0; k < r; ++k) {
        const T* vk = v + k * D;
        const T ck = c[k];
#pragma omp simd
        for (int64_t d = 0; d < D; ++d) yi[d] += ck * vk[d];
      }
    }
  }
}

// acc[d, :] += sum_i x[i, d] u[i, :] over all N rows, columns [d0, d1):
// u [N, r], x [N, D], acc [D, r] (the result transposed: a column's r sums
// sit together, one vector at rank 8). Rows stream in order, eight or four
// at a time (each acc row read and written once per block); each column's
// sum runs over the rows in order whatever the threads.
template <typename T, int R>
GLINT_KERNEL_CLONES void outer_rows(const T* u, const T* x, T* acc, int64_t N, int64_t D, int64_t r_, int64_t d0,
                                    int64_t d1) {
  const int64_t r = rank_or<R>(r_);
  constexpr int64_t n = R > 0 ? R : kLoopRank;
  int64_t i = 0;
  if constexpr (R > 0 && R * sizeof(T) <= 32) {
    // A row of u in one vector (rank 8 in f32): eight rows at a time, each
    // acc row read and written once per eight (15 to 25% faster than four
    // on [2048, 1536] x rank 8, timed alone).
    for (; i + 8 <= N; i += 8) {
      const T* x0 = x + i * D;
      T v[8][R];
      for (int64_t b = 0; b < 8; ++b)
        for (int64_t k = 0; k < R; ++k) v[b][k] = u[(i + b) * R + k];
      for (int64_t d = d0; d < d1; ++d) {
        T* ad = acc + d * R;
        T e[8];
        for (int64_t b = 0; b < 8; ++b) e[b] = x0[b * D + d];
#pragma omp simd
        for (int64_t k = 0; k < R; ++k)
          ad[k] += ((e[0] * v[0][k] + e[1] * v[1][k]) + (e[2] * v[2][k] + e[3] * v[3][k])) +
                   ((e[4] * v[4][k] + e[5] * v[5][k]) + (e[6] * v[6][k] + e[7] * v[7][k]));
      }
    }
  }
  for (; i + 4 <= N; i += 4) {
    const T* x0 = x + i * D;
    const T *x1 = x0 + D, *x2 = x1 + D, *x3 = x2 + D;
    // The four rows of u in locals: at a fixed rank, registers for the
    // whole column loop.
    T u0[n], u1[n], u2[n], u3[n];
    for (int64_t k = 0; k < r; ++k) {
      u0[k] = u[i * r + k];
      u1[k] = u[(i + 1) * r + k];
      u2[k] = u[(i + 2) * r + k];
      u3[k] = u[(i + 3) * r + k];
    }
    for (int64_t d = d0; d < d1; ++d) {
      T* ad = acc + d * r;
      const T e0 = x0[d], e1 = x1[d], e2 = x2[d], e3 = x3[d];
#pragma omp simd
      for (int64_t k = 0; k < r; ++k) ad[k] += ((e0 * u0[k] + e1 * u1[k]) + e2 * u2[k]) + e3 * u3[k];
    }
  }
  for (; i < N; ++i) {
    const T* xi = x + i * D;
    const T* ui = u + i * r;
    for (int64_t d = d0; d < d1; ++d) {
      T* ad = acc + d * r;
      const T e = xi[d];
#pragma omp simd
      for (int64_t k = 0; k < r; ++k) ad[k] += e * ui[k];
    }
  }
}

// f<R>() for the rank r: R = r for the usual ranks, else 0 (read at run time).
template <typename F>
void with_rank(int64_t r, F&& f) {
  switch (r) {
    case 4: f(std::integral_constant<int, 4>{}); break;
    case 8: f(std::integral_constant<int, 8>{}); break;
    case 16: f(std::integral_constant<int, 16>{}); break;
    case 32: f(std::integral_constant<int, 32>{}); break;
    default: f(std::integral_constant<int, 0>{}); break;
  }
}

// x vt: x [N, D], vt [D, r] contiguous -> [N, r].
at::Tensor project(const at::Tensor& x, const at::Tensor& vt) {
  const int64_t N = x.size(0), D = x.size(1), r = vt.size(1);
  if (r > kLoopRank) return at::mm(x, vt);
  auto out = at::empty({N, r}, x.options());
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "lora_project", [&] {
    const auto *px = x.data_ptr<scalar_t>(), *pv = vt.data_ptr<scalar_t>();
    auto* po = out.data_ptr<scalar_t>();
    with_rank(r, [&](auto R) {
      at::parallel_for(0, N, cpu::grain_rows(D * r), [&](int64_t i0, int64_t i1) {
        project_rows<scalar_t, decltype(R)::value>(px, pv, po, i0, i1, D, r);
      });
    });
  });
  return out;
}

// [N, D] = bias + alpha u v: u [N, r], v [r, D], bias [D] (undefined:
// none), all contiguous. The base product then adds itself to it.
at::Tensor write_low_rank(const at::Tensor& u, const at::Tensor& v, double alpha, const at::Tensor& bias = {}) {
  const int64_t N = u.size(0), D = v.size(1), r = u.size(1);
  if (r > kLoopRank) {
    auto y = bias.defined() ? bias.expand({N, D}).clone(at::MemoryFormat::Contiguous) : at::zeros({N, D}, u.options());
    return y.addmm_(u, v, 1.0, alpha);
  }
  auto y = at::empty({N, D}, u.options());
  AT_DISPATCH_FLOATING_TYPES(y.scalar_type(), "lora_write_low_rank", [&] {
    auto* py = y.data_ptr<scalar_t>();
    const auto *pu = u.data_ptr<scalar_t>(), *pv = v.data_ptr<scalar_t>();
    const scalar_t* pb = bias.defined() ? bias.data_ptr<scalar_t>() : nullptr;
    with_rank(r, [&](auto R) {
      at::parallel_for(0, N, cpu::grain_rows(D * r), [&](int64_t i0, int64_t i1) {
        const auto alpha_ = static_cast<scalar_t>(alpha);
        if (pb) {
          write_low_rank_rows<scalar_t, decltype(R)::value, true>(py, pu, pv, pb, alpha_, i0, i1, D, r);
        } else {
          write_low_rank_rows<scalar_t, decltype(R)::value, false>(py, pu, pv, pb, alpha_, i0, i1, D, r);
        }
      });
    });
  });
  return y;
}

// alpha x^T u: u [N, r], x [N, D] contiguous -> [D, r].
at::Tensor outer(const at::Tensor& u, const at::Tensor& x, double alpha) {
  const int64_t N = x.size(0), D = x.size(1), r = u.size(1);
  if (r > kLoopRank) return at::mm(x.t(), u).mul_(alpha);
  auto acc = at::zeros({D, r}, x.options());
  // Columns per pass over the rows: their r sums (16 KiB) stay in L1.
  const int64_t cols = std::max<int64_t>(8, (int64_t{16} << 10) / (r * static_cast<int64_t>(x.element_size())));
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "lora_outer", [&] {
    const auto *pu = u.data_ptr<scalar_t>(), *px = x.data_ptr<scalar_t>();
    auto* pa = acc.data_ptr<scalar_t>();
    with_rank(r, [&](auto R) {
      at::parallel_for(0, D, std::min(cols, D), [&](int64_t c0, int64_t c1) {
        for (int64_t d0 = c0; d0 < c1; d0 += cols)
          outer_rows<scalar_t, decltype(R)::value>(pu, px, pa, N, D, r, d0, std::min(c1, d0 + cols));
      });
    });
  });
  return acc.mul_(alpha);
}

struct LoraLinearFn : torch::autograd::Function<LoraLinearFn> {
  // x [N, in], w [out, in], bias [out] (with_bias; else empty: autograd
  // takes no undefined input), a [r, in], b [out, r], u [N, in] the
  // adapter's own input (separate; else empty, and the adapter reads x),
  // all contiguous -> [N, out].
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& w, const at::Tensor& bias,
                            bool with_bias, const at::Tensor& a, const at::Tensor& b, const at::Tensor& u,
                            bool separate, double scale, const MatmulIntoNT& mm) {
    const auto& in = separate ? u : x;
    auto xa = project(in, a.t().contiguous());  // in a^T [N, r]
    // y = bias + s (in a^T) b^T, then += x w^T: the product's GEMM adds
    // into what is there (rows of out contiguous).
    auto y = write_low_rank(xa, b.t().contiguous(), scale, with_bias ? bias : at::Tensor{});
    mm(y, x, w, /*accumulate=*/true);
    ctx->save_for_backward({x, w, a, b, xa, u});
    ctx->saved_data["scale"] = scale;
    ctx->saved_data["with_bias"] = with_bias;
    ctx->saved_data["separate"] = separate;
    cpu::save_matmul(ctx, mm);
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto saved = ctx->get_saved_variables();
    const auto &x = saved[0], &w = saved[1], &a = saved[2], &b = saved[3], &xa = saved[4], &u = saved[5];
    const double s = ctx->saved_data["scale"].toDouble();
    const bool separate = ctx->saved_data["separate"].toBool();
    const auto& in = separate ? u : x;  // what the adapter read
    const auto& mm = cpu::saved_matmul<MatmulIntoNT>(ctx);
    auto g = grads[0].contiguous();  // [N, out]
    // needs_input_grad counts the tensor inputs only: x w bias a b u.
    const bool need_x = ctx->needs_input_grad(0), need_a = ctx->needs_input_grad(3);
    const bool need_u = separate && ctx->needs_input_grad(5);
    at::Tensor dx, dw, dbias, da, db, du;
    // g b: [N, r], what the adapter's down projection receives (before s).
    at::Tensor gb;
    if ((need_x && !separate) || need_a || need_u) gb = project(g, b);
    if (need_x) {
      // s (g b) a, then += g w; or g w alone where the adapter read u.
      dx = separate ? at::empty({g.size(0), w.size(1)}, g.options()) : write_low_rank(gb, a, s);
      mm(dx, g, w.t(), /*accumulate=*/!separate);
    }
    if (need_u) du = write_low_rank(gb, a, s);  // s (g b) a
    if (ctx->needs_input_grad(1)) {
      dw = at::empty_like(w);
      mm(dw, g.t(), x.t(), /*accumulate=*/false);  // g^T x
    }
    if (ctx->needs_input_grad(2) && ctx->saved_data["with_bias"].toBool()) dbias = g.sum(0);
    if (need_a) da = outer(gb, in, s).t().contiguous();  // s (g b)^T in
    if (ctx->needs_input_grad(4)) db = outer(xa, g, s);   // s g^T (in a^T)
    return {dx, dw, dbias, at::Tensor{}, da, db, du, at::Tensor{}, at::Tensor{}, at::Tensor{}};
  }
};

}  // namespace

at::Tensor lora_linear(const at::Tensor& x, const at::Tensor& w, const c10::optional<at::Tensor>& bias,
                       const at::Tensor& a, const at::Tensor& b, double scale, const MatmulIntoNT& mm,
                       const at::Tensor& adapter_input) {
  cpu::check_floating_cpu(x, "lora_linear", "x");
  cpu::check_floating_cpu(w, "lora_linear", "w");
  cpu::check_floating_cpu(a, "lora_linear", "a");
  cpu::check_floating_cpu(b, "lora_linear", "b");
  const int64_t in = x.size(-1);
  TORCH_CHECK(w.dim() == 2 && w.size(1) == in && a.dim() == 2 && a.size(1) == in && b.dim() == 2 &&
                  b.size(0) == w.size(0) && b.size(1) == a.size(0),
              "lora_linear: x is ", x.sizes(), ", w ", w.sizes(), ", a ", a.sizes(), ", b ", b.sizes(),
              "; expected x [..., in], w [out, in], a [r, in], b [out, r]");
  TORCH_CHECK(a.size(0) > 0, "lora_linear: the adapter's rank is 0");
  const bool with_bias = bias && bias->defined();
  if (with_bias) {
    cpu::check_floating_cpu(*bias, "lora_linear", "bias");
    TORCH_CHECK(bias->dim() == 1 && bias->size(0) == w.size(0), "lora_linear: bias is ", bias->sizes(), ", w ",
                w.sizes());
  }
  const bool separate = adapter_input.defined();
  if (separate) {
    cpu::check_floating_cpu(adapter_input, "lora_linear", "adapter_input");
    TORCH_CHECK(adapter_input.sizes() == x.sizes(), "lora_linear: adapter_input is ", adapter_input.sizes(),
                "; it must have x's shape ", x.sizes());
  }
  std::vector<const at::Tensor*> same{&w, &a, &b};
  if (with_bias) same.push_back(&*bias);
  if (separate) same.push_back(&adapter_input);
  for (const auto* t : same)
    TORCH_CHECK(t->scalar_type() == x.scalar_type(), "lora_linear: x is ", x.scalar_type(), " but a weight or input is ",
                t->scalar_type());
  MatmulIntoNT product = mm ? mm : MatmulIntoNT{[](at::Tensor& out, const at::Tensor& p, const at::Tensor& q, bool acc) {
    out.addmm_(p, q.t(), acc ? 1.0 : 0.0, 1.0);
  }};
  auto y = LoraLinearFn::apply(x.reshape({-1, in}).contiguous(), w.contiguous(),
                               with_bias ? bias->contiguous() : at::empty({0}, x.options()), with_bias, a.contiguous(),
                               b.contiguous(),
                               separate ? adapter_input.reshape({-1, in}).contiguous() : at::empty({0}, x.options()),
                               separate, scale, product);
  auto sizes = x.sizes().vec();
  sizes.back() = w.size(0);
  return y.view(sizes);
}

}  // namespace glint::components::kernels
