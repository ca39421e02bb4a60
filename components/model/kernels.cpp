#include "components/model/kernels.hpp"

#include "components/model/compute_info.hpp"

#include <ATen/Parallel.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <functional>
#include <cstdio>
#include <cstring>
#include <mutex>

namespace glint::components {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// a [M, K] @ b[P, K]^T through oneDNN: dense in, dense out.
at::Tensor dnnl_mm_nt(const at::Tensor& a, const at::Tensor& b) {
  return at::mkldnn_linear(a.contiguous().to_mkldnn(), b.contiguous().to_mkldnn(), {}).to_dense();
}

// Whether an f32 product with `rows` rows goes to oneDNN.
bool wanted(const at::Tensor& x, int64_t rows) {
  return x.scalar_type() == at::kFloat && x.device().is_cpu() && onednn_matmul_enabled(rows);
}

// Whether the product of x (`rows` rows) and w, `madds` multiply-adds, goes
// to oneDNN: both f32, oneDNN chosen for its size class, and at least ~64k
// multiply-adds (below that the conversions cost more than they save).
bool onednn_product(const at::Tensor& x, const at::Tensor& w, int64_t rows, int64_t madds) {
  return w.scalar_type() == at::kFloat && madds >= (1 << 16) && wanted(x, rows);
}

struct DnnlLinear : torch::autograd::Function<DnnlLinear> {
  // The bias is added outside (LibTorch 1.13's custom functions take no
  // undefined tensors).
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& w) {
    auto x2 = x.reshape({-1, x.size(-1)});
    ctx->save_for_backward({x2, w});
    auto sizes = x.sizes().vec();
    sizes.back() = w.size(0);
    return dnnl_mm_nt(x2, w).view(sizes);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto saved = ctx->get_saved_variables();
    const auto& x2 = saved[0];
    const auto& w = saved[1];
    auto g = grads[0].reshape({-1, w.size(0)});
    at::Tensor gx, gw;
    if (ctx->needs_input_grad(0)) {
      auto sizes = grads[0].sizes().vec();
      sizes.back() = w.size(1);
      gx = dnnl_mm_nt(g, w.t()).view(sizes);  // g @ w
    }
    if (ctx->needs_input_grad(1)) gw = dnnl_mm_nt(g.t(), x2.t());  // g^T @ x
    return {gx, gw};
  }
};

// a [N, M, K] @ b [N, K, P], one oneDNN product per batch entry.
at::Tensor dnnl_bmm_raw(const at::Tensor& a, const at::Tensor& b) {
  auto out = at::empty({a.size(0), a.size(1), b.size(2)}, a.options());
  for (int64_t i = 0; i < a.size(0); ++i) out[i].copy_(dnnl_mm_nt(a[i], b[i].t()));
  return out;
}

struct DnnlBmm : torch::autograd::Function<DnnlBmm> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& a, const at::Tensor& b) {
    ctx->save_for_backward({a, b});
    return dnnl_bmm_raw(a, b);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto saved = ctx->get_saved_variables();
    const auto& a = saved[0];
    const auto& b = saved[1];
    const auto& g = grads[0];
    at::Tensor ga, gb;
    if (ctx->needs_input_grad(0)) ga = dnnl_bmm_raw(g, b.transpose(1, 2));  // g @ b^T
    if (ctx->needs_input_grad(1)) gb = dnnl_bmm_raw(a.transpose(1, 2), g);  // a^T @ g
    return {ga, gb};
  }
};

}  // namespace

bool onednn_available() { return at::hasMKLDNN(); }

