// The Qwen3.5 / Qwen3.6 family (reference/model-families.md section 3):
// config.json's fields, from a vision-language checkpoint's text_config or a
// text-only one, honoured or refused; both weight layouts; and the forward
// pass against an independent float64 implementation written here from the
// equations, token by token: the Gated DeltaNet's short conv, l2-normed q/k,
// gates and the delta-rule recurrence S <- exp(g) S + k beta (v - S^T k)^T,
// its gated output norm; the gated attention with partial RoPE; (1 + w)
// norms; and Qwen3.5-MoE's always-renormalised experts with a gated shared
// expert.
#include "components/model/transformer.hpp"

#include "components/checkpoint/safetensors.hpp"
#include "components/model/gguf_export.hpp"
#include "components/model/trainer.hpp"
#include "components/parallel/pipeline.hpp"
#include "components/parallel/tensor_parallel.hpp"
#include "components/sampler/engine.hpp"
#include "components/tensor/torch_bridge.hpp"

#include "support/fake_process_group.hpp"
#include "support/finite_difference.hpp"
#include "support/temp_dir.hpp"
#include "support/tensors.hpp"

#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>

namespace glint::components {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using glint::testing::ids_of;

// -- config.json ----------------------------------------------------------------------

// A Qwen3.5 vision-language checkpoint's config.json (the published layout),
// small: three Gated DeltaNet layers and a gated attention one.
json qwen35_json() {
  return json::parse(R"({
    "architectures": ["Qwen3_5ForConditionalGeneration"], "model_type": "qwen3_5",
    "image_token_id": 60, "video_token_id": 61, "vision_start_token_id": 58, "vision_end_token_id": 59,
    "language_model_only": false, "tie_word_embeddings": false, "transformers_version": "4.57.1",
    "vision_config": {"depth": 2, "hidden_size": 16, "model_type": "qwen3_5", "out_hidden_size": 32},
    "text_config": {
      "model_type": "qwen3_5_text", "vocab_size": 64, "hidden_size": 32, "intermediate_size": 48,
      "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
      "linear_num_key_heads": 2, "linear_key_head_dim": 8, "linear_num_value_heads": 4,
      "linear_value_head_dim": 8, "linear_conv_kernel_dim": 4,
      "layer_types": ["linear_attention", "linear_attention", "linear_attention", "full_attention"],
      "full_attention_interval": 4,
      "rope_parameters": {"rope_type": "default", "rope_theta": 10000000, "partial_rotary_factor": 0.25,
                          "mrope_section": [1, 1, 0], "mrope_interleaved": true},
      "partial_rotary_factor": 0.25, "attn_output_gate": true, "attention_bias": false,
      "hidden_act": "silu", "rms_norm_eps": 1e-6, "max_position_embeddings": 128,
      "tie_word_embeddings": false, "dtype": "bfloat16", "mamba_ssm_dtype": "float32",
      "mtp_num_hidden_layers": 1, "mtp_use_dedicated_embeddings": false, "eos_token_id": 63,
      "attention_dropout": 0.0, "initializer_range": 0.02, "use_cache": true
    }
  })");
}

// Qwen3.5-35B-A3B's layout, small: every layer sparse, a shared expert.
json qwen35_moe_json() {
  auto j = qwen35_json();
  j["architectures"] = {"Qwen3_5MoeForConditionalGeneration"};
  j["model_type"] = "qwen3_5_moe";
  auto& t = j["text_config"];
  t["model_type"] = "qwen3_5_moe_text";
  t.erase("intermediate_size");
  t["layer_types"] = {"linear_attention", "full_attention", "linear_attention", "full_attention"};
  t["num_experts"] = 6;
  t["num_experts_per_tok"] = 2;
  t["moe_intermediate_size"] = 12;
  t["shared_expert_intermediate_size"] = 20;
  t["router_aux_loss_coef"] = 0.001;
  t["output_router_logits"] = false;
  return j;
}

Result<ModelConfig> parse(const json& j) { return ModelConfig::parse(j.dump(), "config.json"); }

