// Mixture-of-experts models (Qwen3-MoE, Qwen2-MoE): config.json's expert
// fields honoured or refused, both on-disk expert layouts, and the forward
// pass against an independent float64 implementation written here from the
// equations (reference/model-families.md 1.1, 2): per token, softmax over
// every expert, the top k, optional renormalisation, the weighted sum of the
// chosen experts' SwiGLU (and Qwen2-MoE's sigmoid-gated shared expert).
#include "components/model/transformer.hpp"

#include "components/model/gguf_export.hpp"
#include "components/model/moe.hpp"
#include "components/parallel/tensor_parallel.hpp"
#include "components/model/trainer.hpp"
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

// -- config.json ------------------------------------------------------------------

// Qwen3-30B-A3B's config.json, with small sizes.
json qwen3_moe_json() {
  return json::parse(R"({
    "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe",
    "vocab_size": 64, "hidden_size": 32, "intermediate_size": 48, "moe_intermediate_size": 12,
    "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2,
    "num_experts": 8, "num_experts_per_tok": 2, "norm_topk_prob": true,
    "decoder_sparse_step": 1, "mlp_only_layers": [], "router_aux_loss_coef": 0.001,
    "output_router_logits": false, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "rope_scaling": null,
    "attention_bias": false, "use_sliding_window": false, "sliding_window": null, "max_window_layers": 48,
    "tie_word_embeddings": false, "max_position_embeddings": 128, "torch_dtype": "bfloat16",
    "hidden_act": "silu", "attention_dropout": 0.0, "use_cache": true
  })");
}

// Qwen1.5-MoE-A2.7B's, small.
json qwen2_moe_json() {
  return json::parse(R"({
    "architectures": ["Qwen2MoeForCausalLM"], "model_type": "qwen2_moe",
    "vocab_size": 64, "hidden_size": 32, "intermediate_size": 40, "moe_intermediate_size": 12,
    "shared_expert_intermediate_size": 20, "num_hidden_layers": 3, "num_attention_heads": 4,
    "num_key_value_heads": 4, "num_experts": 6, "num_experts_per_tok": 3, "norm_topk_prob": false,
    "decoder_sparse_step": 1, "router_aux_loss_coef": 0.001, "output_router_logits": false,
    "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "use_sliding_window": false, "sliding_window": 32768,
    "max_window_layers": 21, "tie_word_embeddings": false, "max_position_embeddings": 128,
    "torch_dtype": "bfloat16", "hidden_act": "silu"
  })");
}

Result<ModelConfig> parse(const json& j) { return ModelConfig::parse(j.dump(), "config.json"); }

TEST(MoeConfig, ReadsQwen3MoeAsTransformersDoes) {
  auto j = qwen3_moe_json();
  j["decoder_sparse_step"] = 2;
  j["mlp_only_layers"] = {3};
  auto c = parse(j);
  ASSERT_TRUE(c) << describe(c.error());
  EXPECT_EQ(c->architecture, Architecture::qwen3_moe);
  EXPECT_EQ(c->head_dim, 8);  // hidden / heads: Qwen3MoeConfig has no 128 default
  EXPECT_TRUE(c->qk_norm);
  EXPECT_FALSE(c->qkv_bias);
  EXPECT_EQ(c->moe.num_experts, 8);
  EXPECT_EQ(c->moe.num_experts_per_tok, 2);
  EXPECT_EQ(c->moe.moe_intermediate_size, 12);
  EXPECT_TRUE(c->moe.norm_topk_prob);
  EXPECT_EQ(c->moe.shared_expert_intermediate_size, 0);
  // (l + 1) % 2 == 0 and l not in mlp_only_layers: layer 1 only.
  std::vector<FeedForward> want{FeedForward::dense, FeedForward::sparse, FeedForward::dense, FeedForward::dense};
  for (int64_t l = 0; l < 4; ++l) EXPECT_EQ(c->feed_forward(l), want[static_cast<size_t>(l)]) << "layer " << l;
  // Written back as transformers reads it, and read again the same.
  auto again = ModelConfig::parse(c->to_json());
  ASSERT_TRUE(again) << describe(again.error());
  EXPECT_EQ(json::parse(again->to_json()), json::parse(c->to_json()));
  EXPECT_EQ(again->moe.mlp_only_layers, std::vector<int64_t>{3});
  EXPECT_EQ(again->feed_forward(1), FeedForward::sparse);
  // The parameter count follows the blocks: three dense layers, one sparse.
  const int64_t h = 32, attn = 32 * 32 * 2 + 2 * 32 * 16 + 2 * 8 + 2 * h;
  EXPECT_EQ(c->num_parameters(), 3 * (attn + 3 * h * 48) + (attn + 8 * h + 8 * 3 * h * 12) + h + 2 * 64 * h);
}

TEST(MoeConfig, ReadsQwen2MoeWithItsSharedExpertAndBiases) {
  auto c = parse(qwen2_moe_json());
  ASSERT_TRUE(c) << describe(c.error());
  EXPECT_EQ(c->architecture, Architecture::qwen2_moe);
  EXPECT_TRUE(c->qkv_bias);  // absent qkv_bias: true, as Qwen2's
  EXPECT_FALSE(c->o_bias);
  EXPECT_FALSE(c->qk_norm);
  EXPECT_EQ(c->moe.shared_expert_intermediate_size, 20);
  EXPECT_FALSE(c->moe.norm_topk_prob);
  EXPECT_EQ(c->sliding_window, 0);  // use_sliding_window false
  auto j = qwen2_moe_json();
  j["qkv_bias"] = false;  // transformers 5's field
  auto no_bias = parse(j);
  ASSERT_TRUE(no_bias) << describe(no_bias.error());
  EXPECT_FALSE(no_bias->qkv_bias);
  EXPECT_EQ(json::parse(no_bias->to_json())["qkv_bias"], false);
  // transformers 5's num_local_experts, alone or agreeing.
  j = qwen2_moe_json();
  j.erase("num_experts");
  j["num_local_experts"] = 6;
  auto local = parse(j);
  ASSERT_TRUE(local) << describe(local.error());
  EXPECT_EQ(local->moe.num_experts, 6);
}

TEST(MoeConfig, RefusesFieldsItCannotHonourNamingThem) {
  struct Case {
    const char* field;
    json value;
    const char* says;
  };
  const std::vector<Case> cases = {
      {"num_experts_per_tok", 9, "num_experts_per_tok is 9"},
      {"num_experts_per_tok", 0, "between 1 and num_experts"},
      {"output_router_logits", 1, "output_router_logits"},
      {"mlp_only_layers", json::array({7}), "mlp_only_layers names layer 7"},
      {"mlp_only_layers", "3", "mlp_only_layers"},
      {"decoder_sparse_step", 0, "decoder_sparse_step must be positive"},
      {"moe_intermediate_size", 0, "moe_intermediate_size"},
      {"num_local_experts", 16, "disagree"},
      {"num_experts", "eight", "num_experts"},
      {"norm_topk_prob", 1, "norm_topk_prob"},
  };
  for (const auto& k : cases) {
    auto j = qwen3_moe_json();
    j[k.field] = k.value;
    auto c = parse(j);
    ASSERT_FALSE(c) << k.field << " = " << k.value.dump();
    const auto msg = describe(c.error());
    EXPECT_NE(msg.find("config.json"), std::string::npos) << msg;
    EXPECT_NE(msg.find(k.says), std::string::npos) << k.field << ": " << msg;
  }
  auto j = qwen2_moe_json();
  j["shared_expert_intermediate_size"] = 0;
  EXPECT_FALSE(parse(j));
}

// -- the float64 reference ----------------------------------------------------------------

