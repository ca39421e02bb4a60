#include "components/model/transformer.hpp"
#include "components/comm/process_group_impl.hpp"
#include "components/parallel/tensor_parallel.hpp"

#include "components/kernels/fused.hpp"
#include "components/model/kernels.hpp"
#include "components/tensor/torch_bridge.hpp"
#include "runtime/log.hpp"
#include "runtime/memory.hpp"
#include "runtime/text.hpp"

#include <ATen/CPUGeneratorImpl.h>
#include <c10/core/GradMode.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <numbers>
#include <set>

namespace glint::components {

namespace fs = std::filesystem;

// -- shapes and batch preparation --------------------------------------------

namespace model_detail {

ParameterShapes parameter_shapes(const ModelConfig& c) {
  ParameterShapes out;
  int64_t h = c.hidden_size, q = c.num_attention_heads * c.head_dim, kv = c.num_key_value_heads * c.head_dim;
  out.push_back({"model.embed_tokens.weight", {c.vocab_size, h}});
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    auto p = "model.layers." + std::to_string(l) + ".";
    out.push_back({p + "input_layernorm.weight", {h}});
    if (c.token_mixer(l) == TokenMixer::gated_deltanet) {
      const auto& la = c.linear_attention;
      const auto a = p + "linear_attn.";
      out.push_back({a + "in_proj_qkv.weight", {la.conv_dim(), h}});
      out.push_back({a + "in_proj_z.weight", {la.value_dim(), h}});
      out.push_back({a + "in_proj_b.weight", {la.num_value_heads, h}});
      out.push_back({a + "in_proj_a.weight", {la.num_value_heads, h}});
      out.push_back({a + "conv1d.weight", {la.conv_dim(), 1, la.conv_kernel_dim}});
      out.push_back({a + "dt_bias", {la.num_value_heads}});
      out.push_back({a + "A_log", {la.num_value_heads}});
      out.push_back({a + "norm.weight", {la.value_head_dim}});
      out.push_back({a + "out_proj.weight", {h, la.value_dim()}});
    } else {
      // With Qwen3.5's output gate, q_proj gives each head's query and gate.
      for (auto [name, rows] : {std::pair{"q_proj", c.attention_gate ? 2 * q : q}, {"k_proj", kv}, {"v_proj", kv}}) {
        out.push_back({p + "self_attn." + name + ".weight", {rows, h}});
        if (c.qkv_bias) out.push_back({p + "self_attn." + name + ".bias", {rows}});
      }
      out.push_back({p + "self_attn.o_proj.weight", {h, q}});
      if (c.o_bias) out.push_back({p + "self_attn.o_proj.bias", {h}});
      if (c.qk_norm) {
        out.push_back({p + "self_attn.q_norm.weight", {c.head_dim}});
        out.push_back({p + "self_attn.k_norm.weight", {c.head_dim}});
      }
    }
    out.push_back({p + "post_attention_layernorm.weight", {h}});
    if (c.feed_forward(l) == FeedForward::sparse) {
      sparse_block_shapes(c, p, out);
      continue;
    }
    out.push_back({p + "mlp.gate_proj.weight", {c.intermediate_size, h}});
    out.push_back({p + "mlp.up_proj.weight", {c.intermediate_size, h}});
    out.push_back({p + "mlp.down_proj.weight", {h, c.intermediate_size}});
    if (c.mlp_bias) {
      out.push_back({p + "mlp.gate_proj.bias", {c.intermediate_size}});
      out.push_back({p + "mlp.up_proj.bias", {c.intermediate_size}});
      out.push_back({p + "mlp.down_proj.bias", {h}});
    }
  }
  out.push_back({"model.norm.weight", {h}});
  if (!c.tie_word_embeddings) out.push_back({"lm_head.weight", {c.vocab_size, h}});
  return out;
}

namespace {

// A [B, T] integer or boolean tensor as i64, or an error naming it.
Result<at::Tensor> as_index_matrix(const Tensor& t, const char* name, int64_t B, int64_t T) {
  if (t.dims() != 2 || t.size(0) != B || t.size(1) != T)
    return make_error(errc::invalid_argument, std::string{name} + " is " + t.describe() + " but input_ids is [" +
                                                  std::to_string(B) + ", " + std::to_string(T) + "]");
  switch (t.dtype()) {
    case Dtype::i64:
    case Dtype::i32:
    case Dtype::u8:
    case Dtype::boolean: return to_torch(t).to(at::kLong);
    default:
      return make_error(errc::invalid_argument,
                        std::string{name} + " must hold integers (i64, i32, u8 or bool), not " + t.describe());
  }
}

}  // namespace

double training_bytes_per_row(const ModelConfig& c, int64_t T, int64_t elem_bytes, bool entropies, bool adapter) {
  // Per token, in elements; hidden() and run() are what this follows.
  const double h = static_cast<double>(c.hidden_size), I = static_cast<double>(c.intermediate_size);
  const double q = static_cast<double>(c.num_attention_heads * c.head_dim);
  const double kv = static_cast<double>(c.num_key_value_heads * c.head_dim);
  const double nh = static_cast<double>(c.num_attention_heads), V = static_cast<double>(c.vocab_size);
  const double t = static_cast<double>(T), L = static_cast<double>(c.num_hidden_layers);
  // The logits, logsumexp's temporary and the gathered log-probabilities'
  // graph, twice more for the entropies.
  const double head = 3 * V + (entropies ? 2 * V : 0);
  const double lora = adapter ? 7 * h : 0;  // LoRA's dropout inputs and low-rank products
  // Per layer, the feed-forward's width per token (an MoE layer's: its k
  // experts' and the shared expert's) and what routing keeps besides: the
  // router's probabilities, the tokens copied in expert order, the experts'
  // outputs and their weighted sum.
  double widths = 0, routing = 0;
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    if (c.feed_forward(l) == FeedForward::dense) {
      widths += I;
      continue;
    }
    const double k = static_cast<double>(c.moe.num_experts_per_tok);
    widths += k * static_cast<double>(c.moe.moe_intermediate_size) +
              static_cast<double>(c.moe.shared_expert_intermediate_size);
    routing += 2 * static_cast<double>(c.moe.num_experts) + 3 * k * h + h;
  }
  const double mean_width = L > 0 ? widths / L : I;
  // Gated DeltaNet layers keep, instead of attention's tensors: the
  // in_proj_qkv output and the conv's, q and k normed and repeated to the
  // value heads, v, z, the gates, the rule's output and the normed output,
  // and the chunked rule's incoming state per chunk of 64.
  const auto& la = c.linear_attention;
  const double nv = static_cast<double>(la.num_value_heads), vd = static_cast<double>(la.value_dim());
  const double gdn = 2 * static_cast<double>(la.conv_dim()) + 2 * nv * static_cast<double>(la.key_head_dim) + 4 * vd +
                     2 * nv + nv * static_cast<double>(la.key_head_dim * la.value_head_dim) / 64;
  const auto linear_layers = static_cast<double>(c.layers_of(TokenMixer::gated_deltanet));
  const double gate = c.attention_gate ? 2 * q : 0;  // the output gate and its product
  if (kernels::enabled()) {
    // The fused kernels keep per layer: the residual stream before and after
    // attention and both norms' outputs, the projections' q, k, v (and
    // before q/k norm, their inputs), the rotated q and k, the attention
    // output and one logsumexp per head, the MLP's gate and up (and their
    // product, when an adapter may take it as its input).
    const double attention = 2 * q + 2 * kv + kv + (c.qk_norm ? q + kv : 0) + nh + gate;
    const double layer = 4 * h + attention + (adapter ? 3 : 2) * mean_width + lora;
    const double mixers = (L - linear_layers) * attention + linear_layers * gdn;
    // The backward pass's peak: one layer's gradients, the logits' gradients
    // and two [64, T] blocks of scores per thread (small: left out).
    const double backward = layer + (linear_layers > 0 ? std::max(0.0, gdn - attention) : 0.0) + 3 * V;
    // The boolean masks, [T, T] bytes (two with sliding windows).
    const double masks = (c.sliding_window > 0 ? 2 : 1) * t / static_cast<double>(elem_bytes);
    return static_cast<double>(elem_bytes) * t * (L * (layer - attention) + mixers + routing + head + backward + masks);
  }
  // The unfused composition. Against the peak resident memory of a
  // cross-entropy step (qwen3, hidden 256, 4 layers, vocab 8192, f32): 0.99x
  // at 32 rows of 128 tokens, 0.99x at 8 x 256, 1.13x at 2 x 1024, 1.26x at
  // 1 x 2048 (conservative for long rows, whose attention scores libtorch
  // frees sooner than counted here).
  // Kept per layer: two norms' inputs and outputs, q/k/v and their rotated
  // forms, k/v repeated to every head, the attention output, the softmax
  // over T keys, the MLP's gate, up, activation and product.
  const double attention = 6 * q + 4 * kv + nh * t + gate;
  const double layer = 6 * h + attention + 4 * mean_width + lora;
  const double mixers = (L - linear_layers) * attention + linear_layers * gdn;
  // The backward pass's peak: one layer's gradients, the scores' three
  // [heads, T, T] temporaries and the logits' gradients.
  const double backward = layer + 3 * nh * t + 3 * V;
  // The additive attention masks, [T, T] floats (two with sliding windows).
  const double masks = (c.sliding_window > 0 ? 2 : 1) * t;
  return static_cast<double>(elem_bytes) * t * (L * (layer - attention) + mixers + routing + head + backward + masks);
}