TEST(Qwen35Config, ReadsAVisionLanguageCheckpointsTextConfig) {
  auto c = parse(qwen35_json());
  ASSERT_TRUE(c) << describe(c.error());
  EXPECT_EQ(c->architecture, Architecture::qwen3_5);
  EXPECT_TRUE(c->from_multimodal);
  EXPECT_EQ(c->media_token_ids, (std::vector<int64_t>{60, 61}));
  EXPECT_EQ(c->num_hidden_layers, 4);
  for (int64_t l = 0; l < 3; ++l) EXPECT_EQ(c->token_mixer(l), TokenMixer::gated_deltanet) << l;
  EXPECT_EQ(c->token_mixer(3), TokenMixer::attention);
  EXPECT_EQ(c->linear_attention.num_key_heads, 2);
  EXPECT_EQ(c->linear_attention.num_value_heads, 4);
  EXPECT_EQ(c->linear_attention.conv_dim(), 2 * 16 + 32);
  EXPECT_EQ(c->rotary_dim(), 4);
  EXPECT_DOUBLE_EQ(c->rope_theta, 1e7);
  EXPECT_TRUE(c->attention_gate && c->unit_offset_norms && c->qk_norm);
  EXPECT_EQ(c->eos_token_ids, (std::vector<int64_t>{63}));
  EXPECT_EQ(c->dtype, Dtype::bf16);
  // glint writes the text model, which reads back the same.
  auto again = ModelConfig::parse(c->to_json());
  ASSERT_TRUE(again) << describe(again.error()) << "\n" << c->to_json();
  EXPECT_FALSE(again->from_multimodal);
  EXPECT_EQ(json::parse(c->to_json())["architectures"][0], "Qwen3_5ForCausalLM");
  EXPECT_EQ(again->token_mixers, c->token_mixers);
  EXPECT_EQ(again->rotary_dim(), 4);
  EXPECT_EQ(again->num_parameters(), c->num_parameters());
  // The interval form, and transformers' legacy spellings of layer types.
  auto j = qwen35_json();
  j["text_config"].erase("layer_types");
  j["text_config"]["num_hidden_layers"] = 8;
  j["text_config"]["full_attention_interval"] = 2;
  auto interval = parse(j);
  ASSERT_TRUE(interval) << describe(interval.error());
  for (int64_t l = 0; l < 8; ++l)
    EXPECT_EQ(interval->token_mixer(l), l % 2 ? TokenMixer::attention : TokenMixer::gated_deltanet) << l;
  j["text_config"]["layer_types"] = {"mamba", "attention", "mamba", "mamba", "attention", "mamba", "mamba", "attention"};
  auto legacy = parse(j);
  ASSERT_TRUE(legacy) << describe(legacy.error());
  EXPECT_EQ(legacy->token_mixer(1), TokenMixer::attention);
  EXPECT_EQ(legacy->token_mixer(2), TokenMixer::gated_deltanet);
  // A text-only config (Qwen3_5ForCausalLM) is the text_config itself.
  auto text = qwen35_json()["text_config"];
  text["architectures"] = {"Qwen3_5ForCausalLM"};
  auto plain = parse(text);
  ASSERT_TRUE(plain) << describe(plain.error());
  EXPECT_FALSE(plain->from_multimodal);
  EXPECT_EQ(plain->num_parameters(), c->num_parameters());
  // The MoE family: every layer sparse, always renormalised.
  auto moe = parse(qwen35_moe_json());
  ASSERT_TRUE(moe) << describe(moe.error());
  EXPECT_EQ(moe->architecture, Architecture::qwen3_5_moe);
  for (int64_t l = 0; l < 4; ++l) EXPECT_EQ(moe->feed_forward(l), FeedForward::sparse);
  EXPECT_TRUE(moe->moe.norm_topk_prob);
  EXPECT_EQ(moe->moe.shared_expert_intermediate_size, 20);
  auto moe_again = ModelConfig::parse(moe->to_json());
  ASSERT_TRUE(moe_again) << describe(moe_again.error()) << "\n" << moe->to_json();
  EXPECT_EQ(moe_again->num_parameters(), moe->num_parameters());
}

TEST(Qwen35Config, RefusesWhatItCannotHonourNamingTheField) {
  auto refused = [](const std::function<void(json&)>& edit, const char* expect, bool moe = false) {
    auto j = moe ? qwen35_moe_json() : qwen35_json();
    edit(j);
    auto c = parse(j);
    ASSERT_FALSE(c) << "accepted: " << j.dump();
    EXPECT_NE(describe(c.error()).find(expect), std::string::npos) << describe(c.error());
  };
  refused([](json& j) { j["text_config"]["layer_types"] = {"linear_attention", "full_attention"}; }, "layer_types");
  refused([](json& j) { j["text_config"]["layer_types"][1] = "sliding_attention"; }, "sliding_attention");
  refused([](json& j) { j["text_config"]["linear_num_value_heads"] = 3; }, "multiple of linear_num_key_heads");
  refused([](json& j) { j["text_config"]["linear_conv_kernel_dim"] = 0; }, "linear_conv_kernel_dim");
  refused([](json& j) { j["text_config"]["attn_output_gate"] = false; }, "attn_output_gate");
  refused([](json& j) { j["text_config"]["output_gate_type"] = "sigmoid"; }, "output_gate_type");
  refused([](json& j) { j["tie_word_embeddings"] = true; }, "tie_word_embeddings");
  refused([](json& j) { j["text_config"]["partial_rotary_factor"] = 0.5; }, "partial_rotary_factor");
  refused([](json& j) {
    j["text_config"]["rope_parameters"]["partial_rotary_factor"] = 0.1;
    j["text_config"]["partial_rotary_factor"] = 0.1;
  }, "int(head_dim");
  refused([](json& j) { j["text_config"]["rope_parameters"].erase("rope_theta"); }, "rope_theta");
  refused([](json& j) { j["text_config"]["text_config"] = 1, j["text_config"] = 3; }, "text_config");
  refused([](json& j) { j["architectures"] = {"Qwen3NextForCausalLM"}; }, "Qwen3-Next");
  refused([](json& j) { j["text_config"]["norm_topk_prob"] = false; }, "renormalises", true);
  refused([](json& j) { j["text_config"]["decoder_sparse_step"] = 2; }, "every layer sparse", true);
  refused([](json& j) { j["text_config"]["shared_expert_intermediate_size"] = 0; }, "shared expert", true);
  refused([](json& j) { j["image_token_id"] = 64; }, "outside the vocabulary");
}