// The whole model on one unpadded sequence, in float64, from the equations:
// attention with GQA, q/k norm, RoPE; per token, per sparse layer, the
// router's softmax, its top k, and the chosen experts' weighted sum. The
// smallest gap between a token's k-th and (k+1)-th router probability is
// kept: where it is near 0, f32 rounding may pick another expert.
struct Reference {
  const ModelConfig& c;
  std::map<std::string, at::Tensor> p;
  double min_gap = 1.0;
  bool record = false;
  std::vector<std::pair<std::vector<double>, std::vector<int64_t>>> routes;  // per (layer, token): probs, chosen

  explicit Reference(const CausalLM& lm) : c(lm.config()) {
    for (const auto& [n, t] : lm.impl().params) p[n] = t.detach().to(at::kDouble);
  }
  at::Tensor lin(const std::string& m, const at::Tensor& x) const {
    auto y = at::matmul(x, p.at(m + ".weight").t());
    if (auto b = p.find(m + ".bias"); b != p.end()) y = y + b->second;
    return y;
  }
  at::Tensor norm(const at::Tensor& x, const at::Tensor& w) const {
    return x / at::sqrt(x.pow(2).mean(-1, true) + c.rms_norm_eps) * w;
  }
  at::Tensor swiglu(const std::string& m, const at::Tensor& x) const {
    auto g = lin(m + ".gate_proj", x);
    return lin(m + ".down_proj", g * at::sigmoid(g) * lin(m + ".up_proj", x));
  }
  at::Tensor rope(const at::Tensor& x) const {  // [T, heads, D]
    const int64_t T = x.size(0), D = c.head_dim, half = D / 2;
    auto out = x.clone();
    for (int64_t t = 0; t < T; ++t)
      for (int64_t i = 0; i < half; ++i) {
        const double angle = static_cast<double>(t) * std::pow(c.rope_theta, -2.0 * static_cast<double>(i) / D);
        auto a = x.select(0, t).select(-1, i), b = x.select(0, t).select(-1, i + half);
        out.select(0, t).select(-1, i).copy_(a * std::cos(angle) - b * std::sin(angle));
        out.select(0, t).select(-1, i + half).copy_(b * std::cos(angle) + a * std::sin(angle));
      }
    return out;
  }
  // Routing replay: (sparse layer ordinal, token) -> the experts it must use.
  std::map<std::pair<int64_t, int64_t>, std::vector<int64_t>> forced;
  int64_t ordinal = 0;  // of the sparse layer being run
  at::Tensor experts(const std::string& pre, const at::Tensor& x) {  // [T, H], token by token
    const auto& m = c.moe;
    auto y = at::zeros_like(x);
    for (int64_t t = 0; t < x.size(0); ++t) {
      auto xt = x[t];
      auto probs = at::softmax(lin(pre + "gate", xt), -1);
      std::vector<std::pair<double, int64_t>> ranked;
      for (int64_t e = 0; e < m.num_experts; ++e) ranked.emplace_back(probs[e].item<double>(), e);
      std::sort(ranked.begin(), ranked.end(), std::greater<>{});
      const auto f = forced.find({ordinal, t});
      if (f != forced.end()) {
        // The given experts, first, with the router's probabilities.
        std::vector<std::pair<double, int64_t>> given;
        for (auto e : f->second) given.emplace_back(probs[e].item<double>(), e);
        for (const auto& r : ranked)
          if (std::find(f->second.begin(), f->second.end(), r.second) == f->second.end()) given.push_back(r);
        ranked = given;
      }
      if (m.num_experts_per_tok < m.num_experts && f == forced.end())
        min_gap = std::min(min_gap, ranked[static_cast<size_t>(m.num_experts_per_tok) - 1].first -
                                        ranked[static_cast<size_t>(m.num_experts_per_tok)].first);
      if (record) {
        std::vector<double> all(static_cast<size_t>(m.num_experts));
        std::vector<int64_t> top;
        for (int64_t e = 0; e < m.num_experts; ++e) all[static_cast<size_t>(e)] = probs[e].item<double>();
        for (int64_t j = 0; j < m.num_experts_per_tok; ++j) top.push_back(ranked[static_cast<size_t>(j)].second);
        routes.emplace_back(std::move(all), std::move(top));
      }
      double total = 0;
      for (int64_t j = 0; j < m.num_experts_per_tok; ++j) total += ranked[static_cast<size_t>(j)].first;
      for (int64_t j = 0; j < m.num_experts_per_tok; ++j) {
        auto [w, e] = ranked[static_cast<size_t>(j)];
        if (m.norm_topk_prob) w /= total;
        y[t] += w * swiglu(pre + "experts." + std::to_string(e), xt);
      }
      if (m.shared_expert_intermediate_size > 0)
        y[t] += at::sigmoid(lin(pre + "shared_expert_gate", xt)).squeeze() * swiglu(pre + "shared_expert", xt);
    }
    return y;
  }
  at::Tensor logits(const std::vector<int64_t>& ids) {
    const int64_t T = static_cast<int64_t>(ids.size()), nh = c.num_attention_heads, nkv = c.num_key_value_heads;
    const int64_t D = c.head_dim;
    ordinal = 0;
    auto x = p.at("model.embed_tokens.weight").index_select(0, at::tensor(ids, at::kLong));
    for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
      const auto pre = "model.layers." + std::to_string(l) + ".";
      auto h = norm(x, p.at(pre + "input_layernorm.weight"));
      auto q = lin(pre + "self_attn.q_proj", h).view({T, nh, D});
      auto k = lin(pre + "self_attn.k_proj", h).view({T, nkv, D});
      auto v = lin(pre + "self_attn.v_proj", h).view({T, nkv, D});
      if (c.qk_norm) {
        q = norm(q, p.at(pre + "self_attn.q_norm.weight"));
        k = norm(k, p.at(pre + "self_attn.k_norm.weight"));
      }
      q = rope(q);
      k = rope(k);
      auto attn = at::zeros({T, nh, D}, at::kDouble);
      for (int64_t head = 0; head < nh; ++head) {
        const int64_t g = head / (nh / nkv);  // the key/value head it shares
        auto s = at::matmul(q.select(1, head), k.select(1, g).t()) / std::sqrt(static_cast<double>(D));
        s = s.masked_fill(at::ones({T, T}, at::kBool).triu(1), -INFINITY);
        attn.select(1, head).copy_(at::matmul(at::softmax(s, -1), v.select(1, g)));
      }
      x = x + lin(pre + "self_attn.o_proj", attn.reshape({T, nh * D}));
      h = norm(x, p.at(pre + "post_attention_layernorm.weight"));
      if (c.feed_forward(l) == FeedForward::sparse) {
        x = x + experts(pre + "mlp.", h);
        ++ordinal;
      } else {
        x = x + swiglu(pre + "mlp", h);
      }
    }
    ordinal = 0;
    return lin("lm_head", norm(x, p.at("model.norm.weight")));
  }
};

// A random model of config `j` whose routing and attention are far from
// uniform (weights scaled up).
CausalLM sharp_model(const json& j, uint64_t seed) {
  auto c = parse(j);
  EXPECT_TRUE(c) << describe(c.error());
  auto lm = CausalLM::init_random(*c, seed);
  EXPECT_TRUE(lm) << describe(lm.error());
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  for (auto& [n, t] : lm->impl().params) {
    if (n.size() > 5 && n.compare(n.size() - 5, 5, ".bias") == 0) t.normal_(0.0, 0.1, gen);  // init makes them 0
    else if (n.find("norm") == std::string::npos) t.mul_(n.find("mlp.gate") != std::string::npos ? 30.0 : 6.0);
  }
  return std::move(*lm);
}

