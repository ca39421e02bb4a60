#pragma once
/// Matrix products for the model, through oneDNN where it is faster.
///
/// Debian's LibTorch sends f32 matmuls to the system BLAS: the reference
/// implementation unless an optimised one is installed, about 2 GFLOP/s on
/// one core of the 2-core VM this was measured on, against ~70 for OpenBLAS.
/// The same LibTorch ships oneDNN (~70 too, but its tensors are converted on
/// every call). Each size class (kLargeProductRows) has its library chosen
/// by a fixed rule, so that every run on a machine computes the same bits:
/// oneDNN for large products on CPUs with AVX-512 (where it measured clearly
/// faster), ATen's own functions otherwise (onednn_by_rule).
/// GLINT_MATMUL=aten or =onednn decides instead; GLINT_MATMUL=measure times
/// both on the first product of each class and keeps the faster, which may
/// differ from run to run on a loaded machine (not deterministic). oneDNN
/// runs f32 only, with autograd; other dtypes (f64 in the gradient tests)
/// and tiny products always go to ATen.

#include <ATen/ATen.h>

#include <cstdint>

namespace glint::components {

/// x [..., in] @ w[out, in]^T (+ b[out]), like at::linear.
at::Tensor fast_linear(const at::Tensor& x, const at::Tensor& w, const c10::optional<at::Tensor>& b = {});

/// out = a @ b^T, or out += a @ b^T when `accumulate` (2-d, no autograd;
/// out [M, P] contiguous), by fast_linear's choice of library: ATen's addmm
/// (a GEMM with beta 0 or 1 on `out` itself), or oneDNN's product then
/// copied or added in. kernels::MatmulIntoNT for the model's fused kernels.
/// Only ATen's path saves the pass that clears the output: oneDNN's makes
/// its product apart and adds it (one [M, P] tensor and pass more than
/// forming the product in out would take, as the old order did).
void fast_linear_into(at::Tensor& out, const at::Tensor& a, const at::Tensor& b, bool accumulate);

/// `w` [out, in] converted once to oneDNN's own layout, for inference that
/// reuses it every step (the sampler): fast_linear then skips converting it
/// on every call. Without oneDNN (or for another dtype) `w` itself. No
/// gradients flow through a packed weight.
at::Tensor pack_linear_weight(const at::Tensor& w);

/// Batched a [N, M, K] @ b [N, K, P], like at::matmul on 3-d tensors.
at::Tensor fast_bmm(const at::Tensor& a, const at::Tensor& b);

/// Products of at least this many rows (training batches) are measured and
/// chosen apart from smaller ones (decoding steps): oneDNN's per-call
/// conversions weigh more on small products.
constexpr int64_t kLargeProductRows = 1024;
/// Whether fast_linear/fast_bmm use oneDNN for f32 products of `rows` rows
/// in this process (measured once per size class, on first use).
bool onednn_matmul_enabled(int64_t rows = kLargeProductRows);
/// While one lives on a thread, that thread's products of any row count
/// take the large-product choice (onednn_matmul_enabled(kLargeProductRows)).
/// For training's mid-sized products, the experts of an MoE block (each
/// expert's slice of the tokens): there, forward and backward through
/// autograd, eight [n, 512] x [512, 768] products of n around a mean took,
/// on one thread, 0.98x ATen's (OpenBLAS's) time with oneDNN at a mean of 64
/// rows, 0.78x at 128, 0.73x at 256, 0.65x at 512, 0.63x at 1024 (AVX-512
/// VM, 2026-12-02); the small-product choice was
/// measured on forward-only products with their conversions, as decoding runs
/// them. The choice is made in the forward pass; the backward follows it.
class LargeProductScope {
public:
  LargeProductScope();
  ~LargeProductScope();
  LargeProductScope(const LargeProductScope&) = delete;
  LargeProductScope& operator=(const LargeProductScope&) = delete;
};
/// The default rule's choice for products of `rows` rows on this CPU (what
/// onednn_matmul_enabled answers without GLINT_MATMUL).
bool onednn_by_rule(int64_t rows);
/// Whether this LibTorch has oneDNN at all.
bool onednn_available();
/// Overrides the choice for small and large products (tests and
/// benchmarks); false when oneDNN is missing and either asks for it.
bool set_onednn_matmul(bool small, bool large);
inline bool set_onednn_matmul(bool on) { return set_onednn_matmul(on, on); }

}  // namespace glint::components