// -- the float64 reference ----------------------------------------------------------------

// The whole model on one unpadded sequence, in float64, token by token.
struct Reference {
  const ModelConfig& c;
  std::map<std::string, at::Tensor> p;

  explicit Reference(const CausalLM& lm) : c(lm.config()) {
    for (const auto& [n, t] : lm.impl().params) p[n] = t.detach().to(at::kDouble);
  }
  at::Tensor lin(const std::string& m, const at::Tensor& x) const { return at::matmul(x, p.at(m + ".weight").t()); }
  // (1 + w) RMSNorm.
  at::Tensor norm(const at::Tensor& x, const std::string& w) const {
    return x / at::sqrt(x.pow(2).mean(-1, true) + c.rms_norm_eps) * (1 + p.at(w));
  }
  static at::Tensor silu(const at::Tensor& x) { return x / (1 + at::exp(-x)); }
  at::Tensor swiglu(const std::string& m, const at::Tensor& x) const {
    return lin(m + ".down_proj", silu(lin(m + ".gate_proj", x)) * lin(m + ".up_proj", x));
  }
  // Partial RoPE of one head's vector at position t: rotate-half within the
  // first rot dimensions.
  at::Tensor rope(const at::Tensor& x, int64_t t) const {
    const int64_t rot = c.rotary_dim(), half = rot / 2;
    auto out = x.clone();
    for (int64_t i = 0; i < half; ++i) {
      const double angle = static_cast<double>(t) * std::pow(c.rope_theta, -2.0 * static_cast<double>(i) / rot);
      const double a = x[i].item<double>(), b = x[i + half].item<double>();
      out[i] = a * std::cos(angle) - b * std::sin(angle);
      out[i + half] = b * std::cos(angle) + a * std::sin(angle);
    }
    return out;
  }
  at::Tensor ffn(int64_t l, const at::Tensor& h) const {  // h [H], one token
    const auto pre = "model.layers." + std::to_string(l) + ".mlp";
    if (c.feed_forward(l) == FeedForward::dense) return swiglu(pre, h);
    auto probs = at::softmax(lin(pre + ".gate", h), -1);
    std::vector<std::pair<double, int64_t>> ranked;
    for (int64_t e = 0; e < c.moe.num_experts; ++e) ranked.emplace_back(probs[e].item<double>(), e);
    std::sort(ranked.begin(), ranked.end(), std::greater<>{});
    double total = 0;
    for (int64_t j = 0; j < c.moe.num_experts_per_tok; ++j) total += ranked[static_cast<size_t>(j)].first;
    auto y = at::zeros_like(h);
    for (int64_t j = 0; j < c.moe.num_experts_per_tok; ++j) {
      auto [w, e] = ranked[static_cast<size_t>(j)];
      y += w / total * swiglu(pre + ".experts." + std::to_string(e), h);
    }
    return y + at::sigmoid(lin(pre + ".shared_expert_gate", h)) * swiglu(pre + ".shared_expert", h);
  }