Result<Prepared> prepare(const ModelConfig& c, const TokenBatch& b) {
  const auto& ids = b.input_ids;
  if (!ids.defined() || ids.dims() != 2)
    return make_error(errc::invalid_argument, "input_ids must be a [batch, seq] tensor, not " +
                                                  (ids.defined() ? ids.describe() : std::string{"undefined"}));
  if (ids.dtype() != Dtype::i64 && ids.dtype() != Dtype::i32)
    return make_error(errc::invalid_argument, "input_ids must be i64 or i32, not " + ids.describe());
  int64_t B = ids.size(0), T = ids.size(1);
  if (B == 0 || T == 0) return make_error(errc::invalid_argument, "input_ids is empty: " + ids.describe());
  Prepared p;
  p.ids = to_torch(ids).to(at::kLong);
  auto check_vocab = [&](const at::Tensor& t, const at::Tensor& where, const char* name) -> caf::error {
    auto bad = (t < 0).logical_or(t >= c.vocab_size).logical_and(where);
    if (!bad.any().item<bool>()) return caf::none;
    auto idx = bad.nonzero()[0];
    int64_t r = idx[0].item<int64_t>(), s = idx[1].item<int64_t>();
    return make_error(errc::invalid_argument, std::string{name} + "[" + std::to_string(r) + ", " + std::to_string(s) +
                                                  "] = " + std::to_string(t[r][s].item<int64_t>()) +
                                                  " is outside the vocabulary [0, " + std::to_string(c.vocab_size) + ")");
  };

  at::Tensor mask = at::ones({B, T}, at::kBool);
  if (b.attention_mask.defined()) {
    auto m = as_index_matrix(b.attention_mask, "attention_mask", B, T);
    if (!m) return m.error();
    mask = *m != 0;
  }
  at::Tensor seg = at::zeros({B, T}, at::kLong);
  if (b.segment_ids.defined()) {
    auto s = as_index_matrix(b.segment_ids, "segment_ids", B, T);
    if (!s) return s.error();
    seg = *s;
    p.segments = seg;
  }
  if (auto e = check_vocab(p.ids, mask, "input_ids")) return e;
  for (auto media : c.media_token_ids)
    if (auto at = (p.ids == media).logical_and(mask); at.any().item<bool>()) {
      auto idx = at.nonzero()[0];
      return make_error(errc::unimplemented,
                        "input_ids[" + std::to_string(idx[0].item<int64_t>()) + ", " +
                            std::to_string(idx[1].item<int64_t>()) + "] = " + std::to_string(media) +
                            " is the checkpoint's image or video placeholder token: glint runs the text model of this "
                            "vision-language checkpoint only, so image and video input is not supported");
    }
  p.real = mask;
  p.ids = p.ids.masked_fill(mask.logical_not(), 0);  // padding may hold any id

  // Positions: the number of real tokens before this one in its row and segment.
  if (b.position_ids.defined()) {
    auto pos = as_index_matrix(b.position_ids, "position_ids", B, T);
    if (!pos) return pos.error();
    if ((*pos < 0).any().item<bool>()) return make_error(errc::invalid_argument, "position_ids has negative entries");
    p.positions = *pos;
  } else {
    auto real = mask.to(at::kLong);
    auto same_seg = seg.unsqueeze(2) == seg.unsqueeze(1);                         // [B, Tq, Tk]
    auto before = at::ones({T, T}, at::kBool).tril(-1).unsqueeze(0);              // k < q
    p.positions = (same_seg.logical_and(before).to(at::kLong) * real.unsqueeze(1)).sum(2);
  }
  // A position the model was not trained for: refused, not extrapolated.
  if (auto beyond = (p.positions >= c.max_position_embeddings).logical_and(mask); beyond.any().item<bool>()) {
    auto idx = beyond.nonzero()[0];
    const int64_t r = idx[0].item<int64_t>(), s = idx[1].item<int64_t>();
    return make_error(errc::invalid_argument,
                      "row " + std::to_string(r) + " has a token at position " +
                          std::to_string(p.positions[r][s].item<int64_t>()) +
                          ", beyond the model's max_position_embeddings " + std::to_string(c.max_position_embeddings) +
                          " (config.json); shorten the rows (the dataloader's max_length and truncation)");
  }

  // Query i attends key j when j <= i, j is real, and both share a segment.
  auto causal = at::ones({T, T}, at::kBool).tril().unsqueeze(0);
  auto same = seg.unsqueeze(2) == seg.unsqueeze(1);
  p.allowed = causal.logical_and(same).logical_and(mask.unsqueeze(1));
  // A padding query with nothing to attend to attends to itself: finite
  // garbage instead of NaN; its outputs are masked anyway.
  p.allowed = p.allowed.logical_or(at::eye(T, at::kBool).unsqueeze(0));

  if (b.target_ids.defined()) {
    auto t = as_index_matrix(b.target_ids, "target_ids", B, T);
    if (!t) return t.error();
    p.target_mask = mask;
    if (auto e = check_vocab(*t, p.target_mask, "target_ids")) return e;
    p.targets = t->masked_fill(p.target_mask.logical_not(), 0);
  } else {
    // The next token, where it is real and in the same segment.
    auto next = at::zeros({B, T}, at::kLong);
    auto has_next = at::zeros({B, T}, at::kBool);
    if (T > 1) {
      next.narrow(1, 0, T - 1).copy_(p.ids.narrow(1, 1, T - 1));
      has_next.narrow(1, 0, T - 1)
          .copy_(mask.narrow(1, 0, T - 1)
                     .logical_and(mask.narrow(1, 1, T - 1))
                     .logical_and(seg.narrow(1, 0, T - 1) == seg.narrow(1, 1, T - 1)));
    }
    p.target_mask = has_next;
    p.targets = next.masked_fill(has_next.logical_not(), 0);
  }
  return p;
}

}  // namespace model_detail

