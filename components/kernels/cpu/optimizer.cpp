// kernels::adamw_step and sum_of_squares on the CPU: one pass over each
// parameter, split over LibTorch's threads.
#include "components/kernels/cpu/common.hpp"
#include "components/kernels/fused.hpp"

#include <algorithm>
#include <cmath>
#include <vector>

namespace glint::components::kernels {

namespace {

// One element: the weight decayed by d, then the moments and the update.
template <typename T>
inline void adamw_one(T& p, T g, T& m, T& v, T d, T b1, T c1, T b2, T c2, T correction2, T eps, T step) {
  const T w = p * d;
  const T mi = m * b1 + c1 * g;
  const T vi = v * b2 + c2 * g * g;
  m = mi;
  v = vi;
  p = w + step * (mi / (std::sqrt(vi / correction2) + eps));
}

// c1 = 1 - beta1, c2 = 1 - beta2, step = -lr / correction1. The mask is
// read as bytes (0 or 1): GCC vectorises no loop that loads a bool.
template <typename T>
GLINT_KERNEL_CLONES void adamw_span(T* p, const T* g, T* m, T* v, const uint8_t* mask, int64_t n, T decay, T b1, T c1,
                                    T b2, T c2, T correction2, T eps, T step) {
  if (mask) {
#pragma omp simd
    for (int64_t i = 0; i < n; ++i)
      adamw_one(p[i], g[i], m[i], v[i], mask[i] ? decay : T{1}, b1, c1, b2, c2, correction2, eps, step);
  } else {
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) adamw_one(p[i], g[i], m[i], v[i], decay, b1, c1, b2, c2, correction2, eps, step);
  }
}

template <typename T>
GLINT_KERNEL_CLONES double squares_span(const T* x, int64_t n) {
  double sum = 0;
#pragma omp simd reduction(+ : sum)
  for (int64_t i = 0; i < n; ++i) sum += static_cast<double>(x[i]) * static_cast<double>(x[i]);
  return sum;
}

}  // namespace

bool adamw_step_fits(const at::Tensor& p, const at::Tensor& g, const at::Tensor& m, const at::Tensor& v,
                     const at::Tensor& decay_mask) {
  auto same = [&](const at::Tensor& t) {
    return t.defined() && t.device().is_cpu() && t.layout() == at::kStrided && t.is_contiguous() &&
           t.scalar_type() == p.scalar_type() && t.sizes() == p.sizes();
  };
  if (!(p.scalar_type() == at::kFloat || p.scalar_type() == at::kDouble)) return false;
  if (!same(p) || !same(g) || !same(m) || !same(v)) return false;
  return !decay_mask.defined() || (decay_mask.scalar_type() == at::kBool && decay_mask.device().is_cpu() &&
                                   decay_mask.is_contiguous() && decay_mask.sizes() == p.sizes());
}

void adamw_step(const at::Tensor& p, const at::Tensor& g, const at::Tensor& m, const at::Tensor& v,
                const at::Tensor& decay_mask, const AdamwStep& s) {
  TORCH_CHECK(adamw_step_fits(p, g, m, v, decay_mask),
              "adamw_step: p, g, m and v must be contiguous CPU tensors of one shape and dtype (f32 or f64), and "
              "decay_mask bool of that shape; p is ",
              p.sizes(), " ", p.scalar_type(), ", g ", g.sizes(), " ", g.scalar_type());
  TORCH_CHECK(s.correction1 > 0 && s.correction2 > 0, "adamw_step: bias corrections must be positive");
  const int64_t n = p.numel();
  AT_DISPATCH_FLOATING_TYPES(p.scalar_type(), "adamw_step", [&] {
    using T = scalar_t;
    T* pp = p.data_ptr<T>();
    const T* gp = g.data_ptr<T>();
    T* mp = m.data_ptr<T>();
    T* vp = v.data_ptr<T>();
    const uint8_t* mask = decay_mask.defined() ? cpu::bool_bytes(decay_mask) : nullptr;
    // The scalars as the composition's in-place ops see them: rounded to the
    // parameter's precision.
    const auto decay = static_cast<T>(s.decay), b1 = static_cast<T>(s.beta1), c1 = static_cast<T>(1.0 - s.beta1),
               b2 = static_cast<T>(s.beta2), c2 = static_cast<T>(1.0 - s.beta2),
               corr2 = static_cast<T>(s.correction2), eps = static_cast<T>(s.eps),
               step = static_cast<T>(-s.lr / s.correction1);
    at::parallel_for(0, n, 32768, [&](int64_t b, int64_t e) {
      adamw_span(pp + b, gp + b, mp + b, vp + b, mask ? mask + b : nullptr, e - b, decay, b1, c1, b2, c2, corr2, eps,
                 step);
    });
  });
}

double sum_of_squares(const at::Tensor& t) {
  cpu::check_floating_cpu(t, "sum_of_squares", "t");
  auto c = t.contiguous();
  const int64_t n = c.numel();
  double total = 0;
  AT_DISPATCH_FLOATING_TYPES(c.scalar_type(), "sum_of_squares", [&] {
    const scalar_t* x = c.data_ptr<scalar_t>();
    // One partial per task, summed in task order: the same answer for the
    // same thread count.
    constexpr int64_t grain = 1 << 16;
    const int64_t tasks = (n + grain - 1) / grain;
    std::vector<double> partial(static_cast<size_t>(tasks), 0.0);
    at::parallel_for(0, tasks, 1, [&](int64_t b, int64_t e) {
      for (int64_t k = b; k < e; ++k)
        partial[static_cast<size_t>(k)] = squares_span(x + k * grain, std::min(grain, n - k * grain));
    });
    for (double v : partial) total += v;
  });
  return total;
}

}  // namespace glint::components::kernels