  at::Tensor logits(const std::vector<int64_t>& ids) const {
    const int64_t T = static_cast<int64_t>(ids.size()), H = c.hidden_size;
    const int64_t nh = c.num_attention_heads, nkv = c.num_key_value_heads, D = c.head_dim;
    const auto& la = c.linear_attention;
    const int64_t nk = la.num_key_heads, dk = la.key_head_dim, nv = la.num_value_heads, dv = la.value_head_dim;
    const int64_t K = la.conv_kernel_dim, C = la.conv_dim();
    auto x = p.at("model.embed_tokens.weight").index_select(0, at::tensor(ids, at::kLong));  // [T, H]
    for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
      const auto pre = "model.layers." + std::to_string(l) + ".";
      auto h = norm(x, pre + "input_layernorm.weight");
      auto mixed = at::zeros({T, H}, at::kDouble);
      if (c.token_mixer(l) == TokenMixer::gated_deltanet) {
        const auto a = pre + "linear_attn.";
        auto w_conv = p.at(a + "conv1d.weight").view({C, K});
        std::vector<at::Tensor> pre_conv;  // in_proj_qkv's rows so far
        std::vector<at::Tensor> S(static_cast<size_t>(nv));
        for (auto& s : S) s = at::zeros({dk, dv}, at::kDouble);
        for (int64_t t = 0; t < T; ++t) {
          auto ht = h[t];
          pre_conv.push_back(lin(a + "in_proj_qkv", ht));
          // Tap K-1 is this token, tap K-1-j the token j before (0 before the start).
          auto conv = at::zeros({C}, at::kDouble);
          for (int64_t j = 0; j < K; ++j)
            if (t - j >= 0) conv += w_conv.select(1, K - 1 - j) * pre_conv[static_cast<size_t>(t - j)];
          conv = silu(conv);
          auto z = lin(a + "in_proj_z", ht), b = lin(a + "in_proj_b", ht), alpha = lin(a + "in_proj_a", ht);
          auto o = at::zeros({nv * dv}, at::kDouble);
          for (int64_t head = 0; head < nv; ++head) {
            const int64_t kh = head / (nv / nk);
            auto q = conv.narrow(0, kh * dk, dk), k = conv.narrow(0, nk * dk + kh * dk, dk);
            auto v = conv.narrow(0, 2 * nk * dk + head * dv, dv);
            q = q / at::sqrt(q.pow(2).sum() + 1e-6) / std::sqrt(static_cast<double>(dk));
            k = k / at::sqrt(k.pow(2).sum() + 1e-6);
            const double beta = 1 / (1 + std::exp(-b[head].item<double>()));
            const double sp = std::log1p(std::exp(alpha[head].item<double>() + p.at(a + "dt_bias")[head].item<double>()));
            const double g = -std::exp(p.at(a + "A_log")[head].item<double>()) * sp;
            auto& s = S[static_cast<size_t>(head)];
            s = std::exp(g) * s;
            auto u = beta * (v - at::matmul(s.t(), k));
            s = s + at::outer(k, u);
            auto oh = at::matmul(s.t(), q);
            // The gated output norm, per head over dv, with a plain weight.
            oh = oh / at::sqrt(oh.pow(2).mean() + c.rms_norm_eps) * p.at(a + "norm.weight") *
                 silu(z.narrow(0, head * dv, dv));
            o.narrow(0, head * dv, dv).copy_(oh);
          }
          mixed[t] = lin(a + "out_proj", o);
        }
      } else {
        const auto a = pre + "self_attn.";
        std::vector<at::Tensor> keys, values;
        for (int64_t t = 0; t < T; ++t) {
          auto ht = h[t];
          auto qg = lin(a + "q_proj", ht).view({nh, 2 * D});
          auto k = lin(a + "k_proj", ht).view({nkv, D}), v = lin(a + "v_proj", ht).view({nkv, D});
          std::vector<at::Tensor> kt;
          for (int64_t j = 0; j < nkv; ++j) kt.push_back(rope(norm(k[j], a + "k_norm.weight"), t));
          keys.push_back(at::stack(kt));
          values.push_back(v);
          auto out = at::zeros({nh * D}, at::kDouble);
          for (int64_t head = 0; head < nh; ++head) {
            const int64_t g = head / (nh / nkv);
            auto q = rope(norm(qg[head].narrow(0, 0, D), a + "q_norm.weight"), t);
            std::vector<double> scores;
            for (int64_t s = 0; s <= t; ++s)
              scores.push_back(at::dot(q, keys[static_cast<size_t>(s)][g]).item<double>() / std::sqrt(static_cast<double>(D)));
            const double top = *std::max_element(scores.begin(), scores.end());
            double total = 0;
            for (auto& s : scores) total += (s = std::exp(s - top));
            auto o = at::zeros({D}, at::kDouble);
            for (int64_t s = 0; s <= t; ++s) o += scores[static_cast<size_t>(s)] / total * values[static_cast<size_t>(s)][g];
            out.narrow(0, head * D, D).copy_(o * at::sigmoid(qg[head].narrow(0, D, D)));
          }
          mixed[t] = lin(a + "o_proj", out);
        }
      }
      x = x + mixed;
      h = norm(x, pre + "post_attention_layernorm.weight");
      auto f = at::zeros({T, H}, at::kDouble);
      for (int64_t t = 0; t < T; ++t) f[t] = ffn(l, h[t]);
      x = x + f;
    }
    auto head = c.tie_word_embeddings ? p.at("model.embed_tokens.weight") : p.at("lm_head.weight");
    return at::matmul(norm(x, "model.norm.weight"), head.t());
  }
};

// A random model of config `j` with every weight away from its start: the
// (1 + w) norms' w drawn (init makes them 0), the gates and the DeltaNet's
// decays spread, the projections scaled up so attention and routing are
// not uniform.
CausalLM sharp_model(const json& j, uint64_t seed, double scale = 6.0) {
  auto c = parse(j);
  EXPECT_TRUE(c) << describe(c.error());
  auto lm = CausalLM::init_random(*c, seed);
  EXPECT_TRUE(lm) << describe(lm.error());
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed + 100);
  for (auto& [n, t] : lm->impl().params) {
    if (n.find("norm.weight") != std::string::npos) t.normal_(n.find("linear_attn") != std::string::npos ? 1.0 : 0.0, 0.3, gen);
    else if (n.find("A_log") != std::string::npos || n.find("dt_bias") != std::string::npos) t.normal_(0.0, 1.0, gen);
    else if (n.find("conv1d") != std::string::npos) t.normal_(0.0, 0.5, gen);
    else t.mul_(n.find("mlp.gate") != std::string::npos ? 5 * scale : scale);
  }
  return std::move(*lm);
}

std::vector<int64_t> random_ids(int64_t n, int64_t vocab, uint64_t seed) {
  std::mt19937_64 rng{seed};
  std::vector<int64_t> v(static_cast<size_t>(n));
  for (auto& t : v) t = static_cast<int64_t>(rng() % static_cast<uint64_t>(vocab - 8));  // not the media ids
  return v;
}

Tensor row(const std::vector<int64_t>& v) { return *Tensor::from_values(v, {1, static_cast<int64_t>(v.size())}); }

struct Variant {
  const char* name;
  json config;
};

