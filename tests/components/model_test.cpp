// CausalLM: HF config parsing, strict weight loading, save/load bit-exact,
// and the forward pass against a slow, separate reference written with
// scalar loops in double precision.
#include "components/model/transformer.hpp"

#include "components/kernels/fused.hpp"

#include "components/tensor/torch_bridge.hpp"

#include "support/temp_dir.hpp"

#include "support/tensors.hpp"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <numbers>

namespace glint::components {
namespace {

namespace fs = std::filesystem;

ModelConfig tiny(Architecture a) {
  auto c = ModelConfig::make(a, 37, 16, 24, 2, 4, 2);
  if (a == Architecture::llama) {
    c.qkv_bias = c.o_bias = true;  // attention_bias
    c.mlp_bias = true;
    c.rope_scaling = {.type = RopeScaling::Type::linear, .factor = 2.0};
  }
  if (a == Architecture::qwen3) {
    c.head_dim = 6;  // Qwen3 decouples head_dim from hidden / heads
    c.tie_word_embeddings = true;
  }
  return c;
}

// -- the reference -------------------------------------------------------------

using Vec = std::vector<double>;

// What the reference computes is spelled out here, not read from the code
// under test: the activation by its hidden_act name and, per layer, the
// attention window (0: every earlier position), as the test states them.
struct Ref {
  const ModelConfig& c;
  std::map<std::string, at::Tensor> p;  // f64
  std::string act = "silu";
  std::vector<int64_t> windows;  // per layer; empty: none
  explicit Ref(const CausalLM& lm, std::string activation = "silu", std::vector<int64_t> layer_windows = {})
      : c(lm.config()), act(std::move(activation)), windows(std::move(layer_windows)) {
    for (auto& [n, t] : lm.impl().params) p[n] = t.to(at::kDouble).contiguous();
  }
  double activate(double g) const {
    if (act == "silu") return g / (1.0 + std::exp(-g));
    if (act == "gelu") return 0.5 * g * (1.0 + std::erf(g / std::sqrt(2.0)));
    if (act == "gelu_new" || act == "gelu_pytorch_tanh")
      return 0.5 * g * (1.0 + std::tanh(std::sqrt(2.0 / std::numbers::pi) * (g + 0.044715 * g * g * g)));
    if (act == "relu") return g > 0 ? g : 0.0;
    ADD_FAILURE() << "no reference for " << act;
    return 0;
  }
  // RoPE's inverse frequency of pair i, with Llama 3.1's scaling written out.
  double inv_freq(size_t i) const {
    const double D = static_cast<double>(c.head_dim);
    double f = std::pow(c.rope_theta, -2.0 * static_cast<double>(i) / D);
    const auto& s = c.rope_scaling;
    if (s.type != RopeScaling::Type::llama3) return f;
    const double old_len = static_cast<double>(s.original_max_position_embeddings);
    const double wavelen = 2 * std::numbers::pi / f;
    if (wavelen < old_len / s.high_freq_factor) return f;            // high frequencies: kept
    if (wavelen > old_len / s.low_freq_factor) return f / s.factor;  // low: stretched
    const double smooth = (old_len / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
    return (1 - smooth) * f / s.factor + smooth * f;
  }
  const double* w(const std::string& n) const { return p.at(n).data_ptr<double>(); }
  bool has(const std::string& n) const { return p.count(n) > 0; }

  Vec matvec(const std::string& prefix, const Vec& x, int64_t rows) const {
    const double* W = w(prefix + ".weight");
    Vec y(static_cast<size_t>(rows), 0.0);
    for (int64_t r = 0; r < rows; ++r) {
      double s = has(prefix + ".bias") ? w(prefix + ".bias")[r] : 0.0;
      for (size_t k = 0; k < x.size(); ++k) s += W[r * static_cast<int64_t>(x.size()) + static_cast<int64_t>(k)] * x[k];
      y[static_cast<size_t>(r)] = s;
    }
    return y;
  }
  Vec norm(const Vec& x, const double* g, size_t off = 0, size_t n = 0) const {
    if (n == 0) n = x.size();
    Vec y = x;
    double ms = 0;
    for (size_t i = 0; i < n; ++i) ms += x[off + i] * x[off + i];
    ms /= static_cast<double>(n);
    for (size_t i = 0; i < n; ++i) y[off + i] = x[off + i] / std::sqrt(ms + c.rms_norm_eps) * g[i];
    return y;
  }
  void rope(Vec& v, size_t off, int64_t pos) const {
    auto D = static_cast<size_t>(c.head_dim), half = D / 2;
    for (size_t i = 0; i < half; ++i) {
      const double linear = c.rope_scaling.type == RopeScaling::Type::linear ? c.rope_scaling.factor : 1.0;
      double angle = static_cast<double>(pos) / linear * inv_freq(i);
      double a = v[off + i], b = v[off + i + half];
      v[off + i] = a * std::cos(angle) - b * std::sin(angle);
      v[off + i + half] = b * std::cos(angle) + a * std::sin(angle);
    }
  }
  // Logits [T][V] of one unpadded sequence.
  std::vector<Vec> logits(const std::vector<int64_t>& ids) const {
    auto T = ids.size();
    auto H = static_cast<size_t>(c.hidden_size), D = static_cast<size_t>(c.head_dim);
    auto nh = static_cast<size_t>(c.num_attention_heads), nkv = static_cast<size_t>(c.num_key_value_heads);
    std::vector<Vec> x(T, Vec(H));
    for (size_t t = 0; t < T; ++t)
      for (size_t h = 0; h < H; ++h) x[t][h] = w("model.embed_tokens.weight")[ids[t] * static_cast<int64_t>(H) + static_cast<int64_t>(h)];
    for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
      auto pre = "model.layers." + std::to_string(l) + ".";
      std::vector<Vec> q(T), k(T), v(T);
      for (size_t t = 0; t < T; ++t) {
        auto h = norm(x[t], w(pre + "input_layernorm.weight"));
        q[t] = matvec(pre + "self_attn.q_proj", h, static_cast<int64_t>(nh * D));
        k[t] = matvec(pre + "self_attn.k_proj", h, static_cast<int64_t>(nkv * D));
        v[t] = matvec(pre + "self_attn.v_proj", h, static_cast<int64_t>(nkv * D));
        for (size_t hd = 0; hd < nh; ++hd) {
          if (c.qk_norm) q[t] = norm(q[t], w(pre + "self_attn.q_norm.weight"), hd * D, D);
          rope(q[t], hd * D, static_cast<int64_t>(t));
        }
        for (size_t hd = 0; hd < nkv; ++hd) {
          if (c.qk_norm) k[t] = norm(k[t], w(pre + "self_attn.k_norm.weight"), hd * D, D);
          rope(k[t], hd * D, static_cast<int64_t>(t));
        }
      }
      for (size_t t = 0; t < T; ++t) {
        Vec attn(nh * D, 0.0);
        for (size_t hd = 0; hd < nh; ++hd) {
          size_t kh = hd / (nh / nkv);
          const auto w = windows.empty() ? 0 : static_cast<size_t>(windows[static_cast<size_t>(l)]);
          const size_t first = w > 0 && t + 1 > w ? t + 1 - w : 0;  // the last w positions up to t
          Vec s(t + 1, -1e300);
          double mx = -1e300;
          for (size_t j = first; j <= t; ++j) {
            double d = 0;
            for (size_t i = 0; i < D; ++i) d += q[t][hd * D + i] * k[j][kh * D + i];
            s[j] = d / std::sqrt(static_cast<double>(D));
            mx = std::max(mx, s[j]);
          }
          double z = 0;
          for (auto& e : s) z += (e = std::exp(e - mx));
          for (size_t j = first; j <= t; ++j)
            for (size_t i = 0; i < D; ++i) attn[hd * D + i] += s[j] / z * v[j][kh * D + i];
        }
        auto o = matvec(pre + "self_attn.o_proj", attn, static_cast<int64_t>(H));
        for (size_t h = 0; h < H; ++h) x[t][h] += o[h];
        auto hn = norm(x[t], w(pre + "post_attention_layernorm.weight"));
        auto I = c.intermediate_size;
        auto g = matvec(pre + "mlp.gate_proj", hn, I), u = matvec(pre + "mlp.up_proj", hn, I);
        for (size_t i = 0; i < g.size(); ++i) g[i] = activate(g[i]) * u[i];
        auto dn = matvec(pre + "mlp.down_proj", g, static_cast<int64_t>(H));
        for (size_t h = 0; h < H; ++h) x[t][h] += dn[h];
      }
    }
    std::vector<Vec> out(T);
    auto head = c.tie_word_embeddings ? std::string{"model.embed_tokens"} : std::string{"lm_head"};
    for (size_t t = 0; t < T; ++t) {
      auto h = norm(x[t], w("model.norm.weight"));
      Vec logit(static_cast<size_t>(c.vocab_size));
      for (int64_t r = 0; r < c.vocab_size; ++r) {
        double s = 0;
        for (size_t i = 0; i < H; ++i) s += w(head + ".weight")[r * static_cast<int64_t>(H) + static_cast<int64_t>(i)] * h[i];
        logit[static_cast<size_t>(r)] = s;
      }
      out[t] = logit;
    }
    return out;
  }
};

using glint::testing::ids_of;

// The largest |logit - reference| over one row's positions and vocabulary.
double worst_difference(const Tensor& logits, const std::vector<Vec>& ref) {
  auto l = to_torch(logits)[0].to(at::kDouble);
  double worst = 0;
  for (size_t t = 0; t < ref.size(); ++t)
    for (size_t v = 0; v < ref[t].size(); ++v)
      worst = std::max(worst, std::abs(l[static_cast<int64_t>(t)][static_cast<int64_t>(v)].item<double>() - ref[t][v]));
  return worst;
}

class ModelArch : public ::testing::TestWithParam<Architecture> {};

TEST_P(ModelArch, LogitsMatchTheSlowReference) {
  auto lm = CausalLM::init_random(tiny(GetParam()), 7);
  ASSERT_TRUE(lm) << describe(lm.error());
  // Larger weights than the init so that attention is far from uniform.
  for (auto& [n, t] : lm->impl().params)
    if (n.find("norm") == std::string::npos) t.mul_(10.0);
  std::vector<int64_t> seq = {3, 17, 36, 0, 5, 9, 22};
  auto out = lm->forward({.input_ids = ids_of({seq})}, {.entropies = true, .logits = true});
  ASSERT_TRUE(out) << describe(out.error());
  auto ref = Ref(*lm).logits(seq);
  EXPECT_LT(worst_difference(out->logits, ref), 2e-4) << "largest logit difference";
  // Log-probabilities of the next tokens and entropies follow from the logits.
  auto lp = to_torch(out->logprobs);
  auto ent = to_torch(out->entropies);
  for (size_t t = 0; t + 1 < seq.size(); ++t) {
    double mx = *std::max_element(ref[t].begin(), ref[t].end()), z = 0;
    for (double e : ref[t]) z += std::exp(e - mx);
    double lse = mx + std::log(z), h = 0;
    for (double e : ref[t]) h -= std::exp(e - lse) * (e - lse);
    EXPECT_NEAR(lp[0][static_cast<int64_t>(t)].item<double>(), ref[t][static_cast<size_t>(seq[t + 1])] - lse, 2e-4);
    EXPECT_NEAR(ent[0][static_cast<int64_t>(t)].item<double>(), h, 2e-4);
  }
  EXPECT_EQ(lp[0][static_cast<int64_t>(seq.size()) - 1].item<float>(), 0.f);  // no next token
}

TEST_P(ModelArch, PaddedAndPackedRowsEqualSeparateOnes) {
  auto lm = CausalLM::init_random(tiny(GetParam()), 11);
  ASSERT_TRUE(lm);
  std::vector<int64_t> a = {1, 2, 3, 4, 5}, b = {6, 7, 8};
  auto alone = [&](const std::vector<int64_t>& s) { return to_torch(lm->forward({.input_ids = ids_of({s})})->logprobs)[0]; };
  auto la = alone(a), lb = alone(b);
  // Right padding for b in one batch with a; then left padding.
  auto right = lm->forward({.input_ids = ids_of({a, {6, 7, 8, 0, 0}}),
                            .attention_mask = ids_of({{1, 1, 1, 1, 1}, {1, 1, 1, 0, 0}})});
  ASSERT_TRUE(right) << describe(right.error());
  auto r = to_torch(right->logprobs);
  EXPECT_TRUE(at::allclose(r[0], la, 1e-5, 1e-5));
  EXPECT_TRUE(at::allclose(r[1].narrow(0, 0, 3), lb, 1e-5, 1e-5));
  EXPECT_EQ(r[1][3].item<float>(), 0.f);
  auto left = lm->forward({.input_ids = ids_of({{0, 0, 6, 7, 8}}), .attention_mask = ids_of({{0, 0, 1, 1, 1}})});
  ASSERT_TRUE(left);
  EXPECT_TRUE(at::allclose(to_torch(left->logprobs)[0].narrow(0, 2, 3), lb, 1e-5, 1e-5));
  // Packed: a and b in one row, segments 0 and 1.
  auto packed = lm->forward({.input_ids = ids_of({{1, 2, 3, 4, 5, 6, 7, 8}}),
                             .segment_ids = ids_of({{0, 0, 0, 0, 0, 1, 1, 1}})});
  ASSERT_TRUE(packed);
  auto p = to_torch(packed->logprobs)[0];
  EXPECT_TRUE(at::allclose(p.narrow(0, 0, 5), la, 1e-5, 1e-5));
  EXPECT_TRUE(at::allclose(p.narrow(0, 5, 3), lb, 1e-5, 1e-5));
}

// The fused kernels (components/kernels) against the unfused composition
// through the whole model, in float64: the same log-probabilities, entropies
// and gradient of every weight, on padded and packed rows, with and without
// sliding windows.
TEST_P(ModelArch, FusedKernelsGiveTheUnfusedValuesAndGradients) {
  for (int64_t window : {0, 3}) {
    auto cfg = tiny(GetParam());
    if (window > 0) {
      if (GetParam() == Architecture::llama) continue;  // Llama has no sliding windows
      cfg.sliding_window = window;
      cfg.sliding_layers = {true, false};
    }
    auto lm = CausalLM::init_random(cfg, 5);
    ASSERT_TRUE(lm) << describe(lm.error());
    auto& impl = lm->impl();
    for (auto& [n, t] : impl.params) t = (n.find("norm") == std::string::npos ? t * 3.0 : t).to(at::kDouble);
    auto p = model_detail::prepare(cfg, {.input_ids = ids_of({{3, 17, 36, 0, 5, 9, 22, 30}, {1, 12, 7, 4, 8, 0, 0, 0}}),
                                         .attention_mask = ids_of({{1, 1, 1, 1, 1, 1, 1, 1}, {1, 1, 1, 1, 1, 0, 0, 0}}),
                                         .segment_ids = ids_of({{0, 0, 0, 1, 1, 1, 1, 1}, {0, 0, 0, 0, 0, 0, 0, 0}})});
    ASSERT_TRUE(p) << describe(p.error());
    auto w_lp = at::randn({2, 8}, at::kDouble), w_ent = at::randn({2, 8}, at::kDouble);
    auto run = [&](bool fused) {
      kernels::set_enabled(fused);
      for (auto& [n, t] : impl.params) t = t.detach().requires_grad_(true);
      auto out = impl.run(*p, /*entropies=*/true, /*logits=*/false);
      ((out.logprobs * w_lp).sum() + (out.entropies * w_ent).sum()).backward();
      std::map<std::string, at::Tensor> r{{"logprobs", out.logprobs.detach()}, {"entropies", out.entropies.detach()}};
      for (auto& [n, t] : impl.params) r["grad " + n] = t.grad();
      return r;
    };
    auto fused = run(true), unfused = run(false);
    kernels::set_enabled(true);
    for (const auto& [name, want] : unfused) {
      ASSERT_TRUE(fused[name].defined()) << name;
      const double diff = (fused[name] - want).abs().max().item<double>();
      EXPECT_LE(diff, 1e-11 * std::max(1.0, want.abs().max().item<double>())) << name << " (window " << window << ")";
    }
  }
}

TEST_P(ModelArch, SaveAndLoadAreBitExact) {
  for (auto dtype : {Dtype::f32, Dtype::bf16}) {
    auto cfg = tiny(GetParam());
    cfg.dtype = dtype;
    auto lm = CausalLM::init_random(cfg, 3);
    ASSERT_TRUE(lm);
    auto dir = glint::testing::fresh_dir("model-save");
    ASSERT_TRUE(lm->save(dir));
    auto back = CausalLM::load(dir);
    ASSERT_TRUE(back) << describe(back.error());
    EXPECT_EQ(back->config().to_json(), cfg.to_json());
    auto dir2 = glint::testing::fresh_dir("model-save2");
    ASSERT_TRUE(back->save(dir2));
    std::ifstream f1{dir + "/model.safetensors", std::ios::binary}, f2{dir2 + "/model.safetensors", std::ios::binary};
    std::string s1{std::istreambuf_iterator<char>(f1), {}}, s2{std::istreambuf_iterator<char>(f2), {}};
    EXPECT_EQ(s1, s2) << "a saved model saves back to the same bytes";
    if (dtype == Dtype::f32) {
      for (auto& [n, t] : lm->impl().params) EXPECT_TRUE(at::equal(t, back->impl().params.at(n))) << n;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Archs, ModelArch,
                         ::testing::Values(Architecture::llama, Architecture::qwen2, Architecture::qwen3),
                         [](const auto& info) { return std::string{hf_class_name(info.param)}; });

// Models whose config.json asks for what glint used to ignore: another
// activation, sliding-window attention, RoPE settings in current
// transformers' spelling or with Llama 3.1's scaling. Each is parsed from
// config.json text and its logits are checked against the reference, told
// independently what the file asks for (a window per layer, the
// activation's name). Before these fields were honoured every one of them
// computed SiLU and full attention, or was refused (llama3).
struct Variant {
  std::string name, json;
  std::string act;
  std::vector<int64_t> windows;  // per layer, what HF computes
};

void PrintTo(const Variant& v, std::ostream* os) { *os << v.name; }

class ModelVariant : public ::testing::TestWithParam<Variant> {};

TEST_P(ModelVariant, LogitsMatchTheSlowReference) {
  const auto& v = GetParam();
  auto cfg = ModelConfig::parse(v.json, v.name + "/config.json");
  ASSERT_TRUE(cfg) << describe(cfg.error());
  auto lm = CausalLM::init_random(*cfg, 11);
  ASSERT_TRUE(lm) << describe(lm.error());
  for (auto& [n, t] : lm->impl().params)
    if (n.find("norm") == std::string::npos) t.mul_(10.0);
  std::vector<int64_t> seq = {3, 17, 36, 0, 5, 9, 22, 30, 1, 12, 7};
  auto out = lm->forward({.input_ids = ids_of({seq})}, {.logits = true});
  ASSERT_TRUE(out) << describe(out.error());
  auto ref = Ref(*lm, v.act, v.windows).logits(seq);
  EXPECT_LT(worst_difference(out->logits, ref), 2e-4) << "largest logit difference";
  // The file glint writes asks for the same model.
  auto again = ModelConfig::parse(cfg->to_json());
  ASSERT_TRUE(again) << describe(again.error());
  EXPECT_EQ(again->to_json(), cfg->to_json());
  EXPECT_EQ(again->sliding_layers, cfg->sliding_layers);
  EXPECT_EQ(again->hidden_act, cfg->hidden_act);
}

std::string sizes(const char* arch) {
  return std::string{R"("architectures":[")"} + arch +
         R"("],"vocab_size":37,"hidden_size":16,"intermediate_size":24,"num_hidden_layers":2,)"
         R"("num_attention_heads":4,"num_key_value_heads":2)";
}

INSTANTIATE_TEST_SUITE_P(
    ConfigFields, ModelVariant,
    ::testing::Values(
        Variant{"LlamaGelu", "{" + sizes("LlamaForCausalLM") + R"(,"hidden_act":"gelu"})", "gelu", {}},
        Variant{"Qwen2GeluTanh", "{" + sizes("Qwen2ForCausalLM") + R"(,"hidden_act":"gelu_pytorch_tanh"})",
                "gelu_pytorch_tanh", {}},
        Variant{"Qwen3GeluNew", "{" + sizes("Qwen3ForCausalLM") + R"(,"head_dim":8,"hidden_act":"gelu_new"})",
                "gelu_new", {}},
        Variant{"LlamaRelu", "{" + sizes("LlamaForCausalLM") + R"(,"hidden_act":"relu"})", "relu", {}},
        // Qwen2: layers from max_window_layers on slide; a window of 3 over 11 tokens.
        Variant{"Qwen2SlidingWindow",
                "{" + sizes("Qwen2ForCausalLM") +
                    R"(,"use_sliding_window":true,"sliding_window":3,"max_window_layers":1})",
                "silu",
                {0, 3}},
        // layer_types (current transformers) wins over max_window_layers.
        Variant{"Qwen3LayerTypes",
                "{" + sizes("Qwen3ForCausalLM") +
                    R"(,"head_dim":8,"use_sliding_window":true,"sliding_window":4,"max_window_layers":5,)"
                    R"("layer_types":["sliding_attention","full_attention"]})",
                "silu",
                {4, 0}},
        // Without use_sliding_window the window is not used (HF sets it to None).
        Variant{"Qwen2WindowSwitchedOff",
                "{" + sizes("Qwen2ForCausalLM") + R"(,"use_sliding_window":false,"sliding_window":2,"max_window_layers":0})",
                "silu",
                {}},
        Variant{"Qwen3RopeParameters",
                "{" + sizes("Qwen3ForCausalLM") +
                    R"(,"head_dim":8,"rope_parameters":{"rope_type":"default","rope_theta":1000000.0},"dtype":"bfloat16"})",
                "silu",
                {}},
        // Llama 3.1's scaling: with these numbers the four frequencies of a
        // head of 8 fall in every band (kept, blended, stretched).
        Variant{"LlamaRopeLlama3",
                "{" + sizes("LlamaForCausalLM") +
                    R"(,"head_dim":8,"rope_theta":10000.0,"rope_scaling":{"rope_type":"llama3","factor":8.0,)"
                    R"("low_freq_factor":1.0,"high_freq_factor":4.0,"original_max_position_embeddings":64}})",
                "silu",
                {}}),
    [](const auto& info) { return info.param.name; });

TEST(Model, LoadingIsStrictAboutNamesAndShapes) {
  auto cfg = tiny(Architecture::qwen2);
  auto lm = CausalLM::init_random(cfg, 1);
  ASSERT_TRUE(lm);
  auto dir = glint::testing::fresh_dir("model-strict");
  ASSERT_TRUE(lm->save(dir));
  auto params = *lm->named_parameters();
  NamedTensors edited;
  for (auto& [n, t] : params)
    if (n != "model.layers.1.self_attn.k_proj.bias") edited.emplace_back(n, t);
  edited.emplace_back("model.layers.9.mlp.extra.weight", params[0].second);
  ASSERT_TRUE(write_safetensors(dir + "/model.safetensors", edited));
  auto bad = CausalLM::load(dir);
  ASSERT_FALSE(bad);
  auto text = describe(bad.error());
  EXPECT_NE(text.find("missing tensors: model.layers.1.self_attn.k_proj.bias"), std::string::npos) << text;
  EXPECT_NE(text.find("unexpected tensors: model.layers.9.mlp.extra.weight"), std::string::npos) << text;

  // A truncated weights file is an error, not a crash.
  auto full = fs::file_size(dir + "/model.safetensors");
  fs::resize_file(dir + "/model.safetensors", full / 2);
  auto cut = CausalLM::load(dir);
  ASSERT_FALSE(cut);
  EXPECT_NE(describe(cut.error()).find("truncated"), std::string::npos) << describe(cut.error());
}

TEST(Model, BadBatchesAreClearErrors) {
  auto lm = CausalLM::init_random(tiny(Architecture::llama), 1);
  ASSERT_TRUE(lm);
  auto oov = lm->forward({.input_ids = ids_of({{1, 2, 37}})});
  ASSERT_FALSE(oov);
  EXPECT_NE(describe(oov.error()).find("input_ids[0, 2] = 37 is outside the vocabulary [0, 37)"), std::string::npos)
      << describe(oov.error());
  auto neg = lm->forward({.input_ids = ids_of({{-1, 2}})});
  ASSERT_FALSE(neg);
  auto shape = lm->forward({.input_ids = ids_of({{1, 2, 3}}), .attention_mask = ids_of({{1, 1}})});
  ASSERT_FALSE(shape);
  EXPECT_NE(describe(shape.error()).find("attention_mask is i64[1, 2] but input_ids is [1, 3]"), std::string::npos)
      << describe(shape.error());
  auto flat = lm->forward({.input_ids = glint::testing::vector_of(std::vector<int64_t>{1, 2})});
  ASSERT_FALSE(flat);
  auto floats = lm->forward({.input_ids = *Tensor::zeros(Dtype::f32, {1, 2})});
  ASSERT_FALSE(floats);
  // Padding may hold anything, even ids outside the vocabulary.
  EXPECT_TRUE(lm->forward({.input_ids = ids_of({{1, 999}}), .attention_mask = ids_of({{1, 0}})}));
}

TEST(Model, PositionsBeyondTheModelsAreRefusedNotExtrapolated) {
  auto cfg = tiny(Architecture::qwen2);
  cfg.max_position_embeddings = 4;
  auto lm = CausalLM::init_random(cfg, 1);
  ASSERT_TRUE(lm);
  EXPECT_TRUE(lm->forward({.input_ids = ids_of({{1, 2, 3, 4}})}));
  auto five = lm->forward({.input_ids = ids_of({{1, 2, 3, 4, 5}})});
  ASSERT_FALSE(five);
  EXPECT_NE(describe(five.error()).find("row 0 has a token at position 4, beyond the model's max_position_embeddings 4"),
            std::string::npos)
      << describe(five.error());
  // Padding beyond is no position; packed segments count from 0 each.
  EXPECT_TRUE(lm->forward({.input_ids = ids_of({{1, 2, 3, 4, 0}}), .attention_mask = ids_of({{1, 1, 1, 1, 0}})}));
  EXPECT_TRUE(lm->forward({.input_ids = ids_of({{1, 2, 3, 4, 5, 6}}), .segment_ids = ids_of({{0, 0, 0, 1, 1, 1}})}));
  EXPECT_FALSE(lm->forward({.input_ids = ids_of({{1, 2}}), .position_ids = ids_of({{0, 9}})}));
}

TEST(ModelConfigJson, ParsesHuggingFaceConfigs) {
  auto qwen2 = ModelConfig::parse(R"({"architectures":["Qwen2ForCausalLM"],"vocab_size":151936,"hidden_size":896,
    "intermediate_size":4864,"num_hidden_layers":24,"num_attention_heads":14,"num_key_value_heads":2,
    "rms_norm_eps":1e-06,"rope_theta":1000000.0,"tie_word_embeddings":true,"torch_dtype":"bfloat16",
    "max_position_embeddings":32768,"rope_scaling":null,"eos_token_id":151643})");
  ASSERT_TRUE(qwen2) << describe(qwen2.error());
  EXPECT_EQ(qwen2->head_dim, 64);
  EXPECT_TRUE(qwen2->qkv_bias);
  EXPECT_FALSE(qwen2->o_bias);
  EXPECT_EQ(qwen2->dtype, Dtype::bf16);
  EXPECT_EQ(qwen2->eos_token_ids, std::vector<int64_t>{151643});
  EXPECT_NEAR(static_cast<double>(qwen2->num_parameters()), 494e6, 1e6);  // Qwen2-0.5B

