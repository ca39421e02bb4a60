// Multi-turn rollouts (AgentRunner) against a scripted sampler: the model's
// tokens are kept as sampled and the environment's messages appended as
// the chat template renders them (the whole context decodes to the
// template's rendering of the conversation), only the model's tokens are
// learned, tool calls are read in the template's format (Qwen 2.5's
// hermes, Llama 3.1's JSON, Qwen 3.5's XML), and every way a trajectory
// ends is named: done, max_turns, length, context, and the environment's
// crash, garbage or hang (error, reward 0, the others go on).
#include "actors/agents.hpp"

#include "components/data/agent_rows.hpp"
#include "runtime/file.hpp"
#include "support/temp_dir.hpp"
#include "support/tokenizers.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <fstream>
#include <set>

namespace glint::actors {
namespace {

using components::Template;
using components::Tokenizer;
using components::TokenizerConfig;

std::shared_ptr<const Template> chat_of(const std::string& name) {
  auto text = read_text_file(std::string{GLINT_TEST_SOURCE_DIR} + "/data/chat_templates/" + name + ".jinja");
  EXPECT_TRUE(text);
  TokenizerConfig config;
  config.chat_template = *text;
  config.chat_template_origin = name + ".jinja";
  auto t = Template::make(glint::testing::chat_tokenizer(std::move(config)), {.name = "jinja"});
  EXPECT_TRUE(t) << describe(t.error());
  return std::make_shared<const Template>(std::move(*t));
}

/// A sampler whose "model" writes a script: turn k (counted from the
/// assistant headers in the context) answers script[k], then the
/// end-of-turn token. Log-probabilities are -0.5 a token; every call and
/// its key are recorded.
class ScriptedBackend : public SamplerBackend {
public:
  ScriptedBackend(std::shared_ptr<const Template> chat, std::vector<std::string> script, std::string header)
      : chat_(std::move(chat)), script_(std::move(script)), header_(std::move(header)) {
    info_.name = "scripted";
    info_.ranks.resize(1);
  }
  const GroupInfo& info() const override { return info_; }
  Future<std::vector<SampledSequence>> sample(const std::vector<SampleRequest>& requests, const SamplingParams& params,
                                              const std::string&) override {
    return sample_on(~0ull, requests, params, "");
  }
  Future<std::vector<SampledSequence>> sample_on(uint64_t key, const std::vector<SampleRequest>& requests,
                                                 const SamplingParams& params, const std::string&) override {
    std::vector<SampledSequence> out;
    for (const auto& r : requests) {
      {
        std::lock_guard<std::mutex> guard{mx_};
        contexts.push_back(r.prompt);
        keys.push_back(key);
      }
      const auto& tok = chat_->tokenizer();
      const auto text = tok.decode(r.prompt, false);
      size_t turn = 0;
      for (size_t at = text.find(header_); at != std::string::npos; at = text.find(header_, at + 1)) ++turn;
      auto ids = *tok.encode(turn >= 1 && turn <= script_.size() ? script_[turn - 1] : "?");
      ids.push_back(chat_->end_of_turn_id());
      SampledSequence s;
      s.index = r.index;
      const auto n = std::min<int64_t>(static_cast<int64_t>(ids.size()), params.max_tokens);
      s.tokens.assign(ids.begin(), ids.begin() + n);
      s.logprobs.chosen.assign(static_cast<size_t>(n), -0.5f);
      s.stop_reason = n < static_cast<int64_t>(ids.size()) ? StopReason::length : StopReason::stop;
      s.stop_token = s.stop_reason == StopReason::stop ? s.tokens.back() : -1;
      out.push_back(std::move(s));
    }
    return Future<std::vector<SampledSequence>>::ready_with(std::move(out));
  }
  Result<std::vector<SampledSequence>> sample_streaming(const std::vector<SampleRequest>&, const SamplingParams&,
                                                        const std::string&,
                                                        std::function<void(const SampleChunk&)>) override {
    return make_error(errc::invalid_argument, "not scripted");
  }
  Future<void> update_weights(const NamedTensors&, const std::string&, int64_t, components::UpdatePolicy) override {
    return none();
  }
  Future<void> add_adapter(const std::string&, const LoraConfig&) override { return none(); }
  Future<void> load_adapter(const std::string&, const std::string&) override { return none(); }
  Future<void> remove_adapter(const std::string&) override { return none(); }
  Future<void> reset_prefix_cache() override { return none(); }
  Future<void> sleep() override { return none(); }
  Future<void> wake() override { return none(); }
  Future<int64_t> abort() override { return Future<int64_t>::ready_with(int64_t{0}); }
  Future<std::vector<Metrics>> stats() override { return Future<std::vector<Metrics>>::ready_with(std::vector<Metrics>{}); }