std::vector<Variant> variants() {
  auto half = qwen35_json();
  half["text_config"]["rope_parameters"]["partial_rotary_factor"] = 0.5;
  half["text_config"]["partial_rotary_factor"] = 0.5;
  half["text_config"]["layer_types"] = {"full_attention", "linear_attention", "full_attention", "linear_attention"};
  half["text_config"]["linear_num_value_heads"] = 2;  // as many value heads as key heads
  half["tie_word_embeddings"] = true;
  half["text_config"]["tie_word_embeddings"] = true;
  return {{"qwen3_5", qwen35_json()}, {"qwen3_5 rotary 0.5, full first, tied", half}, {"qwen3_5_moe", qwen35_moe_json()}};
}

// 70 tokens: the chunked rule (chunks of 64) carries its state into a second chunk.
TEST(Qwen35Model, LogitsMatchTheFloat64Recurrence) {
  for (const auto& [name, config] : variants()) {
    SCOPED_TRACE(name);
    auto lm = sharp_model(config, 1);
    const auto ids = random_ids(70, lm.config().vocab_size, 11);
    Reference ref{lm};
    auto want = ref.logits(ids);
    auto got = lm.forward({.input_ids = row(ids)}, {.logits = true});
    ASSERT_TRUE(got) << describe(got.error());
    const double err = (to_torch(got->logits)[0].to(at::kDouble) - want).abs().max().item<double>();
    std::printf("[ qwen3.5 ] %s: max |logit - f64 recurrence| %.2e, logits up to %.1f\n", name, err,
                want.abs().max().item<double>());
    EXPECT_LT(err, 1e-4);
    // In float64 the chunked model and the recurrence agree to rounding,
    // for a chunk that divides T and one that does not.
    for (auto& [n, t] : lm.impl().params) t = t.to(at::kDouble);
    auto prepared = model_detail::prepare(lm.config(), {.input_ids = row(ids)});
    ASSERT_TRUE(prepared);
    for (int64_t chunk : {64, 7}) {
      lm.impl().gdn_chunk = chunk;
      auto out = lm.impl().run(*prepared, false, true);
      EXPECT_LT((out.logits[0] - want).abs().max().item<double>(), 1e-9) << "chunk " << chunk;
    }
  }
}

// A vision-language checkpoint on disk: weights under model.language_model.,
// a vision tower and an MTP head beside them, MoE experts fused. It loads
// as the text model, equal to the same weights in glint's layout.
TEST(Qwen35Model, LoadsTheVisionLanguageLayoutAndSkipsTheVisionTower) {
  for (const auto& [name, config] : variants()) {
    SCOPED_TRACE(name);
    auto lm = sharp_model(config, 2);
    const auto& c = lm.config();
    const auto dir = glint::testing::fresh_dir("qwen35-vl");
    NamedTensors tensors;
    std::map<std::string, at::Tensor> fused;  // per sparse layer: gate_up, down
    for (const auto& [n, t] : lm.impl().params) {
      std::string to = n.rfind("model.", 0) == 0 ? "model.language_model." + n.substr(6) : n;
      if (auto e = n.find(".mlp.experts."); e != std::string::npos) {
        // mlp.experts.{e}.{gate,up,down}_proj.weight -> gate_up_proj [E, 2I, H], down_proj [E, H, I]
        const auto layer = to.substr(0, to.find(".mlp.experts.")) + ".mlp.experts.";
        const auto rest = n.substr(e + 13);
        const int64_t expert = std::stoll(rest);
        const auto proj = rest.substr(rest.find('.') + 1);
        const int64_t E = c.moe.num_experts, I = c.moe.moe_intermediate_size, H = c.hidden_size;
        if (proj == "down_proj.weight") {
          auto& f = fused[layer + "down_proj"];
          if (!f.defined()) f = at::zeros({E, H, I});
          f[expert].copy_(t);
        } else {
          auto& f = fused[layer + "gate_up_proj"];
          if (!f.defined()) f = at::zeros({E, 2 * I, H});
          f[expert].narrow(0, proj == "gate_proj.weight" ? 0 : I, I).copy_(t);
        }
        continue;
      }
      tensors.emplace_back(to, *from_torch(t.clone()));
    }
    for (auto& [n, t] : fused) tensors.emplace_back(n, *from_torch(t));
    tensors.emplace_back("model.visual.patch_embed.proj.weight", *from_torch(at::ones({16, 3})));
    tensors.emplace_back("mtp.fc.weight", *from_torch(at::ones({32, 64})));
    ASSERT_TRUE(write_safetensors(dir + "/model.safetensors", tensors));
    std::ofstream{dir + "/config.json"} << config.dump(2);
    auto loaded = CausalLM::load(dir);
    ASSERT_TRUE(loaded) << describe(loaded.error());
    const auto ids = row(random_ids(9, c.vocab_size, 3));
    auto want = lm.forward({.input_ids = ids});
    auto got = loaded->forward({.input_ids = ids});
    ASSERT_TRUE(want && got);
    EXPECT_TRUE(at::equal(to_torch(want->logprobs), to_torch(got->logprobs)));
    // glint saves the text model (Qwen3_5ForCausalLM), which loads back the
    // same (in float32 here: the config's bfloat16 would round).
    loaded->impl().cfg.dtype = Dtype::f32;
    const auto out = glint::testing::fresh_dir("qwen35-text");
    ASSERT_TRUE(loaded->save(out));
    auto text = CausalLM::load(out);
    ASSERT_TRUE(text) << describe(text.error());
    auto again = text->forward({.input_ids = ids});
    ASSERT_TRUE(again);
    EXPECT_TRUE(at::equal(to_torch(want->logprobs), to_torch(again->logprobs)));
    // The image placeholder is refused: the vision tower is not run.
    auto image = loaded->forward({.input_ids = ids_of({{1, 60, 2}})});
    ASSERT_FALSE(image);
    EXPECT_NE(describe(image.error()).find("image or video"), std::string::npos) << describe(image.error());
  }
}

