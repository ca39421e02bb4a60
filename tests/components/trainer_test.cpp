// Training a CausalLM: schedules, the optimizer, gradients against finite
// differences, accumulation, and a tiny model that learns.
#include "components/kernels/fused.hpp"
#include "components/model/optim_impl.hpp"
#include "components/model/trainer.hpp"
#include "components/model/transformer.hpp"

#include "components/tensor/torch_bridge.hpp"

#include "support/fake_process_group.hpp"
#include "support/tensors.hpp"

#include "runtime/stop.hpp"

#include <gtest/gtest.h>

#include <c10/core/GradMode.h>

#include <cmath>
#include <set>

namespace glint::components {
namespace {

using glint::testing::ids_of;

ModelConfig small(Architecture a = Architecture::qwen3) { return ModelConfig::make(a, 23, 16, 32, 2, 4, 2); }

TEST(Schedule, WarmupThenDecay) {
  SchedulerConfig s{.kind = SchedulerConfig::Kind::cosine, .warmup_steps = 10, .total_steps = 110};
  EXPECT_DOUBLE_EQ(learning_rate(s, 1.0, 0), 0.0);
  EXPECT_DOUBLE_EQ(learning_rate(s, 1.0, 5), 0.5);
  EXPECT_DOUBLE_EQ(learning_rate(s, 1.0, 10), 1.0);
  EXPECT_NEAR(learning_rate(s, 1.0, 60), 0.5, 1e-12);
  EXPECT_NEAR(learning_rate(s, 1.0, 110), 0.0, 1e-12);
  s.kind = SchedulerConfig::Kind::linear;
  s.min_lr_ratio = 0.1;
  EXPECT_NEAR(learning_rate(s, 2.0, 60), 2.0 * (0.1 + 0.9 * 0.5), 1e-12);
  EXPECT_NEAR(learning_rate(s, 2.0, 500), 0.2, 1e-12);
  s.kind = SchedulerConfig::Kind::constant;
  EXPECT_DOUBLE_EQ(learning_rate(s, 2.0, 500), 2.0);
  EXPECT_EQ(*SchedulerConfig::parse_kind("cosine_with_warmup"), SchedulerConfig::Kind::cosine);
  EXPECT_FALSE(SchedulerConfig::parse_kind("exponential"));
  EXPECT_FALSE((SchedulerConfig{.kind = SchedulerConfig::Kind::linear, .warmup_steps = 5, .total_steps = 5}.validate()));
}

// The step through kernels::adamw_step and through LibTorch's composition:
// decay by name (a weight, a norm), by mask, and none; a strided gradient
// (which the kernel does not take) beside them; three steps each.
TEST(Optimizer, TheFusedStepIsTheComposedOne) {
  auto run = [](bool fused, double weight_decay) {
    const bool was = kernels::enabled();
    kernels::set_enabled(fused);
    at::manual_seed(3);
    std::vector<std::pair<std::string, at::Tensor>> named;
    for (const char* n : {"l.weight", "l.norm.weight", "masked.weight", "strided.weight"})
      named.emplace_back(n, at::randn({37, 29}).requires_grad_(true));
    ParamList params{named.begin(), named.end()};
    std::map<std::string, at::Tensor> masks{{"masked.weight", at::rand({37, 29}) < 0.5}};
    Optimizer opt{{.lr = 0.05, .weight_decay = weight_decay, .beta1 = 0.9, .beta2 = 0.99, .eps = 1e-8}};
    for (int step = 0; step < 3; ++step) {
      for (auto& [n, p] : params)
        p.mutable_grad() = n == "strided.weight" ? at::randn({29, 37}).t() : at::randn({37, 29});
      opt.step(params, 0.05, &masks);
    }
    kernels::set_enabled(was);
    std::vector<at::Tensor> out;
    for (auto& [n, p] : params) out.push_back(p.detach().clone());
    return out;
  };
  for (double wd : {0.0, 0.3}) {
    auto f = run(true, wd), u = run(false, wd);
    for (size_t i = 0; i < f.size(); ++i)
      EXPECT_TRUE(at::allclose(f[i], u[i], 1e-6, 1e-6)) << "parameter " << i << ", weight decay " << wd << ": "
                                                       << (f[i] - u[i]).abs().max().item<double>();
  }
  // And the decay is there: with it the weights end elsewhere.
  EXPECT_FALSE(at::allclose(run(true, 0.3)[0], run(true, 0.0)[0], 1e-6, 1e-6));
  EXPECT_TRUE(at::allclose(run(true, 0.3)[1], run(true, 0.0)[1], 0, 0));  // a norm: never decayed
}

TEST(Optimizer, AdamWMatchesItsFormulaAndSkipsDecayOnNormsAndBiases) {
  EXPECT_TRUE(decays("model.layers.0.mlp.up_proj.weight"));
  EXPECT_FALSE(decays("model.layers.0.self_attn.q_proj.bias"));
  EXPECT_FALSE(decays("model.layers.0.input_layernorm.weight"));
  EXPECT_FALSE(decays("model.layers.0.self_attn.q_norm.weight"));
  EXPECT_FALSE(decays("model.norm.weight"));
  OptimizerConfig cfg{.lr = 0.1, .weight_decay = 0.5, .beta1 = 0.9, .beta2 = 0.99, .eps = 1e-8};
  Optimizer opt{cfg};
  auto w = at::full({1}, 2.0, at::kFloat).requires_grad_(true);
  auto b = at::full({1}, 2.0, at::kFloat).requires_grad_(true);
  ParamList params{{"x.weight", w}, {"x.bias", b}};
  double m = 0, v = 0, wv = 2.0, bv = 2.0;
  for (int step = 1; step <= 3; ++step) {
    double g = 0.3 * step;
    w.mutable_grad() = at::full({1}, g, at::kFloat);
    b.mutable_grad() = at::full({1}, g, at::kFloat);
    opt.step(params, cfg.lr);
    m = 0.9 * m + 0.1 * g;
    v = 0.99 * v + 0.01 * g * g;
    double upd = cfg.lr * (m / (1 - std::pow(0.9, step))) / (std::sqrt(v / (1 - std::pow(0.99, step))) + 1e-8);
    wv = wv * (1 - cfg.lr * 0.5) - upd;
    bv = bv - upd;
    EXPECT_NEAR(w.item<double>(), wv, 1e-6) << "step " << step;
    EXPECT_NEAR(b.item<double>(), bv, 1e-6) << "step " << step;
  }
  // State round trip: a fresh optimizer loaded with it makes the same next step.
  Optimizer other{cfg};
  std::map<std::string, Tensor> st;
  for (auto& [k, t] : opt.state()) st.emplace(k, t);
  ASSERT_TRUE(other.load_state(st, params));
  auto w2 = w.detach().clone().requires_grad_(true), b2 = b.detach().clone().requires_grad_(true);
  ParamList params2{{"x.weight", w2}, {"x.bias", b2}};
  for (auto* p : {&w, &b, &w2, &b2}) p->mutable_grad() = at::full({1}, -0.7, at::kFloat);
  opt.step(params, 0.1);
  other.step(params2, 0.1);
  EXPECT_EQ(w.item<double>(), w2.item<double>());
  EXPECT_EQ(other.steps(), 4);
  st["exp_avg.y.weight"] = st["exp_avg.x.weight"];
  EXPECT_FALSE(other.load_state(st, params));
}

TEST(Optimizer, ClippingScalesToTheMaxNorm) {
  auto a = at::zeros({2}, at::kDouble).requires_grad_(true);
  a.mutable_grad() = at::tensor({3.0, 4.0}, at::kDouble);
  ParamList ps{{"a", a}};
  EXPECT_NEAR(clip_grad_norm(ps, 1.0), 5.0, 1e-12);
  EXPECT_NEAR(a.grad().norm().item<double>(), 1.0, 1e-5);
  EXPECT_NEAR(clip_grad_norm(ps, 10.0), 1.0, 1e-5);  // under the limit: unchanged
}

TEST(Training, GradientsMatchFiniteDifferencesInFloat64) {
  for (auto arch : {Architecture::llama, Architecture::qwen2, Architecture::qwen3}) {
    auto cfg = small(arch);
    if (arch == Architecture::llama) cfg.mlp_bias = cfg.qkv_bias = cfg.o_bias = true;
    auto lm = CausalLM::init_random(cfg, 5);
    ASSERT_TRUE(lm);
    auto& impl = lm->impl();
    for (auto& [n, p] : impl.params) p = (p * 20.0).to(at::kDouble).requires_grad_(true);  // sharp attention
    for (auto& [n, p] : impl.params)
      if (n.find("norm") != std::string::npos) p = (p.detach() / 20.0 + 0.1 * at::rand_like(p)).requires_grad_(true);
    auto prepared = model_detail::prepare(cfg, {.input_ids = ids_of({{1, 5, 9, 2, 7}, {3, 3, 0, 0, 0}}),
                                                .attention_mask = ids_of({{1, 1, 1, 1, 1}, {1, 1, 0, 0, 0}})});
    ASSERT_TRUE(prepared);
    auto f = [&] { return impl.run(*prepared, true, false); };
    auto objective = [&](const CausalLM::Impl::Outputs& o) { return o.logprobs.sum() + 0.3 * o.entropies.sum(); };
    objective(f()).backward();
    for (auto name : {"model.embed_tokens.weight", "model.layers.0.self_attn.q_proj.weight",
                      "model.layers.1.self_attn.k_proj.weight", "model.layers.0.mlp.down_proj.weight",
                      "model.layers.1.post_attention_layernorm.weight", "model.norm.weight"}) {
      auto& p = impl.params.at(name);
      auto flat = p.detach().view({-1});
      for (int64_t i : {int64_t{0}, flat.numel() / 2, flat.numel() - 1}) {
        double h = 1e-6, old = flat[i].item<double>();
        c10::NoGradGuard ng;
        flat[i] = old + h;
        double up = objective(f()).item<double>();
        flat[i] = old - h;
        double down = objective(f()).item<double>();
        flat[i] = old;
        double fd = (up - down) / (2 * h), ad = p.grad().view({-1})[i].item<double>();
        EXPECT_NEAR(ad, fd, 1e-6 * std::max(1.0, std::abs(fd))) << hf_class_name(arch) << " " << name << "[" << i << "]";
      }
    }
  }
}

TEST(Training, AccumulatedMicroBatchesEqualOneBatch) {
  auto cfg = small();
  auto batch = ids_of({{1, 2, 3, 4, 5, 6}, {7, 8, 9, 0, 0, 0}, {4, 4, 4, 4, 0, 0}, {9, 8, 7, 6, 5, 4}});
  auto mask = ids_of({{1, 1, 1, 1, 1, 1}, {1, 1, 1, 0, 0, 0}, {1, 1, 1, 1, 0, 0}, {1, 1, 1, 1, 1, 1}});
  // Without clipping: clipped to norm 1, some of this model's gradients
  // come down to AdamW's eps (1e-8), where its first step turns a relative
  // rounding difference of 1e-4 in one element into 1e-7 in the weight;
  // that measures the optimizer's conditioning, not the accumulation.
  auto make = [&] {
    return *Trainer::create(*CausalLM::init_random(cfg, 9), {.optimizer = {.lr = 1e-2, .max_grad_norm = 0}});
  };
  auto whole = make(), parts = make();
  ASSERT_TRUE(whole.forward_backward({.tokens = {.input_ids = batch, .attention_mask = mask}}, {}));
  std::map<std::string, at::Tensor> whole_grads;
  for (auto& [n, p] : whole.model().impl().params) whole_grads[n] = p.grad().clone();
  auto whole_step = whole.clip_grad_and_step();
  ASSERT_TRUE(whole_step);
  for (int64_t k = 0; k < 4; k += 2) {
    auto r = parts.forward_backward(
        {.tokens = {.input_ids = *batch.slice(k, k + 2), .attention_mask = *mask.slice(k, k + 2)}}, {});
    ASSERT_TRUE(r) << describe(r.error());
  }
  for (auto& [n, p] : parts.model().impl().params) {
    // Against the tensor's scale: its small elements carry the sums' rounding.
    const auto& w = whole_grads.at(n);
    const double diff = (p.grad() - w).abs().max().item<double>(), scale = w.abs().max().item<double>();
    EXPECT_LE(diff, 1e-5 * scale) << n << " (gradient)";
  }
  auto parts_step = parts.clip_grad_and_step();
  ASSERT_TRUE(parts_step);
  // The norm is taken after the division by the batch's token count: a
  // micro-batch's tokens counted wrong would show here (the first AdamW step
  // moves each weight by about lr x sign(g), whatever g's scale).
  EXPECT_NEAR(parts_step->at("grad_norm"), whole_step->at("grad_norm"), 1e-5 * whole_step->at("grad_norm"));
  for (auto& [n, p] : whole.model().impl().params)
    EXPECT_TRUE(at::allclose(p, parts.model().impl().params.at(n), 1e-6, 1e-7)) << n;
}

// A batch too large for the memory at hand runs in slices of rows; the
// update and the metrics are the whole batch's, for every loss (a row
// without a counted token included: DR-GRPO still counts it).
TEST(Training, ABatchInSlicesTrainsAsTheWholeBatch) {
  auto cfg = small();
  const auto ids = ids_of({{1, 2, 3, 4, 5, 6}, {7, 8, 9, 0, 0, 0}, {4, 4, 4, 4, 0, 0}, {9, 8, 7, 6, 5, 4}, {3, 1, 4, 1, 5, 9}});
  const auto attention = ids_of({{1, 1, 1, 1, 1, 1}, {1, 1, 1, 0, 0, 0}, {1, 1, 1, 1, 0, 0}, {1, 1, 1, 1, 1, 1}, {1, 1, 1, 1, 1, 1}});
  const auto loss_mask = ids_of({{0, 0, 1, 1, 1, 1}, {0, 1, 1, 0, 0, 0}, {0, 0, 0, 0, 0, 0}, {0, 0, 0, 1, 1, 1}, {0, 1, 1, 1, 1, 1}});
  const auto advantages = *Tensor::from_values(std::vector<float>{1.f, -0.5f, 2.f, -1.f, 0.25f}, {5});
  auto logps = [&](float shift) {
    std::vector<float> v(30);
    for (size_t i = 0; i < v.size(); ++i) v[i] = -1.5f + shift * static_cast<float>(i % 7) / 7.f;
    return *Tensor::from_values(v, {5, 6});
  };
  const double per_row = model_detail::training_bytes_per_row(cfg, 6, 4, true, false);
  struct Case {
    LossSpec loss;
    bool policy;
  };
  for (const auto& c : {Case{{}, false}, Case{{.kind = LossKind::grpo, .beta = 0.1, .entropy_coef = 0.01}, true},
                        Case{{.kind = LossKind::gspo}, true}, Case{{.kind = LossKind::dr_grpo, .max_tokens = 8}, true},
                        Case{{.kind = LossKind::dr_grpo}, true}, Case{{.kind = LossKind::cispo, .epsilon_high = 0.1}, true}}) {
    SCOPED_TRACE(std::string{to_string(c.loss.kind)});
    TrainBatch b{.tokens = {.input_ids = ids, .attention_mask = attention}, .loss_mask = loss_mask};
    if (c.policy) b.old_logps = logps(0.4f), b.ref_logps = logps(-0.3f), b.advantages = advantages;
    auto make = [&](int64_t rows, uint64_t budget) {
      // SGD: the update is the gradient's (Adam's would turn float noise in
      // a near-zero gradient into a whole step).
      return *Trainer::create(*CausalLM::init_random(cfg, 9),
                              {.optimizer = {.kind = OptimizerConfig::Kind::sgd, .lr = 0.5},
                               .micro_batch_rows = rows,
                               .memory_budget_bytes = budget});
    };
    // Whole; one row per pass; as many as a budget of 2.5 rows holds (2).
    auto whole = make(0, 0), ones = make(1, 0), twos = make(0, static_cast<uint64_t>(2.5 * per_row));
    auto w = whole.forward_backward(b, c.loss);
    ASSERT_TRUE(w) << describe(w.error());
    for (auto* t : {&ones, &twos}) {
      auto s = t->forward_backward(b, c.loss);
      ASSERT_TRUE(s) << describe(s.error());
      ASSERT_EQ(s->size(), w->size());
      for (const auto& [name, value] : *w) EXPECT_NEAR(s->at(name), value, 1e-5 * std::max(1.0, std::abs(value))) << name;
      ASSERT_TRUE(t->clip_grad_and_step());
    }
    ASSERT_TRUE(whole.clip_grad_and_step());
    for (auto& [n, p] : whole.model().impl().params) {
      EXPECT_TRUE(at::allclose(p, ones.model().impl().params.at(n), 1e-5, 1e-6)) << n;
      EXPECT_TRUE(at::allclose(p, twos.model().impl().params.at(n), 1e-5, 1e-6)) << n;
    }
  }
}

// The same step on `packed` as on `padded` (fresh models, SGD): the same
// metrics (but `skip`) and weights after it, whole and one row per pass.
void expect_packed_trains_as_padded(const ModelConfig& cfg, const TrainBatch& padded, const TrainBatch& packed,
                                    const LossSpec& spec, const std::set<std::string>& skip) {
  auto make = [&](int64_t rows) {
    return *Trainer::create(*CausalLM::init_random(cfg, 9),
                            {.optimizer = {.kind = OptimizerConfig::Kind::sgd, .lr = 0.5}, .micro_batch_rows = rows});
  };
  auto reference = make(0), whole = make(0), sliced = make(1);
  auto want = reference.forward_backward(padded, spec);
  ASSERT_TRUE(want) << describe(want.error());
  for (auto* t : {&whole, &sliced}) {
    auto got = t->forward_backward(packed, spec);
    ASSERT_TRUE(got) << describe(got.error());
    for (const auto& [name, value] : *want) {
      if (skip.count(name) || (name == "loss_count" && t == &sliced)) continue;  // slices count their own
      ASSERT_TRUE(got->count(name)) << name;
      EXPECT_NEAR(got->at(name), value, 1e-5 * std::max(1.0, std::abs(value))) << name;
    }
    ASSERT_TRUE(t->clip_grad_and_step());
  }
  ASSERT_TRUE(reference.clip_grad_and_step());
  for (auto& [n, p] : reference.model().impl().params) {
    EXPECT_TRUE(at::allclose(p, whole.model().impl().params.at(n), 1e-5, 1e-6)) << n;
    EXPECT_TRUE(at::allclose(p, sliced.model().impl().params.at(n), 1e-5, 1e-6)) << n;
  }
}

// Sequences packed end to end in rows (segment_ids) train as the same
// sequences one per padded row, for every loss, whole and in slices: the
// per-sequence reductions (GRPO's mean per sequence, GSPO's ratio,
// DR-GRPO's count and length) work per (row, segment).
TEST(Training, APackedBatchTrainsAsItsPaddedOne) {
  auto cfg = small();
  struct Seq {
    std::vector<int64_t> ids;
    std::vector<int64_t> mask;  // counted tokens
    float advantage;
  };
  const std::vector<Seq> seqs = {{{1, 2, 3, 4, 5, 6}, {0, 0, 1, 1, 1, 0}, 1.f},
                                 {{7, 8, 9}, {0, 1, 0}, -0.5f},
                                 {{4, 4, 4, 4, 2}, {0, 0, 1, 1, 0}, 2.f},
                                 {{9, 8}, {1, 0}, -1.f},
                                 {{3, 1, 4, 1, 5, 9, 2}, {0, 1, 1, 1, 1, 1, 0}, 0.25f},
                                 {{5, 5, 5}, {0, 0, 0}, 0.5f}};  // no counted token (packed only)
  // Per-token behaviour and reference log-probs of each sequence.
  auto lp = [](size_t s, size_t t, float shift) { return -1.5f + shift * static_cast<float>((3 * s + t) % 7) / 7.f; };
  // Rows of sequence indices: padded (one each) and packed (two rows).
  auto build = [&](const std::vector<std::vector<size_t>>& rows, bool packed) {
    size_t T = 0;
    for (const auto& r : rows) {
      size_t n = 0;
      for (size_t s : r) n += seqs[s].ids.size();
      T = std::max(T, n);
    }
    const auto B = rows.size();
    std::vector<int64_t> ids(B * T, 0), attention(B * T, 0), segments(B * T, 0);
    std::vector<float> mask(B * T, 0), adv(B * T, 0), old_lp(B * T, 0), ref_lp(B * T, 0);
    for (size_t r = 0; r < B; ++r) {
      size_t at = r * T;
      int64_t segment = 1;
      for (size_t s : rows[r]) {
        for (size_t t = 0; t < seqs[s].ids.size(); ++t, ++at) {
          ids[at] = seqs[s].ids[t];
          attention[at] = 1;
          segments[at] = segment;
          mask[at] = static_cast<float>(seqs[s].mask[t]);
          adv[at] = seqs[s].advantage;
          old_lp[at] = lp(s, t, 0.4f);
          ref_lp[at] = lp(s, t, -0.3f);
        }
        ++segment;
      }
    }
    const std::vector<int64_t> shape{static_cast<int64_t>(B), static_cast<int64_t>(T)};
    TrainBatch b{.tokens = {.input_ids = *Tensor::from_values(ids, shape),
                            .attention_mask = *Tensor::from_values(attention, shape)},
                 .loss_mask = *Tensor::from_values(mask, shape)};
    if (packed) b.tokens.segment_ids = *Tensor::from_values(segments, shape);
    b.old_logps = *Tensor::from_values(old_lp, shape);
    b.ref_logps = *Tensor::from_values(ref_lp, shape);
    b.advantages = *Tensor::from_values(adv, shape);
    return b;
  };
  const auto padded = build({{0}, {1}, {2}, {3}, {4}}, false);
  // As glint packs them: no row longer than the longest sequence (DR-GRPO's
  // T is the rows' length, the padded batch's).
  const auto packed = build({{4}, {0}, {1, 3}, {2}}, true);
  for (const auto& spec : {LossSpec{}, LossSpec{.kind = LossKind::grpo, .beta = 0.1, .entropy_coef = 0.01},
                           LossSpec{.kind = LossKind::gspo}, LossSpec{.kind = LossKind::dr_grpo, .max_tokens = 8},
                           LossSpec{.kind = LossKind::dr_grpo}, LossSpec{.kind = LossKind::cispo, .epsilon_high = 0.1}}) {
    SCOPED_TRACE(std::string{to_string(spec.kind)});
    auto strip = [&](TrainBatch b) {
      if (spec.kind == LossKind::cross_entropy) b.old_logps = b.ref_logps = b.advantages = Tensor{};
      return b;
    };
    expect_packed_trains_as_padded(cfg, strip(padded), strip(packed), spec, {});
  }
  // A packed row whose sequence has no counted token adds nothing, whole or
  // one row per pass (DR-GRPO counts sequences there, not rows).
  for (const auto& spec : {LossSpec{.kind = LossKind::dr_grpo}, LossSpec{.kind = LossKind::grpo}}) {
    SCOPED_TRACE("an empty row, " + std::string{to_string(spec.kind)});
    expect_packed_trains_as_padded(cfg, packed, build({{4}, {0}, {1, 3}, {5}, {2}}, true), spec, {});
  }
  // One advantage per row cannot be right for rows of several sequences.
  auto t = *Trainer::create(*CausalLM::init_random(cfg, 9), {});
  auto per_row = packed;
  per_row.advantages = *Tensor::from_values(std::vector<float>{1.f, 2.f, 3.f, 4.f}, {4});
  auto r = t.forward_backward(per_row, {.kind = LossKind::grpo});
  ASSERT_FALSE(r);
  EXPECT_NE(describe(r.error()).find("per token"), std::string::npos) << describe(r.error());
  // Pairwise losses read whole pairs in each row: not 3 responses.
  auto pairs = packed;
  pairs.advantages = pairs.old_logps = Tensor{};
  auto d = t.forward_backward(pairs, {.kind = LossKind::dpo, .beta = 0.1});
  ASSERT_FALSE(d);
  EXPECT_NE(describe(d.error()).find("whole pairs"), std::string::npos) << describe(d.error());
}

// DPO and IPO on pairs packed whole into rows (chosen, rejected as
// consecutive segments) train as the same pairs in padded rows 2i, 2i + 1.
TEST(Dpo, PackedPairsTrainAsPaddedOnes) {
  auto cfg = small();
  struct Response {
    std::vector<int64_t> ids, mask;
  };
  // Three pairs: prompt then response; the mask counts the response.
  const std::vector<std::pair<Response, Response>> pairs = {
      {{{1, 2, 3, 4}, {0, 1, 1, 0}}, {{1, 2, 5}, {0, 1, 0}}},
      {{{7, 8, 9, 10, 11}, {0, 0, 1, 1, 0}}, {{7, 8, 12, 13, 14}, {0, 0, 1, 1, 0}}},
      {{{4, 4, 6}, {0, 1, 0}}, {{4, 4, 9, 9}, {0, 1, 1, 0}}}};
  auto ref_lp = [](size_t r, size_t t) { return -1.0f - 0.1f * static_cast<float>((5 * r + 3 * t) % 9); };
  // rows: lists of responses (pair * 2 + 0 chosen / 1 rejected).
  auto build = [&](const std::vector<std::vector<size_t>>& rows, bool packed) {
    auto response = [&](size_t r) -> const Response& { return r % 2 == 0 ? pairs[r / 2].first : pairs[r / 2].second; };
    size_t T = 0;
    for (const auto& row : rows) {
      size_t n = 0;
      for (size_t r : row) n += response(r).ids.size();
      T = std::max(T, n);
    }
    const auto B = rows.size();
    std::vector<int64_t> ids(B * T, 0), attention(B * T, 0), segments(B * T, 0);
    std::vector<float> mask(B * T, 0), ref(B * T, 0);
    for (size_t b = 0; b < B; ++b) {
      size_t at = b * T;
      int64_t segment = 1;
      for (size_t r : rows[b]) {
        const auto& x = response(r);
        for (size_t t = 0; t < x.ids.size(); ++t, ++at) {
          ids[at] = x.ids[t];
          attention[at] = 1;
          segments[at] = segment;
          mask[at] = static_cast<float>(x.mask[t]);
          ref[at] = ref_lp(r, t);
        }
        ++segment;
      }
    }
    const std::vector<int64_t> shape{static_cast<int64_t>(B), static_cast<int64_t>(T)};
    TrainBatch batch{.tokens = {.input_ids = *Tensor::from_values(ids, shape),
                                .attention_mask = *Tensor::from_values(attention, shape)},
                     .loss_mask = *Tensor::from_values(mask, shape)};
    if (packed) batch.tokens.segment_ids = *Tensor::from_values(segments, shape);
    batch.ref_logps = *Tensor::from_values(ref, shape);
    return batch;
  };
  const auto padded = build({{0}, {1}, {2}, {3}, {4}, {5}}, false);
  const auto packed = build({{0, 1, 4, 5}, {2, 3}}, true);
  for (const auto& spec : {LossSpec{.kind = LossKind::dpo, .beta = 0.1}, LossSpec{.kind = LossKind::ipo, .beta = 0.5}}) {
    SCOPED_TRACE(std::string{to_string(spec.kind)});
    // sequences and loss_count: rows there, responses here.
    expect_packed_trains_as_padded(cfg, padded, packed, spec, {"sequences", "loss_count"});
  }
  // A row must hold whole pairs.
  auto t = *Trainer::create(*CausalLM::init_random(cfg, 9), {});
  auto r = t.forward_backward(build({{0, 1, 2}, {3, 4, 5}}, true), {.kind = LossKind::dpo, .beta = 0.1});
  ASSERT_FALSE(r);
  EXPECT_NE(describe(r.error()).find("whole pairs"), std::string::npos) << describe(r.error());
  // Pair 0's rejected and pair 1's chosen without a counted token: an even
  // count of responses, but pairing what is left would match pair 0's chosen
  // with pair 1's rejected.
  auto gaps = build({{0, 1, 2, 3}}, true);
  auto mask = to_torch(gaps.loss_mask).clone();
  mask[0].narrow(0, 4, 8).zero_();  // segments 2 (3 tokens) and 3 (5 tokens)
  gaps.loss_mask = *from_torch(mask);
  auto g = t.forward_backward(gaps, {.kind = LossKind::dpo, .beta = 0.1});
  ASSERT_FALSE(g);
  EXPECT_NE(describe(g.error()).find("segment 1 of row 0"), std::string::npos) << describe(g.error());
}

// A slice that fails after others have added their gradients puts back
// what was accumulated before the call: the next step is as if the call
// had not happened.
TEST(Training, ASliceThatFailsLeavesTheAccumulatedGradientsAsTheyWere) {
  auto cfg = small();
  const TrainBatch good{.tokens = {.input_ids = ids_of({{1, 2, 3, 4}, {4, 3, 2, 1}})},
                        .advantages = *Tensor::from_values(std::vector<float>{1.f, -1.f}, {2})};
  // Row 1's advantage overflows its loss (a sum of 3.4e38s): finite input, infinite loss.
  const TrainBatch bad{.tokens = {.input_ids = ids_of({{1, 2, 3, 4}, {5, 6, 7, 8}})},
                       .advantages = *Tensor::from_values(std::vector<float>{1.f, 3.4e38f}, {2})};
  const LossSpec grpo{.kind = LossKind::grpo};
  for (bool before : {true, false}) {
    SCOPED_TRACE(before ? "gradients accumulated before" : "none before");
    auto tr = *Trainer::create(*CausalLM::init_random(cfg, 3), {.optimizer = {.lr = 1e-2}, .micro_batch_rows = 1});
    auto alone = *Trainer::create(*CausalLM::init_random(cfg, 3), {.optimizer = {.lr = 1e-2}});
    if (before) {
      ASSERT_TRUE(tr.forward_backward(good, grpo));
      ASSERT_TRUE(alone.forward_backward(good, grpo));
    }
    auto r = tr.forward_backward(bad, grpo);
    ASSERT_FALSE(r);
    EXPECT_EQ(code_of(r.error()), errc::invalid_argument);
    EXPECT_NE(describe(r.error()).find("micro-batch 2 of 2; nothing was accumulated"), std::string::npos)
        << describe(r.error());
    ASSERT_TRUE(tr.forward_backward(good, grpo));
    ASSERT_TRUE(alone.forward_backward(good, grpo));
    ASSERT_TRUE(tr.clip_grad_and_step());
    ASSERT_TRUE(alone.clip_grad_and_step());
    for (auto& [n, p] : alone.model().impl().params)
      EXPECT_TRUE(at::allclose(p, tr.model().impl().params.at(n), 1e-5, 1e-6)) << n;
  }
}

// One row that does not fit is refused with the estimate, before any
// allocation; a negative micro_batch_rows is refused at creation.
TEST(Training, ARowThatDoesNotFitIsRefusedWithItsEstimate) {
  auto cfg = small();
  const double per_row = model_detail::training_bytes_per_row(cfg, 4, 4, false, false);
  EXPECT_GT(per_row, 0);
  // Linear in the rows' length for the projections, quadratic for attention.
  EXPECT_GT(model_detail::training_bytes_per_row(cfg, 400, 4, false, false), 100 * per_row);
  auto tr = *Trainer::create(*CausalLM::init_random(cfg, 3), {.memory_budget_bytes = static_cast<uint64_t>(per_row / 2)});
  auto r = tr.forward_backward({.tokens = {.input_ids = ids_of({{1, 2, 3, 4}})}}, {});
  ASSERT_FALSE(r);
  EXPECT_EQ(code_of(r.error()), errc::resource_exhausted);
  EXPECT_NE(describe(r.error()).find("training one row of 4 tokens needs about"), std::string::npos)
      << describe(r.error());
  EXPECT_NE(describe(r.error()).find("TrainConfig::memory_budget_bytes"), std::string::npos) << describe(r.error());
  auto neg = Trainer::create(*CausalLM::init_random(cfg, 3), {.micro_batch_rows = -1});
  ASSERT_FALSE(neg);
  EXPECT_NE(describe(neg.error()).find("micro_batch_rows is -1"), std::string::npos);
}

// Once the driver has returned (run_main asks for a stop), a batch in
// micro-batches stops at the next one, putting the gradients back.
TEST(Training, AStopRequestEndsAMicroBatchedCallBetweenSlices) {
  auto tr = *Trainer::create(*CausalLM::init_random(small(), 3), {.micro_batch_rows = 1});
  const TrainBatch b{.tokens = {.input_ids = ids_of({{1, 2, 3, 4}, {4, 3, 2, 1}})}};
  request_stop();
  auto r = tr.forward_backward(b, {});
  request_stop(false);
  ASSERT_FALSE(r);
  EXPECT_EQ(code_of(r.error()), errc::aborted);
  EXPECT_NE(describe(r.error()).find("the driver has returned"), std::string::npos) << describe(r.error());
  ASSERT_TRUE(tr.forward_backward(b, {})) << "served again once the stop is withdrawn";
}

// The data-parallel path without a second process: a fake group whose
// peers hold the same batch. A collective that fails (a peer died, c10d
// timed out) fails the step without stepping; the gradients it had are
// dropped, and the next step works and matches a trainer alone.
TEST(Training, AFailedAllReduceFailsTheStepAndTheNextStepMatchesOneRank) {
  auto cfg = small();
  auto batch = ids_of({{1, 2, 3, 4, 5, 6}, {7, 8, 9, 0, 0, 0}});
  auto mask = ids_of({{1, 1, 1, 1, 1, 1}, {1, 1, 1, 0, 0, 0}});
  auto pg = std::make_shared<glint::testing::FakeProcessGroup>(0, 2);
  pg->script({make_error(errc::unavailable, "all_reduce on rank 0 of 2 failed: peer gone"), caf::error{}});
  auto dp = *Trainer::create(*CausalLM::init_random(cfg, 9), {.optimizer = {.lr = 1e-2}, .dp_group = pg});
  auto alone = *Trainer::create(*CausalLM::init_random(cfg, 9), {.optimizer = {.lr = 1e-2}});
  const TrainBatch b{.tokens = {.input_ids = batch, .attention_mask = mask}};
  ASSERT_TRUE(dp.forward_backward(b, {}));
  auto failed = dp.clip_grad_and_step();
  ASSERT_FALSE(failed);
  EXPECT_EQ(code_of(failed.error()), errc::unavailable);
  EXPECT_NE(describe(failed.error()).find("peer gone"), std::string::npos) << describe(failed.error());
  EXPECT_EQ(dp.step(), 0) << "a failed collective does not step";
  for (auto& [n, p] : dp.model().impl().params)
    EXPECT_TRUE(at::equal(p, alone.model().impl().params.at(n))) << n << " changed in a failed step";

  ASSERT_TRUE(dp.forward_backward(b, {}));
  ASSERT_TRUE(alone.forward_backward(b, {}));
  auto s = dp.clip_grad_and_step();
  ASSERT_TRUE(s) << describe(s.error());
  ASSERT_TRUE(alone.clip_grad_and_step());
  EXPECT_EQ(dp.step(), 1);
  EXPECT_EQ(pg->collectives(), 2);
  for (auto& [n, p] : dp.model().impl().params)
    EXPECT_TRUE(at::allclose(p, alone.model().impl().params.at(n), 1e-6, 1e-7))
        << n << ": the failed step's gradients leaked into the next";
}

TEST(Training, ATinyModelLearnsAFixedSet) {
  auto tr = Trainer::create(*CausalLM::init_random(small(), 1),
                            {.optimizer = {.lr = 2e-2},
                             .scheduler = {.kind = SchedulerConfig::Kind::cosine, .warmup_steps = 3, .total_steps = 60}});
  ASSERT_TRUE(tr);
  TrainBatch b{.tokens = {.input_ids = ids_of({{1, 2, 3, 4, 5, 6, 7, 8}, {8, 7, 6, 5, 4, 3, 2, 1}})}};
  double first = 0, last = 0;
  for (int step = 0; step < 60; ++step) {
    auto m = tr->forward_backward(b, {});
    ASSERT_TRUE(m) << describe(m.error());
    if (step == 0) first = m->at("loss");
    last = m->at("loss");
    auto s = tr->clip_grad_and_step();
    ASSERT_TRUE(s) << describe(s.error());
  }
  EXPECT_LT(last, 0.2 * first) << "loss " << first << " -> " << last;
  EXPECT_EQ(tr->step(), 60);
}

TEST(Training, BadInputIsAnErrorAndTheNextCallIsServed) {
  auto tr = Trainer::create(*CausalLM::init_random(small(), 2), {});
  ASSERT_TRUE(tr);
  auto ids = ids_of({{1, 2, 3}, {4, 5, 6}});
  auto no_step = tr->clip_grad_and_step();
  ASSERT_FALSE(no_step);
  EXPECT_EQ(code_of(no_step.error()), errc::failed_precondition);
  auto nan_adv = *Tensor::from_values(std::vector<float>{1.f, NAN}, {2});
  auto r = tr->forward_backward({.tokens = {.input_ids = ids}, .advantages = nan_adv}, {.kind = LossKind::grpo});
  ASSERT_FALSE(r);
  EXPECT_NE(describe(r.error()).find("advantages holds NaN"), std::string::npos) << describe(r.error());
  auto no_adv = tr->forward_backward({.tokens = {.input_ids = ids}}, {.kind = LossKind::grpo});
  ASSERT_FALSE(no_adv);
  EXPECT_NE(describe(no_adv.error()).find("grpo needs advantages"), std::string::npos);
  auto oov = tr->forward_backward({.tokens = {.input_ids = ids_of({{1, 99}})}}, {});
  ASSERT_FALSE(oov);
  auto shape = tr->forward_backward({.tokens = {.input_ids = ids}, .old_logps = *Tensor::zeros(Dtype::f32, {2, 2})},
                                    {.kind = LossKind::grpo});
  ASSERT_FALSE(shape);
  EXPECT_NE(describe(shape.error()).find("old_logps is f32[2, 2] but the batch is [2, 3]"), std::string::npos)
      << describe(shape.error());
  // Nothing was accumulated by the failures; a good call and a step work.
  auto adv = *Tensor::from_values(std::vector<float>{1.f, -1.f}, {2});
  auto ok = tr->forward_backward({.tokens = {.input_ids = ids}, .advantages = adv}, {.kind = LossKind::grpo});
  ASSERT_TRUE(ok) << describe(ok.error());
  EXPECT_EQ(ok->at("sequences"), 2);
  ASSERT_TRUE(tr->clip_grad_and_step());
}

// The clipping bound is part of the optimizer config, so set_optimizer on a
// trainer that already stepped changes it too (it was fixed at creation).
TEST(Training, SetOptimizerChangesTheClippingBound) {
  TrainBatch b{.tokens = {.input_ids = ids_of({{1, 2, 3, 4, 5, 6}, {6, 5, 4, 3, 2, 1}})}};
  const OptimizerConfig tight{.kind = OptimizerConfig::Kind::sgd, .lr = 1.0, .weight_decay = 0, .max_grad_norm = 1e-3};
  auto changed = *Trainer::create(*CausalLM::init_random(small(), 4), {.optimizer = {.kind = OptimizerConfig::Kind::sgd}});
  auto fixed = *Trainer::create(*CausalLM::init_random(small(), 4), {.optimizer = tight});
  auto loose = *Trainer::create(*CausalLM::init_random(small(), 4), {.optimizer = {.kind = OptimizerConfig::Kind::sgd,
                                                                                   .lr = 1.0, .weight_decay = 0,
                                                                                   .max_grad_norm = 0}});
  ASSERT_TRUE(changed.set_optimizer(tight));
  for (auto* t : {&changed, &fixed, &loose}) {
    ASSERT_TRUE(t->forward_backward(b, {}));
    auto s = t->clip_grad_and_step();
    ASSERT_TRUE(s) << describe(s.error());
  }
  bool differs_from_unclipped = false;
  for (auto& [n, p] : fixed.model().impl().params) {
    EXPECT_TRUE(at::allclose(p, changed.model().impl().params.at(n), 1e-6, 1e-7)) << n;
    differs_from_unclipped |= !at::allclose(p, loose.model().impl().params.at(n), 1e-4, 1e-5);
  }
  EXPECT_TRUE(differs_from_unclipped) << "clipping to 1e-3 changes the step";
  EXPECT_FALSE((OptimizerConfig{.max_grad_norm = -1}.validate()));
}

// A loss setting or batch column the loss kind does not read is refused,
// never ignored: cross_entropy used to train on a batch with advantages as
// if they were not there, and take any beta or epsilon without a word.
TEST(Training, WhatTheLossKindDoesNotReadIsRefused) {
  struct Case {
    LossSpec spec;
    std::string expect;
  };
  std::vector<Case> cases = {
      {{.kind = LossKind::cross_entropy, .beta = 0.1}, "cross_entropy does not read beta"},
      {{.kind = LossKind::cross_entropy, .epsilon = 0.3}, "cross_entropy does not read epsilon"},
      {{.kind = LossKind::cross_entropy, .entropy_coef = 0.01}, "cross_entropy does not read entropy_coef"},
      {{.kind = LossKind::grpo, .max_tokens = 64}, "grpo does not read max_tokens"},
      {{.kind = LossKind::cispo, .epsilon = 0.1}, "cispo does not read epsilon"},
  };
  for (const auto& c : cases) {
    auto ok = c.spec.validate();
    ASSERT_FALSE(ok) << c.expect;
    EXPECT_NE(describe(ok.error()).find(c.expect), std::string::npos) << describe(ok.error());
  }
  EXPECT_TRUE((LossSpec{.kind = LossKind::dr_grpo, .max_tokens = 64}.validate()));
  EXPECT_TRUE((LossSpec{.kind = LossKind::grpo, .epsilon = 0.1, .beta = 0.1}.validate()));

  auto tr = Trainer::create(*CausalLM::init_random(small(), 2), {});
  ASSERT_TRUE(tr);
  auto ids = ids_of({{1, 2, 3, 4}});
  auto adv = *Tensor::from_values(std::vector<float>{1.0f}, {1});
  auto logps = *Tensor::from_values(std::vector<float>{0, 0, 0, 0}, {1, 4});
  auto with_adv = tr->forward_backward({.tokens = {.input_ids = ids}, .advantages = adv}, {});
  ASSERT_FALSE(with_adv);
  EXPECT_NE(describe(with_adv.error()).find("advantages, which cross_entropy does not read"), std::string::npos)
      << describe(with_adv.error());
  EXPECT_FALSE(tr->forward_backward({.tokens = {.input_ids = ids}, .old_logps = logps}, {}));
  // ref_logps with beta 0 is read: the kl metric, without a penalty.
  auto ref = tr->forward_backward({.tokens = {.input_ids = ids}, .ref_logps = logps, .advantages = adv},
                                  {.kind = LossKind::grpo});
  ASSERT_TRUE(ref) << describe(ref.error());
  EXPECT_TRUE(ref->count("kl")) << "the kl metric is reported";
  EXPECT_TRUE(tr->forward_backward({.tokens = {.input_ids = ids}}, {}));
  EXPECT_TRUE(tr->forward_backward({.tokens = {.input_ids = ids}, .ref_logps = logps, .advantages = adv},
                                   {.kind = LossKind::grpo, .beta = 0.1}));
}

TEST(Training, SettingsFromTheWireWithUnknownKindsAreRefused) {
  EXPECT_FALSE((LossSpec{.kind = static_cast<LossKind>(40)}.validate()));
  EXPECT_FALSE((LossSpec{.epsilon = -0.1}.validate()));
  EXPECT_FALSE((OptimizerConfig{.kind = static_cast<OptimizerConfig::Kind>(7)}.validate()));
  EXPECT_FALSE((SchedulerConfig{.kind = static_cast<SchedulerConfig::Kind>(7)}.validate()));
  auto tr = Trainer::create(*CausalLM::init_random(small(), 2), {});
  ASSERT_TRUE(tr);
  auto r = tr->forward_backward({.tokens = {.input_ids = ids_of({{1, 2, 3}})}}, {.kind = static_cast<LossKind>(40)});
  ASSERT_FALSE(r);
  EXPECT_NE(describe(r.error()).find("kind 40"), std::string::npos) << describe(r.error());
}

// -- DPO / IPO: rows in pairs against a reference ------------------------------

// Three pairs (rows 2i chosen, 2i + 1 rejected) whose responses are the last
// tokens of each row.
struct PairBatch {
  Tensor ids = ids_of({{1, 2, 3, 4, 5, 6}, {1, 2, 3, 9, 8, 0}, {7, 7, 2, 5, 5, 5}, {7, 7, 2, 1, 1, 1},
                       {4, 3, 6, 2, 8, 1}, {4, 3, 6, 5, 0, 0}});
  Tensor attention = ids_of({{1, 1, 1, 1, 1, 1}, {1, 1, 1, 1, 1, 0}, {1, 1, 1, 1, 1, 1}, {1, 1, 1, 1, 1, 1},
                             {1, 1, 1, 1, 1, 1}, {1, 1, 1, 1, 0, 0}});
  Tensor mask = ids_of({{0, 0, 1, 1, 1, 0}, {0, 0, 1, 1, 0, 0}, {0, 1, 1, 1, 1, 0}, {0, 1, 1, 1, 1, 0},
                        {0, 0, 1, 1, 1, 0}, {0, 0, 1, 0, 0, 0}});
  TokenBatch tokens() const { return {.input_ids = ids, .attention_mask = attention}; }
};

/// The log-probs of `b` under `lm` with `adapter` ("" : the base), as forward_only answers them.
Tensor reference_logps(const CausalLM& lm, const PairBatch& b, const std::string& adapter = "") {
  auto r = lm.forward(b.tokens(), {.adapter = adapter});
  EXPECT_TRUE(r) << describe(r.error());
  return r->logprobs;
}

Trainer lora_trainer(uint64_t seed, const TrainConfig& extra = {}) {
  auto lm = *CausalLM::init_random(small(), seed);
  EXPECT_TRUE(lm.add_adapter("a", {.r = 4, .alpha = 8, .target_modules = {"all-linear"}}, 3));
  auto cfg = extra;
  cfg.adapter = "a";
  if (cfg.optimizer.lr == OptimizerConfig{}.lr) cfg.optimizer.lr = 5e-2;
  return *Trainer::create(std::move(lm), cfg);
}

// A fresh adapter (B = 0) is the reference exactly: the DPO loss is ln 2,
// the margin 0; IPO's is (1 / (2 beta))^2.
TEST(Dpo, AFreshAdapterStartsAtLn2AgainstTheBaseWithoutIt) {
  PairBatch b;
  for (auto kind : {LossKind::dpo, LossKind::ipo}) {
    auto tr = lora_trainer(5);
    auto ref = reference_logps(tr.model(), b);
    auto m = tr.forward_backward({.tokens = b.tokens(), .loss_mask = b.mask, .ref_logps = ref}, {.kind = kind, .beta = 0.1});
    ASSERT_TRUE(m) << describe(m.error());
    if (kind == LossKind::dpo) EXPECT_NEAR(m->at("loss"), std::log(2.0), 1e-7);
    else EXPECT_NEAR(m->at("loss"), 25.0, 1e-5);
    EXPECT_EQ(m->at("reward_margin"), 0.0);
    EXPECT_EQ(m->at("loss_count"), 3.0) << "a mean over pairs";
  }
}

// Steps on a fixed preference set move the policy towards the chosen
// responses: the loss falls below ln 2 and the margin grows every step.
TEST(Dpo, TheMarginGrowsOnAFixedPreferenceSet) {
  PairBatch b;
  for (bool lora : {true, false}) {
    SCOPED_TRACE(lora ? "lora" : "full");
    auto tr = lora ? lora_trainer(5) : *Trainer::create(*CausalLM::init_random(small(), 5), {.optimizer = {.lr = 1e-2}});
    auto frozen = *CausalLM::init_random(small(), 5);  // the full model's reference: a copy of its start
    auto ref = reference_logps(lora ? tr.model() : frozen, b);
    double last = -1;
    for (int step = 0; step < 6; ++step) {
      auto m = tr.forward_backward({.tokens = b.tokens(), .loss_mask = b.mask, .ref_logps = ref},
                                   {.kind = LossKind::dpo, .beta = 0.5});
      ASSERT_TRUE(m) << describe(m.error());
      EXPECT_GT(m->at("reward_margin"), last) << "step " << step;
      last = m->at("reward_margin");
      ASSERT_TRUE(tr.clip_grad_and_step());
    }
    EXPECT_GT(last, 0.1);
    auto m = tr.forward_backward({.tokens = b.tokens(), .loss_mask = b.mask, .ref_logps = ref}, {.kind = LossKind::dpo, .beta = 0.5});
    ASSERT_TRUE(m);
    EXPECT_LT(m->at("loss"), std::log(2.0) - 0.02);
    EXPECT_EQ(m->at("reward_accuracy"), 1.0);
  }
}

// The loss and gradient equal the scalar formula on the pairs' summed
// response log-probs (components/rl's dpo, checked against its own scalar
// reference in losses_test), whether the batch is one pass, passes of one
// pair (a budget of one row rounds up to a pair), or several micro-batches.
TEST(Dpo, PairsStayWholeInSlicesAndAccumulation) {
  PairBatch b;
  auto base = *CausalLM::init_random(small(), 5);
  // A reference unlike the policy, so the gradient is not the ln 2 point's.
  auto other = *CausalLM::init_random(small(), 6);
  auto ref = reference_logps(other, b);
  const LossSpec dpo{.kind = LossKind::dpo, .beta = 0.3, .label_smoothing = 0.1};
  auto make = [&](int64_t rows) {
    return *Trainer::create(*CausalLM::init_random(small(), 5),
                            {.optimizer = {.kind = OptimizerConfig::Kind::sgd, .lr = 0.5}, .micro_batch_rows = rows});
  };
  auto whole = make(0), ones = make(1), parts = make(0);
  const TrainBatch all{.tokens = b.tokens(), .loss_mask = b.mask, .ref_logps = ref};
  auto w = whole.forward_backward(all, dpo);
  ASSERT_TRUE(w) << describe(w.error());
  auto o = ones.forward_backward(all, dpo);
  ASSERT_TRUE(o) << describe(o.error());
  for (const auto& [name, value] : *w) EXPECT_NEAR(o->at(name), value, 1e-5 * std::max(1.0, std::abs(value))) << name;
  // Pairs 0 and 1, then pair 2.
  for (auto [begin, end] : {std::pair<int64_t, int64_t>{0, 4}, {4, 6}}) {
    auto r = parts.forward_backward({.tokens = {.input_ids = *b.ids.slice(begin, end), .attention_mask = *b.attention.slice(begin, end)},
                                     .loss_mask = *b.mask.slice(begin, end), .ref_logps = *ref.slice(begin, end)},
                                    dpo);
    ASSERT_TRUE(r) << describe(r.error());
  }
  for (auto* t : {&whole, &ones, &parts}) ASSERT_TRUE(t->clip_grad_and_step());
  for (auto& [n, p] : whole.model().impl().params) {
    EXPECT_TRUE(at::allclose(p, ones.model().impl().params.at(n), 1e-5, 1e-6)) << n;
    EXPECT_TRUE(at::allclose(p, parts.model().impl().params.at(n), 1e-5, 1e-6)) << n;
  }
  // And the loss is the formula's on the summed log-probs.
  auto lp = to_torch(reference_logps(base, b)).to(at::kDouble);
  auto rf = to_torch(ref).to(at::kDouble);
  auto m = to_torch(b.mask).to(at::kDouble);
  auto seq = (lp * m).sum(1), rseq = (rf * m).sum(1);
  double expect = 0;
  for (int i = 0; i < 3; ++i) {
    double z = (seq[2 * i].item<double>() - rseq[2 * i].item<double>()) -
               (seq[2 * i + 1].item<double>() - rseq[2 * i + 1].item<double>());
    auto ls = [](double x) { return -std::log1p(std::exp(-x)); };
    expect += -(0.9) * ls(0.3 * z) - 0.1 * ls(-0.3 * z);
  }
  EXPECT_NEAR(w->at("loss"), expect / 3, 1e-5);
  // IPO reads mean log-probs per response token (TRL's form).
  auto ipo = make(0).forward_backward(all, {.kind = LossKind::ipo, .beta = 0.3});
  ASSERT_TRUE(ipo) << describe(ipo.error());
  auto counts = m.sum(1);
  double ipo_expect = 0;
  for (int i = 0; i < 3; ++i) {
    auto mean = [&](const at::Tensor& sums, int row) { return sums[row].item<double>() / counts[row].item<double>(); };
    double z = (mean(seq, 2 * i) - mean(rseq, 2 * i)) - (mean(seq, 2 * i + 1) - mean(rseq, 2 * i + 1));
    ipo_expect += std::pow(z - 1 / (2 * 0.3), 2);
  }
  EXPECT_NEAR(ipo->at("loss"), ipo_expect / 3, 1e-5 * ipo_expect);
}

TEST(Dpo, BadBatchesAndSettingsAreRefusedNamingWhatIsWrong) {
  PairBatch b;
  auto tr = lora_trainer(5);
  auto ref = reference_logps(tr.model(), b);
  const LossSpec dpo{.kind = LossKind::dpo, .beta = 0.1};
  auto expect_error = [&](const TrainBatch& batch, const LossSpec& spec, const std::string& what) {
    auto r = tr.forward_backward(batch, spec);
    ASSERT_FALSE(r) << what;
    EXPECT_NE(describe(r.error()).find(what), std::string::npos) << describe(r.error());
  };
  expect_error({.tokens = {.input_ids = *b.ids.slice(0, 3)}, .ref_logps = *ref.slice(0, 3)}, dpo,
               "reads rows in pairs (chosen, rejected) but the batch has 3 rows");
  expect_error({.tokens = b.tokens(), .loss_mask = b.mask}, dpo, "dpo needs ref_logps");
  expect_error({.tokens = b.tokens(), .loss_mask = b.mask, .ref_logps = ref,
                .advantages = *Tensor::from_values(std::vector<float>(6, 1.f), {6})},
               dpo, "the batch has advantages, which dpo does not read");
  auto empty = ids_of({{0, 0, 1, 1, 1, 0}, {0, 0, 1, 1, 0, 0}, {0, 1, 1, 1, 1, 0}, {0, 0, 0, 0, 0, 0},
                       {0, 0, 1, 1, 1, 0}, {0, 0, 1, 0, 0, 0}});
  expect_error({.tokens = b.tokens(), .loss_mask = empty, .ref_logps = ref}, dpo,
               "row 3 (the rejected response of pair 1) has no counted token");
  struct Case {
    LossSpec spec;
    std::string expect;
  };
  for (const auto& c : std::vector<Case>{
           {{.kind = LossKind::dpo}, "dpo needs beta > 0"},
           {{.kind = LossKind::ipo, .beta = -1}, "ipo needs beta > 0"},
           {{.kind = LossKind::ipo, .beta = 0.1, .label_smoothing = 0.1}, "ipo does not read label_smoothing"},
           {{.kind = LossKind::grpo, .label_smoothing = 0.1}, "grpo does not read label_smoothing"},
           {{.kind = LossKind::dpo, .beta = 0.1, .label_smoothing = 0.7}, "label_smoothing must be in [0, 0.5]"},
           {{.kind = LossKind::dpo, .epsilon = 0.3, .beta = 0.1}, "dpo does not read epsilon"},
           {{.kind = LossKind::dpo, .beta = 0.1, .entropy_coef = 0.1}, "dpo does not read entropy_coef"},
       }) {
    auto ok = c.spec.validate();
    ASSERT_FALSE(ok) << c.expect;
    EXPECT_NE(describe(ok.error()).find(c.expect), std::string::npos) << describe(ok.error());
  }
  // Nothing was accumulated by the refused calls.
  EXPECT_FALSE(tr.clip_grad_and_step());
  EXPECT_TRUE(parse_loss_kind("ipo"));
  EXPECT_TRUE(is_pairwise(*parse_loss_kind("dpo")));
}

}  // namespace
}  // namespace glint::components