namespace {

// Per size class (0: small, 1: large products): -1 not decided yet; 0:
// ATen; 1: oneDNN.
std::atomic<int> use_onednn[2] = {-1, -1};

// LargeProductScopes alive on this thread.
thread_local int large_product_scopes = 0;

int size_class(int64_t rows) { return large_product_scopes > 0 || rows >= kLargeProductRows ? 1 : 0; }

// Seconds of the best of a few runs of `f`.
double best_seconds(const std::function<void()>& f) {
  double best = 1e9;
  for (int i = 0; i < 5; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    f();
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return best;
}

// By timing, as GLINT_MATMUL=measure asks: the faster library on this
// machine now, which a loaded machine can answer differently from run to
// run (a 1-in-34 difference in the last bits of identical runs came from it).
bool measure(int cls) {
  // A product of the class's size, [rows, 512] x [512, 1536], with oneDNN's
  // per-call conversions included, as fast_linear pays them. The two differ:
  // on an AVX-512 VM, oneDNN took 1.75x ATen's (OpenBLAS's) time at 256 rows
  // and 0.6 to 0.76x at 2048, so one answer for both was wrong for one, and
  // a measurement at 256 rows flipped from run to run.
  c10::InferenceMode guard;
  auto x = at::randn({cls == 1 ? 2048 : 256, 512}), w = at::randn({1536, 512});
  (void)at::linear(x, w);
  (void)dnnl_mm_nt(x, w);
  const double aten = best_seconds([&] { (void)at::linear(x, w); });
  const double dnnl = best_seconds([&] { (void)dnnl_mm_nt(x, w); });
  return dnnl < 0.8 * aten;
}

// The rule by default, fixed by the size class and the CPU so that every
// run on a machine makes the same choice (and so the same bits): oneDNN
// for large products on CPUs with AVX-512, where it measured 0.6 to 0.76x
// OpenBLAS's time at 2048 rows; ATen (OpenBLAS) for small products
// everywhere (oneDNN took 1.75x its time at 256 rows, its per-call
// conversions dominating) and for large ones on AVX2 machines, where
// oneDNN was not clearly faster (docs/models.md).
bool rule(int cls) { return cls == 1 && __builtin_cpu_supports("avx512f"); }

bool decide(int cls) {
  if (!onednn_available()) return false;
  if (const char* env = std::getenv("GLINT_MATMUL"); env && *env) {
    if (std::strcmp(env, "aten") == 0) return false;
    if (std::strcmp(env, "onednn") == 0) return true;
    if (std::strcmp(env, "measure") == 0) return measure(cls);
    static std::once_flag warned;
    std::call_once(warned, [env] {
      std::fprintf(stderr, "glint warning: GLINT_MATMUL=%s is not one of aten, onednn, measure: using the default rule\n",
                   env);
    });
  }
  return rule(cls);
}

}  // namespace

LargeProductScope::LargeProductScope() { ++large_product_scopes; }
LargeProductScope::~LargeProductScope() { --large_product_scopes; }

bool onednn_by_rule(int64_t rows) { return onednn_available() && rule(size_class(rows)); }

bool onednn_matmul_enabled(int64_t rows) {
  auto& choice = use_onednn[size_class(rows)];
  int v = choice.load(std::memory_order_relaxed);
  if (v < 0) {
    // Two threads may both measure; either answer is a valid choice.
    int expected = -1;
    choice.compare_exchange_strong(expected, decide(size_class(rows)) ? 1 : 0);
    v = choice.load();
  }
  return v == 1;
}

bool set_onednn_matmul(bool small, bool large) {
  if ((small || large) && !onednn_available()) return false;
  use_onednn[0].store(small ? 1 : 0);
  use_onednn[1].store(large ? 1 : 0);
  return true;
}

at::Tensor pack_linear_weight(const at::Tensor& w) {
  // Packed for decoding: products of a few rows each step.
  if (w.dim() != 2 || !wanted(w, 1)) return w;
  return w.contiguous().to_mkldnn();
}

at::Tensor fast_linear(const at::Tensor& x, const at::Tensor& w, const c10::optional<at::Tensor>& b) {
  if (w.is_mkldnn()) {
    auto sizes = x.sizes().vec();
    sizes.back() = w.size(0);
    auto y = at::mkldnn_linear(x.reshape({-1, x.size(-1)}).contiguous().to_mkldnn(), w, {}).to_dense().view(sizes);
    return b && b->defined() ? y + *b : y;
  }
  const int64_t rows = x.numel() / std::max<int64_t>(x.size(-1), 1);
  if (!onednn_product(x, w, rows, rows * w.numel())) return at::linear(x, w, b);
  auto y = DnnlLinear::apply(x, w);
  return b && b->defined() ? y + *b : y;
}

void fast_linear_into(at::Tensor& out, const at::Tensor& a, const at::Tensor& b, bool accumulate) {
  if (onednn_product(a, b, a.size(0), a.size(0) * b.numel())) {
    auto y = dnnl_mm_nt(a, b);
    if (accumulate) {
      out.add_(y);
    } else {
      out.copy_(y);
    }
    return;
  }
  out.addmm_(a, b.t(), accumulate ? 1.0 : 0.0, 1.0);
}

at::Tensor fast_bmm(const at::Tensor& a, const at::Tensor& b) {
  if (!onednn_product(a, b, a.size(1), a.size(1) * a.size(2) * b.size(2))) return at::matmul(a, b);
  return DnnlBmm::apply(a, b);
}

}  // namespace glint::components

namespace glint::components {

ComputeInfo compute_info() {
  ComputeInfo c;
  c.matmul_small = onednn_matmul_enabled(1) ? "onednn" : "aten";
  c.matmul_large = onednn_matmul_enabled(kLargeProductRows) ? "onednn" : "aten";
  const char* env = std::getenv("GLINT_MATMUL");
  c.matmul_choice = !env || !*env ? "rule"
                    : std::strcmp(env, "measure") == 0 ? "GLINT_MATMUL=measure (timed: not deterministic)"
                                                       : std::string{"GLINT_MATMUL="} + env;
  c.intra_op_threads = at::get_num_threads();
  c.inter_op_threads = at::get_num_interop_threads();
  c.avx512 = __builtin_cpu_supports("avx512f");
  return c;
}

std::string ComputeInfo::json() const {
  return "{\"matmul_small\": \"" + matmul_small + "\", \"matmul_large\": \"" + matmul_large +
         "\", \"matmul_choice\": \"" + matmul_choice + "\", \"intra_op_threads\": " + std::to_string(intra_op_threads) +
         ", \"inter_op_threads\": " + std::to_string(inter_op_threads) + ", \"avx512\": " + (avx512 ? "true" : "false") +
         "}\n";
}

}  // namespace glint::components