std::vector<int64_t> random_ids(int64_t n, int64_t vocab, uint64_t seed) {
  std::mt19937_64 rng{seed};
  std::vector<int64_t> v(static_cast<size_t>(n));
  for (auto& t : v) t = static_cast<int64_t>(rng() % static_cast<uint64_t>(vocab));
  return v;
}

Tensor row(const std::vector<int64_t>& v) { return *Tensor::from_values(v, {1, static_cast<int64_t>(v.size())}); }

struct Variant {
  const char* name;
  json config;
};

std::vector<Variant> variants() {
  auto step2 = qwen3_moe_json();
  step2["decoder_sparse_step"] = 2;
  step2["mlp_only_layers"] = {3};
  step2["norm_topk_prob"] = false;
  step2["num_experts_per_tok"] = 3;
  auto biased = qwen3_moe_json();
  biased["attention_bias"] = true;
  return {{"qwen3_moe", qwen3_moe_json()}, {"qwen3_moe step 2, mlp_only, k 3", step2},
          {"qwen3_moe attention_bias", biased}, {"qwen2_moe", qwen2_moe_json()}};
}

TEST(MoeModel, LogitsMatchTheFloat64Reference) {
  for (const auto& [name, config] : variants())
    for (uint64_t seed : {1, 2}) {
      SCOPED_TRACE(std::string{name} + ", seed " + std::to_string(seed));
      auto lm = sharp_model(config, seed);
      const auto ids = random_ids(19, lm.config().vocab_size, seed + 10);
      Reference ref{lm};
      auto want = ref.logits(ids);
      auto got = lm.forward({.input_ids = row(ids)}, {.logits = true});
      ASSERT_TRUE(got) << describe(got.error());
      const double err = (to_torch(got->logits)[0].to(at::kDouble) - want).abs().max().item<double>();
      // The router's smallest margin between the k-th and (k+1)-th expert,
      // reported beside the error: a near-tie there is where f32 and f64
      // may route differently.
      std::printf("[ moe ] %s seed %llu: max |logit - f64 reference| %.2e, smallest router gap %.2e, logits up to %.1f\n",
                  name, static_cast<unsigned long long>(seed), err, ref.min_gap, want.abs().max().item<double>());
      // f32 rounds probabilities near 1e-7: a smaller gap could route otherwise.
      ASSERT_GT(ref.min_gap, 1e-6) << "a router near-tie: choose another seed";
      EXPECT_LT(err, 1e-4);
      // The model itself in float64 agrees to rounding.
      for (auto& [n, t] : lm.impl().params) t = t.to(at::kDouble);
      auto prepared = model_detail::prepare(lm.config(), {.input_ids = row(ids)});
      ASSERT_TRUE(prepared);
      auto out = lm.impl().run(*prepared, false, true);
      EXPECT_LT((out.logits[0] - want).abs().max().item<double>(), 1e-9);
    }
}

TEST(MoeModel, GreedyGenerationEqualsTheFloat64Reference) {
  for (const auto& [name, config] : variants()) {
    SCOPED_TRACE(name);
    auto lm = sharp_model(config, 3);
    auto prompt = random_ids(6, lm.config().vocab_size, 4);
    auto engine = Engine::create(lm, {.max_num_batched_tokens = 64});
    ASSERT_TRUE(engine) << describe(engine.error());
    auto outs = engine->generate({prompt}, {.max_tokens = 10, .temperature = 0, .ignore_eos = true});
    ASSERT_TRUE(outs[0]) << describe(outs[0].error());
    Reference ref{lm};
    auto seq = prompt;
    std::vector<int64_t> want;
    for (int i = 0; i < 10; ++i) {
      auto l = ref.logits(seq)[static_cast<int64_t>(seq.size()) - 1];
      auto top = std::get<0>(l.topk(2));
      EXPECT_GT((top[0] - top[1]).item<double>(), 1e-4) << "a near-tie in the reference's logits at token " << i;
      want.push_back(l.argmax().item<int64_t>());
      seq.push_back(want.back());
    }
    EXPECT_EQ(outs[0]->sequences.at(0).tokens, want);
  }
}

// Continuous batching with the prefix cache: prompts that share a prefix,
// batched together, each give the greedy tokens of a full recompute.
TEST(MoeModel, ThePrefixCacheAndBatchingKeepGreedyOutput) {
  auto lm = sharp_model(qwen3_moe_json(), 15);
  auto engine = Engine::create(lm, {.block_size = 4, .max_num_batched_tokens = 16, .enable_prefix_caching = true});
  ASSERT_TRUE(engine) << describe(engine.error());
  auto shared = random_ids(9, 64, 21);
  std::vector<std::vector<int64_t>> prompts;
  for (uint64_t i = 0; i < 3; ++i) {
    auto p = shared;
    for (auto t : random_ids(static_cast<int64_t>(2 + i), 64, 30 + i)) p.push_back(t);
    prompts.push_back(p);
  }
  const SamplingParams greedy{.max_tokens = 8, .temperature = 0, .ignore_eos = true};
  for (int round = 0; round < 2; ++round) {  // the second round finds the prefix cached
    auto outs = engine->generate(prompts, greedy);
    for (size_t i = 0; i < prompts.size(); ++i) {
      ASSERT_TRUE(outs[i]) << describe(outs[i].error());
      auto seq = prompts[i];
      std::vector<int64_t> want;
      for (int n = 0; n < 8; ++n) {
        auto f = lm.forward({.input_ids = row(seq)}, {.logits = true});
        ASSERT_TRUE(f);
        want.push_back(to_torch(f->logits)[0][static_cast<int64_t>(seq.size()) - 1].argmax().item<int64_t>());
        seq.push_back(want.back());
      }
      EXPECT_EQ(outs[i]->sequences.at(0).tokens, want) << "round " << round << ", prompt " << i;
    }
  }
  EXPECT_GT(engine->stats().cached_tokens, 0);
}

// The grouped block against the composition it replaces (every expert on
// every token, weighted by the router): the same logits and gradients.
TEST(MoeModel, TheGroupedBlockEqualsEveryExpertOnEveryToken) {
  for (const auto& [name, config] : variants()) {
    SCOPED_TRACE(name);
    auto lm = sharp_model(config, 4);
    auto& impl = lm.impl();
    for (auto& [n, p] : impl.params) p = p.to(at::kDouble).requires_grad_(true);
    auto prepared = model_detail::prepare(lm.config(), {.input_ids = ids_of({{4, 8, 15, 16, 23, 42}, {1, 1, 2, 3, 5, 8}})});
    ASSERT_TRUE(prepared);
    // Every parameter's gradient: an expert no token chose has none in the
    // grouped block, and zero in the dense one (its outputs weigh 0).
    auto pass = [&] {
      for (auto& [n, p] : impl.params) p.mutable_grad() = at::Tensor{};
      auto out = impl.run(*prepared, false, true);
      out.logprobs.sum().backward();
      std::map<std::string, at::Tensor> grads;
      for (auto& [n, p] : impl.params) grads[n] = p.grad().defined() ? p.grad().clone() : at::zeros_like(p);
      return std::pair{out.logits.detach(), grads};
    };
    auto [grouped, grouped_grads] = pass();
    set_dense_experts(true);
    auto [dense, dense_grads] = pass();
    set_dense_experts(false);
    EXPECT_LT((grouped - dense).abs().max().item<double>(), 1e-10);
    int untouched = 0;
    for (const auto& [n, g] : grouped_grads) {
      EXPECT_LT((g - dense_grads.at(n)).abs().max().item<double>(), 1e-10) << n;
      untouched += n.find(".experts.") != std::string::npos && g.abs().max().item<double>() == 0;
    }
    std::printf("[ moe ] %s: %d expert weights no token reached\n", name, untouched);
  }
}