  auto qwen3 = ModelConfig::parse(R"({"architectures":["Qwen3ForCausalLM"],"vocab_size":151936,"hidden_size":1024,
    "intermediate_size":3072,"num_hidden_layers":28,"num_attention_heads":16,"num_key_value_heads":8,"head_dim":128,
    "attention_bias":false,"tie_word_embeddings":true,"torch_dtype":"bfloat16"})");
  ASSERT_TRUE(qwen3) << describe(qwen3.error());
  EXPECT_TRUE(qwen3->qk_norm);
  EXPECT_NEAR(static_cast<double>(qwen3->num_parameters()), 596e6, 2e6);  // Qwen3-0.6B

  auto llama = ModelConfig::parse(R"({"architectures":["LlamaForCausalLM"],"vocab_size":32000,"hidden_size":64,
    "intermediate_size":128,"num_hidden_layers":2,"num_attention_heads":4,
    "rope_scaling":{"type":"linear","factor":4.0}})");
  ASSERT_TRUE(llama) << describe(llama.error());
  EXPECT_EQ(llama->num_key_value_heads, 4);
  EXPECT_EQ(llama->rope_scaling.type, RopeScaling::Type::linear);
  EXPECT_EQ(llama->rope_scaling.factor, 4.0);
  auto again = ModelConfig::parse(llama->to_json());
  ASSERT_TRUE(again);
  EXPECT_EQ(again->to_json(), llama->to_json());
}

