// The sampler actor in local and 2-process cluster mode: a dp=2 group samples
// like one engine on the whole call, with the training input laid out as the
// trainer reads it; per-request errors, streaming, weight updates,
// sleep/wake, abort, and calls that share engine steps.
#include "actors/detail/chunk_stream.hpp"
#include "actors/sampler.hpp"
#include "actors/sampler_group.hpp"
#include "placement/service.hpp"
#include "components/model/model.hpp"
#include "components/sampler/engine.hpp"
#include "support/cluster.hpp"
#include "support/temp_dir.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <future>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <thread>

#include <signal.h>

namespace glint {
namespace {

using actors::SampledSequence;
using actors::sampler_actor;
using components::CausalLM;
using components::SamplingParams;
using Prompts = std::vector<std::vector<int64_t>>;

components::ModelConfig tiny() {
  auto c = components::ModelConfig::make(components::Architecture::qwen3, 64, 32, 48, 2, 4, 2);
  c.max_position_embeddings = 1024;
  return c;
}

// Random weights whose logits are far from uniform (as in sampler_test):
// greedy choices then do not hinge on rounding, which changes with the
// batch a sequence shares a step with.
CausalLM sharp_model(uint64_t seed) {
  auto lm = *CausalLM::init_random(tiny(), seed);
  auto params = lm.named_parameters();
  for (auto& [name, t] : *params) {
    const bool qk = name.find("q_proj") != std::string::npos || name.find("k_proj") != std::string::npos;
    const float f = qk ? 8.f : name == "lm_head.weight" ? 40.f : 1.f;
    if (f == 1.f) continue;
    auto values = *t.mutable_values<float>();  // a span: the Result it comes in is a temporary
    for (auto& x : values) x *= f;
  }
  return lm;
}

NamedTensors weights_of(const CausalLM& lm) {
  NamedTensors out;
  auto params = lm.named_parameters();
  for (auto& [name, t] : *params) out.emplace_back(name, t.clone());
  return out;
}

// What one engine makes of the whole call.
std::vector<components::RequestOutput> reference(const CausalLM& lm, const Prompts& prompts, const SamplingParams& p) {
  auto engine = components::Engine::create(lm, {.cache_bytes = 1 << 20});
  EXPECT_TRUE(engine) << describe(engine.error());
  std::vector<components::RequestOutput> out;
  for (auto& o : engine->generate(prompts, p)) {
    EXPECT_TRUE(o) << describe(o.error());
    out.push_back(o ? std::move(*o) : components::RequestOutput{});
  }
  return out;
}

// The training row training_batch makes of one sequence, by TrainBatch's
// convention: position t predicts token t + 1, so the completion's tokens
// are the targets of positions P-1 .. L-2.
void expect_training_input(const Prompts& prompts, const SampledSequence& s) {
  const auto& prompt = prompts.at(static_cast<size_t>(s.index));
  const size_t p = prompt.size(), len = p + s.tokens.size();
  auto batch = actors::training_batch(prompts, {s});
  ASSERT_TRUE(batch) << describe(batch.error());
  std::vector<int64_t> ids = prompt;
  ids.insert(ids.end(), s.tokens.begin(), s.tokens.end());
  auto got = *batch->tensors.at("input_ids").values<int64_t>();
  EXPECT_EQ(std::vector<int64_t>(got.begin(), got.end()), ids);
  auto mask = *batch->tensors.at("loss_mask").values<float>();
  auto old = *batch->tensors.at("old_logps").values<float>();
  ASSERT_EQ(mask.size(), len);
  ASSERT_EQ(old.size(), len);
  ASSERT_EQ(s.logprobs.chosen.size(), s.tokens.size());
  for (size_t t = 0; t < len; ++t) {
    const bool target_is_completion = t + 1 >= p && t + 1 < len;
    EXPECT_EQ(mask[t], target_is_completion ? 1.f : 0.f) << "position " << t;
    EXPECT_EQ(old[t], target_is_completion ? s.logprobs.chosen[t + 1 - p] : 0.f) << "position " << t;
  }
}

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

class SamplerActorTest : public testing::ModeJobTest {
protected:
  Group<sampler_actor> spawn(actors::SamplerSpec spec, int ranks = 2) {
    auto mesh = placement::DeviceMesh::from_sizes({.dp = ranks});
    EXPECT_TRUE(mesh);
    auto g = actors::spawn_sampler_group(*job_.rt, placement::DeviceGroup::of("sampler", ranks), *mesh, spec);
    EXPECT_TRUE(g) << describe(g.error());
    return g ? g->with_timeout(std::chrono::seconds(30)) : Group<sampler_actor>{};
  }

  static actors::SamplerSpec random_spec(uint64_t seed) {
    return {.config_json = tiny().to_json(), .seed = seed, .cache_bytes = 1 << 20};
  }

  // `lm` saved where every process of the job can load it.
  actors::SamplerSpec saved_spec(const CausalLM& lm, const std::string& name) {
    auto dir = glint::testing::fresh_dir(name + "-" + std::to_string(static_cast<int>(GetParam())));
    EXPECT_TRUE(lm.save(dir));
    return {.model_dir = dir, .cache_bytes = 1 << 20};
  }

