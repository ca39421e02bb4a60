#pragma once
/// The gated delta rule, the recurrence of a Gated DeltaNet token mixer
/// (Qwen3.5 / Qwen3.6 linear-attention layers; ../shared/reference/
/// model-families.md, sections 3.3 and 4), in two evaluations that agree to
/// rounding:
///
///   auto [o, s] = gdn::recurrent(in);           // the definition, token by token (decode, tests)
///   auto [o, s] = gdn::chunked(in, {.chunk = 64});  // training, scoring, prefill
///
/// Per value head, with state S (dk x dv, zero or the given one) and, at
/// each position t, a log decay g_t <= 0 and a write strength beta_t:
///
///   S <- exp(g_t) S;   u_t = beta_t (v_t - S^T k_t);   S <- S + k_t u_t^T;   o_t = S^T q_t
///
/// q and k come in as the layer feeds them (l2-normalised, q scaled by
/// dk^-1/2), one key head per value head (the caller repeats grouped key
/// heads). The chunked form solves each chunk's writes as one unit lower-
/// triangular system and carries the state across chunks; every exponent
/// it takes is a difference G_t - G_s with s <= t of the chunk's running sum
/// of g, so nothing overflows. recurrent is differentiable by autograd;
/// chunked has a backward pass of its own (checked against autograd's of
/// the same composition, chunked_by_autograd, and finite differences).
///
/// Packed batches (several sequences in one row) pass `resets`: the state
/// is zero again before each marked position, exactly as if each segment
/// ran alone.

#include <ATen/ATen.h>

#include <functional>
#include <utility>