TEST(ModelConfigJson, BadConfigsNameTheField) {
  struct Case {
    std::string json, expect;
  };
  std::string base = R"("architectures":["LlamaForCausalLM"],"vocab_size":10,"hidden_size":8,"intermediate_size":8,"num_hidden_layers":1)";
  std::vector<Case> cases = {
      {"{" + base + R"(,"num_attention_heads":"two"})", "'num_attention_heads' should be a integer"},
      {"{" + base + "}", "lacks the field 'num_attention_heads'"},
      {"{" + base + R"(,"num_attention_heads":4,"num_key_value_heads":3})", "num_key_value_heads (3) must divide"},
      {"{" + base + R"(,"num_attention_heads":4,"rope_scaling":{"type":"yarn","factor":2}})", "rope type 'yarn'"},
      {R"({"architectures":["GPT2LMHeadModel"]})", "GPT2LMHeadModel' is not supported"},
      {"{" + base + R"(,"num_attention_heads":4,"torch_dtype":"float64"})", "float64"},
      {"[1, 2", "not valid JSON"},
  };
  for (const auto& c : cases) {
    auto r = ModelConfig::parse(c.json, "cfg.json");
    ASSERT_FALSE(r) << c.json;
    EXPECT_NE(describe(r.error()).find(c.expect), std::string::npos) << describe(r.error());
  }
  auto missing = ModelConfig::load("/nonexistent/config.json");
  ASSERT_FALSE(missing);
  EXPECT_EQ(code_of(missing.error()), errc::not_found);
}

