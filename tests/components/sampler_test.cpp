#include "components/model/transformer.hpp"
#include "components/sampler/engine.hpp"
#include "components/sampler/paged_attention.hpp"
#include "components/tensor/torch_bridge.hpp"
#include "support/tokenizers.hpp"

#include "runtime/stop.hpp"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <random>
#include <tuple>

namespace glint::components {
namespace {

constexpr int64_t kVocab = 300;  // 256 single bytes, then multi-byte tokens

// A small Qwen3 (GQA, q/k norm) whose logits are far from uniform: random
// weights of std 0.02 make near-ties, and greedy comparisons would then
// depend on rounding rather than on the code under test.
CausalLM test_model(uint64_t seed = 3) {
  auto cfg = ModelConfig::make(Architecture::qwen3, kVocab, 64, 96, 2, 4, 2, 16);
  cfg.max_position_embeddings = 256;
  cfg.eos_token_ids = {299};
  auto lm = *CausalLM::init_random(cfg, seed);
  auto& p = lm.impl().params;
  for (auto& [name, t] : p) {
    if (name.find("q_proj") != std::string::npos || name.find("k_proj") != std::string::npos) t.mul_(8);
    if (name == "lm_head.weight") t.mul_(40);
  }
  return lm;
}

std::vector<int64_t> random_prompt(int64_t len, uint64_t seed) {
  std::mt19937_64 rng{seed};
  std::vector<int64_t> v(static_cast<size_t>(len));
  for (auto& t : v) t = static_cast<int64_t>(rng() % 256);
  return v;
}

Tensor row(const std::vector<int64_t>& v) { return *Tensor::from_values(v, {1, static_cast<int64_t>(v.size())}); }

// Greedy generation by recomputing the whole sequence for every token.
std::vector<int64_t> naive_greedy(const CausalLM& lm, std::vector<int64_t> seq, int64_t n,
                                  const std::string& adapter = "") {
  std::vector<int64_t> out;
  for (int64_t i = 0; i < n; ++i) {
    auto f = lm.forward({.input_ids = row(seq)}, {.logits = true, .adapter = adapter});
    EXPECT_TRUE(f) << describe(f.error());
    auto logits = to_torch(f->logits)[0][static_cast<int64_t>(seq.size()) - 1];
    auto t = logits.argmax().item<int64_t>();
    out.push_back(t);
    seq.push_back(t);
  }
  return out;
}

// The model's log-probability of each token after the first.
std::vector<float> model_logprobs(const CausalLM& lm, const std::vector<int64_t>& seq, const std::string& adapter = "") {
  auto f = lm.forward({.input_ids = row(seq)}, {.adapter = adapter});
  EXPECT_TRUE(f);
  auto v = *f->logprobs.values<float>();
  return {v.begin(), v.end() - 1};  // the last position has no target
}

Engine make_engine(CausalLM lm, EngineConfig cfg = {}, std::optional<Tokenizer> tok = {}) {
  auto e = Engine::create(std::move(lm), cfg, std::move(tok));
  EXPECT_TRUE(e) << describe(e.error());
  return std::move(*e);
}

std::vector<std::vector<int64_t>> prompts_of(std::initializer_list<int64_t> lens, uint64_t seed = 10) {
  std::vector<std::vector<int64_t>> out;
  for (auto l : lens) out.push_back(random_prompt(l, seed++));
  return out;
}

const SamplingParams greedy{.max_tokens = 24, .temperature = 0, .ignore_eos = true};

void expect_greedy_matches(Engine& e, const std::vector<std::vector<int64_t>>& prompts, const SamplingParams& p) {
  auto outs = e.generate(prompts, p);
  for (size_t i = 0; i < prompts.size(); ++i) {
    ASSERT_TRUE(outs[i]) << describe(outs[i].error());
    auto want = naive_greedy(e.model(), prompts[i], p.max_tokens);
    ASSERT_EQ(outs[i]->sequences.size(), static_cast<size_t>(p.num_samples));
    for (const auto& s : outs[i]->sequences) {
      EXPECT_EQ(s.tokens, want) << "prompt " << i << " of length " << prompts[i].size();
      EXPECT_EQ(s.stop_reason, StopReason::length);
    }
  }
}

TEST(Sampler, GreedyEqualsFullRecompute) {
  auto prompts = prompts_of({1, 5, 16, 17, 33, 40, 70});
  for (bool prefix : {false, true}) {
    SCOPED_TRACE(prefix ? "prefix caching" : "no prefix caching");
    auto e = make_engine(test_model(), {.max_num_batched_tokens = 64, .enable_prefix_caching = prefix});
    expect_greedy_matches(e, prompts, greedy);
    EXPECT_EQ(e.stats().free_blocks, e.stats().num_blocks);  // everything released
  }
}

// Once the driver has returned (run_main asks for a stop), generate ends
// between engine steps: every request answers aborted and frees its blocks.
TEST(Sampler, AStopRequestEndsGenerationBetweenSteps) {
  auto e = make_engine(test_model());
  request_stop();
  auto out = e.generate(prompts_of({7, 16}), greedy);
  request_stop(false);
  ASSERT_EQ(out.size(), 2u);
  for (const auto& o : out) {
    ASSERT_FALSE(o);
    EXPECT_EQ(code_of(o.error()), errc::aborted);
  }
  EXPECT_EQ(e.stats().free_blocks, e.stats().num_blocks);
  auto again = e.generate(prompts_of({7}), greedy);
  ASSERT_TRUE(again[0]) << "served again once the stop is withdrawn";
}

TEST(Sampler, PrefixCacheReusesSharedPromptBlocks) {
  auto e = make_engine(test_model());
  auto shared = random_prompt(40, 1);
  auto a = shared, b = shared;
  a.insert(a.end(), {1, 2, 3});
  b.insert(b.end(), {4, 5, 6, 7});
  expect_greedy_matches(e, {a}, greedy);
  EXPECT_EQ(e.stats().cached_tokens, 0);
  auto out = e.generate({b}, greedy);
  ASSERT_TRUE(out[0]);
  EXPECT_EQ(out[0]->cached_tokens, 32);
  EXPECT_EQ(e.stats().cached_tokens, 32);  // two full blocks of the shared 40
  EXPECT_EQ(out[0]->sequences[0].tokens, naive_greedy(e.model(), b, greedy.max_tokens));
  e.reset_prefix_cache();
  (void)e.generate({b}, greedy);
  EXPECT_EQ(e.stats().cached_tokens, 32);  // no new hits after the reset
  // Requests queued together share their prefix within one step.
  auto c = shared;
  c.push_back(9);
  e.reset_prefix_cache();
  expect_greedy_matches(e, {a, b, c}, greedy);
  EXPECT_EQ(e.stats().cached_tokens, 32 + 2 * 32);
}

TEST(Sampler, SamplesShareThePromptAndEachMatchesGreedy) {
  auto e = make_engine(test_model());
  auto p = greedy;
  p.num_samples = 3;
  expect_greedy_matches(e, prompts_of({7, 16, 21}), p);
  EXPECT_EQ(e.stats().free_blocks, e.stats().num_blocks);
}

TEST(Sampler, PreemptionByRecomputeKeepsGreedyOutput) {
  // Six blocks of 16 tokens for four requests that each grow to four blocks.
  auto lm = test_model();
  const auto& c = lm.config();
  const int64_t block_bytes = 2 * c.num_hidden_layers * 16 * c.num_key_value_heads * c.head_dim * 4;
  auto e = make_engine(std::move(lm), {.cache_bytes = 6 * block_bytes, .enable_prefix_caching = false});
  auto p = greedy;
  p.max_tokens = 40;
  expect_greedy_matches(e, prompts_of({20, 9, 18, 13}), p);
  EXPECT_GT(e.stats().preemptions, 0);
  EXPECT_GT(e.stats().recomputed_tokens, 0);
  // Forked samples are preempted and recomputed one by one.
  p.num_samples = 3;
  p.max_tokens = 30;
  expect_greedy_matches(e, prompts_of({20, 9}), p);
}

TEST(Sampler, LogprobsEqualTheModelsWithinFloatTolerance) {
  auto e = make_engine(test_model());
  SamplingParams p{.num_samples = 2, .max_tokens = 20, .temperature = 1.0, .seed = 5, .ignore_eos = true,
                   .logprobs = 3, .prompt_logprobs = 2};
  auto prompt = random_prompt(23, 4);
  auto out = e.generate({prompt}, p);
  ASSERT_TRUE(out[0]);
  const auto& o = *out[0];
  auto want_prompt = model_logprobs(e.model(), prompt);
  ASSERT_EQ(o.prompt_logprobs.chosen.size(), prompt.size() - 1);
  for (size_t i = 0; i < want_prompt.size(); ++i) EXPECT_NEAR(o.prompt_logprobs.chosen[i], want_prompt[i], 1e-4);
  for (const auto& s : o.sequences) {
    auto full = prompt;
    full.insert(full.end(), s.tokens.begin(), s.tokens.end());
    auto want = model_logprobs(e.model(), full);
    ASSERT_EQ(s.logprobs.chosen.size(), s.tokens.size());
    ASSERT_EQ(s.logprobs.k, 3);
    for (size_t i = 0; i < s.tokens.size(); ++i) {
      EXPECT_NEAR(s.logprobs.chosen[i], want[prompt.size() - 1 + i], 1e-4) << i;
      // The top entries are sorted and bound the chosen token's.
      EXPECT_GE(s.logprobs.top_logprobs[3 * i], s.logprobs.top_logprobs[3 * i + 1]);
      EXPECT_GE(s.logprobs.top_logprobs[3 * i] + 1e-6f, s.logprobs.chosen[i]);
    }
  }
  EXPECT_NE(o.sequences[0].tokens, o.sequences[1].tokens);
}

TEST(Sampler, SameSeedSameSampleWhateverSharesTheBatch) {
  SamplingParams p{.max_tokens = 30, .temperature = 0.9, .top_k = 50, .top_p = 0.95, .seed = 77, .ignore_eos = true};
  auto prompt = random_prompt(19, 8);
  auto alone = make_engine(test_model());
  auto a = alone.generate({prompt}, p);
  ASSERT_TRUE(a[0]);

  auto busy = make_engine(test_model(), {.max_num_batched_tokens = 48});
  SamplingParams other{.num_samples = 2, .max_tokens = 25, .temperature = 1.2, .ignore_eos = true};
  std::vector<uint64_t> ids;
  for (auto& q : prompts_of({40, 3, 60}, 50)) ids.push_back(*busy.add_request(q, other));
  (void)busy.step();
  (void)busy.step();
  auto mine = *busy.add_request(prompt, p);  // joins mid-flight
  ids.push_back(*busy.add_request(random_prompt(33, 9), other));
  while (busy.has_unfinished()) ASSERT_TRUE(busy.step());
  EXPECT_EQ(busy.output(mine)->sequences[0].tokens, a[0]->sequences[0].tokens);

  p.seed = 78;
  auto c = alone.generate({prompt}, p);
  EXPECT_NE(c[0]->sequences[0].tokens, a[0]->sequences[0].tokens);
}

TEST(Sampler, FiltersThatLeaveOneTokenAreGreedy) {
  auto e = make_engine(test_model());
  auto prompt = random_prompt(12, 2);
  auto want = naive_greedy(e.model(), prompt, 16);
  for (SamplingParams p : {SamplingParams{.top_k = 1}, SamplingParams{.top_p = 1e-6}, SamplingParams{.min_p = 1.0}}) {
    p.max_tokens = 16;
    p.ignore_eos = true;
    p.seed = 1;
    auto out = e.generate({prompt}, p);
    ASSERT_TRUE(out[0]);
    EXPECT_EQ(out[0]->sequences[0].tokens, want) << p.top_k << " " << p.top_p << " " << p.min_p;
  }
}

TEST(Sampler, DrawsFollowTheModelsDistribution) {
  auto e = make_engine(test_model(), {.max_num_seqs = 512});
  auto prompt = random_prompt(6, 3);
  const int n = 400;
  auto out = e.generate({prompt}, {.num_samples = n, .max_tokens = 1, .seed = 11, .logprobs = 0});
  ASSERT_TRUE(out[0]);
  std::map<int64_t, int> count;
  std::map<int64_t, double> prob;
  for (const auto& s : out[0]->sequences) {
    ++count[s.tokens[0]];
    prob[s.tokens[0]] = std::exp(s.logprobs.chosen[0]);
  }
  for (auto [t, k] : count) {
    const double p = prob[t], sd = std::sqrt(n * p * (1 - p));
    EXPECT_NEAR(k, n * p, 5 * sd + 1) << "token " << t;
  }
}

TEST(Sampler, RepetitionPenaltyChangesGreedyChoicesAwayFromSeenTokens) {
  auto e = make_engine(test_model());
  auto prompt = random_prompt(10, 6);
  auto plain = e.generate({prompt}, {.max_tokens = 40, .temperature = 0, .ignore_eos = true});
  auto penal = e.generate({prompt}, {.max_tokens = 40, .temperature = 0, .repetition_penalty = 100, .ignore_eos = true});
  auto distinct = [](const std::vector<int64_t>& v) { return std::set<int64_t>(v.begin(), v.end()).size(); };
  EXPECT_GT(distinct(penal[0]->sequences[0].tokens), distinct(plain[0]->sequences[0].tokens));
}

// A byte-level tokenizer.json: ids 0..255 are single bytes, 256.. three-byte
// tokens of letters (multi-byte, so stop strings end inside them), 299 a
// special end token.
Tokenizer test_tokenizer() {
  nlohmann::json vocab = nlohmann::json::object();
  for (int b = 0; b < 256; ++b) vocab[glint::testing::byte_char(b)] = b;
  for (int i = 256; i < 299; ++i) {
    std::string t;
    for (int k = 0; k < 3; ++k) t += glint::testing::byte_char('a' + (i * 7 + k * 5) % 26);
    vocab[t] = i;
  }
  nlohmann::json j = {{"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", nlohmann::json::array()}}},
                      {"decoder", {{"type", "ByteLevel"}}},
                      {"added_tokens", {{{"id", 299}, {"content", "<|end|>"}, {"special", true}}}}};
  return *Tokenizer::parse(j.dump());
}