using glint::testing::central_difference;

// -- weights on disk ----------------------------------------------------------------------

TEST(MoeModel, SavesPerExpertAndLoadsBothLayouts) {
  const auto dir = glint::testing::fresh_dir("moe-save");
  auto lm = sharp_model(qwen3_moe_json(), 5);
  ASSERT_TRUE(lm.save(dir + "/per_expert"));
  auto back = CausalLM::load(dir + "/per_expert");
  ASSERT_TRUE(back) << describe(back.error());
  for (const auto& [n, t] : lm.impl().params) {
    ASSERT_TRUE(back->impl().params.count(n)) << n;
    // bfloat16 on disk (torch_dtype): equal after the same rounding.
    EXPECT_TRUE(at::equal(back->impl().params.at(n), t.to(at::kBFloat16).to(at::kFloat))) << n;
  }
  EXPECT_TRUE(back->impl().params.count("model.layers.2.mlp.experts.7.down_proj.weight"));

  // transformers 5's fused layout: [E, 2I, H] gate rows then up rows, [E, H, I].
  const auto& c = lm.config();
  NamedTensors fused;
  for (const auto& [n, t] : lm.impl().params)
    if (n.find("mlp.experts.") == std::string::npos) fused.emplace_back(n, *from_torch(t));
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const auto pre = "model.layers." + std::to_string(l) + ".mlp.experts.";
    std::vector<at::Tensor> gate_up, down;
    for (int64_t e = 0; e < c.moe.num_experts; ++e) {
      const auto q = pre + std::to_string(e) + ".";
      gate_up.push_back(at::cat({lm.impl().param(q + "gate_proj.weight"), lm.impl().param(q + "up_proj.weight")}, 0));
      down.push_back(lm.impl().param(q + "down_proj.weight"));
    }
    fused.emplace_back(pre + "gate_up_proj", *from_torch(at::stack(gate_up)));
    fused.emplace_back(pre + "down_proj", *from_torch(at::stack(down)));
  }
  auto cfg = c;
  cfg.dtype = Dtype::f32;
  const auto fused_dir = dir + "/fused";
  fs::create_directories(fused_dir);
  ASSERT_TRUE(write_safetensors_dir(fused_dir, fused));
  {
    std::ofstream f{fused_dir + "/config.json"};
    f << cfg.to_json();
  }
  auto from_fused = CausalLM::load(fused_dir);
  ASSERT_TRUE(from_fused) << describe(from_fused.error());
  const auto ids = row(random_ids(9, c.vocab_size, 1));
  auto a = lm.forward({.input_ids = ids}, {.logits = true});
  auto b = from_fused->forward({.input_ids = ids}, {.logits = true});
  ASSERT_TRUE(a && b);
  EXPECT_TRUE(at::equal(to_torch(a->logits), to_torch(b->logits)));

  // A config naming more experts than the weights hold: refused, saying which.
  auto more = json::parse(cfg.to_json());
  more["num_experts"] = 9;
  {
    std::ofstream f{fused_dir + "/config.json"};
    f << more.dump();
  }
  auto bad = CausalLM::load(fused_dir);
  ASSERT_FALSE(bad);
  EXPECT_NE(describe(bad.error()).find("num_experts 9"), std::string::npos) << describe(bad.error());
  // Per-expert weights missing one expert: the error names it.
  fs::remove(dir + "/per_expert/model.safetensors");
  NamedTensors partial;
  for (const auto& [n, t] : lm.impl().params)
    if (n.find("mlp.experts.5.") == std::string::npos || n.find("layers.1.") == std::string::npos)
      partial.emplace_back(n, *from_torch(t));
  ASSERT_TRUE(write_safetensors_dir(dir + "/per_expert", partial));
  auto missing = CausalLM::load(dir + "/per_expert");
  ASSERT_FALSE(missing);
  EXPECT_NE(describe(missing.error()).find("model.layers.1.mlp.experts.5.gate_proj.weight"), std::string::npos)
      << describe(missing.error());
}

// What does not take experts yet refuses them by name, before any work.
// Tensor parallelism refuses experts; GGUF export refuses what llama.cpp's
// qwen3moe cannot compute (a dense layer among the sparse ones, weights not
// renormalised), naming the field, and writes nothing.
TEST(MoeModel, TensorParallelismAndGgufExportRefuseWhatTheyCannotRun) {
  auto lm = sharp_model(qwen3_moe_json(), 16);
  auto tp = tp::shard_model(lm.impl(), std::make_shared<glint::testing::FakeProcessGroup>(0, 2));
  ASSERT_FALSE(tp);
  EXPECT_NE(describe(tp.error()).find("Qwen3MoeForCausalLM has experts"), std::string::npos) << describe(tp.error());
  EXPECT_FALSE(lm.impl().tp) << "nothing was sharded";
  const std::pair<json, const char*> cases[] = {
      {[] { auto j = qwen3_moe_json(); j["mlp_only_layers"] = {1}; return j; }(), "layer 1 is a dense MLP"},
      {[] { auto j = qwen3_moe_json(); j["norm_topk_prob"] = false; return j; }(), "norm_topk_prob is false"}};
  for (const auto& [j, why] : cases) {
    const auto dir = glint::testing::fresh_dir("moe-gguf");
    ASSERT_TRUE(sharp_model(j, 16).save(dir + "/model"));
    auto gguf = export_gguf(dir + "/model", dir + "/model.gguf", {});
    ASSERT_FALSE(gguf);
    EXPECT_NE(describe(gguf.error()).find(why), std::string::npos) << describe(gguf.error());
    EXPECT_FALSE(fs::exists(dir + "/model.gguf"));
  }
}

// -- training -------------------------------------------------------------------------------

TEST(MoeTraining, GradientsMatchFiniteDifferencesInFloat64) {
  for (const auto& [name, config] : variants()) {
    SCOPED_TRACE(name);
    auto lm = sharp_model(config, 6);
    auto& impl = lm.impl();
    for (auto& [n, p] : impl.params) p = p.to(at::kDouble).requires_grad_(true);
    auto prepared = model_detail::prepare(lm.config(), {.input_ids = ids_of({{1, 5, 9, 2, 7, 3}, {3, 3, 8, 0, 0, 0}}),
                                                        .attention_mask = ids_of({{1, 1, 1, 1, 1, 1}, {1, 1, 1, 0, 0, 0}})});
    ASSERT_TRUE(prepared);
    auto objective = [&] { return impl.run(*prepared, false, false).logprobs.sum(); };
    objective().backward();
    std::vector<std::string> names = {"model.layers.1.mlp.gate.weight", "model.layers.0.self_attn.q_proj.weight"};
    // Two experts of layer 1 that tokens reached (the others have no gradient).
    int reached = 0;
    for (int64_t e = 0; e < lm.config().moe.num_experts && reached < 2; ++e) {
      const auto q = "model.layers.1.mlp.experts." + std::to_string(e) + ".";
      if (!impl.params.at(q + "gate_proj.weight").grad().defined()) continue;
      names.push_back(q + (reached++ == 0 ? "gate_proj.weight" : "down_proj.weight"));
    }
    ASSERT_EQ(reached, 2) << "fewer than two experts of layer 1 were reached";
    if (lm.config().moe.shared_expert_intermediate_size > 0) {
      names.push_back("model.layers.1.mlp.shared_expert_gate.weight");
      names.push_back("model.layers.1.mlp.shared_expert.up_proj.weight");
    }
    for (const auto& n : names) {
      auto& p = impl.params.at(n);
      ASSERT_TRUE(p.grad().defined()) << n;
      for (int64_t i : {int64_t{0}, p.numel() / 3, p.numel() - 1}) {
        const double fd = central_difference(objective, p, i), ad = p.grad().view({-1})[i].item<double>();
        EXPECT_NEAR(ad, fd, 1e-6 * std::max(1.0, std::abs(fd))) << n << "[" << i << "]";
      }
    }
  }
}