// Found by fuzz/targets/model_config.cpp: nlohmann throws out_of_range, not
// parse_error, for a number past a double (1e999), which went past the catch
// to std::terminate; and a float where the rope scaling wants an integer
// (1e300) was converted to int64 with undefined behaviour.
TEST(ModelConfigJson, ANumberPastADoubleOrAFloatForAnIntegerIsAnError) {
  const std::string base = R"("architectures":["LlamaForCausalLM"],"vocab_size":10,"hidden_size":8,)"
                           R"("intermediate_size":8,"num_hidden_layers":1,"num_attention_heads":2)";
  auto huge = ModelConfig::parse("{" + base + R"(,"rope_theta":1e999})", "cfg.json");
  ASSERT_FALSE(huge);
  EXPECT_EQ(code_of(huge.error()), errc::invalid_argument);
  EXPECT_NE(describe(huge.error()).find("not valid JSON"), std::string::npos) << describe(huge.error());
  auto fractional = ModelConfig::parse(
      "{" + base + R"(,"rope_scaling":{"rope_type":"llama3","factor":8,"low_freq_factor":1,"high_freq_factor":4,)"
                   R"("original_max_position_embeddings":1e300}})",
      "cfg.json");
  ASSERT_FALSE(fractional);
  EXPECT_NE(describe(fractional.error()).find("original_max_position_embeddings' of rope type llama3 should be an integer"),
            std::string::npos)
      << describe(fractional.error());
}