// -- the forward pass ---------------------------------------------------------

at::Tensor CausalLM::Impl::linear(const std::string& prefix, const at::Tensor& x, bool bias,
                                  const PassOptions& pass) const {
  const at::Tensor* w = &param(prefix + ".weight");
  if (pass.packed)
    if (auto it = pass.packed->find(prefix + ".weight"); it != pass.packed->end()) w = &it->second;
  return project(prefix, x, *w, bias ? c10::optional<at::Tensor>{param(prefix + ".bias")} : c10::nullopt, pass);
}

namespace {

// Whether a tensor can go through components/kernels (f32 or f64 on the CPU)
// and the kernels are on (kernels::enabled; GLINT_FUSED_KERNELS=0 is the
// unfused composition, kept as the reference).
bool fusable(const at::Tensor& x) {
  return kernels::enabled() && x.device().is_cpu() &&
         (x.scalar_type() == at::kFloat || x.scalar_type() == at::kDouble);
}

// The pass's own adapter on `prefix` (A, B), when kernels::lora_linear can
// take the layer and it whole: every tensor f32 or f64 alike, none packed
// for oneDNN.
const std::pair<at::Tensor, at::Tensor>* kernel_adapter(const std::string& prefix, const at::Tensor& x,
                                                        const at::Tensor& w, const c10::optional<at::Tensor>& bias,
                                                        const PassOptions& pass) {
  if (!pass.lora || pass.lora->merged || !fusable(x)) return nullptr;
  auto it = pass.lora->weights.find(prefix);
  if (it == pass.lora->weights.end()) return nullptr;
  const auto& [a, b] = it->second;
  for (const auto* t : {&w, &a, &b, bias ? &*bias : &w})
    if (t->is_mkldnn() || t->scalar_type() != x.scalar_type() || !t->device().is_cpu()) return nullptr;
  return &it->second;
}

}  // namespace

at::Tensor CausalLM::Impl::lora_input(const at::Tensor& x, const PassOptions& pass) {
  const double p = pass.lora ? pass.lora->cfg.dropout : 0.0;
  if (!pass.train || p <= 0) return x;
  return pass.dropout_rng ? x * at::empty_like(x).bernoulli_(1.0 - p, *pass.dropout_rng) / (1.0 - p)
                          : at::dropout(x, p, true);
}

at::Tensor CausalLM::Impl::project(const std::string& prefix, const at::Tensor& x, const at::Tensor& w,
                                   const c10::optional<at::Tensor>& bias, const PassOptions& pass) const {
  if (const auto* ab = kernel_adapter(prefix, x, w, bias, pass)) {
    // The base product and the adapter's in one node: the adapter's rank-r
    // products go into the base's output, and backward into its input's
    // gradient, in place (kernels::lora_linear).
    // With dropout in training the adapter reads its own masked x.
    auto in = lora_input(x, pass);
    auto y = kernels::lora_linear(x, w, bias, ab->first, ab->second, pass.lora->scaling.at(prefix),
                                  fast_linear_into,
                                  in.is_same(x) ? at::Tensor{} : in);
    return add_lora(prefix, x, std::move(y), pass, /*own=*/false);
  }
  return add_lora(prefix, x, fast_linear(x, w, bias), pass);
}

at::Tensor CausalLM::Impl::add_lora(const std::string& prefix, const at::Tensor& x, at::Tensor y,
                                    const PassOptions& pass, bool own) const {
  if (own && pass.lora && !pass.lora->merged) {
    if (auto it = pass.lora->weights.find(prefix); it != pass.lora->weights.end()) {
      const auto& [a, b] = it->second;
      auto in = lora_input(x, pass);
      // y + s (x A^T) B^T as one addmm: s scales the rank-r product, and the
      // sum is the GEMM's own accumulation, where y + (x A^T B^T) s made and
      // read two more [tokens, out] tensors each way.
      auto low = fast_linear(in, a) * pass.lora->scaling.at(prefix);
      if (b.is_mkldnn()) {
        y = y + fast_linear(low, b);
      } else {
        const auto out_sizes = y.sizes().vec();
        y = at::addmm(y.reshape({-1, y.size(-1)}), low.reshape({-1, low.size(-1)}), b.t()).view(out_sizes);
      }
    }
  }
  const int64_t row_dim = x.dim() - 2;
  for (const auto& ra : pass.row_adapters) {
    if (ra.lora->merged) continue;
    auto it = ra.lora->weights.find(prefix);
    if (it == ra.lora->weights.end()) continue;
    const auto& [a, b] = it->second;
    auto delta = fast_linear(fast_linear(x.index_select(row_dim, ra.rows), a), b) * ra.lora->scaling.at(prefix);
    y.index_add_(row_dim, ra.rows, delta);
  }
  return y;
}

namespace {

// Whether a LoRA adapter of the pass changes module `prefix`.
bool adapted(const std::string& prefix, const PassOptions& pass) {
  if (pass.lora && !pass.lora->merged && pass.lora->weights.count(prefix)) return true;
  for (const auto& ra : pass.row_adapters)
    if (!ra.lora->merged && ra.lora->weights.count(prefix)) return true;
  return false;
}

}  // namespace

