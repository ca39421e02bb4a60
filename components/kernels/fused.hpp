#pragma once
/// Fused training kernels: work that is not a matmul, done without the
/// intermediate tensors LibTorch's composition of small ops would keep.
///
/// Laid out as ggml lays out its backends: this header declares each op
/// once; `cpu/` holds the CPU implementation, and a `cuda/` directory can
/// sit beside it later, chosen by the inputs' device. Every op has a test
/// against the unfused LibTorch reference, forward and gradients, in
/// float64 (tests/components/fused_kernels_test.cpp). Each takes f32 or f64
/// CPU tensors, is differentiable in the inputs it says, and saves for its
/// backward pass only what the backward cannot cheaply recompute.
///
/// Thread safety: the ops are pure functions of their inputs; they split
/// their work over LibTorch's intra-op threads (at::parallel_for).

#include <ATen/ATen.h>

#include <cstdint>
#include <functional>

namespace glint::components::kernels {

/// Whether the model uses the fused kernels below (true unless the
/// environment says GLINT_FUSED_KERNELS=0, read once). The unfused LibTorch
/// composition stays as the reference and for what no kernel covers.
bool enabled();
/// Overrides `enabled()` (tests and benchmarks that compare both paths).
void set_enabled(bool on);

/// What linear_logprob and logprob return, for logits z = x @ w^T.
struct LinearLogprob {
  at::Tensor logprobs;   ///< [...]: log softmax(z)[target]
  at::Tensor entropies;  ///< [...]: the entropy of softmax(z), when asked (else undefined)
};

/// The log-probability of each target, and the entropy, under the
/// distribution softmax(x @ w^T) -- the LM head and its loss -- without ever
/// holding the [N, V] logits: rows go through in chunks of `chunk_rows`
/// (0: as many as fit in 16 MiB of float32 logits, one buffer reused), each chunk's logits are
/// reduced to a logsumexp, a target logit and an entropy and freed, and the
/// backward pass computes them again chunk by chunk (one more x @ w^T, the
/// price of the memory). Differentiable in x and w, through both outputs.
/// x [..., H], w [V, H], targets [...] (int64, each in [0, V)).
LinearLogprob linear_logprob(const at::Tensor& x, const at::Tensor& w, const at::Tensor& targets,
                             bool entropies = true, int64_t chunk_rows = 0);

/// The same two outputs from logits already formed, logits [..., V]: one
/// pass over each row forward (no log-softmax, gather or softmax tensors),
/// and a backward that writes the logits' gradient straight into one new
/// tensor, where LibTorch's logsumexp, gather and softmax backward make four
/// or five the size of the logits (at a 32 MiB threshold glibc maps each one
/// and the kernel zeroes its pages again every step). Float32 and float64
/// run the row kernels, other dtypes LibTorch's composition. Differentiable
/// in the logits.
LinearLogprob logprob(const at::Tensor& logits, const at::Tensor& targets, bool entropies = true);

/// RMSNorm over the last dimension, as Llama and Qwen define it:
/// x / sqrt(mean(x^2) + eps) * weight. x [..., H], weight [H]. Saves x and
/// one reciprocal root per row (the unfused composition keeps two more
/// [..., H] tensors). Differentiable in x and weight.
at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps);

/// The SwiGLU MLP's product silu(gate) * up, elementwise (same shapes).
/// Saves gate and up only: silu(gate) is recomputed in the backward pass.
/// Differentiable in both.
at::Tensor swiglu(const at::Tensor& gate, const at::Tensor& up);

/// a @ b^T for 2-d tensors, without autograd, computed as the caller
/// computes its own products (the model passes its BLAS-or-oneDNN choice).
using MatmulNT = std::function<at::Tensor(const at::Tensor& a, const at::Tensor& b)>;

/// The gated MLP's down projection, swiglu(gate, up) @ w^T, without keeping
/// the [..., I] product for the backward pass, where the unfused composition
/// keeps it as the projection's input: the backward pass computes it again
/// from gate and up (one elementwise pass; Liger's recomputation). gate, up
/// [..., I], w [H, I] -> [..., H]. Differentiable in gate, up and w. `mm`
/// multiplies (empty: at::mm).
at::Tensor swiglu_linear(const at::Tensor& gate, const at::Tensor& up, const at::Tensor& w, const MatmulNT& mm = {});

/// out = a @ b^T, or out += a @ b^T when `accumulate`, for 2-d tensors
/// without autograd; out [M, P] contiguous, written in place (every element
/// written when not accumulating: it may hold anything, NaN included). a and
/// b may be transposed or otherwise strided views (lora_linear passes w^T,
/// g^T and x^T): an implementation that needs contiguous operands makes
/// them so. The caller's
/// product, as MatmulNT, for kernels that write part of a result first and
/// have the product add the rest: a GEMM with beta = 1 skips the pass that
/// clears its output (OpenBLAS zeroes C for beta = 0), and the part written
/// first costs one write instead of a read and a write after the product.
using MatmulIntoNT = std::function<void(at::Tensor& out, const at::Tensor& a, const at::Tensor& b, bool accumulate)>;