TEST(Sampler, StopStringsCutTheTextExactly) {
  auto e = make_engine(test_model(), {}, test_tokenizer());
  auto prompt = random_prompt(9, 12);
  SamplingParams p{.max_tokens = 40, .temperature = 0, .ignore_eos = true};
  auto full = e.generate({prompt}, p);
  ASSERT_TRUE(full[0]);
  const auto& all = full[0]->sequences[0];
  std::string bytes;
  std::vector<size_t> ends;  // byte offset after each token
  for (auto t : all.tokens) {
    bytes += e.tokenizer()->token_bytes(t);
    ends.push_back(bytes.size());
  }
  ASSERT_GT(bytes.size(), 12u);
  // A stop string that starts mid-way and ends inside a later token.
  const size_t from = bytes.size() / 3;
  const std::string stop = bytes.substr(from, 4);
  const size_t first = bytes.find(stop);
  p.stop = {stop, "\x01never\x02"};
  auto cut = e.generate({prompt}, p);
  ASSERT_TRUE(cut[0]);
  const auto& s = cut[0]->sequences[0];
  EXPECT_EQ(s.stop_reason, StopReason::stop);
  EXPECT_EQ(s.stop_string, stop);
  EXPECT_EQ(s.text, to_valid_utf8(bytes.substr(0, first)));
  // Tokens run up to the one that completed the match.
  size_t last = 0;
  while (ends[last] < first + stop.size()) ++last;
  EXPECT_EQ(s.tokens, std::vector<int64_t>(all.tokens.begin(), all.tokens.begin() + static_cast<long>(last) + 1));
  p.include_stop_str_in_output = true;
  auto with = e.generate({prompt}, p);
  EXPECT_EQ(with[0]->sequences[0].text, to_valid_utf8(bytes.substr(0, first + stop.size())));
  // A stop token ends the sequence and is kept.
  p.stop.clear();
  p.stop_token_ids = {all.tokens[5]};
  auto tok = e.generate({prompt}, p);
  const auto& st = tok[0]->sequences[0];
  EXPECT_EQ(st.stop_reason, StopReason::stop);
  EXPECT_EQ(st.stop_token, all.tokens[5]);
  auto k = std::find(all.tokens.begin(), all.tokens.end(), all.tokens[5]) - all.tokens.begin();
  EXPECT_EQ(st.tokens.size(), static_cast<size_t>(k + 1));
}

