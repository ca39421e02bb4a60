#pragma once
/// Matrix products for the model, through oneDNN where it is faster.
///
/// Debian's LibTorch sends f32 matmuls to the system BLAS, which is the
/// reference implementation unless an optimised one is installed: about
/// 2 GFLOP/s on one core of the 2-core VM this was measured on. The same
/// LibTorch ships oneDNN, which does the same [2048, 512] x [512, 1536]
/// product at about 58 GFLOP/s. These functions run f32 products through
/// oneDNN (forward and backward, with autograd) and fall back to ATen for
/// other dtypes (f64 in the gradient tests), tiny products, or a build
/// without oneDNN. Set GLINT_MATMUL=aten to compare.

#include <ATen/ATen.h>

namespace glint::components {

/// x [..., in] @ w[out, in]^T (+ b[out]), like at::linear.
at::Tensor fast_linear(const at::Tensor& x, const at::Tensor& w, const c10::optional<at::Tensor>& b = {});

/// `w` [out, in] converted once to oneDNN's own layout, for inference that
/// reuses it every step (the sampler): fast_linear then skips converting it
/// on every call. Without oneDNN (or for another dtype) `w` itself. No
/// gradients flow through a packed weight.
at::Tensor pack_linear_weight(const at::Tensor& w);

/// Batched a [N, M, K] @ b [N, K, P], like at::matmul on 3-d tensors.
at::Tensor fast_bmm(const at::Tensor& a, const at::Tensor& b);

/// Whether fast_linear/fast_bmm use oneDNN for f32 in this process.
bool onednn_matmul_enabled();

}  // namespace glint::components