/// A linear layer with a LoRA adapter, as one autograd node:
///   y = x w^T (+ bias) + scale (x a^T) b^T
/// x [..., in], w [out, in], bias [out] (optional), a [r, in], b [out, r]
/// (PEFT's lora_A and lora_B) -> [..., out]. The adapter's products of rank
/// r (up to 32: row loops; above, BLAS) are written first, with the bias,
/// into the output, and the base product adds itself to them (`mm` with
/// accumulate); the backward pass does the same with the input gradient.
/// The composition forms (x a^T) b^T and (g b) a as [N, out] and [N, in]
/// tensors, each zeroed, written, added and freed, per adapted projection
/// and step. Saves x and the [N, r] x a^T. Differentiable in x, w, bias, a
/// and b (the frozen base's w and bias usually need none). `mm` computes the
/// base products (empty: ATen's addmm). `adapter_input` (x's shape;
/// undefined: x itself) is what the adapter reads instead of x, such as
/// LoRA dropout's masked x: the adapter's part of the input gradient then
/// goes to it, as a new tensor, and the base's alone to x.
at::Tensor lora_linear(const at::Tensor& x, const at::Tensor& w, const c10::optional<at::Tensor>& bias,
                       const at::Tensor& a, const at::Tensor& b, double scale, const MatmulIntoNT& mm = {},
                       const at::Tensor& adapter_input = {});

/// Rotary position embedding in the rotate-half layout (Hugging Face's):
/// x * cos + rotate_half(x) * sin, per head. x [..., heads, D]; cos and sin
/// [..., D], the leading dimensions of x without its heads (the same angles
/// for every head). One pass instead of five, nothing saved but the tables.
/// Differentiable in x (the tables are constants of the positions).
at::Tensor rope(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin);

/// Scaled dot-product attention with grouped-query heads and an arbitrary
/// boolean mask, without the [B, heads, T, T] scores or probabilities:
/// softmax(q k^T * scale, masked by `allowed`) v, computed per kv head in
/// blocks of query rows (the blocks of the query heads that share it
/// stacked, up to four, into one product), each block over only the span
/// of keys its mask allows (half the work of a causal mask), keeping one
/// logsumexp per query row for the backward pass, which computes the
/// block's probabilities again.
/// q [B, T, heads, D], k and v [B, T, kv_heads, D] (heads a multiple of
/// kv_heads; query head h reads kv head h / (heads / kv_heads)), allowed
/// [B, T, T] bool (query i may attend to key j; every row must allow at
/// least one key). Returns [B, T, heads * D]. Differentiable in q, k, v.
at::Tensor attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& allowed,
                     double scale);

/// The constants of one AdamW step (decoupled weight decay, as PyTorch's
/// AdamW): the optimizer's settings and the step's bias corrections.
struct AdamwStep {
  double lr = 0, beta1 = 0.9, beta2 = 0.999, eps = 1e-8;
  double decay = 1;       ///< the weights' factor before the update: 1 - lr x weight_decay (1: none)
  double correction1 = 1; ///< 1 - beta1^step
  double correction2 = 1; ///< 1 - beta2^step
};

/// One AdamW step over one parameter in one pass, where the unfused
/// composition makes eight over it and allocates a temporary of its size:
///   p *= decay  (where decay_mask is true; everywhere when it is undefined)
///   m = beta1 m + (1 - beta1) g;  v = beta2 v + (1 - beta2) g^2
///   p += -lr / correction1 x m / (sqrt(v / correction2) + eps)
/// in that order and the parameter's precision; equal to the composition
/// up to the last bit (its x86-64-v3 build contracts into FMA, and ATen's
/// addcdiv may round value x m before the division).
/// p, g, m and v: contiguous CPU tensors of one shape and dtype (f32 or f64),
/// p, m and v updated in place; decay_mask bool of that shape. Not
/// differentiable: a step runs outside autograd.
void adamw_step(const at::Tensor& p, const at::Tensor& g, const at::Tensor& m, const at::Tensor& v,
                const at::Tensor& decay_mask, const AdamwStep& s);

/// Whether adamw_step takes these tensors (else use the composition).
bool adamw_step_fits(const at::Tensor& p, const at::Tensor& g, const at::Tensor& m, const at::Tensor& v,
                     const at::Tensor& decay_mask);

/// The sum of t's squares, accumulated in float64 without the float64 copy
/// (and its square) the composition t.to(kDouble).pow(2).sum() makes: for
/// gradient norms. t: f32 or f64, strided (any strides), on the CPU.
double sum_of_squares(const at::Tensor& t);

}  // namespace glint::components::kernels