  std::mutex mx_;
  std::vector<std::vector<int64_t>> contexts;
  std::vector<uint64_t> keys;

private:
  static Future<void> none() { return Future<void>::ready_with(Result<void>{}); }
  GroupInfo info_;
  std::shared_ptr<const Template> chat_;
  std::vector<std::string> script_;
  std::string header_;
};

DataRow arithmetic_row() {
  DataRow r;
  r.fields = {{"question", "What is 6 * 7?"}, {"answer", "6 * 7 = 42\n#### 42"}};
  return r;
}

AgentRunner::MakeEnvironment calculator() {
  return [] { return components::rl::make_environment("builtin:calculator", {}); };
}

/// The tools the calculator offers, as the runner renders them.
std::string calculator_tools() {
  auto env = components::rl::make_environment("builtin:calculator", {});
  return (*env)->reset(arithmetic_row().fields)->tools.dump();
}

components::SamplingParams params(int64_t n = 2) {
  return {.num_samples = n, .max_tokens = 256, .temperature = 1.0, .seed = 5};
}

struct Case {
  const char* name;
  std::string call;    // the model's tool call, as the template's format writes it
  std::string header;  // what opens an assistant turn
  std::string glue;    // what the template writes after the end-of-turn token
};

class AgentsByTemplate : public ::testing::TestWithParam<Case> {};

TEST_P(AgentsByTemplate, KeepTheModelsTokensAndAppendTheRenderedObservations) {
  const auto& c = GetParam();
  auto chat = chat_of(c.name);
  auto backend = std::make_shared<ScriptedBackend>(chat, std::vector<std::string>{c.call, "The answer is 42."}, c.header);
  AgentRunner agents{SamplerGroup{backend}, chat, calculator(), {.max_turns = 4, .max_tokens = 4096}};
  auto runs = agents.run({arithmetic_row(), arithmetic_row()}, params()).take();
  ASSERT_TRUE(runs) << describe(runs.error());
  ASSERT_EQ(runs->size(), 4u);
  const auto& tok = chat->tokenizer();
  for (size_t i = 0; i < runs->size(); ++i) {
    const auto& t = (*runs)[i];
    SCOPED_TRACE(std::string{c.name} + ", trajectory " + std::to_string(i));
    EXPECT_EQ(t.index, static_cast<int64_t>(i / 2));
    EXPECT_EQ(t.sample, static_cast<int64_t>(i % 2));
    EXPECT_EQ(t.end, "done") << t.error;
    EXPECT_EQ(t.reward, 1.0);
    EXPECT_EQ(t.turns, 2);
    EXPECT_EQ(t.tool_calls, 1);
    EXPECT_EQ(t.tool_call_errors, 0);
    EXPECT_EQ(t.metrics.at("tool_calls_valid"), 1.0);
    ASSERT_EQ(t.messages.size(), 5u) << t.messages.dump();  // system, user, assistant (call), tool, assistant
    EXPECT_EQ(t.messages[2]["tool_calls"][0]["function"]["arguments"]["expression"], "6*7");
    EXPECT_EQ(t.messages[3]["content"], "42");
    // Token in, token out: the context is the template's rendering of the
    // conversation, the model's tokens as sampled.
    std::vector<int64_t> all = t.prompt;
    all.insert(all.end(), t.sequence.tokens.begin(), t.sequence.tokens.end());
    auto expected = chat->render(*components::agent_messages(t.messages, false), false, calculator_tools());
    ASSERT_TRUE(expected) << describe(expected.error());
    EXPECT_EQ(tok.decode(all, false) + c.glue, *expected);
    // Only the model's tokens are learned, and they are the script's.
    ASSERT_EQ(t.learned.size(), t.sequence.tokens.size());
    ASSERT_EQ(t.sequence.logprobs.chosen.size(), t.sequence.tokens.size());
    std::vector<int64_t> learned;
    for (size_t j = 0; j < t.learned.size(); ++j) {
      if (t.learned[j] == 1.f) learned.push_back(t.sequence.tokens[j]);
      EXPECT_EQ(t.sequence.logprobs.chosen[j], t.learned[j] == 1.f ? -0.5f : 0.f);
    }
    EXPECT_EQ(tok.decode(learned, false), c.call + tok.token_bytes(chat->end_of_turn_id()) + "The answer is 42." +
                                              tok.token_bytes(chat->end_of_turn_id()));
    EXPECT_GT(t.observation_tokens, 0);
  }
  // A conversation's turns go to one rank: a key per trajectory, the same each turn.
  ASSERT_EQ(backend->keys.size(), 8u);
  std::set<uint64_t> distinct(backend->keys.begin(), backend->keys.end());
  EXPECT_EQ(distinct.size(), 4u);
  // The training columns: every trajectory, its mask as learned.
  auto b = agent_batch(*runs, {1, -1, 0.5, -0.5});
  ASSERT_EQ(b.sequences.size(), 4u);
  auto batch = training_batch(b.prompts, b.sequences, {.advantages = b.advantages, .learned = b.learned});
  ASSERT_TRUE(batch) << describe(batch.error());
  double sum = 0;
  auto mask = *batch->tensors.at("loss_mask").values<float>();
  for (float v : mask) sum += v;
  double learned_total = 0;
  for (const auto& t : *runs) learned_total += static_cast<double>(std::count(t.learned.begin(), t.learned.end(), 1.f));
  EXPECT_EQ(sum, learned_total);
  // A mask that is not one per sequence, or not as long as its tokens, is an error.
  auto short_masks = b.learned;
  short_masks.pop_back();
  EXPECT_FALSE(training_batch(b.prompts, b.sequences, {.learned = short_masks}));
  auto cut = b.learned;
  cut[0].pop_back();
  EXPECT_FALSE(training_batch(b.prompts, b.sequences, {.learned = cut}));
  auto m = agent_metrics(*runs);
  EXPECT_EQ(m.at("turns/mean"), 2.0);
  EXPECT_EQ(m.at("end/done"), 1.0);
  EXPECT_EQ(m.at("env/tool_calls_valid/mean"), 1.0);
}

INSTANTIATE_TEST_SUITE_P(
    Templates, AgentsByTemplate,
    ::testing::Values(
        Case{"qwen2.5", "<tool_call>\n{\"name\": \"calculator\", \"arguments\": {\"expression\": \"6*7\"}}\n</tool_call>",
             "<|im_start|>assistant", "\n"},
        Case{"llama3.1-full", "{\"name\": \"calculator\", \"parameters\": {\"expression\": \"6*7\"}}",
             "<|start_header_id|>assistant", ""}),
    [](const auto& info) {
      std::string n = info.param.name;
      for (auto& ch : n)
        if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
      return n;
    });

// Runs one trajectory of the arithmetic row with `script` against `make`.
Trajectory one(std::vector<std::string> script, AgentRunner::MakeEnvironment make, AgentOptions options,
               int64_t max_tokens = 256) {
  auto chat = chat_of("qwen2.5");
  auto backend = std::make_shared<ScriptedBackend>(chat, std::move(script), "<|im_start|>assistant");
  AgentRunner agents{SamplerGroup{backend}, chat, std::move(make), options};
  auto p = params(1);
  p.max_tokens = max_tokens;
  auto runs = agents.run({arithmetic_row()}, p).take();
  EXPECT_TRUE(runs) << describe(runs.error());
  return runs && runs->size() == 1 ? runs->front() : Trajectory{};
}

const std::string kCall = "<tool_call>\n{\"name\": \"calculator\", \"arguments\": {\"expression\": \"6*7\"}}\n</tool_call>";

TEST(Agents, EveryEndIsNamed) {
  // The turns run out: the model calls the tool every turn.
  auto t = one({kCall, kCall, kCall}, calculator(), {.max_turns = 2, .max_tokens = 4096});
  EXPECT_EQ(t.end, "max_turns");
  EXPECT_EQ(t.turns, 2);
  EXPECT_EQ(t.reward, 0);
  // A turn cut at its token limit.
  t = one({kCall}, calculator(), {.max_turns = 4, .max_tokens = 4096}, 5);
  EXPECT_EQ(t.end, "length");
  EXPECT_EQ(t.sequence.tokens.size(), 5u);
  EXPECT_EQ(t.reward, 0);
  // An observation that overflows the trajectory: ends before it, nothing appended.
  auto whole = one({kCall, "42"}, calculator(), {.max_turns = 4, .max_tokens = 4096});
  ASSERT_EQ(whole.end, "done");
  const auto first_turn = std::count(whole.learned.begin(), whole.learned.end(), 1.f) - 2;  // "42" and its end token
  t = one({kCall, "42"}, calculator(),
          {.max_turns = 4, .max_tokens = static_cast<int64_t>(whole.prompt.size()) + first_turn + 3});
  EXPECT_EQ(t.end, "context");
  EXPECT_NE(t.error.find("leave no room"), std::string::npos) << t.error;
  EXPECT_EQ(t.observation_tokens, 0);
  EXPECT_EQ(t.reward, 0);
  // A malformed call is an error observation for the model, not a crash.
  t = one({"<tool_call>\n{\"name\": \"calculator\", \"arguments\": {\"expression\": }\n</tool_call>", "42"},
          calculator(), {.max_turns = 4, .max_tokens = 4096});
  EXPECT_EQ(t.end, "done");
  EXPECT_EQ(t.tool_call_errors, 1);
  ASSERT_GE(t.messages.size(), 4u);
  EXPECT_NE(t.messages[3]["content"].get<std::string>().find("error"), std::string::npos) << t.messages.dump();
  EXPECT_EQ(t.reward, 1.0);
}

TEST(Agents, AFailingEnvironmentEndsItsTrajectoryAndTheOthersGoOn) {
  auto dir = glint::testing::fresh_dir("agents-env");
  // Answers the reset, then does what $1 says at the first step.
  std::ofstream{dir + "/env.sh"} << "read line\n"
                                    "echo '{\"messages\": [{\"role\": \"user\", \"content\": \"6*7?\"}]}'\n"
                                    "read line\n"
                                    "case $1 in crash) exit 3;; garbage) echo 'not json';; hang) sleep 30;;\n"
                                    "  *) echo '{\"messages\": [], \"reward\": 1, \"done\": true}';; esac\n"
                                    "read line\n";
  for (std::string how : {"crash", "garbage", "hang"}) {
    SCOPED_TRACE(how);
    std::atomic<int> made{0};
    // Trajectory 0's environment fails; trajectory 1's answers.
    auto make = [&]() -> Result<std::unique_ptr<components::rl::Environment>> {
      const bool bad = made++ == 0;
      return components::rl::make_environment("sh " + dir + "/env.sh " + (bad ? how : std::string{"ok"}),
                                              {.timeout = std::chrono::milliseconds{500}});
    };
    auto chat = chat_of("qwen2.5");
    auto backend = std::make_shared<ScriptedBackend>(chat, std::vector<std::string>{"42"}, "<|im_start|>assistant");
    AgentRunner agents{SamplerGroup{backend}, chat, make, {.max_turns = 2, .max_tokens = 4096, .max_concurrent = 1}};
    auto runs = agents.run({arithmetic_row()}, params(2)).take();
    ASSERT_TRUE(runs) << describe(runs.error());
    ASSERT_EQ(runs->size(), 2u);
    EXPECT_EQ((*runs)[0].end, "error");
    EXPECT_NE((*runs)[0].error.find("step"), std::string::npos) << (*runs)[0].error;
    EXPECT_EQ((*runs)[0].reward, 0);
    EXPECT_EQ((*runs)[0].turns, 1);  // its sampled turn stays, to be trained with reward 0
    EXPECT_EQ((*runs)[1].end, "done") << (*runs)[1].error;
    EXPECT_EQ((*runs)[1].reward, 1.0);
  }
  // An environment whose reset fails: no prompt, nothing to learn, left out of the batch.
  auto broken = [&]() { return components::rl::make_environment("exit 4", {}); };
  auto t = one({"42"}, broken, {.max_turns = 2, .max_tokens = 4096});
  EXPECT_EQ(t.end, "error");
  EXPECT_NE(t.error.find("reset"), std::string::npos) << t.error;
  EXPECT_TRUE(agent_batch({t}, {1.0}).sequences.empty());
}

TEST(Agents, RefusesWhatCannotRun) {
  auto chat = chat_of("qwen2.5");
  auto backend = std::make_shared<ScriptedBackend>(chat, std::vector<std::string>{"42"}, "<|im_start|>assistant");
  AgentRunner agents{SamplerGroup{backend}, chat, calculator(), {}};
  EXPECT_FALSE(agents.run({}, params()).take());
  auto p = params();
  p.stop = {"\n"};
  auto r = agents.run({arithmetic_row()}, p).take();
  ASSERT_FALSE(r);
  EXPECT_NE(describe(r.error()).find("stop strings"), std::string::npos);
  AgentRunner zero{SamplerGroup{backend}, chat, calculator(), {.max_turns = 0}};
  EXPECT_FALSE(zero.run({arithmetic_row()}, params()).take());
}

}  // namespace
}  // namespace glint::actors