// A packed row (segment_ids) equals its segments run alone: the conv window
// and the delta rule's state restart at each segment, as do the positions.
// A left-padded row equals the row without its padding.
TEST(Qwen35Model, PackedRowsEqualTheirSegmentsAloneAndPaddingChangesNothing) {
  for (const auto& [name, config] : variants()) {
    SCOPED_TRACE(name);
    auto lm = sharp_model(config, 4);
    const auto a = random_ids(5, 64, 1), b = random_ids(9, 64, 2);
    std::vector<int64_t> packed = a, seg(a.size(), 0);
    packed.insert(packed.end(), b.begin(), b.end());
    seg.resize(packed.size(), 1);
    auto together = lm.forward({.input_ids = row(packed), .segment_ids = row(seg)});
    auto first = lm.forward({.input_ids = row(a)});
    auto second = lm.forward({.input_ids = row(b)});
    ASSERT_TRUE(together && first && second);
    auto t = to_torch(together->logprobs)[0];
    // The last token of each segment has no target within it: compare the others.
    EXPECT_LT((t.narrow(0, 0, 4) - to_torch(first->logprobs)[0].narrow(0, 0, 4)).abs().max().item<float>(), 1e-5);
    EXPECT_LT((t.narrow(0, 5, 8) - to_torch(second->logprobs)[0].narrow(0, 0, 8)).abs().max().item<float>(), 1e-5);
    std::vector<int64_t> padded(3, 0), mask(3, 0);
    padded.insert(padded.end(), b.begin(), b.end());
    mask.resize(padded.size(), 1);
    auto left = lm.forward({.input_ids = row(padded), .attention_mask = row(mask)});
    ASSERT_TRUE(left);
    EXPECT_LT((to_torch(left->logprobs)[0].narrow(0, 3, 8) - to_torch(second->logprobs)[0].narrow(0, 0, 8))
                  .abs().max().item<float>(), 1e-5);
  }
}

using glint::testing::central_difference;

// Every kind of parameter's gradient through the whole model (the fused
// kernels' hand-written backward passes, a packed and a padded row), and a
// LoRA adapter's on the Gated DeltaNet's projections, against finite
// differences in float64.
TEST(Qwen35Training, GradientsMatchFiniteDifferencesInFloat64) {
  for (const auto& [name, config] : variants()) {
    SCOPED_TRACE(name);
    auto lm = sharp_model(config, 6);
    LoraConfig lora{.r = 2, .alpha = 4};
    lora.target_modules = {"in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a", "out_proj", "q_proj"};
    ASSERT_TRUE(lm.add_adapter("a", lora, 3));
    auto& impl = lm.impl();
    for (auto& [n, p] : impl.params) p = p.to(at::kDouble).requires_grad_(true);
    for (auto& [m, ab] : impl.adapters.at("a").weights) {
      ab.first = ab.first.to(at::kDouble).requires_grad_(true);
      ab.second = ab.second.to(at::kDouble).normal_(0, 0.3).requires_grad_(true);
    }
    impl.gdn_chunk = 4;  // several chunks, one partial
    auto prepared = model_detail::prepare(lm.config(), {.input_ids = ids_of({{1, 5, 9, 2, 7, 3, 4, 8, 6, 1, 2}, {3, 3, 8, 1, 2, 0, 0, 0, 0, 0, 0}}),
                                                        .attention_mask = ids_of({{1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1}, {1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0}}),
                                                        .segment_ids = ids_of({{0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1}, {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}})});
    ASSERT_TRUE(prepared) << describe(prepared.error());
    PassOptions pass;
    pass.lora = &impl.adapters.at("a");
    auto objective = [&] { return impl.run(*prepared, false, false, pass).logprobs.sum(); };
    objective().backward();
    std::vector<std::pair<std::string, at::Tensor>> checked;
    for (const char* n : {"model.embed_tokens.weight", "model.layers.0.input_layernorm.weight", "model.norm.weight"})
      checked.emplace_back(n, impl.params.at(n));
    for (int64_t l = 0; l < lm.config().num_hidden_layers; ++l) {
      const auto pre = "model.layers." + std::to_string(l) + ".";
      if (lm.config().token_mixer(l) == TokenMixer::gated_deltanet) {
        for (const char* n : {"in_proj_qkv.weight", "in_proj_z.weight", "in_proj_b.weight", "in_proj_a.weight",
                              "conv1d.weight", "A_log", "dt_bias", "norm.weight", "out_proj.weight"})
          checked.emplace_back(pre + "linear_attn." + n, impl.params.at(pre + "linear_attn." + n));
        checked.emplace_back(pre + "linear_attn.in_proj_qkv lora_B", impl.adapters.at("a").weights.at(pre + "linear_attn.in_proj_qkv").second);
        checked.emplace_back(pre + "linear_attn.in_proj_a lora_A", impl.adapters.at("a").weights.at(pre + "linear_attn.in_proj_a").first);
      } else {
        for (const char* n : {"q_proj.weight", "k_norm.weight", "q_norm.weight", "o_proj.weight"})
          checked.emplace_back(pre + "self_attn." + n, impl.params.at(pre + "self_attn." + n));
      }
    }
    for (const auto& [n, p] : checked) {
      ASSERT_TRUE(p.grad().defined()) << n;
      for (int64_t i : {int64_t{0}, p.numel() / 3, p.numel() - 1}) {
        const double fd = central_difference(objective, p, i), ad = p.grad().view({-1})[i].item<double>();
        EXPECT_NEAR(ad, fd, 1e-6 * std::max(1.0, std::abs(fd))) << n << "[" << i << "]";
      }
    }
  }
}