at::Tensor CausalLM::Impl::rms_norm(const at::Tensor& x, const at::Tensor& stored) const {
  // Qwen3.5 scales by (1 + w): its stored weights start at 0.
  const auto weight = cfg.unit_offset_norms ? stored + 1 : stored;
  if (fusable(x) && weight.scalar_type() == x.scalar_type()) return kernels::rms_norm(x, weight, cfg.rms_norm_eps);
  auto var = x.pow(2).mean(-1, /*keepdim=*/true);
  return x * at::rsqrt(var + cfg.rms_norm_eps) * weight;
}

at::Tensor CausalLM::Impl::activate(const at::Tensor& x) const {
  switch (cfg.hidden_act) {
    case Activation::silu: return at::silu(x);
    case Activation::gelu: return at::gelu(x);
    case Activation::gelu_tanh: return at::gelu(x, "tanh");
    case Activation::relu: return at::relu(x);
  }
  return at::silu(x);
}

at::Tensor CausalLM::Impl::mlp_down(const std::string& prefix, const at::Tensor& gate, const at::Tensor& up, bool bias,
                                    const PassOptions& pass) const {
  const bool swiglu = cfg.hidden_act == Activation::silu && fusable(gate) && up.scalar_type() == gate.scalar_type();
  const auto& w = param(prefix + ".weight");
  const bool packed = pass.packed && pass.packed->count(prefix + ".weight");
  if (swiglu && at::GradMode::is_enabled() && !adapted(prefix, pass) && !packed && w.scalar_type() == gate.scalar_type()) {
    // Training: the [tokens, intermediate] product is not kept for the
    // backward pass (an adapter on the projection would keep it anyway).
    auto y = kernels::swiglu_linear(gate, up, w, [](const at::Tensor& a, const at::Tensor& b) { return fast_linear(a, b); });
    return bias ? y + param(prefix + ".bias") : y;
  }
  return linear(prefix, swiglu ? kernels::swiglu(gate, up) : activate(gate) * up, bias, pass);
}

at::Tensor CausalLM::Impl::swiglu_mlp(const std::string& prefix, const at::Tensor& h, bool bias,
                                      const PassOptions& pass) const {
  auto gate = linear(prefix + ".gate_proj", h, bias, pass);
  auto up = linear(prefix + ".up_proj", h, bias, pass);
  return mlp_down(prefix + ".down_proj", gate, up, bias, pass);
}

at::Tensor CausalLM::Impl::feed_forward(int64_t layer, const at::Tensor& h, const PassOptions& pass) const {
  if (cfg.feed_forward(layer) == FeedForward::sparse) {
    if (tp)  // tp::shard_model refuses a model with experts; this keeps the block honest on its own
      throw_error(make_error(errc::unimplemented, "experts on a tensor-parallel model are not built yet"));
    return sparse_moe(layer, h, pass);
  }
  return swiglu_mlp("model.layers." + std::to_string(layer) + ".mlp", h, cfg.mlp_bias, pass);
}