namespace glint::components::gdn {

/// One call's inputs. Shapes: q, k [B, T, H, dk]; v [B, T, H, dv];
/// g, beta [B, T, H]; state [B, H, dk, dv] or undefined (zeros); resets
/// [B, T] bool or undefined (none). One floating dtype throughout.
struct Inputs {
  at::Tensor q{}, k{}, v{}, g{}, beta{};
  at::Tensor state{};
  at::Tensor resets{};
};

struct Outputs {
  at::Tensor o;      ///< [B, T, H, dv]
  at::Tensor state;  ///< [B, H, dk, dv]: after the last position
};

/// The recurrence token by token. Throws (glint's error in a
/// std::runtime_error) on shapes that do not fit together.
Outputs recurrent(const Inputs& in);

struct ChunkOptions {
  int64_t chunk = 64;  ///< positions per chunk (any T: the last chunk is padded)
};

/// The same in chunks of `chunk` positions. Its backward pass is written
/// by hand: the forward keeps the inputs and each chunk's incoming state
/// only, and the backward recomputes one chunk at a time, last first.
Outputs chunked(const Inputs& in, const ChunkOptions& opt = {});
/// The same composition differentiated by autograd (which keeps every
/// chunk's n x n products): the reference chunked's backward is tested
/// against.
Outputs chunked_by_autograd(const Inputs& in, const ChunkOptions& opt = {});

/// The layer's short causal depthwise convolution and its silu: x [B, T, C]
/// (the in_proj_qkv output), weight [C, 1, K] (conv1d.weight; tap K-1 is the
/// current position), `state` [B, K-1, C] the K-1 positions before x (zeros
/// when undefined), `resets` [B, T] as above (a window never reaches before
/// its segment's start). Answers silu(conv(x)) [B, T, C] and the state after
/// x: its last K-1 positions before the convolution (with the earlier state
/// in front when T < K-1; zeros before a reset). Its backward pass is
/// written by hand and recomputes the convolution rather than keep it.
std::pair<at::Tensor, at::Tensor> causal_conv_silu(const at::Tensor& x, const at::Tensor& weight,
                                                   const at::Tensor& state = {}, const at::Tensor& resets = {});

/// The output norm with its gate, per value head over dv: w * o /
/// sqrt(mean(o^2) + eps) * silu(z); o, z [..., dv], w [dv]. A hand-written
/// backward that keeps o, z and w only.
at::Tensor gated_rms_norm(const at::Tensor& o, const at::Tensor& z, const at::Tensor& w, double eps);

/// q or k l2-normed per head over d (eps 1e-6 inside the root), times
/// `scale`, each of its heads then repeated `repeat` times in place: x [B,
/// T, heads, d] gives [B, T, heads repeat, d] (key head j serves value heads
/// j r .. j r + r - 1). A hand-written backward.
at::Tensor l2_norm_heads(const at::Tensor& x, double scale, int64_t repeat);

/// The gates: g = -exp(A_log) softplus(a + dt_bias) and beta = sigmoid(b),
/// a and b [B, T, H], A_log and dt_bias [H]. A hand-written backward.
std::pair<at::Tensor, at::Tensor> gates(const at::Tensor& a, const at::Tensor& b, const at::Tensor& A_log,
                                        const at::Tensor& dt_bias);

/// A Gated DeltaNet token mixer's parameters (linear_attn.*, Hugging Face's
/// names and shapes) and head layout.
struct MixerWeights {
  at::Tensor in_proj_qkv{}, in_proj_z{}, in_proj_b{}, in_proj_a{};  ///< [conv_dim | value_dim | nv | nv, H]
  at::Tensor conv1d{};                                               ///< [conv_dim, 1, K]
  at::Tensor A_log{}, dt_bias{};                                     ///< [nv]
  at::Tensor norm{};                                                 ///< [dv]
  at::Tensor out_proj{};                                             ///< [H, value_dim]
  int64_t key_heads = 0, key_dim = 0, value_heads = 0, value_dim = 0;  ///< nk, dk, nv, dv (per head)
  double eps = 1e-6;                                                   ///< rms_norm_eps
  /// How a projection is applied: (module name as PEFT targets it,
  /// "in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a" or "out_proj"; its
  /// weight; the input). Empty: x @ weight^T. The model passes its own
  /// (LoRA adapters, per-row adapters, its matmul choice).
  std::function<at::Tensor(const char*, const at::Tensor&, const at::Tensor&)> project{};
};

/// What a sequence carries from one call to the next (the sampler's cache).
struct MixerState {
  at::Tensor conv{};       ///< [B, K-1, conv_dim]
  at::Tensor recurrent{};  ///< [B, nv, dk, dv]
};

/// The input projections of h [..., H]: in_proj_qkv, in_proj_z, in_proj_b
/// and in_proj_a, through w.project.
struct Projected {
  at::Tensor qkv{};  ///< [..., conv_dim]
  at::Tensor z{};    ///< [..., value_heads * value_dim]
  at::Tensor b{};    ///< [..., value_heads]
  at::Tensor a{};    ///< [..., value_heads]
};
Projected project_in(const MixerWeights& w, const at::Tensor& h);

/// What the mixer does between its projections, on [B, T, .] inputs:
/// convolution, l2-normed q and k, the gates, the delta rule (chunked, or
/// token by token when `chunk` is 0) and the gated norm. Answers the output
/// before out_proj [B, T, value_heads * value_dim] and the state after it.
/// The sampler projects a whole step's rows at once (each row's adapter)
/// and runs this per sequence, with its own state.
std::pair<at::Tensor, MixerState> mix_projected(const MixerWeights& w, const Projected& in, const MixerState& state = {},
                                                const at::Tensor& resets = {}, int64_t chunk = 64);

/// The token mixer on h [B, T, H] (the layer's normed input): projections,
/// convolution, l2-normed q and k, the gates, the delta rule (chunked, or
/// token by token when `chunk` is 0), the gated norm and out_proj. `state`
/// carries a previous call's (undefined members: zeros); `resets` marks
/// packed segments' starts. Answers [B, T, H] and the state after h.
std::pair<at::Tensor, MixerState> mix(const MixerWeights& w, const at::Tensor& h, const MixerState& state = {},
                                      const at::Tensor& resets = {}, int64_t chunk = 64);

}  // namespace glint::components::gdn