  static Result<std::vector<SampledSequence>> sample(const Group<sampler_actor>& g, const Prompts& prompts,
                                                     const SamplingParams& p, const std::string& adapter = "") {
    return g.call<Collect::flatten>(Dispatch::slice_dp, actors::sample_atom_v, actors::requests_of(prompts), p, adapter)
        .get();
  }
};

const SamplingParams greedy{.max_tokens = 6, .temperature = 0, .ignore_eos = true};

TEST_P(SamplerActorTest, DataParallelGroupSamplesLikeOneEngineOnTheWholeCall) {
  auto lm = sharp_model(5);
  auto group = spawn(saved_spec(lm, "sampler-dp"));
  const Prompts prompts = {{1, 2, 3}, {4, 5, 6, 7, 8, 9, 10}, {11}, {12, 13, 14, 15}, {3, 2, 1, 0, 63}};
  SamplingParams p{.num_samples = 2, .max_tokens = 6, .temperature = 0, .ignore_eos = true, .logprobs = 2};
  auto seqs = sample(group, prompts, p);
  ASSERT_TRUE(seqs) << describe(seqs.error());
  ASSERT_EQ(seqs->size(), prompts.size() * 2);
  auto ref = reference(lm, prompts, p);
  ASSERT_EQ(ref.size(), prompts.size());
  for (size_t i = 0; i < prompts.size(); ++i) {
    for (size_t k = 0; k < 2; ++k) {
      const auto& s = (*seqs)[i * 2 + k];
      const auto& want = ref[i].sequences[k];
      EXPECT_EQ(s.index, static_cast<int64_t>(i));
      EXPECT_EQ(s.sample, static_cast<int64_t>(k));
      EXPECT_EQ(s.error, "");
      EXPECT_EQ(s.stop_reason, actors::StopReason::length);
      EXPECT_EQ(s.weight_version, 0);
      EXPECT_EQ(s.tokens, want.tokens) << "prompt " << i << " sample " << k;
      EXPECT_EQ(s.logprobs.k, 2);
      EXPECT_EQ(s.logprobs.top_ids, want.logprobs.top_ids);
      ASSERT_EQ(s.logprobs.chosen.size(), want.logprobs.chosen.size());
      for (size_t j = 0; j < want.logprobs.chosen.size(); ++j)
        EXPECT_NEAR(s.logprobs.chosen[j], want.logprobs.chosen[j], 1e-4);
      expect_training_input(prompts, s);
    }
  }
  // The old_logps are what the trainer computes for the same positions.
  auto batch = actors::training_batch(prompts, *seqs);
  ASSERT_TRUE(batch) << describe(batch.error());
  const auto& ids = batch->tensors.at("input_ids");
  EXPECT_EQ(ids.shape(), (std::vector<int64_t>{10, 13}));
  auto fwd = lm.forward({.input_ids = ids, .attention_mask = batch->tensors.at("attention_mask")});
  ASSERT_TRUE(fwd) << describe(fwd.error());
  auto model_logps = *fwd->logprobs.values<float>();
  auto mask = *batch->tensors.at("loss_mask").values<float>();
  auto old = *batch->tensors.at("old_logps").values<float>();
  double counted = 0;
  for (size_t t = 0; t < mask.size(); ++t) {
    counted += mask[t];
    if (mask[t] > 0) {
      EXPECT_NEAR(old[t], model_logps[t], 1e-4) << "flat position " << t;
    }
  }
  EXPECT_EQ(counted, 10 * 6);
}

TEST_P(SamplerActorTest, BadRequestCarriesItsErrorWhileTheOthersComplete) {
  auto spec = random_spec(1);
  spec.max_model_len = 32;
  auto group = spawn(spec);
  const Prompts prompts = {{1, 2, 3}, {}, {1, 64}, {5, 6}, std::vector<int64_t>(40, 1)};
  auto seqs = sample(group, prompts, greedy);
  ASSERT_TRUE(seqs) << describe(seqs.error());
  ASSERT_EQ(seqs->size(), 5u);
  for (size_t i : {0, 3}) {
    EXPECT_EQ((*seqs)[i].error, "");
    EXPECT_EQ((*seqs)[i].tokens.size(), 6u);
    expect_training_input(prompts, (*seqs)[i]);
  }
  const std::map<size_t, std::string> why = {{1, "the prompt is empty"}, {2, "outside the vocabulary"}, {4, "max_model_len"}};
  for (const auto& [i, text] : why) {
    const auto& s = (*seqs)[i];
    EXPECT_EQ(s.index, static_cast<int64_t>(i));
    EXPECT_TRUE(contains(s.error, text)) << s.error;
    EXPECT_TRUE(s.tokens.empty());
    EXPECT_EQ(s.stop_reason, actors::StopReason::none);
  }
  auto unknown = sample(group, {{1, 2}, {3, 4}}, greedy, "nobody");
  ASSERT_TRUE(unknown) << describe(unknown.error());
  for (const auto& s : *unknown) EXPECT_TRUE(contains(s.error, "no LoRA adapter 'nobody'")) << s.error;
  // Parameters belong to the whole call: bad ones fail it.
  auto bad = sample(group, {{1, 2}, {3, 4}}, {.temperature = -1});
  ASSERT_FALSE(bad);
  EXPECT_EQ(code_of(bad.error()), errc::invalid_argument);
  EXPECT_TRUE(contains(describe(bad.error()), "temperature")) << describe(bad.error());
  EXPECT_TRUE(contains(describe(bad.error()), "of sampler group 'sampler'")) << describe(bad.error());
  auto good = sample(group, {{1, 2}, {3, 4}}, greedy);
  ASSERT_TRUE(good) << describe(good.error());
  EXPECT_EQ((*good)[1].tokens.size(), 6u);
}

TEST_P(SamplerActorTest, SeededPromptsOfOneCallDrawTheirOwnNumbersWhicheverRankServesThem) {
  auto group = spawn(random_spec(2));
  const Prompts prompts = {{1, 2, 3}, {1, 2, 3}, {1, 2, 3}, {1, 2, 3}};
  SamplingParams p{.max_tokens = 12, .temperature = 1.0, .seed = 11, .ignore_eos = true};
  auto seqs = sample(group, prompts, p);
  ASSERT_TRUE(seqs) << describe(seqs.error());
  ASSERT_EQ(seqs->size(), 4u);
  std::set<std::vector<int64_t>> distinct;
  for (const auto& s : *seqs) distinct.insert(s.tokens);
  EXPECT_EQ(distinct.size(), 4u) << "the same prompt four times in a seeded call drew the same numbers";
  // Request 2 alone (its index kept) samples what it did in the call.
  auto alone = group.call<Collect::flatten>(Dispatch::all, actors::sample_atom_v,
                                            std::vector<actors::SampleRequest>{{.index = 2, .prompt = {1, 2, 3}}}, p,
                                            std::string{})
                   .get();
  ASSERT_TRUE(alone) << describe(alone.error());
  ASSERT_FALSE(alone->empty());
  for (const auto& s : *alone) EXPECT_EQ(s.tokens, (*seqs)[2].tokens) << "every rank samples request 2 alike";
}

TEST_P(SamplerActorTest, SamplerWithoutAModelAnswersWhyOnEveryCall) {
  auto group = spawn({.config_json = "{\"model_type\": \"qwen3\""}, 1);
  auto seqs = sample(group, {{1, 2}}, greedy);
  ASSERT_FALSE(seqs);
  EXPECT_TRUE(contains(describe(seqs.error()), "SamplerSpec::config_json")) << describe(seqs.error());
  auto stats = group.call<Collect::first>(Dispatch::all, actors::stats_atom::value).get();
  ASSERT_FALSE(stats);
  EXPECT_EQ(describe(stats.error()), describe(seqs.error()));
}

TEST_P(SamplerActorTest, StreamedChunksAddUpToTheFinalSequences) {
  auto group = spawn(random_spec(2));
  const auto requests = actors::requests_of({{1, 2, 3}, {}, {7, 8, 9, 10, 11}});
  SamplingParams p{.num_samples = 2, .max_tokens = 5, .temperature = 1.0, .seed = 11, .ignore_eos = true};
  struct Seen {
    std::vector<int64_t> tokens;
    std::vector<float> logprobs;
    int chunks = 0;
    bool finished = false;
    actors::StopReason stop_reason = actors::StopReason::none;
    std::string error;
  };
  std::map<std::pair<int64_t, int64_t>, Seen> seen;  // only the listener's thread writes, until the call returns
  auto seqs = actors::sample_streaming(*job_.rt, group, requests, p, "", [&](const actors::SampleChunk& c) {
    auto& s = seen[{c.index, c.sample}];
    EXPECT_FALSE(s.finished) << "a chunk after the last one of " << c.index << "/" << c.sample;
    EXPECT_EQ(c.tokens.size(), c.logprobs.size());
    s.tokens.insert(s.tokens.end(), c.tokens.begin(), c.tokens.end());
    s.logprobs.insert(s.logprobs.end(), c.logprobs.begin(), c.logprobs.end());
    ++s.chunks;
    s.finished = c.finished;
    s.stop_reason = c.stop_reason;
    s.error = c.error;
  });
  ASSERT_TRUE(seqs) << describe(seqs.error());
  ASSERT_EQ(seqs->size(), 6u);
  ASSERT_EQ(seen.size(), 6u);
  for (const auto& s : *seqs) {
    const auto& got = seen.at({s.index, s.sample});
    EXPECT_TRUE(got.finished);
    EXPECT_EQ(got.error, s.error);
    EXPECT_EQ(got.tokens, s.tokens);
    EXPECT_EQ(got.logprobs, s.logprobs.chosen);
    EXPECT_EQ(got.stop_reason, s.stop_reason);
    if (s.index == 1) {
      EXPECT_TRUE(contains(s.error, "empty")) << s.error;
      EXPECT_EQ(got.chunks, 1);
    } else {
      EXPECT_EQ(s.tokens.size(), 5u);
      EXPECT_GE(got.chunks, 5) << "one chunk per step with a new token";
    }
  }
  EXPECT_NE((*seqs)[0].tokens, (*seqs)[1].tokens) << "two samples of one prompt drew the same 5 tokens";
}

TEST_P(SamplerActorTest, UpdateWeightsChangesGreedyOutputAndReportsTheVersion) {
  auto group = spawn(random_spec(3));
  const Prompts prompts = {{1, 2, 3, 4}, {9, 8, 7}};
  auto before = sample(group, prompts, greedy);
  ASSERT_TRUE(before) << describe(before.error());
  EXPECT_EQ((*before)[0].weight_version, 0);

  auto fresh = sharp_model(99);
  auto update = [&](const NamedTensors& w, actors::UpdatePolicy policy) {
    return group.call<Collect::first>(Dispatch::all, actors::update_weights_atom::value, w,
                                      actors::WeightUpdate{.version = 7, .policy = policy})
        .get();
  };
  auto ok = update(weights_of(fresh), actors::UpdatePolicy::finish_old);
  ASSERT_TRUE(ok) << describe(ok.error());
  auto after = sample(group, prompts, greedy);
  ASSERT_TRUE(after) << describe(after.error());
  auto ref = reference(fresh, prompts, greedy);
  for (size_t i = 0; i < prompts.size(); ++i) {
    EXPECT_EQ((*after)[i].tokens, ref[i].sequences[0].tokens);
    EXPECT_EQ((*after)[i].weight_version, 7);
  }
  EXPECT_NE((*after)[0].tokens, (*before)[0].tokens);
  auto stats = group.call<Collect::first>(Dispatch::all, actors::stats_atom::value).get();
  ASSERT_TRUE(stats) << describe(stats.error());
  EXPECT_EQ(stats->at("weight_version"), 7);

  // A bad update changes nothing.
  auto wrong = weights_of(fresh);
  wrong[1].second = *Tensor::zeros(Dtype::f32, {3});
  auto shape = update(wrong, actors::UpdatePolicy::finish_old);
  ASSERT_FALSE(shape);
  EXPECT_TRUE(contains(describe(shape.error()), wrong[1].first)) << describe(shape.error());
  // An enum from another process can hold any number.
  auto policy = update(weights_of(sharp_model(1)), static_cast<actors::UpdatePolicy>(7));
  ASSERT_FALSE(policy);
  EXPECT_TRUE(contains(describe(policy.error()), "policy 7 is not finish_old, continue_new or abort")) << describe(policy.error());
  auto again = sample(group, prompts, greedy);
  ASSERT_TRUE(again);
  EXPECT_EQ(*again, *after);
}

TEST_P(SamplerActorTest, AsleepSamplerRefusesCallsUntilWoken) {
  auto group = spawn(random_spec(4));
  auto all = [&](auto atom) { return group.call<Collect::first>(Dispatch::all, atom).get(); };
  ASSERT_TRUE(all(actors::sleep_atom::value));
  EXPECT_EQ(all(actors::stats_atom::value)->at("sleeping"), 1);
  auto refused = sample(group, {{1, 2}, {3}}, greedy);
  ASSERT_FALSE(refused);
  EXPECT_EQ(code_of(refused.error()), errc::failed_precondition);
  EXPECT_TRUE(contains(describe(refused.error()), "asleep")) << describe(refused.error());
  ASSERT_TRUE(all(actors::wake_atom::value));
  auto seqs = sample(group, {{1, 2}, {3}}, greedy);
  ASSERT_TRUE(seqs) << describe(seqs.error());
  EXPECT_EQ((*seqs)[1].tokens.size(), 6u);
}

TEST_P(SamplerActorTest, ConcurrentCallsShareEngineStepsAndBothComplete) {
  auto lm = sharp_model(6);
  auto group = spawn(saved_spec(lm, "sampler-concurrent"), 1);
  const Prompts a = {{1, 2, 3}, {4, 5}, {6, 7, 8, 9}};
  const Prompts b = {{10, 11}, {12}};
  const SamplingParams pa{.max_tokens = 16, .temperature = 0, .ignore_eos = true};
  const SamplingParams pb{.num_samples = 2, .max_tokens = 4, .temperature = 0, .ignore_eos = true};
  auto fa = group.call<Collect::flatten>(Dispatch::all, actors::sample_atom_v, actors::requests_of(a), pa, std::string{});
  auto fb = group.call<Collect::flatten>(Dispatch::all, actors::sample_atom_v, actors::requests_of(b), pb, std::string{});
  auto ra = fa.get();
  auto rb = fb.get();
  ASSERT_TRUE(ra) << describe(ra.error());
  ASSERT_TRUE(rb) << describe(rb.error());
  auto want_a = reference(lm, a, pa);
  auto want_b = reference(lm, b, pb);
  ASSERT_EQ(ra->size(), 3u);
  ASSERT_EQ(rb->size(), 4u);
  for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ((*ra)[i].tokens, want_a[i].sequences[0].tokens);
  for (size_t i = 0; i < rb->size(); ++i) EXPECT_EQ((*rb)[i].tokens, want_b[i / 2].sequences[i % 2].tokens);
  // One after the other they take 16 + 4 steps; sharing them, about 16.
  auto stats = group.call<Collect::first>(Dispatch::all, actors::stats_atom::value).get();
  ASSERT_TRUE(stats);
  EXPECT_LT(stats->at("steps"), 20);
  EXPECT_EQ(stats->at("calls"), 0);
}

TEST_P(SamplerActorTest, AbortAnswersTheCallsInFlight) {
  auto group = spawn(random_spec(5));
  const Prompts prompts = {{1, 2}, {3, 4}, {5, 6}, {7, 8}};
  const SamplingParams p{.max_tokens = 500, .temperature = 0, .ignore_eos = true};
  auto running = group.call<Collect::flatten>(Dispatch::slice_dp, actors::sample_atom_v, actors::requests_of(prompts), p,
                                              std::string{});
  auto asleep = group.call<Collect::first>(Dispatch::all, actors::sleep_atom::value).get();
  ASSERT_FALSE(asleep) << "sleep while requests are in flight";
  EXPECT_TRUE(contains(describe(asleep.error()), "in flight")) << describe(asleep.error());
  auto aborted = group.call<Collect::sum>(Dispatch::all, actors::abort_atom::value).get();
  ASSERT_TRUE(aborted) << describe(aborted.error());
  EXPECT_EQ(*aborted, 4);
  auto seqs = running.get();
  ASSERT_TRUE(seqs) << describe(seqs.error());
  ASSERT_EQ(seqs->size(), 4u);
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_EQ((*seqs)[i].stop_reason, actors::StopReason::abort);
    EXPECT_LT((*seqs)[i].tokens.size(), 500u);
    expect_training_input(prompts, (*seqs)[i]);
  }
  auto next = sample(group, prompts, greedy);
  ASSERT_TRUE(next) << describe(next.error());
  EXPECT_EQ((*next)[3].stop_reason, actors::StopReason::length);