TEST(Sampler, EosStopsUnlessIgnored) {
  // Make the model's second greedy token its eos.
  auto lm = test_model();
  auto want = naive_greedy(lm, random_prompt(5, 1), 2);
  lm.impl().cfg.eos_token_ids = {want[1]};
  auto e = make_engine(std::move(lm));
  auto out = e.generate({random_prompt(5, 1)}, {.max_tokens = 10, .temperature = 0});
  ASSERT_TRUE(out[0]);
  EXPECT_EQ(out[0]->sequences[0].tokens, want);
  EXPECT_EQ(out[0]->sequences[0].stop_reason, StopReason::stop);
  out = e.generate({random_prompt(5, 1)}, {.max_tokens = 10, .temperature = 0, .ignore_eos = true});
  EXPECT_EQ(out[0]->sequences[0].tokens.size(), 10u);
}

TEST(Sampler, MaxTokensZeroScoresThePrompt) {
  auto e = make_engine(test_model());
  auto prompt = random_prompt(30, 5);
  auto out = e.generate({prompt}, {.max_tokens = 0, .prompt_logprobs = 0});
  ASSERT_TRUE(out[0]);
  EXPECT_TRUE(out[0]->sequences[0].tokens.empty());
  EXPECT_EQ(out[0]->sequences[0].stop_reason, StopReason::length);
  auto want = model_logprobs(e.model(), prompt);
  ASSERT_EQ(out[0]->prompt_logprobs.chosen.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(out[0]->prompt_logprobs.chosen[i], want[i], 1e-4);
}

TEST(Sampler, BadRequestsFailAloneWhileTheBatchCompletes) {
  auto e = make_engine(test_model(), {.max_model_len = 64});
  auto ok = random_prompt(8, 1);
  struct Case {
    std::vector<int64_t> prompt;
    SamplingParams params;
    std::string adapter;
    std::string says;
  };
  std::vector<Case> cases = {
      {{}, greedy, "", "empty"},
      {random_prompt(65, 2), greedy, "", "max_model_len is 64"},
      {ok, {.temperature = -1}, "", "temperature"},
      {ok, {.top_p = 0}, "", "top_p"},
      {ok, {.top_p = 1.5}, "", "top_p"},
      {ok, greedy, "tenant-x", "no LoRA adapter 'tenant-x'"},
      {{1, 2, kVocab}, greedy, "", "outside the vocabulary"},
      {ok, {.stop = {"x"}}, "", "tokenizer"},
      {ok, {.num_samples = 300}, "", "max_num_seqs"},
  };
  std::vector<uint64_t> good;
  for (const auto& c : cases) {
    auto id = e.add_request(c.prompt, c.params, c.adapter);
    ASSERT_FALSE(id) << c.says;
    EXPECT_NE(describe(id.error()).find(c.says), std::string::npos) << describe(id.error());
    good.push_back(*e.add_request(ok, greedy));
  }
  while (e.has_unfinished()) ASSERT_TRUE(e.step());
  for (auto id : good) EXPECT_EQ(e.output(id)->sequences[0].stop_reason, StopReason::length);
  // A request that can never fit in the cache.
  auto tiny = make_engine(test_model(), {.cache_bytes = 2 * 2 * 16 * 2 * 16 * 4});
  auto id = tiny.add_request(random_prompt(40, 1), greedy);
  ASSERT_FALSE(id);
  EXPECT_NE(describe(id.error()).find("cache_bytes"), std::string::npos) << describe(id.error());
}

TEST(Sampler, ContinuousBatchingLetsRequestsJoinAndLeave) {
  auto e = make_engine(test_model());
  auto p = greedy;
  p.max_tokens = 4;
  auto shortie = *e.add_request(random_prompt(5, 1), p);
  p.max_tokens = 30;
  auto longer = *e.add_request(random_prompt(9, 2), p);
  for (int i = 0; i < 6; ++i) ASSERT_TRUE(e.step());
  EXPECT_TRUE(e.output(shortie)->finished);
  EXPECT_FALSE(e.output(longer)->finished);
  auto late = *e.add_request(random_prompt(7, 3), p);
  ASSERT_TRUE(e.step());
  EXPECT_EQ(e.stats().running, 2);
  while (e.has_unfinished()) ASSERT_TRUE(e.step());
  EXPECT_EQ(e.output(late)->sequences[0].tokens, naive_greedy(e.model(), random_prompt(7, 3), 30));
  EXPECT_EQ(e.output(longer)->sequences[0].tokens, naive_greedy(e.model(), random_prompt(9, 2), 30));
  e.abort(late);  // finished: ignored
  auto gone = *e.add_request(random_prompt(7, 3), p);
  ASSERT_TRUE(e.step());
  e.abort(gone);
  EXPECT_EQ(e.output(gone)->sequences[0].stop_reason, StopReason::abort);
  EXPECT_FALSE(e.has_unfinished());
}

// Gives adapter `name` random B matrices, so that it changes the output.
void randomise(Engine& e, const std::string& name) {
  auto& a = const_cast<CausalLM::Impl&>(e.model().impl()).adapters.at(name);
  for (auto& [m, ab] : a.weights) ab.second.normal_(0, 0.5);
}

TEST(Sampler, AdaptersAndTheBaseModelInOneBatch) {
  auto e = make_engine(test_model());
  ASSERT_TRUE(e.add_adapter("a", {.r = 4, .target_modules = {"all-linear"}}));
  ASSERT_TRUE(e.add_adapter("b", {.r = 4}));
  // An adapter of the LM head only (Tinker's train_unembed): its rows' logits.
  ASSERT_TRUE(e.add_adapter("h", {.r = 4, .target_modules = {"lm_head"}}));
  randomise(e, "a");
  randomise(e, "b");
  randomise(e, "h");
  auto prompt = random_prompt(21, 5);
  std::vector<std::pair<uint64_t, std::string>> ids;
  for (std::string name : {"a", "", "h", "b", "a", "h"}) ids.emplace_back(*e.add_request(prompt, greedy, name), name);
  while (e.has_unfinished()) ASSERT_TRUE(e.step());
  std::set<std::vector<int64_t>> distinct;
  for (auto [id, name] : ids) {
    auto got = e.output(id)->sequences[0].tokens;
    EXPECT_EQ(got, naive_greedy(e.model(), prompt, greedy.max_tokens, name)) << "adapter '" << name << "'";
    distinct.insert(got);
  }
  EXPECT_EQ(distinct.size(), 4u);
  EXPECT_FALSE(e.remove_adapter("zzz"));
  EXPECT_TRUE(e.remove_adapter("b"));
}

TEST(Sampler, WeightUpdatesWaitForRequestsInFlightOrAbortThem) {
  auto e = make_engine(test_model());
  auto other = test_model(4);
  auto prompt = random_prompt(11, 3);
  auto old_tokens = naive_greedy(e.model(), prompt, greedy.max_tokens);
  auto new_tokens = naive_greedy(other, prompt, greedy.max_tokens);
  ASSERT_NE(old_tokens, new_tokens);

  auto before = *e.add_request(prompt, greedy);
  ASSERT_TRUE(e.step());
  ASSERT_TRUE(e.update_weights(*other.named_parameters(), "", 1, UpdatePolicy::finish_old));
  EXPECT_TRUE(e.update_pending());
  auto after = *e.add_request(prompt, greedy);
  while (e.has_unfinished()) ASSERT_TRUE(e.step());
  EXPECT_FALSE(e.update_pending());
  EXPECT_EQ(e.output(before)->sequences[0].tokens, old_tokens);
  EXPECT_EQ(e.output(before)->sequences[0].weight_version, 0);
  EXPECT_EQ(e.output(after)->sequences[0].tokens, new_tokens);
  EXPECT_EQ(e.output(after)->sequences[0].weight_version, 1);

  auto cut = *e.add_request(prompt, greedy);
  ASSERT_TRUE(e.step());
  ASSERT_TRUE(e.update_weights(*test_model().named_parameters(), "", 2, UpdatePolicy::abort));
  EXPECT_EQ(e.output(cut)->sequences[0].stop_reason, StopReason::abort);
  EXPECT_EQ(e.weight_version(), 2);
  auto again = e.generate({prompt}, greedy);
  EXPECT_EQ(again[0]->sequences[0].tokens, old_tokens);
  EXPECT_EQ(again[0]->sequences[0].weight_version, 2);

  // Bad updates change nothing.
  NamedTensors bad = {{"model.norm.weight", *Tensor::from_values(std::vector<float>{1, 2}, {2})}};
  EXPECT_FALSE(e.update_weights(bad, "", 3));
  bad = {{"no.such.weight", *Tensor::from_values(std::vector<float>{1}, {1})}};
  EXPECT_FALSE(e.update_weights(bad, "", 3));
  EXPECT_EQ(e.weight_version(), 2);
}

// Asynchronous RL sends updates while requests run: finish_old updates
// queue up, each applying once the requests before it are done, so a
// request added between two updates runs wholly on the first.
TEST(Sampler, FinishOldUpdatesQueueUpInOrder) {
  auto e = make_engine(test_model());
  auto v1 = test_model(4), v2 = test_model(5);
  auto prompt = random_prompt(11, 3);
  auto on0 = naive_greedy(e.model(), prompt, greedy.max_tokens);
  auto on1 = naive_greedy(v1, prompt, greedy.max_tokens);
  auto on2 = naive_greedy(v2, prompt, greedy.max_tokens);
  ASSERT_NE(on0, on1);
  ASSERT_NE(on1, on2);
  auto a = *e.add_request(prompt, greedy);
  ASSERT_TRUE(e.step());
  ASSERT_TRUE(e.update_weights(*v1.named_parameters(), "", 1, UpdatePolicy::finish_old));
  auto b = *e.add_request(prompt, greedy);
  ASSERT_TRUE(e.step());
  ASSERT_TRUE(e.update_weights(*v2.named_parameters(), "", 2, UpdatePolicy::finish_old));
  auto c = *e.add_request(prompt, greedy);
  EXPECT_TRUE(e.update_pending());
  EXPECT_EQ(e.weight_version(), 0);
  while (e.has_unfinished()) ASSERT_TRUE(e.step());
  EXPECT_FALSE(e.update_pending());
  EXPECT_EQ(e.weight_version(), 2);
  for (auto [id, tokens, version] : {std::tuple{a, on0, 0}, {b, on1, 1}, {c, on2, 2}}) {
    const auto& s = e.output(id)->sequences[0];
    EXPECT_EQ(s.tokens, tokens) << "version " << version;
    EXPECT_EQ(s.weight_version, version);
    EXPECT_EQ(s.first_weight_version, version);
  }
  // At most 8 wait; the 9th is refused and changes nothing.
  auto held = *e.add_request(prompt, {.max_tokens = 40, .temperature = 0, .ignore_eos = true});
  ASSERT_TRUE(e.step());
  std::vector<uint64_t> between;
  for (int64_t v = 3; v <= 10; ++v) {
    ASSERT_TRUE(e.update_weights(*(v % 2 ? v1 : v2).named_parameters(), "", v, UpdatePolicy::finish_old)) << v;
    between.push_back(*e.add_request(prompt, greedy));
  }
  auto refused = e.update_weights(*v1.named_parameters(), "", 11, UpdatePolicy::finish_old);
  ASSERT_FALSE(refused);
  EXPECT_NE(describe(refused.error()).find("already wait"), std::string::npos) << describe(refused.error());
  while (e.has_unfinished()) ASSERT_TRUE(e.step());
  EXPECT_EQ(e.weight_version(), 10);
  EXPECT_EQ(e.output(held)->sequences[0].weight_version, 2);
  for (int64_t v = 3; v <= 10; ++v) {
    const auto& q = e.output(between[static_cast<size_t>(v - 3)])->sequences[0];
    EXPECT_EQ(q.weight_version, v) << "a request runs on the update before it";
    EXPECT_EQ(q.tokens, v % 2 ? on1 : on2) << v;
  }
  // An update waiting for a request that is then aborted applies before
  // the engine sleeps, and one sent while it sleeps applies at once.
  auto cut = *e.add_request(prompt, {.max_tokens = 40, .temperature = 0, .ignore_eos = true});
  ASSERT_TRUE(e.step());
  ASSERT_TRUE(e.update_weights(*v2.named_parameters(), "", 11, UpdatePolicy::finish_old));
  EXPECT_TRUE(e.update_pending());
  e.abort(cut);
  ASSERT_TRUE(e.sleep());
  EXPECT_FALSE(e.update_pending());
  EXPECT_EQ(e.weight_version(), 11);
  ASSERT_TRUE(e.update_weights(*v1.named_parameters(), "", 12, UpdatePolicy::finish_old));
  EXPECT_EQ(e.weight_version(), 12);
  ASSERT_TRUE(e.wake());
  auto after = e.generate({prompt}, greedy);
  EXPECT_EQ(after[0]->sequences[0].tokens, on1);
  EXPECT_EQ(after[0]->sequences[0].weight_version, 12);
}

TEST(Sampler, ContinueNewMovesRunningRequestsToTheNewWeights) {
  auto e = make_engine(test_model());
  auto v1 = test_model(4);
  auto prompt = random_prompt(11, 10);
  const SamplingParams long_greedy{.max_tokens = 24, .temperature = 0, .ignore_eos = true};
  const auto all_old = naive_greedy(e.model(), prompt, long_greedy.max_tokens);
  auto running = *e.add_request(prompt, long_greedy);
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(e.step());
  const auto first = e.output(running)->sequences[0].tokens;
  ASSERT_EQ(first.size(), 4u);
  ASSERT_TRUE(e.update_weights(*v1.named_parameters(), "", 1, UpdatePolicy::continue_new));
  EXPECT_FALSE(e.update_pending()) << "it applies before the next step";
  EXPECT_EQ(e.weight_version(), 1);
  // On until its first block of 16 (prompt and 6 tokens, most computed by
  // the old weights) is full.
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(e.step());
  const auto& s = e.output(running)->sequences[0];
  ASSERT_EQ(s.tokens.size(), 8u);
  EXPECT_EQ(std::vector<int64_t>(s.tokens.begin(), s.tokens.begin() + 4), first) << "its first tokens stay";
  // A request after the update with that block's tokens as its prompt must
  // not reuse the block (its values mix the old weights in).
  auto again = prompt;
  again.insert(again.end(), s.tokens.begin(), s.tokens.begin() + 7);
  auto fresh = *e.add_request(again, long_greedy);
  while (e.has_unfinished()) ASSERT_TRUE(e.step());
  EXPECT_EQ(s.first_weight_version, 0);
  EXPECT_EQ(s.weight_version, 1);
  EXPECT_NE(s.tokens, all_old) << "its later tokens come from the new weights";
  const auto& f = e.output(fresh)->sequences[0];
  EXPECT_EQ(f.first_weight_version, 1);
  EXPECT_EQ(e.output(fresh)->cached_tokens, 0);
  EXPECT_EQ(f.tokens, naive_greedy(v1, again, long_greedy.max_tokens));
  EXPECT_EQ(*parse_update_policy("continue_new"), UpdatePolicy::continue_new);
  EXPECT_FALSE(parse_update_policy("later"));
  EXPECT_FALSE(e.update_weights(*v1.named_parameters(), "", 2, static_cast<UpdatePolicy>(7)));
  // Queued behind a finish_old update, a continue_new one does not hold
  // back the requests that one waits for (it used to: neither applied).
  auto waiting = *e.add_request(prompt, long_greedy);
  ASSERT_TRUE(e.update_weights(*test_model().named_parameters(), "", 3, UpdatePolicy::finish_old));
  ASSERT_TRUE(e.update_weights(*v1.named_parameters(), "", 4, UpdatePolicy::continue_new));
  for (int i = 0; i < 200 && e.has_unfinished(); ++i) ASSERT_TRUE(e.step());
  ASSERT_FALSE(e.has_unfinished()) << "stuck";
  EXPECT_FALSE(e.update_pending());
  EXPECT_EQ(e.output(waiting)->sequences[0].weight_version, 1) << "it ran before both updates";
  EXPECT_EQ(e.weight_version(), 4);
}

TEST(Sampler, LoraOnlyUpdatesChangeOneAdapter) {
  auto e = make_engine(test_model());
  ASSERT_TRUE(e.add_adapter("t", {.r = 4}));
  auto prompt = random_prompt(11, 3);
  auto base = naive_greedy(e.model(), prompt, greedy.max_tokens);
  auto donor = test_model();
  ASSERT_TRUE(donor.add_adapter("t", {.r = 4}, 9));
  for (auto& [m, ab] : donor.impl().adapters.at("t").weights) ab.second.normal_(0, 0.5);
  ASSERT_TRUE(e.update_weights(*donor.adapter_parameters("t"), "t", 7));
  auto out = e.generate({prompt, prompt}, greedy, "t");
  EXPECT_EQ(out[0]->sequences[0].tokens, naive_greedy(donor, prompt, greedy.max_tokens, "t"));
  EXPECT_NE(out[0]->sequences[0].tokens, base);
  EXPECT_EQ(e.generate({prompt}, greedy)[0]->sequences[0].tokens, base);
}

// Tenants share a sampler: one adapter's update waits only for that
// adapter's requests, holds back only that adapter's new ones, and the
// versions sequences report are their adapter's.
TEST(Sampler, AnAdaptersUpdateWaitsOnlyForItsOwnRequests) {
  auto e = make_engine(test_model());
  ASSERT_TRUE(e.add_adapter("t", {.r = 4}));
  ASSERT_TRUE(e.add_adapter("u", {.r = 4}));
  auto prompt = random_prompt(11, 3);
  auto base = naive_greedy(e.model(), prompt, greedy.max_tokens);
  auto donor = test_model();
  ASSERT_TRUE(donor.add_adapter("t", {.r = 4}, 9));
  for (auto& [m, ab] : donor.impl().adapters.at("t").weights) ab.second.normal_(0, 0.5);
  const SamplingParams long_greedy{.max_tokens = 30, .temperature = 0, .ignore_eos = true};
  auto old_base = *e.add_request(prompt, {.max_tokens = 60, .temperature = 0, .ignore_eos = true});
  auto old_t = *e.add_request(prompt, long_greedy, "t");
  ASSERT_TRUE(e.step());
  ASSERT_TRUE(e.update_weights(*donor.adapter_parameters("t"), "t", 5, UpdatePolicy::finish_old));
  EXPECT_TRUE(e.update_pending());
  auto base_req = *e.add_request(prompt, greedy);
  auto u_req = *e.add_request(prompt, greedy, "u");
  auto new_t = *e.add_request(prompt, greedy, "t");
  ASSERT_TRUE(e.step());
  EXPECT_FALSE(e.output(base_req)->sequences[0].tokens.empty()) << "the base's requests pass the waiting update";
  EXPECT_FALSE(e.output(u_req)->sequences[0].tokens.empty()) << "so do another adapter's";
  EXPECT_TRUE(e.output(new_t)->sequences[0].tokens.empty()) << "t's new request waits for t's update";
  // abort stops only what the update touches.
  ASSERT_TRUE(e.update_weights(*e.model().adapter_parameters("u"), "u", 6, UpdatePolicy::abort));
  EXPECT_EQ(e.output(u_req)->sequences[0].stop_reason, StopReason::abort);
  EXPECT_NE(e.output(base_req)->sequences[0].stop_reason, StopReason::abort);
  EXPECT_NE(e.output(old_t)->sequences[0].stop_reason, StopReason::abort);
  // t's update waits for t's old request only: it applies while the base's
  // longer one runs on.
  for (int i = 0; i < 100 && e.update_pending(); ++i) ASSERT_TRUE(e.step());
  EXPECT_FALSE(e.update_pending());
  EXPECT_FALSE(e.output(old_base)->finished) << "the base's request did not hold t's update";
  for (int i = 0; i < 200 && e.has_unfinished(); ++i) ASSERT_TRUE(e.step());
  ASSERT_FALSE(e.has_unfinished());
  EXPECT_EQ(e.output(old_t)->sequences[0].weight_version, 0);
  EXPECT_EQ(e.output(new_t)->sequences[0].weight_version, 5);
  EXPECT_EQ(e.output(new_t)->sequences[0].tokens, naive_greedy(donor, prompt, greedy.max_tokens, "t"));
  EXPECT_EQ(e.output(base_req)->sequences[0].weight_version, 0) << "the base was not updated";
  EXPECT_EQ(e.output(base_req)->sequences[0].tokens, base);
  EXPECT_EQ(e.generate({prompt}, greedy, "u")[0]->sequences[0].weight_version, 6);
  // A base update touches every adapter: t's next update queues behind it,
  // and an adapter with an update waiting cannot be removed.
  auto running = *e.add_request(prompt, long_greedy);
  ASSERT_TRUE(e.step());
  ASSERT_TRUE(e.update_weights(*test_model(4).named_parameters(), "", 8, UpdatePolicy::finish_old));
  ASSERT_TRUE(e.update_weights(*donor.adapter_parameters("t"), "t", 9, UpdatePolicy::finish_old));
  auto gone = e.remove_adapter("t");
  ASSERT_FALSE(gone);
  EXPECT_NE(describe(gone.error()).find("weight update"), std::string::npos) << describe(gone.error());
  for (int i = 0; i < 200 && e.has_unfinished(); ++i) ASSERT_TRUE(e.step());
  ASSERT_FALSE(e.has_unfinished());
  EXPECT_FALSE(e.update_pending());
  EXPECT_EQ(e.output(running)->sequences[0].weight_version, 0);
  EXPECT_EQ(e.generate({prompt}, greedy, "t")[0]->sequences[0].weight_version, 9);
  EXPECT_EQ(e.generate({prompt}, greedy, "u")[0]->sequences[0].weight_version, 8)
      << "the base's update applied after u's, and changes u's output too";
  EXPECT_EQ(e.generate({prompt}, greedy)[0]->sequences[0].weight_version, 8);
  EXPECT_FALSE(e.remove_adapter("zzz"));
  ASSERT_TRUE(e.remove_adapter("t"));
  ASSERT_TRUE(e.add_adapter("t", {.r = 4}));
  EXPECT_EQ(e.generate({prompt}, greedy, "t")[0]->sequences[0].weight_version, 8) << "a new adapter: the base's";
}

TEST(Sampler, SleepFreesTheCacheAndWakeRestoresIt) {
  auto e = make_engine(test_model());
  auto prompt = random_prompt(11, 3);
  auto want = e.generate({prompt}, greedy)[0]->sequences[0].tokens;
  ASSERT_TRUE(e.sleep());
  EXPECT_TRUE(e.sleeping());
  auto refused = e.add_request(prompt, greedy);
  ASSERT_FALSE(refused);
  EXPECT_NE(describe(refused.error()).find("asleep"), std::string::npos);
  ASSERT_TRUE(e.wake());
  EXPECT_EQ(e.generate({prompt}, greedy)[0]->sequences[0].tokens, want);
  (void)e.add_request(prompt, greedy);
  EXPECT_FALSE(e.sleep());  // a request is in flight
}

}  // namespace
}  // namespace glint::components