// Current transformers writes rope_parameters and dtype; glint read neither
// and fell back to rope_theta 10000 and float32.
TEST(ModelConfigJson, ReadsCurrentTransformersSpellings) {
  const std::string base = "{" + sizes("Qwen2ForCausalLM");
  auto c = ModelConfig::parse(base + R"(,"rope_parameters":{"rope_type":"default","rope_theta":1000000.0},"dtype":"bfloat16"})");
  ASSERT_TRUE(c) << describe(c.error());
  EXPECT_EQ(c->rope_theta, 1e6);
  EXPECT_EQ(c->dtype, Dtype::bf16);
  auto linear = ModelConfig::parse(base + R"(,"rope_parameters":{"rope_type":"linear","factor":2.0,"rope_theta":500.0}})");
  ASSERT_TRUE(linear) << describe(linear.error());
  EXPECT_EQ(linear->rope_scaling.type, RopeScaling::Type::linear);
  EXPECT_EQ(linear->rope_scaling.factor, 2.0);
  EXPECT_EQ(linear->rope_theta, 500.0);
  // A legacy rope_scaling beside rope_parameters is fine when it says the same.
  auto agreeing = ModelConfig::parse(
      base + R"(,"rope_parameters":{"rope_type":"linear","factor":2.0,"rope_theta":500.0},"rope_scaling":{"type":"linear","factor":2.0}})");
  ASSERT_TRUE(agreeing) << describe(agreeing.error());
  EXPECT_EQ(agreeing->rope_scaling.factor, 2.0);
  auto default_too = ModelConfig::parse(
      base + R"(,"rope_parameters":{"rope_theta":500.0},"rope_scaling":{"rope_type":"default"}})");
  ASSERT_TRUE(default_too) << describe(default_too.error());
  // Either spelling of the type on either side, integer factors, nulls and a factor of 1 say the same.
  for (std::string both : {R"("rope_parameters":{"type":"linear","factor":8,"rope_theta":5.0},"rope_scaling":{"rope_type":"linear","factor":8.0}})",
                           R"("rope_parameters":{"rope_theta":5.0},"rope_scaling":{"type":"default","factor":1.0,"original_max_position_embeddings":null}})"}) {
    auto same = ModelConfig::parse(base + "," + both);
    EXPECT_TRUE(same) << both << ": " << (same ? "" : describe(same.error()));
  }
  // dtype wins over the older torch_dtype; an absent rope_theta is 10000 (HF's default for all three).
  auto both = ModelConfig::parse(base + R"(,"torch_dtype":"float32","dtype":"float16"})");
  ASSERT_TRUE(both);
  EXPECT_EQ(both->dtype, Dtype::f16);
  EXPECT_EQ(both->rope_theta, 10000.0);
  // What glint writes carries both spellings, and reads back the same.
  auto text = nlohmann::json::parse(c->to_json());
  EXPECT_EQ(text["rope_parameters"]["rope_theta"], 1e6);
  EXPECT_EQ(text["rope_theta"], 1e6);
  EXPECT_EQ(text["dtype"], "bfloat16");
  EXPECT_EQ(text["torch_dtype"], "bfloat16");
  // eos_token_id as a list (Llama 3.1 ends at any of three): every one stops.
  auto eos = ModelConfig::parse(base + R"(,"eos_token_id":[5, 8, 9]})");
  ASSERT_TRUE(eos);
  EXPECT_EQ(eos->eos_token_ids, (std::vector<int64_t>{5, 8, 9}));
  EXPECT_TRUE(eos->is_eos(9));
  EXPECT_EQ(nlohmann::json::parse(eos->to_json())["eos_token_id"], nlohmann::json({5, 8, 9}));
}