  // A weight update with the abort policy ends the calls in flight too, and
  // applies at once.
  running = group.call<Collect::flatten>(Dispatch::slice_dp, actors::sample_atom_v, actors::requests_of(prompts), p,
                                         std::string{});
  auto updated = group.call<Collect::first>(Dispatch::all, actors::update_weights_atom::value,
                                            weights_of(sharp_model(8)),
                                            actors::WeightUpdate{.version = 3, .policy = actors::UpdatePolicy::abort})
                     .get();
  ASSERT_TRUE(updated) << describe(updated.error());
  seqs = running.get();
  ASSERT_TRUE(seqs) << describe(seqs.error());
  for (const auto& s : *seqs) {
    EXPECT_EQ(s.stop_reason, actors::StopReason::abort);
    EXPECT_EQ(s.weight_version, 0);
  }
  next = sample(group, prompts, greedy);
  ASSERT_TRUE(next) << describe(next.error());
  EXPECT_EQ((*next)[0].weight_version, 3);
}

// Packed: every sequence whole in one segment of one row, with the padded
// row's loss mask and old log-probs, its advantage at each of its tokens,
// and at least min_rows rows.
TEST(TrainingBatch, PackedHoldsEachSequenceWholeWithItsAdvantagePerToken) {
  const Prompts prompts = {{1, 2}, {3, 4, 5}};
  auto seq = [](int64_t index, std::vector<int64_t> tokens, std::vector<float> chosen) {
    SampledSequence s;
    s.index = index;
    s.tokens = std::move(tokens);
    s.logprobs.chosen = std::move(chosen);
    return s;
  };
  const std::vector<SampledSequence> seqs = {seq(0, {6, 7, 8}, {-.1f, -.2f, -.3f}), seq(1, {9}, {-.4f}),
                                             seq(0, {10, 11}, {-.5f, -.6f}), seq(1, {12, 13, 14, 15, 16, 17, 18, 19}, {-.7f, -.8f, -.9f, -1.f, -1.1f, -1.2f, -1.3f, -1.4f})};
  const std::vector<double> adv = {1.0, -1.0, 0.5, 2.0};
  auto padded = actors::training_batch(prompts, seqs, {.pad_id = 0, .advantages = adv});
  auto packed = actors::training_batch(prompts, seqs, {.pad_id = 0, .advantages = adv, .pack = true, .min_rows = 2});
  ASSERT_TRUE(padded && packed) << describe(packed ? padded.error() : packed.error());
  const auto& shape = packed->tensors.at("input_ids").shape();
  ASSERT_GE(shape[0], 2);
  EXPECT_LT(shape[0] * shape[1], padded->tensors.at("input_ids").shape()[0] * padded->tensors.at("input_ids").shape()[1]);
  EXPECT_EQ(packed->tensors.at("advantages").shape(), shape) << "per token";
  EXPECT_EQ(packed->tensors.at("segment_ids").dtype(), Dtype::i64);
  auto column = [](const Batch& b, const char* name) { return *b.tensors.at(name).values<float>(); };
  auto ids = *packed->tensors.at("input_ids").values<int64_t>();
  auto segs = *packed->tensors.at("segment_ids").values<int64_t>();
  auto mask = column(*packed, "loss_mask"), old = column(*packed, "old_logps"), a = column(*packed, "advantages");
  const auto T = padded->tensors.at("input_ids").shape()[1];
  auto pids = *padded->tensors.at("input_ids").values<int64_t>();
  auto pmask = column(*padded, "loss_mask"), pold = column(*padded, "old_logps");
  std::set<size_t> found;
  for (int64_t r = 0; r < shape[0]; ++r)
    for (int64_t at = 0; at < shape[1];) {
      const auto i = static_cast<size_t>(r * shape[1] + at);
      if (segs[i] == 0) break;  // padding ends the row
      size_t n = 0;
      while (at + static_cast<int64_t>(n) < shape[1] && segs[i + n] == segs[i]) ++n;
      // Which sequence: the padded row with these tokens.
      bool matched = false;
      for (size_t s = 0; s < seqs.size() && !matched; ++s) {
        const size_t len = prompts[static_cast<size_t>(seqs[s].index)].size() + seqs[s].tokens.size();
        if (len != n) continue;
        bool same = true;
        for (size_t t = 0; t < n; ++t) same = same && pids[s * static_cast<size_t>(T) + t] == ids[i + t];
        if (!same) continue;
        matched = found.insert(s).second;
        for (size_t t = 0; t < n; ++t) {
          EXPECT_EQ(mask[i + t], pmask[s * static_cast<size_t>(T) + t]) << "sequence " << s << " token " << t;
          EXPECT_EQ(old[i + t], pold[s * static_cast<size_t>(T) + t]) << "sequence " << s << " token " << t;
          EXPECT_EQ(a[i + t], static_cast<float>(adv[s])) << "sequence " << s << " token " << t;
        }
      }
      EXPECT_TRUE(matched) << "row " << r << " at " << at << " holds no sequence whole";
      at += static_cast<int64_t>(n);
    }
  EXPECT_EQ(found.size(), seqs.size());
}

// Routing replay: each completion token's routes land at the position that
// predicts it, in padded and packed batches alike; -1 everywhere else. A
// sequence without routes, or with too few, is refused.
TEST(TrainingBatch, RoutingReplayPutsEachTokensRoutesWhereItIsPredicted) {
  const Prompts prompts = {{1, 2}, {3, 4, 5}};
  constexpr int64_t S = 2, k = 2;
  // Route entries encode (sequence, token, slot): s * 1000 + j * 10 + q.
  auto seq = [](int64_t id, int64_t index, std::vector<int64_t> tokens) {
    SampledSequence s;
    s.index = index;
    s.tokens = std::move(tokens);
    s.logprobs.chosen.assign(s.tokens.size(), -0.5f);
    s.routes.layers = S, s.routes.k = k;
    for (size_t j = 0; j < s.tokens.size(); ++j)
      for (int64_t q = 0; q < S * k; ++q) s.routes.experts.push_back(static_cast<int32_t>(id * 1000 + static_cast<int64_t>(j) * 10 + q));
    return s;
  };
  const std::vector<SampledSequence> seqs = {seq(0, 0, {6, 7, 8}), seq(1, 1, {9}), seq(2, 0, {10, 11}),
                                             seq(3, 1, {12, 13, 14, 15, 16, 17})};
  for (bool pack : {false, true}) {
    SCOPED_TRACE(pack ? "packed" : "padded");
    auto b = actors::training_batch(prompts, seqs, {.pack = pack, .min_rows = 2, .routing_replay = true});
    ASSERT_TRUE(b) << describe(b.error());
    const auto& shape = b->tensors.at("input_ids").shape();
    const auto& rt = b->tensors.at("routes");
    ASSERT_EQ(rt.shape(), (std::vector<int64_t>{shape[0], shape[1], S, k}));
    auto routes = *rt.values<int32_t>();
    auto ids = *b->tensors.at("input_ids").values<int64_t>();
    auto mask = *b->tensors.at("loss_mask").values<float>();
    size_t covered = 0, tokens = 0;
    for (const auto& s : seqs) tokens += s.tokens.size();
    for (int64_t pos = 0; pos < shape[0] * shape[1]; ++pos) {
      const auto* r = routes.data() + pos * S * k;
      if (r[0] == -1) {
        for (int64_t q = 0; q < S * k; ++q) EXPECT_EQ(r[q], -1) << "position " << pos;
        EXPECT_EQ(mask[static_cast<size_t>(pos)], 0.f) << "a completion token without its routes at " << pos;
        continue;
      }
      const auto s = static_cast<size_t>(r[0] / 1000), j = static_cast<size_t>(r[0] / 10 % 100);
      for (int64_t q = 0; q < S * k; ++q) EXPECT_EQ(r[q], r[0] + q);
      ASSERT_LT(s, seqs.size());
      ASSERT_LT(j, seqs[s].tokens.size());
      EXPECT_EQ(ids[static_cast<size_t>(pos + 1)], seqs[s].tokens[j]) << "the routes of a token sit where it is predicted";
      EXPECT_EQ(mask[static_cast<size_t>(pos)], 1.f);
      ++covered;
    }
    EXPECT_EQ(covered, tokens);
  }
  auto without = seqs;
  without[1].routes = {};
  auto refused = actors::training_batch(prompts, without, {.routing_replay = true});
  ASSERT_FALSE(refused);
  EXPECT_NE(describe(refused.error()).find("return_routes"), std::string::npos) << describe(refused.error());
  auto short_routes = seqs;
  short_routes[2].routes.experts.resize(S * k);
  EXPECT_FALSE(actors::training_batch(prompts, short_routes, {.routing_replay = true}));
  EXPECT_FALSE(actors::training_batch(prompts, seqs).value().tensors.count("routes")) << "only when asked";
}

// A sampler rank lost in the middle of a call costs nothing: its slice goes
// to the live rank and the call answers what an uninterrupted one does
// (draws are keyed by request, not by rank); later calls sample on the
// ranks left. Calls without a seed draw theirs from the group's stream, so
// a group sampling alone gives the same answer whatever rank serves.
// Two processes, a two-rank sampler group spread over them (rank 1 on node
// 1, the process tests kill), and eight prompts: requests 4..7 go to rank 1.
class SamplerFailover : public ::testing::Test {
protected:
  void SetUp() override {
    auto j = testing::TestJob::start(Mode::cluster, 2);
    ASSERT_TRUE(j) << describe(j.error());
    job.emplace(std::move(*j));
    ASSERT_TRUE(placement::service(*job->rt, {.strategy = placement::Strategy::spread}));
    dir = glint::testing::fresh_dir("sampler-failover");
    ASSERT_TRUE(sharp_model(3).save(dir));
    auto g = actors::open_sampler_group(*job->rt, placement::DeviceGroup::of("sampler", 2),
                                        *placement::DeviceMesh::from_sizes({.dp = 2}),
                                        {.model_dir = dir, .sampling_seed = 5, .cache_bytes = 1 << 20});
    ASSERT_TRUE(g) << describe(g.error());
    sg.emplace(std::move(*g));
    ASSERT_EQ(sg->info().ranks[1].node, 1);
    for (int64_t i = 0; i < 8; ++i) prompts.push_back({1 + i, 2 + i, 3 + i});
  }
  std::optional<testing::TestJob> job;
  std::string dir;
  std::optional<actors::SamplerGroup> sg;
  Prompts prompts;
};

TEST_F(SamplerFailover, ARankKilledMidCallHasItsRequestsServedByALiveOne) {
  auto& rt = *job->rt;
  const SamplingParams p{.num_samples = 2, .max_tokens = 200, .temperature = 1.0, .seed = 7, .ignore_eos = true};
  auto want = sg->sample(prompts, p).get();
  ASSERT_TRUE(want) << describe(want.error());
  auto running = sg->sample(prompts, p);
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  ASSERT_FALSE(running.ready()) << "the call ended before the kill; make it longer";
  job->nodes[0].signal(SIGKILL);
  auto expect_same = [&](const Result<std::vector<SampledSequence>>& got, const char* what) {
    ASSERT_TRUE(got) << what << ": " << describe(got.error());
    ASSERT_EQ(got->size(), want->size()) << what;
    for (size_t i = 0; i < want->size(); ++i) {
      EXPECT_EQ((*got)[i].index, (*want)[i].index) << what;
      EXPECT_EQ((*got)[i].sample, (*want)[i].sample) << what;
      EXPECT_EQ((*got)[i].tokens, (*want)[i].tokens) << what << ": sequence " << i;
    }
  };
  expect_same(running.get(), "the call in flight when rank 1's node died");
  expect_same(sg->sample(prompts, p).get(), "a call after rank 1's node died");
  // Unseeded: the group's stream, not the rank, decides the draws.
  auto fresh = actors::open_sampler_group(rt, placement::DeviceGroup::of("again", 1),
                                          *placement::DeviceMesh::from_sizes({.dp = 1}),
                                          {.model_dir = dir, .sampling_seed = 5, .cache_bytes = 1 << 20});
  ASSERT_TRUE(fresh) << describe(fresh.error());
  auto unseeded = p;
  unseeded.seed = -1;
  auto a = fresh->sample(prompts, unseeded).get();
  auto b = sg->sample(prompts, unseeded).get();
  ASSERT_TRUE(a && b);
  ASSERT_EQ(a->size(), b->size());
  // Both groups' first unseeded call: the same seed from the same stream.
  for (size_t i = 0; i < a->size(); ++i) EXPECT_EQ((*a)[i].tokens, (*b)[i].tokens) << "sequence " << i;
  rt.shutdown();
  EXPECT_EQ(job->nodes[0].wait_for(std::chrono::seconds(5)), std::optional<int>{128 + SIGKILL});
}

// The same for a streamed call: rank 1's node dies after its sequences
// began to stream; the live rank samples them again from their first token
// (the same tokens, keyed by request), and the callback sees each sequence
// once, in order, with no token twice: what an uninterrupted call streams.
TEST_F(SamplerFailover, AStreamedCallGoesOnWhenARankIsKilledMidCall) {
  auto& rt = *job->rt;
  const SamplingParams p{.num_samples = 2, .max_tokens = 200, .temperature = 1.0, .seed = 7, .ignore_eos = true,
                         .logprobs = 0};
  struct Heard {
    std::mutex mx;
    std::map<std::pair<int64_t, int64_t>, std::vector<int64_t>> tokens;
    std::map<std::pair<int64_t, int64_t>, size_t> logprobs, finished;
  };
  auto listen = [](Heard& h, std::atomic<bool>* rank1_began) {
    return [&h, rank1_began](const actors::SampleChunk& c) {
      std::lock_guard<std::mutex> guard{h.mx};
      auto& t = h.tokens[{c.index, c.sample}];
      t.insert(t.end(), c.tokens.begin(), c.tokens.end());
      h.logprobs[{c.index, c.sample}] += c.logprobs.size();
      if (c.finished) ++h.finished[{c.index, c.sample}];
      if (rank1_began && c.index >= 4 && !c.tokens.empty()) *rank1_began = true;  // rank 1 holds requests 4..7
    };
  };
  Heard whole;
  auto want = sg->sample_streaming(prompts, p, listen(whole, nullptr));
  ASSERT_TRUE(want) << describe(want.error());

  Heard cut;
  std::atomic<bool> rank1_began{false};
  auto running = std::async(std::launch::async, [&] { return sg->sample_streaming(prompts, p, listen(cut, &rank1_began)); });
  ASSERT_TRUE(testing::eventually([&] { return rank1_began.load(); }));
  job->nodes[0].signal(SIGKILL);
  auto got = running.get();
  ASSERT_TRUE(got) << describe(got.error());
  ASSERT_EQ(got->size(), want->size());
  for (size_t i = 0; i < want->size(); ++i) EXPECT_EQ((*got)[i].tokens, (*want)[i].tokens) << "sequence " << i;
  std::lock_guard<std::mutex> guard{cut.mx};
  ASSERT_EQ(cut.tokens.size(), whole.tokens.size());
  for (const auto& [k, t] : whole.tokens) {
    EXPECT_EQ(cut.tokens[k], t) << "request " << k.first << " sample " << k.second << " as streamed";
    EXPECT_EQ(cut.logprobs[k], t.size()) << "request " << k.first << " sample " << k.second;
    EXPECT_EQ(cut.finished[k], 1u) << "request " << k.first << " sample " << k.second << ": its last chunk";
  }
  // Chunks name requests by index: a streamed call refuses two with one.
  auto twice = sg->backend().sample_streaming({{3, {1, 2}}, {3, {4, 5}}}, p, "", [](const actors::SampleChunk&) {});
  ASSERT_FALSE(twice);
  EXPECT_NE(describe(twice.error()).find("request index 3 appears twice"), std::string::npos) << describe(twice.error());
  rt.shutdown();
}

// The stream behind sample_streaming, fed by hand: a second attempt at a
// sequence continues it where the first left off, without repeating a
// token; one that drew other tokens fails the call instead of splicing two
// sequences together.
TEST(ChunkStream, ARetryContinuesTheSequenceAndOneThatDivergesFailsTheCall) {
  auto job = testing::TestJob::start(Mode::local);
  ASSERT_TRUE(job) << describe(job.error());
  auto feed = [&](bool diverge) {
    std::vector<std::vector<int64_t>> heard;
    actors::detail::ChunkStream stream(*job->rt, [&](const actors::SampleChunk& c) { heard.push_back(c.tokens); }, 1);
    auto first = stream.listener(), second = stream.listener();
    caf::anon_send(first, actors::SampleChunk{.index = 4, .tokens = {1, 2}, .logprobs = {-.1f, -.2f}});
    caf::anon_send(first, actors::SampleChunk{.index = 4, .tokens = {3}, .logprobs = {-.3f}});
    std::this_thread::sleep_for(std::chrono::milliseconds(100));  // the first attempt's chunks arrive first
    caf::anon_send(second, actors::SampleChunk{.index = 4, .tokens = {1, diverge ? int64_t{9} : 2, 3, 4},
                                               .logprobs = {-.1f, -.2f, -.3f, -.4f}, .finished = true});
    auto r = stream.finish(std::vector<SampledSequence>{}, std::chrono::seconds(5));
    return std::make_pair(std::move(r), heard);
  };
  auto [ok, heard] = feed(false);
  ASSERT_TRUE(ok) << describe(ok.error());
  EXPECT_EQ(heard, (std::vector<std::vector<int64_t>>{{1, 2}, {3}, {4}}));
  auto [bad, partial] = feed(true);
  ASSERT_FALSE(bad);
  EXPECT_EQ(code_of(bad.error()), errc::aborted);
  EXPECT_NE(describe(bad.error()).find("drew token 9 at position 1 where the lost rank had streamed 2"), std::string::npos)
      << describe(bad.error());
  EXPECT_EQ(partial, (std::vector<std::vector<int64_t>>{{1, 2}, {3}})) << "nothing of the other sequence handed on";
}

// A supervised sampler group (RestartPolicy) replaces a rank it lost: on
// the rank's own node once a restarted process took its place there, else
// on a live node. The new rank replays the group's adapters and weight
// updates before it samples, so the answers (and their weight version) are
// those the group gave before the loss.
TEST(SamplerRespawn, ALostRankIsRespawnedWithTheGroupsWeightsOnItsRestartedNodeThenOnALiveOne) {
  auto job = testing::TestJob::start(Mode::cluster, 2);
  ASSERT_TRUE(job) << describe(job.error());
  auto& rt = *job->rt;
  ASSERT_TRUE(placement::service(rt, {.strategy = placement::Strategy::spread}));
  auto dir = glint::testing::fresh_dir("sampler-respawn");
  ASSERT_TRUE(sharp_model(3).save(dir));
  auto sg = actors::open_sampler_group(rt, placement::DeviceGroup::of("sampler", 2),
                                       *placement::DeviceMesh::from_sizes({.dp = 2}),
                                       {.model_dir = dir, .sampling_seed = 5, .cache_bytes = 1 << 20},
                                       RestartPolicy{.max_restarts = 2, .backoff = std::chrono::milliseconds(0)});
  ASSERT_TRUE(sg) << describe(sg.error());
  ASSERT_EQ(sg->info().ranks[1].node, 1);
  ASSERT_TRUE(sg->update_weights(weights_of(sharp_model(8)), 4).get());
  ASSERT_TRUE(sg->add_adapter("a", components::LoraConfig{}).get());
  Prompts prompts;
  for (int64_t i = 0; i < 8; ++i) prompts.push_back({1 + i, 2 + i, 3 + i});
  const SamplingParams p{.num_samples = 2, .max_tokens = 12, .temperature = 1.0, .seed = 7, .ignore_eos = true};
  auto want = sg->sample(prompts, p).get();
  ASSERT_TRUE(want) << describe(want.error());
  for (const auto& q : *want) ASSERT_EQ(q.weight_version, 4);
  auto expect_same = [&](const Result<std::vector<SampledSequence>>& got, const std::string& what) {
    ASSERT_TRUE(got) << what << ": " << describe(got.error());
    ASSERT_EQ(got->size(), want->size()) << what;
    for (size_t i = 0; i < want->size(); ++i) {
      EXPECT_EQ((*got)[i].tokens, (*want)[i].tokens) << what << ": sequence " << i;
      EXPECT_EQ((*got)[i].weight_version, 4) << what << ": sequence " << i;
    }
  };
  auto stats_ranks = [&] {
    auto st = sg->stats().get();
    return st ? static_cast<int>(st->size()) : -1;
  };

  // 1. Node 1 dies and `glint run --max-restarts` starts it again: the rank
  //    comes back there, with the weights of version 4 and adapter "a".
  job->nodes[0].signal(SIGKILL);
  ASSERT_TRUE(testing::eventually([&] { return rt.node(1).lost; }));
  ASSERT_TRUE(job->restart_node(1));
  ASSERT_TRUE(testing::eventually([&] { return !rt.node(1).lost; }));
  expect_same(sg->sample(prompts, p).get(), "after the respawn on the restarted node");
  auto now = sg->backend().actor_group();
  ASSERT_TRUE(now);
  EXPECT_EQ(now->rank(1).ctx.node, 1);
  EXPECT_TRUE(now->alive(1)) << "rank 1 was not respawned";
  EXPECT_EQ(stats_ranks(), 2);
  expect_same(sg->with_adapter("a").sample(prompts, p).get(), "adapter 'a' (B zero) on the respawned rank");

  // 2. Node 1 dies again and stays dead: the rank is respawned on node 0.
  job->nodes[0].signal(SIGKILL);
  ASSERT_TRUE(testing::eventually([&] { return rt.node(1).lost; }));
  expect_same(sg->sample(prompts, p).get(), "after the respawn on the live node");
  now = sg->backend().actor_group();
  EXPECT_EQ(now->rank(1).ctx.node, 0);
  // The placement service planned the move and holds the rank's new slot.
  auto slot = placement::replace(rt, "sampler", 1);
  ASSERT_TRUE(slot) << describe(slot.error());
  EXPECT_EQ(slot->node, 0);
  EXPECT_TRUE(now->alive(1));
  EXPECT_EQ(stats_ranks(), 2);
  rt.shutdown();
}

// A rank whose actor dies while its process lives on (a crash, an exit) is
// respawned as a lost one is; without a policy the group stops sending it
// work after the first failure.
TEST(SamplerRespawn, ACrashedRankIsRespawnedInItsLiveProcess) {
  auto job = testing::TestJob::start(Mode::local);
  ASSERT_TRUE(job) << describe(job.error());
  auto& rt = *job->rt;
  const actors::SamplerSpec spec{.config_json = tiny().to_json(), .seed = 3, .sampling_seed = 5, .cache_bytes = 1 << 20};
  auto mesh = placement::DeviceMesh::from_sizes({.dp = 2});
  auto sg = actors::open_sampler_group(rt, placement::DeviceGroup::of("crashy", 2), *mesh, spec,
                                       RestartPolicy{.max_restarts = 1, .backoff = std::chrono::milliseconds(0)});
  auto plain = actors::open_sampler_group(rt, placement::DeviceGroup::of("plain", 2), *mesh, spec);
  ASSERT_TRUE(sg && plain);
  Prompts prompts;
  for (int64_t i = 0; i < 6; ++i) prompts.push_back({1 + i, 2 + i});
  const SamplingParams p{.num_samples = 2, .max_tokens = 6, .temperature = 1.0, .seed = 7, .ignore_eos = true};
  auto want = sg->sample(prompts, p).get();
  ASSERT_TRUE(want) << describe(want.error());
  for (auto* group : {&*sg, &*plain}) {
    const auto before = group->backend().actor_group()->rank(1).actor;
    caf::anon_send_exit(group->backend().actor_group()->handle(1), caf::exit_reason::kill);
    // Until rank 1 is seen gone (the kill is a message too).
    for (int i = 0; i < 200 && group->backend().actor_group()->call_rank(1, actors::stats_atom::value).get(); ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    for (int call = 0; call < 2; ++call) {
      auto got = group->sample(prompts, p).get();
      ASSERT_TRUE(got) << describe(got.error());
      ASSERT_EQ(got->size(), want->size());
      for (size_t i = 0; i < want->size(); ++i) EXPECT_EQ((*got)[i].tokens, (*want)[i].tokens) << "sequence " << i;
    }
    auto stats = group->stats().get();
    ASSERT_TRUE(stats) << describe(stats.error());
    const bool supervised = group == &*sg;
    EXPECT_EQ(stats->size(), supervised ? 2u : 1u) << (supervised ? "rank 1 was not respawned" : "rank 1 still called");
    EXPECT_EQ(group->backend().actor_group()->rank(1).actor != before, supervised);
  }
  rt.shutdown();
}

INSTANTIATE_TEST_SUITE_P(Modes, SamplerActorTest, ::testing::Values(Mode::local, Mode::cluster),
                         [](const auto& info) { return info.param == Mode::local ? "local" : "cluster"; });

}  // namespace
}  // namespace glint