// Micro-batches train as the whole batch (in float64, to rounding), and a
// step lowers the loss.
TEST(Qwen35Training, MicroBatchesTrainAsTheWholeBatchAndAStepLowersTheLoss) {
  for (const auto& [name, config] : variants()) {
    SCOPED_TRACE(name);
    TrainBatch b{.tokens = {.input_ids = ids_of({{1, 5, 9, 2, 7, 3}, {3, 3, 8, 1, 2, 6}, {4, 0, 2, 2, 9, 1}})}};
    std::map<std::string, at::Tensor> grads[2];
    double loss[2] = {0, 0};
    for (int split = 0; split < 2; ++split) {
      auto lm = sharp_model(config, 3);
      for (auto& [n, p] : lm.impl().params) p = p.to(at::kDouble);
      auto t = Trainer::create(std::move(lm), {.micro_batch_rows = split ? 1 : 0});
      ASSERT_TRUE(t) << describe(t.error());
      auto m = t->forward_backward(b, {});
      ASSERT_TRUE(m) << describe(m.error());
      loss[split] = m->at("loss");
      for (const auto& [n, p] : t->model().impl().params)
        if (p.grad().defined()) grads[split][n] = p.grad().clone();
      if (split == 1) {
        ASSERT_TRUE(t->clip_grad_and_step());
        auto after = t->forward_backward(b, {});
        ASSERT_TRUE(after);
        EXPECT_LT(after->at("loss"), loss[1]);
      }
    }
    EXPECT_NEAR(loss[0], loss[1], 1e-10);
    ASSERT_EQ(grads[0].size(), grads[1].size());
    for (const auto& [n, g] : grads[0])
      EXPECT_LT((g - grads[1].at(n)).abs().max().item<double>(), 1e-10 * std::max(1.0, g.abs().max().item<double>())) << n;
  }
}

// -- the sampler ------------------------------------------------------------------------

// Greedy tokens of the float64 reference, recomputed over the whole
// sequence at each step.
std::vector<int64_t> reference_greedy(const CausalLM& lm, std::vector<int64_t> seq, int n) {
  Reference ref{lm};
  std::vector<int64_t> out;
  for (int i = 0; i < n; ++i) {
    auto l = ref.logits(seq)[static_cast<int64_t>(seq.size()) - 1];
    auto top = std::get<0>(l.topk(2));
    EXPECT_GT((top[0] - top[1]).item<double>(), 1e-4) << "a near-tie in the reference's logits at token " << i;
    out.push_back(l.argmax().item<int64_t>());
    seq.push_back(out.back());
  }
  return out;
}

// The sampler carries each sequence's conv window and recurrent state:
// greedy output equals the float64 recurrence, with prompts prefilled in
// chunks over several steps (max_num_batched_tokens 16) and decoded
// together.
TEST(Qwen35Sampler, GreedyGenerationEqualsTheFloat64Recurrence) {
  for (const auto& [name, config] : variants()) {
    SCOPED_TRACE(name);
    auto lm = sharp_model(config, 3);
    std::vector<std::vector<int64_t>> prompts = {random_ids(37, 64, 4), random_ids(5, 64, 5), random_ids(1, 64, 6)};
    auto engine = Engine::create(lm, {.max_num_batched_tokens = 16});
    ASSERT_TRUE(engine) << describe(engine.error());
    EXPECT_FALSE(engine->config().enable_prefix_caching);
    EXPECT_GT(engine->stats().state_bytes_per_sequence, 0);
    auto outs = engine->generate(prompts, {.max_tokens = 8, .temperature = 0, .ignore_eos = true});
    for (size_t i = 0; i < prompts.size(); ++i) {
      ASSERT_TRUE(outs[i]) << describe(outs[i].error());
      EXPECT_EQ(outs[i]->sequences.at(0).tokens, reference_greedy(lm, prompts[i], 8)) << "prompt " << i;
    }
  }
}