TEST(ModelConfigJson, HeadDimDefaultsAsEachArchitectureDoes) {
  // hidden 16 / 4 heads = 4 for Llama and Qwen2; Qwen3Config's default is 128.
  EXPECT_EQ(ModelConfig::parse("{" + sizes("LlamaForCausalLM") + "}")->head_dim, 4);
  EXPECT_EQ(ModelConfig::parse("{" + sizes("Qwen2ForCausalLM") + "}")->head_dim, 4);
  EXPECT_EQ(ModelConfig::parse("{" + sizes("Qwen3ForCausalLM") + "}")->head_dim, 128);
  // Weights that do not fit then say which config fields set the shapes.
  auto dir = glint::testing::fresh_dir("qwen3-head-dim");
  auto small = ModelConfig::parse("{" + sizes("Qwen3ForCausalLM") + R"(,"head_dim":4})");
  ASSERT_TRUE(small);
  ASSERT_TRUE(CausalLM::init_random(*small, 1)->save(dir));
  std::ofstream{dir + "/config.json"} << "{" + sizes("Qwen3ForCausalLM") + "}";
  auto lm = CausalLM::load(dir);
  ASSERT_FALSE(lm);
  EXPECT_NE(describe(lm.error()).find("head_dim 128 (Qwen3's default when the field is absent"), std::string::npos)
      << describe(lm.error());
}