namespace glint::components {
namespace {

// The fused kernel against gather + softmax + matmul, for the vectorised
// head size (64) and one the scalar path takes (6).
TEST(PagedAttention, DecodeEqualsGatherThenSoftmaxThenMatmul) {
  for (int64_t D : {64, 6}) {
    const int64_t S = 5, nh = 4, nkv = 2, slots_n = 200, C = 37;
    auto q = at::randn({S, nh, D});
    auto kc = at::randn({slots_n, nkv, D}), vc = at::randn({slots_n, nkv, D});
    auto slots = at::randint(0, slots_n, {S, C}, at::kLong);
    auto lengths = at::tensor(std::vector<int64_t>{1, 37, 16, 17, 5}, at::kLong);
    const double scale = 0.3;
    for (int64_t window : {0, 1, 7, 16}) {
    auto got = paged_decode_attention(q, kc, vc, slots, lengths, scale, window);
    for (int64_t s = 0; s < S; ++s) {
      const int64_t n = lengths[s].item<int64_t>();
      const int64_t first = window > 0 && n > window ? n - window : 0;  // a window reads the last positions
      const int64_t len = n - first;
      auto idx = slots[s].narrow(0, first, len);
      auto k = kc.index_select(0, idx).to(at::kDouble), v = vc.index_select(0, idx).to(at::kDouble);  // [len, kv, D]
      for (int64_t h = 0; h < nh; ++h) {
        auto kh = k.select(1, h / (nh / nkv)), vh = v.select(1, h / (nh / nkv));
        auto p = at::softmax(at::mv(kh, q[s][h].to(at::kDouble)) * scale, 0);
        auto want = at::mv(vh.t(), p);
        EXPECT_TRUE(at::allclose(got[s][h].to(at::kDouble), want, 1e-5, 1e-5))
            << "D " << D << " window " << window << " s " << s << " h " << h;
      }
    }
    }
  }
}

// A Qwen2 whose second layer slides a window of 6 positions (config.json's
// use_sliding_window, sliding_window, max_window_layers): the paged sampler
// computes what the model's full forward does (itself checked against a
// float64 reference in model_test), through chunked prefill, decode, prefix
// caching and preemption. And the window matters: the same weights without
// it generate something else.
TEST(Sampler, SlidingWindowLayersMatchTheModelsForward) {
  auto cfg = ModelConfig::parse(R"({"architectures":["Qwen2ForCausalLM"],"vocab_size":300,"hidden_size":64,
    "intermediate_size":96,"num_hidden_layers":2,"num_attention_heads":4,"num_key_value_heads":2,
    "max_position_embeddings":256,"use_sliding_window":true,"sliding_window":6,"max_window_layers":1})");
  ASSERT_TRUE(cfg) << describe(cfg.error());
  ASSERT_EQ(cfg->window(0), 0);
  ASSERT_EQ(cfg->window(1), 6);
  auto windowed = *CausalLM::init_random(*cfg, 5);
  for (auto& [name, t] : windowed.impl().params) {
    if (name.find("q_proj") != std::string::npos || name.find("k_proj") != std::string::npos) t.mul_(8);
    if (name == "lm_head.weight") t.mul_(40);
  }
  auto prompts = prompts_of({3, 6, 7, 20, 33}, 40);
  for (bool prefix : {false, true}) {
    SCOPED_TRACE(prefix ? "prefix caching" : "no prefix caching");
    auto e = make_engine(windowed, {.max_num_batched_tokens = 16, .enable_prefix_caching = prefix});
    expect_greedy_matches(e, prompts, greedy);
    expect_greedy_matches(e, prompts, greedy);  // the second time from the prefix cache
  }
  // Logprobs of a sampled continuation equal the model's.
  auto e = make_engine(windowed);
  SamplingParams p{.max_tokens = 16, .temperature = 1.0, .seed = 3, .ignore_eos = true, .logprobs = 1};
  auto prompt = random_prompt(21, 9);
  auto out = e.generate({prompt}, p);
  ASSERT_TRUE(out[0]) << describe(out[0].error());
  auto full = prompt;
  const auto& seq = out[0]->sequences[0];
  full.insert(full.end(), seq.tokens.begin(), seq.tokens.end());
  auto want = model_logprobs(e.model(), full);
  for (size_t i = 0; i < seq.tokens.size(); ++i) EXPECT_NEAR(seq.logprobs.chosen[i], want[prompt.size() - 1 + i], 1e-4) << i;
  // Preempted and recomputed sequences keep their window.
  const int64_t block_bytes = 2 * cfg->num_hidden_layers * 16 * cfg->num_key_value_heads * cfg->head_dim * 4;
  auto tight = make_engine(windowed, {.cache_bytes = 6 * block_bytes, .enable_prefix_caching = false});
  auto longer = greedy;
  longer.max_tokens = 40;
  expect_greedy_matches(tight, prompts_of({20, 9, 18, 13}, 50), longer);
  EXPECT_GT(tight.stats().preemptions, 0);
  // Without the window the same weights answer differently.
  auto full_cfg = *cfg;
  full_cfg.sliding_window = 0;
  full_cfg.sliding_layers.clear();
  auto plain = *CausalLM::init_random(full_cfg, 5);
  for (auto& [name, t] : plain.impl().params) t.copy_(windowed.impl().params.at(name));
  auto a = make_engine(windowed).generate(prompts, greedy);
  auto b = make_engine(plain).generate(prompts, greedy);
  int differ = 0;
  for (size_t i = 0; i < prompts.size(); ++i) differ += a[i]->sequences[0].tokens != b[i]->sequences[0].tokens;
  EXPECT_GT(differ, 0) << "the window changed no greedy output: the test would not notice it ignored";
}

}  // namespace
}  // namespace glint::components