at::Tensor CausalLM::Impl::inverse_frequencies() const {
  // Over the rotated dimensions only (partial_rotary_factor).
  const int64_t rot = cfg.rotary_dim(), half = rot / 2;
  auto exponents = at::arange(0, half, at::kDouble) * 2.0 / static_cast<double>(rot);
  auto inv_freq = at::pow(cfg.rope_theta, exponents).reciprocal();  // [half], f64
  const auto& s = cfg.rope_scaling;
  if (s.type != RopeScaling::Type::llama3) return inv_freq;
  // Llama 3.1: wavelengths longer than the original context / low_freq_factor
  // are stretched by `factor`, shorter than / high_freq_factor kept, and the
  // band between blends the two.
  const double old_len = static_cast<double>(s.original_max_position_embeddings);
  const double low_wavelen = old_len / s.low_freq_factor, high_wavelen = old_len / s.high_freq_factor;
  auto wavelen = 2.0 * std::numbers::pi / inv_freq;
  auto scaled = at::where(wavelen > low_wavelen, inv_freq / s.factor, inv_freq);
  auto smooth = (old_len / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
  auto blended = (1.0 - smooth) * scaled / s.factor + smooth * scaled;
  auto medium = (wavelen >= high_wavelen).logical_and(wavelen <= low_wavelen);
  return at::where(medium, blended, scaled);
}

std::pair<at::Tensor, at::Tensor> CausalLM::Impl::rope(const at::Tensor& positions) const {
  auto inv_freq = inverse_frequencies();                                                  // [half], f64
  auto pos = positions.to(at::kDouble);                                                   // [B, T]
  if (cfg.rope_scaling.type == RopeScaling::Type::linear) pos = pos / cfg.rope_scaling.factor;
  auto freqs = pos.unsqueeze(-1) * inv_freq;                                              // [B, T, half]
  auto emb = at::cat({freqs, freqs}, -1);                                                 // [B, T, D]
  auto dtype = options().dtype().toScalarType();
  return {emb.cos().to(dtype), emb.sin().to(dtype)};
}

namespace {

at::Tensor rotate_half(const at::Tensor& x) {
  auto half = x.size(-1) / 2;
  return at::cat({-x.narrow(-1, half, half), x.narrow(-1, 0, half)}, -1);
}

}  // namespace

gdn::MixerWeights CausalLM::Impl::mixer_weights(int64_t layer, const PassOptions& pass) const {
  const auto pre = "model.layers." + std::to_string(layer) + ".linear_attn.";
  const auto& la = cfg.linear_attention;
  gdn::MixerWeights w;
  w.in_proj_qkv = param(pre + "in_proj_qkv.weight");
  w.in_proj_z = param(pre + "in_proj_z.weight");
  w.in_proj_b = param(pre + "in_proj_b.weight");
  w.in_proj_a = param(pre + "in_proj_a.weight");
  w.conv1d = param(pre + "conv1d.weight");
  w.A_log = param(pre + "A_log");
  w.dt_bias = param(pre + "dt_bias");
  w.norm = param(pre + "norm.weight");
  w.out_proj = param(pre + "out_proj.weight");
  w.key_heads = la.num_key_heads;
  w.key_dim = la.key_head_dim;
  w.value_heads = la.num_value_heads;
  w.value_dim = la.value_head_dim;
  w.eps = cfg.rms_norm_eps;
  // Through linear(): the pass's adapters on linear_attn.<name> (PEFT's
  // module names) and its packed weights.
  w.project = [this, pre, &pass](const char* name, const at::Tensor&, const at::Tensor& x) {
    return linear(pre + name, x, false, pass);
  };
  return w;
}

at::Tensor CausalLM::Impl::decode_stack(const at::Tensor& ids, const at::Tensor& positions, const Attention& attend,
                                        const PassOptions& pass, const TokenMix& mix) const {
  const auto& c = cfg;
  const int64_t D = c.head_dim;
  // Tensor parallelism: this rank's heads, q/k/v and gate/up column-
  // parallel (their replicated input's gradient summed over the ranks), o
  // and down row-parallel (their outputs summed).
  const int64_t nh = tp ? tp->heads : c.num_attention_heads, nkv = tp ? tp->kv_heads : c.num_key_value_heads;
  auto replicated = [&](const at::Tensor& t) { return tp ? tp::copy_to(t, *tp->pg) : t; };
  auto summed = [&](const at::Tensor& t) { return tp ? tp::reduce_from(t, *tp->pg) : t; };
  if (tp && (pass.lora || !pass.row_adapters.empty() || pass.packed))
    throw_error(make_error(errc::unimplemented, "LoRA and packed weights on a tensor-parallel model are not built yet"));
  const bool embeds = !pp || pp->first();
  if (!embeds && !pass.stage_input.defined())
    throw_error(make_error(errc::internal, "a pipeline stage after the first ran without the stage before's activations"));
  auto x = !embeds ? pass.stage_input
           : tp    ? tp::vocab_embedding(ids, param("model.embed_tokens.weight"), tp->vocab_begin, *tp->pg)
                   : at::embedding(param("model.embed_tokens.weight"), ids);
  auto [cos, sin] = rope(positions);  // [..., T, rot]: the same for every head
  const bool fused_rope = fusable(x);
  const int64_t rot = c.rotary_dim();
  auto rotate = [&](const at::Tensor& t) {
    // Partial RoPE (Qwen3.5): the first rot dimensions turn (rotate-half
    // within them), the rest pass through.
    auto part = rot == D ? t : t.narrow(-1, 0, rot).contiguous();
    auto turned = fused_rope ? kernels::rope(part, cos, sin) : part * cos.unsqueeze(-2) + rotate_half(part) * sin.unsqueeze(-2);
    return rot == D ? turned : at::cat({turned, t.narrow(-1, rot, D - rot)}, -1);
  };
  auto heads = [&](const at::Tensor& t, int64_t n) {
    auto shape = t.sizes().vec();
    shape.back() = n;
    shape.push_back(D);
    return t.view(shape);
  };
  const int64_t first = pp ? pp->first_layer : 0, end = pp ? pp->end_layer : c.num_hidden_layers;
  for (int64_t l = first; l < end; ++l) {
    auto pre = "model.layers." + std::to_string(l) + ".";
    if (pass.layer_hooks) pass.layer_hooks->enter(l);
    auto h = replicated(rms_norm(x, param(pre + "input_layernorm.weight")));
    if (c.token_mixer(l) == TokenMixer::gated_deltanet) {
      if (!mix)
        throw_error(make_error(errc::unimplemented, "layer " + std::to_string(l) +
                                                        " is a Gated DeltaNet, and this pass has no state for it"));
      x = x + summed(mix(l, mixer_weights(l, pass), h));
    } else {
      auto qg = linear(pre + "self_attn.q_proj", h, c.qkv_bias, pass);
      at::Tensor q, gate;
      if (c.attention_gate) {  // per head: head_dim of query, then head_dim of gate
        auto both = heads(qg, nh * 2).unflatten(-2, {nh, 2});  // [..., nh, 2, D]
        q = both.select(-2, 0).contiguous();
        gate = both.select(-2, 1).flatten(-2);  // [..., nh * D]
      } else {
        q = heads(qg, nh);
      }
      auto k = heads(linear(pre + "self_attn.k_proj", h, c.qkv_bias, pass), nkv);
      auto v = heads(linear(pre + "self_attn.v_proj", h, c.qkv_bias, pass), nkv);
      if (c.qk_norm) {
        q = rms_norm(q, param(pre + "self_attn.q_norm.weight"));
        k = rms_norm(k, param(pre + "self_attn.k_norm.weight"));
      }
      q = rotate(q);
      k = rotate(k);
      auto attended = attend(l, q, k, v);
      if (gate.defined()) attended = attended * at::sigmoid(gate);
      x = x + summed(linear(pre + "self_attn.o_proj", attended, c.o_bias, pass));
    }
    h = replicated(rms_norm(x, param(pre + "post_attention_layernorm.weight")));
    x = x + summed(feed_forward(l, h, pass));
    if (pass.layer_hooks) x = pass.layer_hooks->exit(l, std::move(x));
  }
  if (pp && !pp->last()) return x;
  return rms_norm(x, param("model.norm.weight"));
}

at::Tensor CausalLM::Impl::hidden(const model_detail::Prepared& p, const PassOptions& pass) const {
  const auto& c = cfg;
  int64_t B = p.ids.size(0), T = p.ids.size(1), D = c.head_dim;
  int64_t nh = tp ? tp->heads : c.num_attention_heads, groups = nh / (tp ? tp->kv_heads : c.num_key_value_heads);
  // Additive masks: 0 where allowed, -inf elsewhere; [B, 1, T, T]. Sliding
  // layers also mask keys sliding_window or more positions before the query
  // (transformers: key kept while its index > query's - window).
  auto additive = [&](const at::Tensor& allowed) {
    return at::zeros({B, 1, T, T}, options())
        .masked_fill(allowed.logical_not().unsqueeze(1), -std::numeric_limits<float>::infinity());
  };
  at::Tensor window_allowed;
  if (c.sliding_window > 0) {
    auto distance = p.positions.unsqueeze(2) - p.positions.unsqueeze(1);  // [B, Tq, Tk]: query - key
    window_allowed = p.allowed.logical_and(distance < c.sliding_window).logical_or(at::eye(T, at::kBool).unsqueeze(0));
  }
  const double scale = 1.0 / std::sqrt(static_cast<double>(D));
  // Gated DeltaNet layers: padding zeroed before the mixer, as transformers
  // does (a left-padded row's state stays zero until its first token), and
  // the conv window and state reset at each packed segment's start.
  TokenMix mix;
  at::Tensor resets, real;
  if (c.has_linear_attention()) {
    if (p.segments.defined() && T > 1) {
      resets = at::zeros({B, T}, at::kBool);
      resets.narrow(1, 1, T - 1).copy_(p.segments.narrow(1, 1, T - 1) != p.segments.narrow(1, 0, T - 1));
    }
    real = p.real.unsqueeze(-1).to(options().dtype());
    mix = [&](int64_t, const gdn::MixerWeights& w, const at::Tensor& h) {
      return gdn::mix(w, h * real, {}, resets, gdn_chunk).first;
    };
  }
  if (fusable(params.begin()->second)) {
    // kernels::attention: the boolean masks as they are, no [B, heads, T, T]
    // scores or probabilities held for the backward pass.
    auto attend = [&](int64_t layer, const at::Tensor& q4, const at::Tensor& k4, const at::Tensor& v4) {
      return kernels::attention(q4, k4, v4, c.window(layer) > 0 ? window_allowed : p.allowed, scale);
    };
    return decode_stack(p.ids, p.positions, attend, pass, mix);
  }
  auto bias = additive(p.allowed);
  auto window_bias = window_allowed.defined() ? additive(window_allowed) : at::Tensor{};
  auto attend = [&](int64_t layer, const at::Tensor& q4, const at::Tensor& k4, const at::Tensor& v4) {
    const auto& mask = c.window(layer) > 0 ? window_bias : bias;
    auto q = q4.transpose(1, 2), k = k4.transpose(1, 2), v = v4.transpose(1, 2);  // [B, heads, T, D]
    if (groups > 1) {
      k = k.repeat_interleave(groups, 1);
      v = v.repeat_interleave(groups, 1);
    }
    auto flat = [&](const at::Tensor& t) { return t.reshape({B * nh, t.size(2), t.size(3)}); };
    auto scores = fast_bmm(flat(q), flat(k).transpose(1, 2)).view({B, nh, T, T}) * scale + mask;
    auto attn = fast_bmm(flat(at::softmax(scores, -1)), flat(v)).view({B, nh, T, D});
    return attn.transpose(1, 2).reshape({B, T, nh * D});
  };
  return decode_stack(p.ids, p.positions, attend, pass, mix);
}

const at::Tensor& CausalLM::Impl::module_weight(const std::string& module) const {
  if (module == "lm_head" && cfg.tie_word_embeddings) return param("model.embed_tokens.weight");
  return param(module + ".weight");
}

at::Tensor CausalLM::Impl::logits(const at::Tensor& hidden, const PassOptions& pass) const {
  if (tp)  // its LM head is this rank's rows: these would be a part of the logits
    throw_error(make_error(errc::unimplemented, "the logits of a tensor-parallel model are not built yet"));
  return project("lm_head", hidden, module_weight("lm_head"), c10::nullopt, pass);
}

namespace {

// Whether the LM head's log-probabilities go through the fused kernel
// (kernels::linear_logprob), which never holds the [rows, vocab] logits but
// computes them twice: by default when they would take more than 256 MiB
// (a large vocabulary or many tokens), where the memory matters more than
// the second matmul. GLINT_FUSED_LOGPROB=1 always, =0 never.
bool use_fused_logprob(int64_t rows, int64_t vocab) {
  static const int mode = [] {
    const char* v = std::getenv("GLINT_FUSED_LOGPROB");
    return v && std::string{v} == "1" ? 1 : v && std::string{v} == "0" ? 0 : -1;
  }();
  if (mode >= 0) return mode == 1;
  return static_cast<double>(rows) * static_cast<double>(vocab) * 4 > 256.0 * (1 << 20);
}

// A fused kernel's log-probs, zero where the target is masked, and its
// entropies when it made them.
void take_logprobs(CausalLM::Impl::Outputs& out, kernels::LinearLogprob fused, const at::Tensor& target_mask) {
  out.logprobs = fused.logprobs.masked_fill(target_mask.logical_not(), 0);
  if (fused.entropies.defined()) out.entropies = std::move(fused.entropies);
}

}  // namespace

CausalLM::Impl::Outputs CausalLM::Impl::run(const model_detail::Prepared& p, bool entropies, bool keep_logits,
                                            const PassOptions& pass) const {
  auto h = hidden(p, pass);
  if (pp && !pp->last()) {
    Outputs out;
    out.activations = h;
    return out;
  }
  if (tp) {
    // The vocabulary split over the ranks: no rank forms the logits.
    if (entropies || keep_logits)
      throw_error(make_error(errc::unimplemented, "entropies and logits of a tensor-parallel model are not built yet"));
    const auto H = h.size(-1);
    auto lp = tp::vocab_logprob(h.reshape({-1, H}), module_weight("lm_head"), tp->vocab_begin, cfg.vocab_size,
                                p.targets.reshape({-1}),
                                *tp->pg);
    Outputs out;
    out.logprobs = lp.view(p.targets.sizes()).masked_fill(p.target_mask.logical_not(), 0);
    return out;
  }
  if (!keep_logits && !adapted("lm_head", pass) && use_fused_logprob(h.numel() / h.size(-1), cfg.vocab_size)) {
    // The LM head and its log-softmax in row chunks: the [B, T, V] logits
    // are never held, in the forward pass or the backward.
    Outputs out;
    take_logprobs(out, kernels::linear_logprob(h, module_weight("lm_head"), p.targets, entropies), p.target_mask);
    return out;
  }
  auto lg = logits(h, pass);
  Outputs out;
  if (fusable(lg)) {
    // One pass over each row of logits, and their gradient written once
    // (kernels::logprob); the composition below makes four or five tensors
    // the size of the logits in its backward.
    take_logprobs(out, kernels::logprob(lg, p.targets, entropies), p.target_mask);
  } else {
    // log p(target) = logit[target] - logsumexp(logits): no [B, T, V]
    // log-softmax is materialised (or kept for backward) besides the logits.
    auto lse = at::logsumexp(lg, -1);
    out.logprobs =
        (lg.gather(-1, p.targets.unsqueeze(-1)).squeeze(-1) - lse).masked_fill(p.target_mask.logical_not(), 0);
    if (entropies) out.entropies = lse - (at::softmax(lg, -1) * lg).sum(-1);
  }
  if (keep_logits) out.logits = lg;
  return out;
}

// -- CausalLM -------------------------------------------------------------------

namespace {

// A Qwen3.5 checkpoint's text model under glint's (ForCausalLM's) names:
// model.language_model.* is model.* (as transformers renames it loading the
// text model), and the vision tower (model.visual.*) and the multi-token-
// prediction head (mtp.*) are left out, the load saying so.
Result<void> text_model_names(std::map<std::string, Tensor>& weights, const std::string& origin) {
  std::map<std::string, Tensor> out;
  int64_t visual = 0, mtp = 0;
  const std::string nested = "model.language_model.";
  for (auto& [name, t] : weights) {
    if (name.rfind("model.visual.", 0) == 0) {
      ++visual;
      continue;
    }
    if (name.rfind("mtp.", 0) == 0) {
      ++mtp;
      continue;
    }
    auto to = name.rfind(nested, 0) == 0 ? "model." + name.substr(nested.size()) : name;
    if (out.count(to))
      return make_error(errc::invalid_argument, origin + " holds " + to + " twice (as " + name +
                                                    " and under the other layout, model.language_model. or model.)");
    out.emplace(std::move(to), std::move(t));
  }
  if (visual > 0 || mtp > 0)
    log::info(origin + ": left out " + std::to_string(visual) + " vision-tower tensors (model.visual.*) and " +
              std::to_string(mtp) + " multi-token-prediction tensors (mtp.*); glint runs the text model");
  weights = std::move(out);
  return {};
}

Result<std::shared_ptr<CausalLM::Impl>> from_weights(const ModelConfig& cfg, std::map<std::string, Tensor> weights,
                                                     const std::string& origin) {
  if (is_hybrid(cfg.architecture))
    if (auto ok = text_model_names(weights, origin); !ok) return ok.error();
  if (cfg.has_experts())
    if (auto ok = model_detail::unfuse_experts(cfg, weights, origin); !ok) return ok.error();
  auto expected = model_detail::parameter_shapes(cfg);
  std::vector<std::string> missing, wrong_shape;
  std::set<std::string> known;
  auto impl = std::make_shared<CausalLM::Impl>();
  impl->cfg = cfg;
  for (const auto& [name, shape] : expected) {
    known.insert(name);
    auto it = weights.find(name);
    if (it == weights.end()) {
      missing.push_back(name);
      continue;
    }
    const auto& t = it->second;
    if (t.shape() != shape) {
      wrong_shape.push_back(name + " is " + t.describe() + ", expected [" + join(shape) + "]");
      continue;
    }
    if (t.dtype() != Dtype::f32 && t.dtype() != Dtype::bf16 && t.dtype() != Dtype::f16) {
      wrong_shape.push_back(name + " is " + t.describe() + ", expected a floating-point dtype");
      continue;
    }
    impl->names.push_back(name);
    impl->params[name] = to_torch(t).to(at::kFloat, /*non_blocking=*/false, /*copy=*/true).contiguous();
  }
  std::vector<std::string> unexpected;
  for (const auto& [name, t] : weights)
    if (!known.count(name)) unexpected.push_back(name);
  if (!missing.empty() || !unexpected.empty() || !wrong_shape.empty()) {
    std::string msg = origin + " does not match its config (" + std::string{hf_class_name(cfg.architecture)} + ")";
    // A model of many experts can miss thousands: the first ones and a count.
    auto some = [](std::vector<std::string> v, const char* sep = ", ") {
      const size_t n = v.size();
      if (n > 24) v.resize(24);
      return join(v, sep) + (n > 24 ? std::string{sep} + "and " + std::to_string(n - 24) + " more" : std::string{});
    };
    if (!missing.empty()) msg += "; missing tensors: " + some(missing);
    if (!unexpected.empty()) msg += "; unexpected tensors: " + some(unexpected);
    if (!wrong_shape.empty()) {
      msg += "; " + some(wrong_shape, "; ");
      // The expected shapes come from config.json: say from which fields,
      // so a config that is wrong (or a default that does not apply) is
      // not taken for damaged weights.
      msg += " (expected from config.json: hidden_size " + std::to_string(cfg.hidden_size) + ", num_attention_heads " +
             std::to_string(cfg.num_attention_heads) + ", num_key_value_heads " +
             std::to_string(cfg.num_key_value_heads) + ", head_dim " + std::to_string(cfg.head_dim) +
             (cfg.architecture == Architecture::qwen3 ? " (Qwen3's default when the field is absent: 128)" : "") +
             ", intermediate_size " + std::to_string(cfg.intermediate_size) + ", vocab_size " +
             std::to_string(cfg.vocab_size) +
             (cfg.has_experts() ? ", num_experts " + std::to_string(cfg.moe.num_experts) + ", moe_intermediate_size " +
                                      std::to_string(cfg.moe.moe_intermediate_size) + ", decoder_sparse_step " +
                                      std::to_string(cfg.moe.decoder_sparse_step)
                                : std::string{}) +
             ")";
    }
    return make_error(errc::invalid_argument, msg);
  }
  return impl;
}

}  // namespace

Result<CausalLM> CausalLM::load(const std::string& dir) {
  auto cfg = ModelConfig::load((fs::path{dir} / "config.json").string());
  if (!cfg) return cfg.error();
  if (auto ok = check_memory(4.0 * static_cast<double>(cfg->num_parameters()),
                             "the model in " + dir + " (" + std::to_string(cfg->num_parameters()) +
                                 " parameters, held in float32)");
      !ok)
    return ok.error();
  auto weights = load_safetensors_dir(dir);
  if (!weights) return weights.error();
  auto impl = from_weights(*cfg, std::move(*weights), "the weights in " + dir);
  if (!impl) return impl.error();
  CausalLM lm;
  lm.impl_ = std::move(*impl);
  std::error_code ec;
  auto where = fs::absolute(dir, ec).lexically_normal();
  if (!where.has_filename() && where.has_parent_path()) where = where.parent_path();  // "models/tiny/"
  lm.impl_->name_or_path = ec ? dir : where.string();
  return lm;
}

Result<CausalLM> CausalLM::init_random(const ModelConfig& cfg, uint64_t seed) try {
  if (auto ok = cfg.validate(); !ok) return ok.error();
  if (auto ok = check_memory(4.0 * static_cast<double>(cfg.num_parameters()),
                             "a model of " + std::to_string(cfg.num_parameters()) + " parameters (in float32)");
      !ok)
    return ok.error();
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  auto impl = std::make_shared<Impl>();
  impl->cfg = cfg;
  for (const auto& [name, shape] : model_detail::parameter_shapes(cfg)) {
    at::Tensor t;
    bool is_norm = name.find("norm.weight") != std::string::npos;
    bool is_bias = name.size() > 5 && name.compare(name.size() - 5, 5, ".bias") == 0;
    // (1 + w) norms start at 0, the Gated DeltaNet's plain output norm at 1
    // (transformers' Qwen3.5 initialisation); A_log at log of U(1, 16) and
    // dt_bias at 1, transformers' too (it draws A from U(0, 16)).
    const bool plain_norm = !cfg.unit_offset_norms || name.find("linear_attn.norm.weight") != std::string::npos;
    if (is_norm) t = plain_norm ? at::ones(shape, at::kFloat) : at::zeros(shape, at::kFloat);
    else if (name.ends_with(".A_log")) t = at::empty(shape, at::kFloat).uniform_(1.0, 16.0, gen).log_();
    else if (name.ends_with(".dt_bias")) t = at::ones(shape, at::kFloat);
    else if (is_bias) t = at::zeros(shape, at::kFloat);
    else t = at::empty(shape, at::kFloat).normal_(0.0, cfg.initializer_range, gen);
    impl->names.push_back(name);
    impl->params[name] = t;
  }
  CausalLM lm;
  lm.impl_ = std::move(impl);
  return lm;
} catch (const std::exception& e) {
  return error_of_exception(e, "making a model's random weights");
}

Result<void> CausalLM::Impl::have_parameters(const char* what, bool passes, bool writes) const {
  if (pp)
    return make_error(errc::failed_precondition,
                      std::string{what} + ": this model is pipeline stage " + std::to_string(pp->pg->rank()) + " of " +
                          std::to_string(pp->pg->size()) + " and holds decoder layers " +
                          std::to_string(pp->first_layer) + " to " + std::to_string(pp->end_layer - 1) +
                          " only; a pipeline's trainer runs it");
  if (ep && !passes)
    return make_error(errc::failed_precondition,
                      std::string{what} + ": this rank holds experts " + std::to_string(ep->first_expert) + " to " +
                          std::to_string(ep->first_expert + ep->experts - 1) + " of " +
                          std::to_string(cfg.moe.num_experts) + " (expert parallelism over " +
                          std::to_string(ep->pg->size()) + " ranks); the trainer saves and streams the whole model");
  if (tp && !passes)
    return make_error(errc::failed_precondition, std::string{what} + ": the model's parameters are tensor-parallel "
                                                     "shards over " + std::to_string(tp->pg->size()) +
                                                     " ranks; each rank holds a part of each projection");
  if (sharded_by.empty()) return {};
  if (writes)
    return make_error(errc::failed_precondition, std::string{what} + ": the model's parameters are sharded by " +
                                                     sharded_by + "; a change to them would be lost at the next pass");
  if (gathered) return {};
  return make_error(errc::failed_precondition, std::string{what} + ": the model's parameters are sharded by " +
                                                   sharded_by + " and not gathered here; gather them first "
                                                   "(Trainer::gather_parameters, on every rank of the group)");
}

Result<void> model_detail::save_pretrained(const ModelConfig& c, const std::string& dir, int64_t max_shard_bytes,
                                           const std::function<Result<at::Tensor>(const std::string&)>& fetch) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return make_error(errc::unavailable, "cannot create " + dir + ": " + ec.message());
  auto shapes = parameter_shapes(c);
  // Qwen3.5-MoE's checkpoints hold each layer's experts fused, and
  // transformers reads that layout only: gate_up_proj [E, 2I, H] (each
  // expert's gate rows, then its up rows) and down_proj [E, H, I].
  const bool fuse = c.architecture == Architecture::qwen3_5_moe;
  if (fuse) {
    const int64_t E = c.moe.num_experts, I = c.moe.moe_intermediate_size, H = c.hidden_size;
    ParameterShapes disk;
    for (auto& [name, shape] : shapes) {
      const auto at = name.find(".mlp.experts.");
      if (at == std::string::npos) {
        disk.emplace_back(std::move(name), std::move(shape));
        continue;
      }
      if (name.compare(at + 13, 2, "0.") != 0 || name.find(".gate_proj.") == std::string::npos) continue;
      const auto layer = name.substr(0, at) + ".mlp.experts.";
      disk.push_back({layer + "gate_up_proj", {E, 2 * I, H}});
      disk.push_back({layer + "down_proj", {E, H, I}});
    }
    shapes = std::move(disk);
  }
  // `fetch` answers the parameters in parameter_shapes' order (each
  // expert's gate, up, down): gate_up_proj fetches them all, and the down
  // projections wait for down_proj, which follows it.
  std::vector<at::Tensor> downs;
  auto fetch_disk = [&](const std::string& name) -> Result<at::Tensor> {
    const bool gate_up = name.ends_with(".mlp.experts.gate_up_proj"), down = name.ends_with(".mlp.experts.down_proj");
    if (!fuse || (!gate_up && !down)) return fetch(name);
    if (down) {
      auto stacked = at::stack(downs);
      downs.clear();
      return stacked;
    }
    const auto layer = name.substr(0, name.rfind('.') + 1);
    std::vector<at::Tensor> gate_ups;
    for (int64_t e = 0; e < c.moe.num_experts; ++e) {
      const auto q = layer + std::to_string(e) + ".";
      auto g = fetch(q + "gate_proj.weight");
      if (!g) return g.error();
      auto u = fetch(q + "up_proj.weight");
      if (!u) return u.error();
      auto d = fetch(q + "down_proj.weight");
      if (!d) return d.error();
      gate_ups.push_back(at::cat({*g, *u}, 0));
      downs.push_back(*d);
    }
    return at::stack(gate_ups);
  };
  const auto dtype = to_torch(c.dtype);
  std::vector<TensorSpec> specs;
  for (const auto& [name, shape] : shapes) {
    int64_t n = 1;
    for (auto d : shape) n *= d;
    specs.push_back({name, static_cast<uint64_t>(n) * c10::elementSize(dtype)});
  }
  auto one = [&](size_t i) -> Result<Tensor> {
    const auto& [name, shape] = shapes[i];
    auto t = fetch_disk(name);
    if (!t) return t.error();
    if (t->sizes().vec() != shape)
      return make_error(errc::internal, name + " came as [" + join(t->sizes().vec()) + "], expected [" + join(shape) + "]");
    return from_torch(t->detach().to(dtype).contiguous());
  };
  if (auto ok = write_safetensors_dir_streamed(dir, specs, one, max_shard_bytes); !ok) return ok.error();
  auto cfg_path = fs::path{dir} / "config.json";
  auto tmp = temp_path_for(cfg_path.string());
  {
    std::ofstream f{tmp};
    f << c.to_json();
    if (!f) return make_error(errc::unavailable, "cannot write " + tmp);
  }
  fs::rename(tmp, cfg_path, ec);
  if (ec) return make_error(errc::unavailable, "cannot write " + cfg_path.string() + ": " + ec.message());
  return {};
}