// transformers' load_balancing_loss_func, written out: over every sparse
// layer's real tokens at once, f_e = (token, slot) pairs that chose e / rows,
// P_e = mean router probability, aux = E * sum_e f_e P_e.
double reference_aux_loss(const CausalLM& lm, const std::vector<std::vector<int64_t>>& rows) {
  const auto& c = lm.config();
  const int64_t E = c.moe.num_experts;
  std::vector<double> f(static_cast<size_t>(E)), P(static_cast<size_t>(E));
  double n = 0;
  for (const auto& ids : rows) {
    Reference ref{lm};
    ref.record = true;
    (void)ref.logits(ids);
    for (const auto& [probs, chosen] : ref.routes) {
      n += 1;
      for (int64_t e = 0; e < E; ++e) P[static_cast<size_t>(e)] += probs[static_cast<size_t>(e)];
      for (auto e : chosen) f[static_cast<size_t>(e)] += 1;
    }
  }
  double aux = 0;
  for (int64_t e = 0; e < E; ++e) aux += (f[static_cast<size_t>(e)] / n) * (P[static_cast<size_t>(e)] / n);
  return static_cast<double>(E) * aux;
}

TEST(MoeTraining, TheLoadBalancingLossIsTransformersOverTheRealTokens) {
  for (const auto& [name, config] : variants()) {
    SCOPED_TRACE(name);
    auto j = config;
    j["output_router_logits"] = true;
    j["router_aux_loss_coef"] = 0.25;
    auto with = sharp_model(j, 12);
    auto without = sharp_model(config, 12);  // the same weights, no router loss
    // Two rows, the second right-padded: its padding is not routed.
    const std::vector<std::vector<int64_t>> real = {{1, 5, 9, 2, 7, 3, 4}, {3, 3, 8, 1}};
    TrainBatch b{.tokens = {.input_ids = ids_of({{1, 5, 9, 2, 7, 3, 4}, {3, 3, 8, 1, 0, 0, 0}}),
                            .attention_mask = ids_of({{1, 1, 1, 1, 1, 1, 1}, {1, 1, 1, 1, 0, 0, 0}})}};
    auto t1 = Trainer::create(with, {});
    auto t0 = Trainer::create(without, {});
    ASSERT_TRUE(t1 && t0);
    auto m1 = t1->forward_backward(b, {});
    auto m0 = t0->forward_backward(b, {});
    ASSERT_TRUE(m1) << describe(m1.error());
    ASSERT_TRUE(m0) << describe(m0.error());
    const double want = reference_aux_loss(without, real);
    EXPECT_NEAR(m0->at("moe_aux_loss"), want, 1e-5);
    EXPECT_NEAR(m1->at("moe_aux_loss"), want, 1e-5);
    EXPECT_NEAR(m1->at("loss") - m0->at("loss"), 0.25 * want, 1e-5);
    // The metrics: entropy within [0, log E], each sparse layer's load.
    EXPECT_GT(m0->at("moe_router_entropy"), 0);
    EXPECT_LT(m0->at("moe_router_entropy"), std::log(static_cast<double>(without.config().moe.num_experts)));
    EXPECT_GE(m0->at("moe_load_max_over_mean"), 1.0);
    EXPECT_TRUE(m0->count("moe_load_max_over_mean_layer_1"));
    for (int64_t l = 0; l < without.config().num_hidden_layers; ++l)
      EXPECT_EQ(m0->count("moe_load_max_over_mean_layer_" + std::to_string(l)) == 1,
                without.config().feed_forward(l) == FeedForward::sparse)
          << "layer " << l;
    // A summed loss has no weight to give it: refused, saying why.
    t1->zero_grad();
    auto summed = t1->forward_backward(b, {.reduction = LossReduction::sum});
    ASSERT_FALSE(summed);
    EXPECT_NE(describe(summed.error()).find("output_router_logits"), std::string::npos) << describe(summed.error());
  }
}

TEST(MoeTraining, TheLoadBalancingLossGradientMatchesFiniteDifferences) {
  auto lm = sharp_model(qwen2_moe_json(), 13);
  auto& impl = lm.impl();
  for (auto& [n, p] : impl.params) p = p.to(at::kDouble).requires_grad_(true);
  auto prepared = model_detail::prepare(lm.config(), {.input_ids = ids_of({{2, 4, 6, 8, 10, 12}})});
  ASSERT_TRUE(prepared);
  auto aux = [&] {
    RouterRecord record;
    PassOptions pass;
    pass.routes = &record;
    (void)impl.run(*prepared, false, false, pass);
    return model_detail::router_statistics(record, prepared->real, lm.config().moe.num_experts).aux_loss;
  };
  aux().backward();
  for (auto n : {"model.layers.1.mlp.gate.weight", "model.layers.0.self_attn.q_proj.weight"}) {
    auto& p = impl.params.at(n);
    ASSERT_TRUE(p.grad().defined()) << n;
    for (int64_t i : {int64_t{1}, p.numel() / 2})
      EXPECT_NEAR(p.grad().view({-1})[i].item<double>(), central_difference(aux, p, i), 1e-6) << n << "[" << i << "]";
  }
}

TEST(MoeTraining, ATrainerStepLowersTheLoss) {
  for (const auto& [name, config] : variants()) {
    SCOPED_TRACE(name);
    auto t = Trainer::create(sharp_model(config, 7), {.optimizer = {.lr = 1e-3}});
    ASSERT_TRUE(t) << describe(t.error());
    TrainBatch b{.tokens = {.input_ids = ids_of({{1, 5, 9, 2, 7, 3, 4, 4}, {3, 3, 8, 1, 2, 6, 6, 0}})}};
    double first = 0, last = 0;
    for (int step = 0; step < 5; ++step) {
      auto m = t->forward_backward(b, {});
      ASSERT_TRUE(m) << describe(m.error());
      (step == 0 ? first : last) = m->at("loss");
      ASSERT_TRUE(t->clip_grad_and_step());
    }
    EXPECT_LT(last, first);
  }
}

// -- LoRA ------------------------------------------------------------------------------------

