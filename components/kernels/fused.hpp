#pragma once
/// Fused training kernels: work that is not a matmul, done without the
/// intermediate tensors LibTorch's composition of small ops would keep.
///
/// Laid out as ggml lays out its backends: this header declares each op
/// once; `cpu/` holds the CPU implementation, and a `cuda/` directory can
/// sit beside it later, chosen by the inputs' device. Every op has a test
/// against the unfused LibTorch reference, forward and gradients, in
/// float64 (tests/components/fused_kernels_test.cpp).

#include <ATen/ATen.h>

#include <cstdint>

namespace glint::components::kernels {

struct LinearLogprob {
  at::Tensor logprobs;   ///< [...]: log softmax(x @ w^T)[target]
  at::Tensor entropies;  ///< [...]: the entropy of softmax(x @ w^T), when asked (else undefined)
};

/// The log-probability of each target, and the entropy, under the
/// distribution softmax(x @ w^T) -- the LM head and its loss -- without ever
/// holding the [N, V] logits: rows go through in chunks of `chunk_rows`
/// (0: as many as fit in about 32 MiB of logits), each chunk's logits are
/// reduced to a logsumexp, a target logit and an entropy and freed, and the
/// backward pass computes them again chunk by chunk (one more x @ w^T, the
/// price of the memory). Differentiable in x and w, through both outputs.
/// x [..., H], w [V, H], targets [...] (int64, each in [0, V)).
LinearLogprob linear_logprob(const at::Tensor& x, const at::Tensor& w, const at::Tensor& targets,
                             bool entropies = true, int64_t chunk_rows = 0);

}  // namespace glint::components::kernels