// Log-probabilities of sampled tokens (n = 3 forks of one prompt's state,
// many sequences in one step, a cache small enough to preempt and
// recompute) equal the trainer's forward pass on the same tokens.
TEST(Qwen35Sampler, SampledLogprobsEqualTheTrainersThroughForksAndPreemption) {
  for (const auto& [name, config] : variants()) {
    SCOPED_TRACE(name);
    // The text model only: a sampled token may be any id, the image
    // placeholder too, which the trainer's pass would refuse.
    auto text = config;
    text.erase("image_token_id");
    text.erase("video_token_id");
    auto lm = sharp_model(text, 5, 4.0);
    auto probe = Engine::create(lm, {});
    ASSERT_TRUE(probe) << describe(probe.error());
    const int64_t state = probe->stats().state_bytes_per_sequence;
    // Room for the states of 8 sequences and few KV blocks: 4 prompts of 3
    // samples must take turns and be preempted.
    const auto& c = lm.config();
    const int64_t block = 2 * c.layers_of(TokenMixer::attention) * 16 * c.num_key_value_heads * c.head_dim * 4;
    auto engine = Engine::create(lm, {.cache_bytes = 16 * state + 5 * block, .max_num_seqs = 8, .max_num_batched_tokens = 32});
    ASSERT_TRUE(engine) << describe(engine.error());
    EXPECT_EQ(engine->stats().state_slots, 8);
    std::vector<std::vector<int64_t>> prompts;
    for (uint64_t k = 0; k < 4; ++k) prompts.push_back(random_ids(6 + 5 * static_cast<int64_t>(k), 64, 20 + k));
    SamplingParams p{.num_samples = 3, .max_tokens = 40, .temperature = 1.0, .seed = 7, .ignore_eos = true, .logprobs = 1};
    auto outs = engine->generate(prompts, p);
    double worst = 0;
    for (size_t i = 0; i < prompts.size(); ++i) {
      ASSERT_TRUE(outs[i]) << describe(outs[i].error());
      for (const auto& sq : outs[i]->sequences) {
        auto full = prompts[i];
        full.insert(full.end(), sq.tokens.begin(), sq.tokens.end());
        auto fwd = lm.forward({.input_ids = row(full)});
        ASSERT_TRUE(fwd);
        auto want = to_torch(fwd->logprobs)[0];
        ASSERT_EQ(sq.logprobs.chosen.size(), sq.tokens.size());
        for (size_t t = 0; t < sq.tokens.size(); ++t)
          worst = std::max(worst, std::abs(sq.logprobs.chosen[t] - want[static_cast<int64_t>(prompts[i].size() + t) - 1].item<double>()));
        for (size_t t = 0; t < sq.tokens.size(); ++t)
          EXPECT_NEAR(sq.logprobs.chosen[t], want[static_cast<int64_t>(prompts[i].size() + t) - 1].item<float>(), 1e-5)
              << "prompt " << i << " token " << t;
      }
    }
    std::printf("[ qwen3.5 sampler ] %s: max |sampler - trainer log-prob| %.1e; %lld preemptions, %lld tokens recomputed, "
                "state %lld bytes per sequence\n", name, worst,
                static_cast<long long>(engine->stats().preemptions), static_cast<long long>(engine->stats().recomputed_tokens),
                static_cast<long long>(state));
    EXPECT_GT(engine->stats().preemptions, 0);
  }
}

// A budget that cannot hold one sequence's state is refused before any work.
TEST(Qwen35Sampler, AStateThatCannotFitIsRefusedSayingWhy) {
  auto lm = sharp_model(qwen35_json(), 1);
  auto e = Engine::create(lm, {.cache_bytes = 1000});
  ASSERT_FALSE(e);
  EXPECT_NE(describe(e.error()).find("Gated DeltaNet state"), std::string::npos) << describe(e.error());
  // The image placeholder in a prompt is refused too.
  auto ok = Engine::create(lm, {});
  ASSERT_TRUE(ok);
  auto image = ok->add_request({1, 60, 2}, {});
  ASSERT_FALSE(image);
  EXPECT_NE(describe(image.error()).find("image or video"), std::string::npos) << describe(image.error());
}

// Tensor and pipeline parallelism and GGUF export refuse the family, naming it.
TEST(Qwen35Model, WhatIsNotBuiltIsRefusedNamingTheLayerKind) {
  auto lm = sharp_model(qwen35_json(), 1);
  auto copy = sharp_model(qwen35_json(), 1);
  auto pg = std::make_shared<glint::testing::FakeProcessGroup>(0, 2);
  auto tp = tp::shard_model(lm.impl(), pg);
  ASSERT_FALSE(tp);
  EXPECT_NE(describe(tp.error()).find("Gated DeltaNet"), std::string::npos) << describe(tp.error());
  auto pp = pp::shard_model(copy.impl(), pg);
  ASSERT_FALSE(pp);
  EXPECT_NE(describe(pp.error()).find("Gated DeltaNet"), std::string::npos) << describe(pp.error());
  const auto dir = glint::testing::fresh_dir("qwen35-gguf");
  ASSERT_TRUE(lm.save(dir + "/model"));
  auto gguf = export_gguf(dir + "/model", dir + "/m.gguf");
  ASSERT_FALSE(gguf);
  EXPECT_NE(describe(gguf.error()).find("Qwen3.5"), std::string::npos) << describe(gguf.error());
}

}  // namespace
}  // namespace glint::components