TEST(MoeLora, AdaptsExpertsInPeftsLayout) {
  auto lm = sharp_model(qwen2_moe_json(), 8);
  LoraConfig cfg{.r = 2, .alpha = 4};
  cfg.target_modules = {"q_proj", "gate_proj", "down_proj", "shared_expert_gate"};
  ASSERT_TRUE(lm.add_adapter("a", cfg, 1));
  const auto& modules = lm.impl().adapters.at("a").modules;
  for (auto m : {"model.layers.0.mlp.experts.5.gate_proj", "model.layers.2.mlp.experts.0.down_proj",
                 "model.layers.1.mlp.shared_expert.gate_proj", "model.layers.1.mlp.shared_expert_gate",
                 "model.layers.0.self_attn.q_proj"})
    EXPECT_NE(std::find(modules.begin(), modules.end(), m), modules.end()) << m;
  EXPECT_EQ(std::find(modules.begin(), modules.end(), "model.layers.0.mlp.gate"), modules.end());
  // B random: the adapter changes the output, and the merged weights give
  // what the adapter does.
  for (auto& [m, ab] : lm.impl().adapters.at("a").weights) ab.second.normal_(0, 0.2);
  const auto ids = row(random_ids(7, 64, 2));
  auto base = lm.forward({.input_ids = ids});
  auto adapted = lm.forward({.input_ids = ids}, {.adapter = "a"});
  ASSERT_TRUE(base && adapted);
  EXPECT_GT((to_torch(base->logprobs) - to_torch(adapted->logprobs)).abs().max().item<float>(), 1e-3);
  auto merged = lm.merged_parameters("a");
  ASSERT_TRUE(merged) << describe(merged.error());
  auto copy = *CausalLM::init_random(lm.config(), 0);
  for (const auto& [n, t] : *merged) copy.impl().params.at(n).copy_(to_torch(t));
  auto folded = copy.forward({.input_ids = ids});
  ASSERT_TRUE(folded);
  EXPECT_LT((to_torch(folded->logprobs) - to_torch(adapted->logprobs)).abs().max().item<float>(), 1e-4);
  // Saved with PEFT's keys, and loaded back the same.
  const auto dir = glint::testing::fresh_dir("moe-adapter");
  ASSERT_TRUE(lm.save_adapter("a", dir));
  auto keys = load_safetensors(dir + "/adapter_model.safetensors");
  ASSERT_TRUE(keys) << describe(keys.error());
  bool found = false;
  for (const auto& [n, t] : *keys) found |= n == "base_model.model.model.layers.1.mlp.experts.4.gate_proj.lora_A.weight";
  EXPECT_TRUE(found);
  ASSERT_TRUE(lm.load_adapter("b", dir));
  auto again = lm.forward({.input_ids = ids}, {.adapter = "b"});
  ASSERT_TRUE(again);
  EXPECT_TRUE(at::equal(to_torch(again->logprobs), to_torch(adapted->logprobs)));
  // The experts' containers are not Linear: refused by name.
  LoraConfig containers{.r = 2, .alpha = 4};
  containers.target_modules = {"experts"};
  auto refused = lm.add_adapter("c", containers, 1);
  ASSERT_FALSE(refused);
  EXPECT_NE(describe(refused.error()).find("mlp.experts"), std::string::npos) << describe(refused.error());
}

TEST(MoeLora, AdapterGradientsOnExpertsMatchFiniteDifferences) {
  auto lm = sharp_model(qwen2_moe_json(), 14);
  LoraConfig cfg{.r = 2, .alpha = 4};
  cfg.target_modules = {"gate_proj", "up_proj", "down_proj", "q_proj", "shared_expert_gate"};
  ASSERT_TRUE(lm.add_adapter("a", cfg, 1));
  auto& impl = lm.impl();
  for (auto& [n, p] : impl.params) p = p.to(at::kDouble);
  auto& adapter = impl.adapters.at("a");
  for (auto& [m, ab] : adapter.weights) {
    ab.first = ab.first.to(at::kDouble).requires_grad_(true);
    ab.second = (at::randn_like(ab.second, at::kDouble) * 0.3).requires_grad_(true);
  }
  auto prepared = model_detail::prepare(lm.config(), {.input_ids = ids_of({{2, 7, 1, 8, 2, 8, 1, 8}})});
  ASSERT_TRUE(prepared);
  PassOptions pass;
  pass.lora = &adapter;
  auto objective = [&] { return impl.run(*prepared, false, false, pass).logprobs.sum(); };
  objective().backward();
  int checked = 0;
  for (auto& [m, ab] : adapter.weights) {
    if (m.find(".experts.") == std::string::npos && m.find("shared_expert_gate") == std::string::npos) continue;
    if (!ab.first.grad().defined()) continue;  // an expert no token reached
    for (auto* t : {&ab.first, &ab.second})
      EXPECT_NEAR(t->grad().view({-1})[0].item<double>(), central_difference(objective, *t, 0), 1e-6) << m;
    ++checked;
  }
  EXPECT_GT(checked, 4);
}

TEST(MoeLora, TheSamplersMultiTenantBatchesMatchEachAdapterAlone) {
  auto lm = sharp_model(qwen3_moe_json(), 9);
  LoraConfig cfg{.r = 2, .alpha = 4};
  cfg.target_modules = {"gate_proj", "up_proj", "down_proj", "v_proj"};
  for (const char* name : {"x", "y"}) {
    ASSERT_TRUE(lm.add_adapter(name, cfg, name[0]));
    for (auto& [m, ab] : lm.impl().adapters.at(name).weights) ab.second.normal_(0, 0.3);
  }
  auto engine = Engine::create(lm, {.max_num_batched_tokens = 64});
  ASSERT_TRUE(engine) << describe(engine.error());
  const auto p1 = random_ids(5, 64, 11), p2 = random_ids(8, 64, 12);
  SamplingParams greedy{.max_tokens = 6, .temperature = 0, .ignore_eos = true};
  // One batch of three tenants: each step's tokens go through the experts
  // together, each with its own adapter's rows.
  std::vector<uint64_t> ids;
  for (auto [prompt, adapter] : {std::pair{&p1, "x"}, {&p2, "y"}, {&p1, ""}}) {
    auto id = engine->add_request(*prompt, greedy, adapter);
    ASSERT_TRUE(id) << describe(id.error());
    ids.push_back(*id);
  }
  while (engine->has_unfinished()) ASSERT_TRUE(engine->step());
  std::vector<std::optional<RequestOutput>> together;
  for (auto id : ids) {
    together.push_back(engine->take(id));
    ASSERT_TRUE(together.back());
  }
  auto alone_x = engine->generate({p1}, greedy, "x");
  auto alone_y = engine->generate({p2}, greedy, "y");
  auto alone_base = engine->generate({p1}, greedy);
  ASSERT_TRUE(alone_x[0] && alone_y[0] && alone_base[0]);
  EXPECT_EQ(together[0]->sequences[0].tokens, alone_x[0]->sequences[0].tokens);
  EXPECT_EQ(together[1]->sequences[0].tokens, alone_y[0]->sequences[0].tokens);
  EXPECT_EQ(together[2]->sequences[0].tokens, alone_base[0]->sequences[0].tokens);
}


// -- micro-batches ---------------------------------------------------------------------------

// A batch cut into micro-batches trains as the whole batch: the same loss
// and gradients (a micro-batch once lost its real-token mask, and the
// router's statistics then failed the step). The load-balancing loss is not
// in it: like transformers', it is one per forward pass (per micro-batch).
TEST(MoeTraining, MicroBatchesTrainAsTheWholeBatch) {
  auto j = qwen3_moe_json();
  TrainBatch b{.tokens = {.input_ids = ids_of({{1, 5, 9, 2, 7, 3}, {3, 3, 8, 1, 2, 6}, {4, 0, 2, 2, 9, 1}})}};
  std::map<std::string, at::Tensor> grads[2];
  double loss[2] = {0, 0}, aux[2] = {0, 0};
  for (int split = 0; split < 2; ++split) {
    auto t = Trainer::create(sharp_model(j, 3), {.micro_batch_rows = split ? 1 : 0});
    ASSERT_TRUE(t) << describe(t.error());
    auto m = t->forward_backward(b, {});
    ASSERT_TRUE(m) << describe(m.error());
    loss[split] = m->at("loss");
    aux[split] = m->at("moe_aux_loss");
    for (const auto& [n, p] : t->model().impl().params)
      if (p.grad().defined()) grads[split][n] = p.grad().clone();
  }
  EXPECT_NEAR(loss[0], loss[1], 1e-5);
  EXPECT_GT(aux[1], 0);
  ASSERT_EQ(grads[0].size(), grads[1].size());
  for (const auto& [n, g] : grads[0]) EXPECT_LT((g - grads[1].at(n)).abs().max().item<double>(), 1e-5) << n;
}

