// The sampler rank's state driven directly: the test plays the actor's
// part (it runs the steps the state asks for), so continuous batching,
// streaming, refusals, staged weight updates and aborts are checked without
// an actor system.
#include "actors/sampler_state.hpp"

#include "runtime/stop.hpp"

#include <gtest/gtest.h>

#include <deque>

namespace glint::actors {
namespace {

components::ModelConfig tiny() {
  return components::ModelConfig::make(components::Architecture::qwen3, 64, 16, 32, 2, 4, 2);
}

const SamplingParams greedy{.num_samples = 2, .max_tokens = 4, .temperature = 0, .ignore_eos = true};

struct Driver {
  std::deque<uint64_t> steps;
  SamplerState st{RankContext{.group = "sampler"},
                  {.config_json = tiny().to_json(), .seed = 3, .cache_bytes = 1 << 20},
                  [this](uint64_t loop) { steps.push_back(loop); }};

  /// Runs the steps asked for until none is (bounded: a stuck loop fails).
  void run() {
    for (int i = 0; i < 1000 && !steps.empty(); ++i) {
      auto loop = steps.front();
      steps.pop_front();
      st.step(loop);
    }
    EXPECT_TRUE(steps.empty()) << "the step loop did not end";
  }

  std::optional<Result<std::vector<SampledSequence>>> sample(const std::vector<std::vector<int64_t>>& prompts,
                                                             const SamplingParams& p,
                                                             SamplerState::OnChunk on_chunk = nullptr) {
    std::optional<Result<std::vector<SampledSequence>>> out;
    st.sample(requests_of(prompts), p, "", std::move(on_chunk), [&](auto r) { out = std::move(r); });
    run();
    return out;
  }
};

TEST(SamplerState, AnswersEveryRequestInOrderOnceItsStepsRan) {
  Driver d;
  auto out = d.sample({{1, 2, 3}, {4, 5}}, greedy);
  ASSERT_TRUE(out) << "answered once the loop ran dry";
  ASSERT_TRUE(*out) << describe(out->error());
  ASSERT_EQ((*out)->size(), 4u);
  for (size_t i = 0; i < 4; ++i) {
    const auto& s = (**out)[i];
    EXPECT_EQ(s.index, static_cast<int64_t>(i / 2));
    EXPECT_EQ(s.sample, static_cast<int64_t>(i % 2));
    EXPECT_EQ(s.tokens.size(), 4u);
    EXPECT_EQ(s.logprobs.chosen.size(), 4u) << "chosen log-probabilities are always recorded";
    EXPECT_EQ(s.stop_reason, StopReason::length);
  }
  EXPECT_EQ((**out)[0].tokens, (**out)[1].tokens) << "greedy samples of one prompt agree";
  EXPECT_EQ(d.st.stats()->at("calls"), 0);
}

TEST(SamplerState, CallsArrivingBetweenStepsShareTheLoop) {
  Driver d;
  std::optional<Result<std::vector<SampledSequence>>> a, b;
  d.st.sample(requests_of({{1, 2, 3}}), greedy, "", nullptr, [&](auto r) { a = std::move(r); });
  ASSERT_EQ(d.steps.size(), 1u) << "the first call starts the loop";
  d.st.sample(requests_of({{7, 8}}), greedy, "", nullptr, [&](auto r) { b = std::move(r); });
  EXPECT_EQ(d.steps.size(), 1u) << "the second joins it instead of starting another";
  d.st.step(d.steps.front() + 1);  // a stray step of another loop is ignored
  d.run();
  ASSERT_TRUE(a && *a);
  ASSERT_TRUE(b && *b);
  EXPECT_EQ((*b)->at(0).tokens.size(), 4u);
}

// A long step loop is not silent: it says how many of its sequences are
// done (the 768k-sample GRPO step ran 150 s without a word). With no
// interval, a line after every step but the first; the counts climb to
// what was asked, and a loop that ran dry says nothing more.
TEST(SamplerState, ALongStepLoopSaysHowFarItIs) {
  Driver d;
  std::vector<std::string> said;
  d.st.report_progress(std::chrono::milliseconds(0), [&](const std::string& s) { said.push_back(s); });
  const SamplingParams p{.num_samples = 2, .max_tokens = 6, .temperature = 0, .ignore_eos = true};
  auto out = d.sample({{1, 2, 3}, {4, 5}, {6}}, p);
  ASSERT_TRUE(out && *out);
  ASSERT_FALSE(said.empty());
  EXPECT_NE(said.front().find("sampler group 'sampler': sampling: 0 of 6 sequences finished after"), std::string::npos)
      << said.front();
  EXPECT_NE(said.front().find("tokens generated)"), std::string::npos) << said.front();
  const auto n = said.size();
  EXPECT_TRUE(d.sample({{1}}, greedy));
  EXPECT_NE(said.at(n).find("0 of 2 sequences"), std::string::npos) << "a new loop counts afresh: " << said.at(n);
  // Every 10 s by default: a short loop says nothing.
  Driver quiet;
  std::vector<std::string> none;
  quiet.st.report_progress(std::chrono::milliseconds(10000), [&](const std::string& s) { none.push_back(s); });
  EXPECT_TRUE(quiet.sample({{1, 2}}, p));
  EXPECT_TRUE(none.empty());
}

TEST(SamplerState, StreamedChunksEndOncePerSequenceAndRefusalsFailOnlyTheirRequest) {
  Driver d;
  std::map<std::pair<int64_t, int64_t>, std::vector<int64_t>> streamed;
  std::map<std::pair<int64_t, int64_t>, int> finished;
  auto out = d.sample({{1, 2}, {}, {3}}, greedy, [&](SampleChunk c) {
    auto& t = streamed[{c.index, c.sample}];
    t.insert(t.end(), c.tokens.begin(), c.tokens.end());
    finished[{c.index, c.sample}] += c.finished;
  });
  ASSERT_TRUE(out && *out);
  for (const auto& s : **out) {
    EXPECT_EQ((finished[{s.index, s.sample}]), 1) << s.index << "/" << s.sample;
    EXPECT_EQ((streamed[{s.index, s.sample}]), s.tokens);
    if (s.index == 1) EXPECT_NE(s.error.find("empty"), std::string::npos) << s.error;
    else EXPECT_TRUE(s.error.empty()) << s.error;
  }
}

TEST(SamplerState, CallWideErrorsAreAnsweredAtOnceWithTheRankNamed) {
  Driver d;
  auto bad = d.sample({{1}}, {.temperature = -1});
  ASSERT_TRUE(bad);
  ASSERT_FALSE(*bad);
  EXPECT_NE(describe(bad->error()).find("rank 0 of sampler group 'sampler'"), std::string::npos);
  ASSERT_TRUE(d.st.engine());
  ASSERT_TRUE((*d.st.engine())->sleep());
  auto asleep = d.sample({{1}}, greedy);
  ASSERT_TRUE(asleep && !*asleep);
  EXPECT_EQ(code_of(asleep->error()), errc::failed_precondition);
  ASSERT_TRUE(d.st.wake());
  auto ok = d.sample({{1}}, greedy);
  EXPECT_TRUE(ok && *ok);
}

TEST(SamplerState, StagedBucketsApplyWithTheirVersionAndStaleOnesAreDropped) {
  Driver d;
  auto lm = components::CausalLM::init_random(tiny(), 11);
  ASSERT_TRUE(lm);
  auto named = *lm->named_parameters();
  NamedTensors first(named.begin(), named.begin() + 2), rest(named.begin() + 2, named.end());
  ASSERT_TRUE(d.st.stage_weights(NamedTensors{named.begin(), named.begin() + 1}, 4)) << "a stale version";
  ASSERT_TRUE(d.st.stage_weights(first, 5));
  ASSERT_TRUE(d.st.update_weights(rest, {.version = 5}));
  d.run();
  EXPECT_EQ(d.st.stats()->at("weight_version"), 5);
  // The new weights sample what the model they came from predicts.
  auto engine = components::Engine::create(*lm, {.cache_bytes = 1 << 20});
  ASSERT_TRUE(engine);
  auto want = engine->generate({{1, 2, 3}}, greedy);
  auto got = d.sample({{1, 2, 3}}, greedy);
  ASSERT_TRUE(got && *got && want[0]);
  EXPECT_EQ((*got)->at(0).tokens, want[0]->sequences[0].tokens);
  EXPECT_EQ((*got)->at(0).weight_version, 5);

  auto bad_policy = d.st.update_weights({}, {.version = 6, .policy = static_cast<UpdatePolicy>(9)});
  ASSERT_FALSE(bad_policy);
  EXPECT_EQ(code_of(bad_policy.error()), errc::invalid_argument);
}

TEST(SamplerState, AnAnswerOverTheMessageLimitIsAClearError) {
  Driver d;
  const auto limit = max_message_bytes();
  set_max_message_bytes(200);  // what every process of a job installs from Options::max_message_bytes
  auto big = d.sample({{1, 2}, {3}}, greedy);
  set_max_message_bytes(limit);
  ASSERT_TRUE(big);
  ASSERT_FALSE(*big);
  EXPECT_EQ(code_of(big->error()), errc::resource_exhausted);
  EXPECT_NE(describe(big->error()).find("max_message_bytes"), std::string::npos) << describe(big->error());
  auto ok = d.sample({{1, 2}, {3}}, greedy);
  EXPECT_TRUE(ok && *ok) << "under the limit again";
}

TEST(SamplerState, AbortEndsRequestsInFlightAndAnswersTheirCalls) {
  Driver d;
  std::optional<Result<std::vector<SampledSequence>>> out;
  d.st.sample(requests_of({{1, 2}, {3}}), {.max_tokens = 50, .temperature = 0, .ignore_eos = true}, "", nullptr,
              [&](auto r) { out = std::move(r); });
  auto n = d.st.abort_all();
  ASSERT_TRUE(n);
  EXPECT_EQ(*n, 2);
  ASSERT_TRUE(out && *out) << "the call is answered by the abort";
  for (const auto& s : **out) EXPECT_EQ(s.stop_reason, StopReason::abort);
  d.run();
}

// Once the driver has returned (run_main asks for a stop), the next step
// answers every call in flight with aborted and the loop ends.
TEST(SamplerState, AStopRequestAnswersTheCallsInFlightAtTheNextStep) {
  Driver d;
  std::optional<Result<std::vector<SampledSequence>>> out;
  d.st.sample(requests_of({{1, 2}, {3}}), {.max_tokens = 50, .temperature = 0, .ignore_eos = true}, "", nullptr,
              [&](auto r) { out = std::move(r); });
  request_stop();
  d.run();
  request_stop(false);
  ASSERT_TRUE(out) << "answered";
  ASSERT_FALSE(*out);
  EXPECT_EQ(code_of(out->error()), errc::aborted);
  EXPECT_EQ(d.st.stats()->at("calls"), 0);
  auto again = d.sample({{1, 2}}, greedy);
  ASSERT_TRUE(again);
  EXPECT_TRUE(*again) << "served again once the stop is withdrawn";
}

}  // namespace
}  // namespace glint::actors