// Every field that changes the computation and that glint cannot compute is
// refused at load, naming the file, the field and its value.
TEST(ModelConfigJson, RefusesWhatItCannotComputeNamingFileFieldAndValue) {
  struct Case {
    std::string extra, expect;
  };
  std::vector<Case> cases = {
      {R"("hidden_act":"gelu_10")", "'hidden_act': activation 'gelu_10' is not supported"},
      {R"("attention_dropout":0.1)", "'attention_dropout' is 0.1"},
      {R"("partial_rotary_factor":0.5)", "'partial_rotary_factor' is 0.5"},
      {R"("quantization_config":{"quant_method":"gptq"})", "'quantization_config' is {\"quant_method\":\"gptq\"}"},
      {R"("rope_parameters":{"rope_type":"yarn","factor":4.0,"rope_theta":1e6})", "rope type 'yarn'"},
      {R"("rope_scaling":{"rope_type":"dynamic","factor":2.0})", "rope type 'dynamic'"},
      {R"("rope_scaling":{"rope_type":"llama3","factor":8.0})", "'rope_scaling.low_freq_factor' of rope type llama3"},
      {R"("rope_parameters":"fast")", "'rope_parameters' should be an object"},
      // Both spellings, disagreeing: rope_scaling was once silently ignored.
      {R"("rope_parameters":{"rope_type":"default","rope_theta":1e6},"rope_scaling":{"rope_type":"linear","factor":4.0})",
       "disagree on the rope type"},
      {R"("rope_parameters":{"rope_type":"linear","factor":2.0,"rope_theta":1e6},"rope_scaling":{"type":"linear","factor":4.0})",
       "disagree on 'factor'"},
      {R"("use_sliding_window":true,"sliding_window":0)", "'sliding_window' is 0"},
      {R"("use_sliding_window":true,"sliding_window":4,"layer_types":["full_attention"])",
       "'layer_types' should list one type per layer (2)"},
      {R"("use_sliding_window":true,"sliding_window":4,"layer_types":["full_attention","chunked_attention"])",
       "\"chunked_attention\" for layer 1"},
      {R"("layer_types":["sliding_attention","full_attention"])", "marks layer 0 sliding_attention, but there is no window"},
      {R"("dtype":"float8_e4m3fn")", "'dtype' is 'float8_e4m3fn'"},
      {R"("eos_token_id":"</s>")", "'eos_token_id' should be an integer or a list"},
  };
  for (const auto& c : cases) {
    auto r = ModelConfig::parse("{" + sizes("Qwen2ForCausalLM") + "," + c.extra + "}", "models/x/config.json");
    ASSERT_FALSE(r) << c.extra;
    const auto msg = describe(r.error());
    EXPECT_NE(msg.find("models/x/config.json"), std::string::npos) << msg;
    EXPECT_NE(msg.find(c.expect), std::string::npos) << msg;
  }
}