// -- routing replay ----------------------------------------------------------------------------

int64_t sparse_layers(const ModelConfig& c) {
  int64_t S = 0;
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) S += c.feed_forward(l) == FeedForward::sparse;
  return S;
}

// Logits [T, V] of one row with routes `replay` (i64 [T, S, k]; undefined: none).
at::Tensor logits_with(const CausalLM& lm, const std::vector<int64_t>& ids, const at::Tensor& replay) {
  auto p = model_detail::prepare(lm.config(), {.input_ids = row(ids)});
  EXPECT_TRUE(p) << describe(p.error());
  PassOptions pass;
  pass.replay = replay;
  c10::NoGradGuard no_grad;
  return lm.impl().run(*p, false, true, pass).logits[0];
}

// The experts each position of a row chose, i64 [T, S, k].
at::Tensor own_routes(const CausalLM& lm, const std::vector<int64_t>& ids) {
  auto p = model_detail::prepare(lm.config(), {.input_ids = row(ids)});
  EXPECT_TRUE(p) << describe(p.error());
  RouterRecord record;
  PassOptions pass;
  pass.routes = &record;
  c10::NoGradGuard no_grad;
  lm.impl().run(*p, false, false, pass);
  std::vector<at::Tensor> chosen;
  for (const auto& l : record.layers) chosen.push_back(l.chosen);
  return at::stack(chosen, 1);
}

// Replayed routes are used as given, weighted by the router's probabilities
// of them: the logits equal the float64 reference forced to those experts,
// at positions where they differ from the router's own choice; replaying
// the router's own choice changes nothing.
TEST(MoeReplay, ReplayedRoutesMatchTheFloat64ReferenceForcedToThem) {
  for (const auto& [name, config] : variants()) {
    SCOPED_TRACE(name);
    auto lm = sharp_model(config, 31);
    const auto& c = lm.config();
    const int64_t S = sparse_layers(c), k = c.moe.num_experts_per_tok, E = c.moe.num_experts;
    auto ids = random_ids(12, c.vocab_size, 32);
    auto own = own_routes(lm, ids);
    ASSERT_EQ(own.sizes().vec(), (std::vector<int64_t>{12, S, k}));
    EXPECT_TRUE(at::equal(logits_with(lm, ids, own), logits_with(lm, ids, at::Tensor{})));

    auto replay = at::full({12, S, k}, -1, at::kLong);
    Reference ref{lm};
    std::mt19937_64 rng{33};
    for (int64_t t : {2, 5, 6, 11}) {
      for (int64_t s = 0; s < S; ++s) {
        // k distinct experts, the router's least likely first: not its choice.
        std::vector<int64_t> all(static_cast<size_t>(E));
        for (int64_t e = 0; e < E; ++e) all[static_cast<size_t>(e)] = e;
        std::shuffle(all.begin(), all.end(), rng);
        std::vector<int64_t> pick(all.begin(), all.begin() + k);
        for (int64_t j = 0; j < k; ++j) replay[t][s][j] = pick[static_cast<size_t>(j)];
        ref.forced[{s, t}] = pick;
      }
    }
    auto got = logits_with(lm, ids, replay);
    auto want = ref.logits(ids);
    EXPECT_LT((got.to(at::kDouble) - want).abs().max().item<double>(), 1e-4);
    // Before the first replayed position nothing changes; from it on, it does.
    auto free = logits_with(lm, ids, at::Tensor{});
    EXPECT_LT((got.narrow(0, 0, 2) - free.narrow(0, 0, 2)).abs().max().item<double>(), 1e-5);
    EXPECT_GT((got[2] - free[2]).abs().max().item<double>(), 1e-3);
  }
}

// The gradients of a replayed pass reach the router through the weights of
// the given experts: they match float64 finite differences.
TEST(MoeReplay, GradientsWithReplayedRoutesMatchFiniteDifferences) {
  auto lm = sharp_model(qwen2_moe_json(), 34);
  for (auto& [n, p] : lm.impl().params) p = p.to(at::kDouble);
  const auto& c = lm.config();
  const int64_t S = sparse_layers(c), k = c.moe.num_experts_per_tok;
  auto ids = random_ids(6, c.vocab_size, 35);
  auto replay = at::full({6, S, k}, -1, at::kLong);
  for (int64_t s = 0; s < S; ++s)
    for (int64_t j = 0; j < k; ++j) replay[3][s][j] = (j * 2 + s) % c.moe.num_experts;
  auto p = model_detail::prepare(c, {.input_ids = row(ids)});
  ASSERT_TRUE(p);
  auto loss = [&] {
    PassOptions pass;
    pass.replay = replay;
    return lm.impl().run(*p, false, false, pass).logprobs.sum();
  };
  const auto gate = "model.layers.0.mlp.gate.weight";
  auto& w = lm.impl().params.at(gate);
  w.requires_grad_(true);
  {
    c10::AutoGradMode on(true);
    loss().backward();
  }
  auto g = w.grad().clone();
  c10::NoGradGuard no_grad;
  for (int64_t i : {0, 7, 40, 101}) {
    const double fd = central_difference(loss, w, i);
    EXPECT_NEAR(g.view(-1)[i].item<double>(), fd, 1e-6 * std::max(1.0, std::abs(fd))) << gate << "[" << i << "]";
  }
}

// Routes that cannot be replayed are refused before any work, naming what
// is wrong; the model's gradients stay untouched.
TEST(MoeReplay, BadRoutesAreRefusedBeforeAnyWork) {
  auto t = Trainer::create(sharp_model(qwen3_moe_json(), 36), {});
  ASSERT_TRUE(t) << describe(t.error());
  const auto& c = t->model().config();
  const int64_t S = sparse_layers(c), k = c.moe.num_experts_per_tok, E = c.moe.num_experts;
  auto batch = [&](const at::Tensor& r) {
    return TrainBatch{.tokens = {.input_ids = ids_of({{1, 5, 9, 2}})}, .routes = *from_torch(r)};
  };
  auto good = at::full({1, 4, S, k}, -1, at::kLong);
  auto expect_refused = [&](at::Tensor r, const std::string& says) {
    auto m = t->forward_backward(batch(r), {});
    ASSERT_FALSE(m) << says;
    EXPECT_NE(describe(m.error()).find(says), std::string::npos) << describe(m.error());
    for (const auto& [n, p] : t->model().impl().params)
      EXPECT_FALSE(p.grad().defined() && p.grad().abs().sum().item<double>() != 0) << n;
  };
  auto out_of_range = good.clone();
  out_of_range[0][2].fill_(0);
  out_of_range[0][2][1][0] = E;
  expect_refused(out_of_range, "row 0 position 2 routes to");
  auto partly = good.clone();
  partly[0][1][0][0] = 3;
  expect_refused(partly, "every entry -1");
  auto twice = good.clone();
  twice[0][3].fill_(5);
  expect_refused(twice, "names an expert twice");
  expect_refused(at::full({1, 4, S + 1, k}, -1, at::kLong), "expected [1, 4, " + std::to_string(S) + ", 2]");
  expect_refused(at::full({1, 4, S, k}, -1.0, at::kFloat), "integer tensor");
  EXPECT_TRUE(t->forward_backward(batch(good), {}));  // all -1: every position routes itself

  auto dense = Trainer::create(*CausalLM::init_random(ModelConfig::make(Architecture::qwen3, 64, 32, 48, 2, 4, 2), 1), {});
  ASSERT_TRUE(dense);
  auto m = dense->forward_backward(
      {.tokens = {.input_ids = ids_of({{1, 5, 9, 2}})}, .routes = *from_torch(at::full({1, 4, 1, 2}, 0, at::kLong))}, {});
  ASSERT_FALSE(m);
  EXPECT_NE(describe(m.error()).find("no sparse layer"), std::string::npos) << describe(m.error());
}