Result<void> CausalLM::save(const std::string& dir, int64_t max_shard_bytes) const {
  if (auto ok = impl_->have_parameters("save"); !ok) return ok;
  return model_detail::save_pretrained(impl_->cfg, dir, max_shard_bytes,
                                       [&](const std::string& name) -> Result<at::Tensor> { return impl_->params.at(name); });
}

const ModelConfig& CausalLM::config() const { return impl_->cfg; }

Result<ForwardResult> CausalLM::forward(const TokenBatch& batch, const ForwardOptions& opts) const try {
  if (auto ok = impl_->have_parameters("forward", true); !ok) return ok.error();
  auto p = model_detail::prepare(impl_->cfg, batch);
  if (!p) return p.error();
  PassOptions pass;
  if (!opts.adapter.empty()) {
    auto a = impl_->adapter(opts.adapter);
    if (!a) return a.error();
    pass.lora = *a;
  }
  c10::NoGradGuard no_grad;
  auto out = impl_->run(*p, opts.entropies, opts.logits, pass);
  ForwardResult r;
  for (auto [want, from, to] : {std::tuple{true, &out.logprobs, &r.logprobs},
                                 std::tuple{opts.entropies, &out.entropies, &r.entropies},
                                 std::tuple{opts.logits, &out.logits, &r.logits}}) {
    if (!want) continue;
    auto t = from_torch(from->to(at::kFloat).contiguous());
    if (!t) return t.error();
    *to = std::move(*t);
  }
  return r;
} catch (const std::exception& e) {
  // Input is checked above; this is a bug or an allocation failure, never a crash.
  return error_of_exception(e, "the forward pass");
}

Result<NamedTensors> CausalLM::named_parameters() const {
  if (auto ok = impl_->have_parameters("named_parameters"); !ok) return ok.error();
  NamedTensors out;
  for (const auto& name : impl_->names) {
    // FSDP frees the gathered bytes at the next pass: copies, not views.
    const auto& p = impl_->params.at(name);
    auto t = from_torch(impl_->sharded_by.empty() ? p : p.detach().clone());
    if (!t) return with_context(t.error(), name);
    out.emplace_back(name, std::move(*t));
  }
  return out;
}

}  // namespace glint::components