// Fields that change nothing are not dropped: glint writes them back.
TEST(ModelConfigJson, KeepsFieldsItDoesNotUseWhenItSaves) {
  // use_sliding_window with a null window: transformers has no window then.
  auto null_window = ModelConfig::parse("{" + sizes("Qwen2ForCausalLM") + R"(,"use_sliding_window":true,"sliding_window":null})");
  ASSERT_TRUE(null_window) << describe(null_window.error());
  EXPECT_EQ(null_window->sliding_window, 0);
  auto c = ModelConfig::parse("{" + sizes("LlamaForCausalLM") +
                              R"(,"use_cache":true,"transformers_version":"4.57.1","pad_token_id":0,)"
                              R"("pretraining_tp":1,"custom":{"a":[1,2]},"sliding_window":4096})");
  ASSERT_TRUE(c) << describe(c.error());
  EXPECT_EQ(c->sliding_window, 0) << "LlamaForCausalLM has no sliding window in transformers";
  auto text = nlohmann::json::parse(c->to_json());
  EXPECT_EQ(text["use_cache"], true);
  EXPECT_EQ(text["transformers_version"], "4.57.1");
  EXPECT_EQ(text["pad_token_id"], 0);
  EXPECT_EQ(text["custom"]["a"][1], 2);
  EXPECT_EQ(text["sliding_window"], 4096);
  auto again = ModelConfig::parse(c->to_json());
  ASSERT_TRUE(again);
  EXPECT_EQ(again->to_json(), c->to_json());
}


TEST(ModelConfigJson, GenerationConfigEosIdsEndAGenerationAndAreNotSavedIntoConfigJson) {
  auto dir = glint::testing::fresh_dir("gen-config");
  auto c = ModelConfig::make(Architecture::qwen2, 37, 16, 24, 2, 4, 2);
  c.eos_token_ids = {5};
  std::ofstream{dir + "/config.json"} << c.to_json();
  std::ofstream{dir + "/generation_config.json"} << R"({"eos_token_id": [5, 7], "temperature": 0.7, "top_p": 0.8})";
  auto loaded = ModelConfig::load(dir + "/config.json");
  ASSERT_TRUE(loaded) << describe(loaded.error());
  EXPECT_TRUE(loaded->is_eos(5));
  EXPECT_TRUE(loaded->is_eos(7)) << "generation_config.json's eos ids stop sampling too";
  EXPECT_FALSE(loaded->is_eos(6));
  EXPECT_EQ(nlohmann::json::parse(loaded->to_json())["eos_token_id"], 5);
  std::ofstream{dir + "/generation_config.json", std::ios::trunc} << R"({"eos_token_id": 99})";
  auto outside = ModelConfig::load(dir + "/config.json");
  ASSERT_FALSE(outside);
  EXPECT_NE(describe(outside.error()).find("generation_config.json: eos_token_id 99 is outside the vocabulary"),
            std::string::npos)
      << describe(outside.error());
  std::ofstream{dir + "/generation_config.json", std::ios::trunc} << R"({"eos_token_id": "x"})";
  EXPECT_FALSE(ModelConfig::load(dir + "/config.json"));
}


TEST(ModelConfigJson, SizesBeyondGlintsBoundsAreRefusedBeforeAnyAllocation) {
  auto c = ModelConfig::make(Architecture::qwen2, 37, 16, 24, 2, 4, 2);
  auto j = nlohmann::json::parse(c.to_json());
  j["num_hidden_layers"] = 1000000000;
  auto parsed = ModelConfig::parse(j.dump(), "big/config.json");
  ASSERT_FALSE(parsed);
  EXPECT_NE(describe(parsed.error()).find("big/config.json"), std::string::npos) << describe(parsed.error());
  EXPECT_NE(describe(parsed.error()).find("num_hidden_layers 1000000000 is more than glint's bound of 4096"),
            std::string::npos)
      << describe(parsed.error());
  // Within the bounds but more than the machine holds: refused by the estimate.
  auto huge = ModelConfig::make(Architecture::qwen2, 1 << 20, 1 << 16, 1 << 18, 512, 64, 8);
  ASSERT_TRUE(huge.validate()) << describe(huge.validate().error());
  auto lm = CausalLM::init_random(huge, 0);
  ASSERT_FALSE(lm);
  EXPECT_EQ(code_of(lm.error()), errc::resource_exhausted);
  EXPECT_NE(describe(lm.error()).find("more than this machine's"), std::string::npos) << describe(lm.error());
}

}  // namespace
}  // namespace glint::components