// The sampler's routes (return_routes) are the trainer's at the positions
// that predict each token: replayed, the trainer's log-probabilities are
// the sampler's. A dense model refuses the option.
TEST(MoeReplay, TheSamplersRoutesAreThoseThatDrewEachToken) {
  auto lm = sharp_model(qwen3_moe_json(), 37);
  const auto& c = lm.config();
  const int64_t S = sparse_layers(c), k = c.moe.num_experts_per_tok;
  auto engine = Engine::create(lm, {.block_size = 4, .max_num_batched_tokens = 16});
  ASSERT_TRUE(engine) << describe(engine.error());
  std::vector<std::vector<int64_t>> prompts{random_ids(5, 64, 38), random_ids(9, 64, 39)};
  auto outs = engine->generate(prompts, {.num_samples = 2, .max_tokens = 6, .seed = 4, .ignore_eos = true,
                                         .logprobs = 0, .return_routes = true});
  for (size_t i = 0; i < prompts.size(); ++i) {
    ASSERT_TRUE(outs[i]) << describe(outs[i].error());
    for (const auto& seq : outs[i]->sequences) {
      ASSERT_EQ(seq.routes.layers, S);
      ASSERT_EQ(seq.routes.k, k);
      ASSERT_EQ(seq.routes.tokens(), static_cast<int64_t>(seq.tokens.size()));
      auto ids = prompts[i];
      ids.insert(ids.end(), seq.tokens.begin(), seq.tokens.end());
      auto own = own_routes(lm, ids);
      const auto P = static_cast<int64_t>(prompts[i].size());
      for (int64_t j = 0; j < seq.routes.tokens(); ++j)
        for (int64_t s = 0; s < S; ++s)
          for (int64_t x = 0; x < k; ++x)
            EXPECT_EQ(seq.routes.experts[static_cast<size_t>((j * S + s) * k + x)], own[P - 1 + j][s][x].item<int64_t>())
                << "prompt " << i << " token " << j << " layer " << s;
    }
  }
  auto dense = Engine::create(*CausalLM::init_random(ModelConfig::make(Architecture::qwen3, 64, 32, 48, 2, 4, 2), 1), {});
  ASSERT_TRUE(dense);
  auto refused = dense->generate({{1, 2, 3}}, {.max_tokens = 2, .return_routes = true});
  ASSERT_FALSE(refused[0]);
  EXPECT_NE(describe(refused[0].error()).find("return_routes"), std::string::npos);
}

// What routing replay is for: the trainer's log-probabilities of sampled
// tokens against the sampler's. With the sampler's weights, both paths
// agree to rounding; one step later (the router moved, as after an update
// the sampler has not seen: async RL, --sync-every > 1) tokens route
// elsewhere and their log-probabilities jump. Replaying the sampler's
// routes keeps only the smooth change of the gate weights.
TEST(MoeReplay, ReplayClosesTheGapBetweenSamplerAndTrainerLogprobs) {
  auto c = parse(qwen3_moe_json());
  ASSERT_TRUE(c);
  auto sampled_lm = CausalLM::init_random(*c, 40);  // an untrained router: near-uniform, with near ties
  ASSERT_TRUE(sampled_lm);
  auto engine = Engine::create(*sampled_lm, {.block_size = 4});
  ASSERT_TRUE(engine) << describe(engine.error());
  std::vector<std::vector<int64_t>> prompts;
  for (uint64_t i = 0; i < 4; ++i) prompts.push_back(random_ids(6, 64, 41 + i));
  auto outs = engine->generate(prompts, {.max_tokens = 12, .seed = 5, .ignore_eos = true, .logprobs = 0,
                                         .return_routes = true});
  const int64_t S = sparse_layers(*c), k = c->moe.num_experts_per_tok, T = 6 + 12;
  auto ids = at::zeros({4, T}, at::kLong);
  auto routes = at::full({4, T, S, k}, -1, at::kLong);
  auto sampler_lp = at::zeros({4, T}), mask = at::zeros({4, T});
  for (int64_t i = 0; i < 4; ++i) {
    ASSERT_TRUE(outs[static_cast<size_t>(i)]);
    const auto& seq = outs[static_cast<size_t>(i)]->sequences.at(0);
    ASSERT_EQ(static_cast<int64_t>(seq.tokens.size()), 12);
    for (int64_t t = 0; t < 6; ++t) ids[i][t] = prompts[static_cast<size_t>(i)][static_cast<size_t>(t)];
    for (int64_t j = 0; j < 12; ++j) {
      ids[i][6 + j] = seq.tokens[static_cast<size_t>(j)];
      sampler_lp[i][5 + j] = seq.logprobs.chosen[static_cast<size_t>(j)];
      mask[i][5 + j] = 1;
      for (int64_t s = 0; s < S; ++s)
        for (int64_t x = 0; x < k; ++x) routes[i][5 + j][s][x] = seq.routes.experts[static_cast<size_t>((j * S + s) * k + x)];
    }
  }
  // Mean and largest |trainer - sampler| over the completion tokens.
  auto gap = [&](CausalLM lm, bool replay) {
    auto t = Trainer::create(std::move(lm), {});
    EXPECT_TRUE(t);
    TrainBatch b{.tokens = {.input_ids = *from_torch(ids)}, .loss_mask = *from_torch(mask)};
    if (replay) b.routes = *from_torch(routes);
    Tensor lp;
    auto m = t->forward_backward(b, {}, &lp);
    EXPECT_TRUE(m) << describe(m.error());
    auto d = (to_torch(lp) - sampler_lp).abs() * mask;
    return std::pair{d.sum().item<double>() / mask.sum().item<double>(), d.max().item<double>()};
  };
  auto copy = [&] {  // a deep copy of the sampled weights
    auto lm = CausalLM::init_random(*c, 0);
    EXPECT_TRUE(lm);
    c10::NoGradGuard no_grad;
    for (auto& [n, p] : lm->impl().params) p.copy_(sampled_lm->impl().params.at(n));
    return std::move(*lm);
  };
  auto lagged = [&] {  // the trainer's router after an update the sampler has not seen
    auto lm = copy();
    auto gen = at::make_generator<at::CPUGeneratorImpl>(42);
    c10::NoGradGuard no_grad;
    for (auto& [n, p] : lm.impl().params)
      if (n.find("mlp.gate.weight") != std::string::npos) p.add_(at::normal(0.0, 1.0, p.sizes(), gen) * p.std() * 0.3);
    return lm;
  };
  auto [same_free, same_free_max] = gap(copy(), false);
  auto [same_replay, same_replay_max] = gap(copy(), true);
  auto [lag_free, lag_free_max] = gap(lagged(), false);
  auto [lag_replay, lag_replay_max] = gap(lagged(), true);
  std::printf("sampler vs trainer log-probs, mean (max) |diff| over %d tokens:\n"
              "  same weights:  without replay %.2e (%.2e), with replay %.2e (%.2e)\n"
              "  router lagged: without replay %.2e (%.2e), with replay %.2e (%.2e)\n",
              4 * 12, same_free, same_free_max, same_replay, same_replay_max, lag_free, lag_free_max, lag_replay,
              lag_replay_max);
  EXPECT_LT(same_replay_max, 1e-5);
  EXPECT_LT(same_free_max, 1e-5);  // no route lies within rounding of a tie here
  EXPECT_LT(lag_replay, 0.5 * lag_free);
  EXPECT_LT(lag_replay_max, lag_free_max);
}
}  // namespace
}  // namespace glint::components
