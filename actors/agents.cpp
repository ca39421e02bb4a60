#include "actors/agents.hpp"

#include "components/data/agent_rows.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <thread>

namespace glint::actors {

namespace {

using json = nlohmann::ordered_json;
using clock = std::chrono::steady_clock;

uint64_t mix(uint64_t x) {  // splitmix64's finaliser
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

/// A turn's seed from the call's, the row, the sample and the turn.
int64_t turn_seed(int64_t seed, int64_t index, int64_t sample, int64_t turn) {
  uint64_t h = mix(static_cast<uint64_t>(seed));
  for (int64_t v : {index, sample, turn}) h = mix(h ^ static_cast<uint64_t>(v));
  return static_cast<int64_t>(h & 0x7fffffffffffull);
}

bool starts_with(const std::string& s, const std::string& prefix) {
  return s.size() >= prefix.size() && s.compare(0, prefix.size(), prefix) == 0;
}

}  // namespace

struct AgentRunner::Pool {
  MakeEnvironment make;
  std::mutex mx;
  std::vector<std::unique_ptr<components::rl::Environment>> idle;
  /// run()'s threads and whether each is done: joined by the next run() or the runner's destructor.
  std::vector<std::pair<std::thread, std::shared_ptr<std::atomic<bool>>>> threads;

  Result<std::unique_ptr<components::rl::Environment>> acquire() {
    {
      std::lock_guard<std::mutex> guard{mx};
      if (!idle.empty()) {
        auto e = std::move(idle.back());
        idle.pop_back();
        return e;
      }
    }
    auto e = make();
    if (!e) return e.error();
    if (!*e) return make_error(errc::internal, "the environment factory made no environment");
    return e;
  }
  void release(std::unique_ptr<components::rl::Environment> e) {
    std::lock_guard<std::mutex> guard{mx};
    idle.push_back(std::move(e));
  }
};

AgentRunner::AgentRunner(SamplerGroup sampler, std::shared_ptr<const components::Template> chat, MakeEnvironment make,
                         AgentOptions options)
    : sampler_(std::move(sampler)), chat_(std::move(chat)), options_(options), pool_(std::make_shared<Pool>()) {
  pool_->make = std::move(make);
  if (chat_) {
    const auto& t = chat_->tokenizer().config().chat_template;
    format_ = t ? components::tool_call_format_of(*t) : components::ToolCallFormat::none;
  }
}

AgentRunner::~AgentRunner() {
  std::vector<std::pair<std::thread, std::shared_ptr<std::atomic<bool>>>> threads;
  {
    std::lock_guard<std::mutex> guard{pool_->mx};
    threads.swap(pool_->threads);
  }
  for (auto& t : threads) t.first.join();
}

Trajectory AgentRunner::episode(const DataRow& row, int64_t index, int64_t sample,
                                const components::SamplingParams& params) {
  const auto start = clock::now();
  Trajectory t;
  t.index = index;
  t.sample = sample;
  t.sequence.index = index;
  t.sequence.sample = sample;
  t.sequence.stop_reason = StopReason::stop;
  const auto& tok = chat_->tokenizer();
  const int64_t eot = chat_->end_of_turn_id();
  const std::string eot_text = tok.token_bytes(eot);
  std::unique_ptr<components::rl::Environment> env;
  auto end = [&](std::string how, std::string why = {}) {
    t.end = std::move(how);
    t.error = std::move(why);
    if (t.end == "length" || t.end == "context" || t.end == "error") t.reward = 0;
    // A failed environment is dropped (its process killed); a sound one serves the next episode.
    if (env && t.end != "error") pool_->release(std::move(env));
    t.seconds = std::chrono::duration<double>(clock::now() - start).count();
    return std::move(t);
  };
  auto made = pool_->acquire();
  if (!made) return end("error", "starting the environment: " + context_of(made.error()));
  env = std::move(*made);
  auto reset = env->reset(row.fields);
  if (!reset) return end("error", "the environment's reset: " + context_of(reset.error()));
  t.messages = reset->messages;
  const json tools = reset->tools;
  const std::string tools_text = tools.is_null() ? std::string{} : tools.dump();
  // The conversation rendered with the model's template.
  auto render = [&](const json& messages, bool generation_prompt) -> Result<std::string> {
    auto m = components::agent_messages(messages, false);
    if (!m) return m.error();
    return chat_->render(*m, generation_prompt, tools_text);
  };
  auto first = render(t.messages, true);
  if (!first) return end("error", "rendering the environment's first messages: " + context_of(first.error()));
  auto prompt = tok.encode(*first);
  if (!prompt) return end("error", "encoding the environment's first messages: " + context_of(prompt.error()));
  t.prompt = std::move(*prompt);
  if (static_cast<int64_t>(t.prompt.size()) >= options_.max_tokens)
    return end("context", "the first messages are " + std::to_string(t.prompt.size()) + " tokens, the trajectory's " +
                              "limit is " + std::to_string(options_.max_tokens));
  std::vector<int64_t> context = t.prompt;
  const uint64_t key = static_cast<uint64_t>(index * params.num_samples + sample);
  auto& seq = t.sequence;
  for (int64_t turn = 0;; ++turn) {
    if (turn >= options_.max_turns) return end("max_turns");
    if (options_.rerender && turn > 0) {
      auto text = render(t.messages, true);
      auto ids = text ? tok.encode(*text) : Result<std::vector<int64_t>>{text.error()};
      if (!ids) return end("error", "re-rendering the conversation: " + context_of(ids.error()));
      context = std::move(*ids);
    }
    auto p = params;
    p.num_samples = 1;
    p.max_tokens = std::min<int64_t>(params.max_tokens, options_.max_tokens - static_cast<int64_t>(context.size()));
    p.seed = turn_seed(params.seed, index, sample, turn);
    auto got = sampler_.sample_on(key, {SampleRequest{.index = index, .prompt = context}}, p).take();
    const std::string at = "turn " + std::to_string(turn + 1);
    if (!got) return end("error", "sampling " + at + ": " + context_of(got.error()));
    if (got->size() != 1) return end("error", "sampling " + at + ": " + std::to_string(got->size()) + " sequences for one request");
    auto& s = got->front();
    if (!s.error.empty()) return end("error", "sampling " + at + " was refused: " + s.error);
    if (s.stop_reason == StopReason::abort) return end("error", "sampling " + at + " was aborted");
    if (turn > 0) {
      t.prefill_tokens += static_cast<int64_t>(context.size());
      t.cached_tokens += s.cached_tokens;
      seq.first_weight_version = std::min(seq.first_weight_version, s.first_weight_version);
    } else {
      seq.first_weight_version = s.first_weight_version;
    }
    seq.weight_version = s.weight_version;
    seq.tokens.insert(seq.tokens.end(), s.tokens.begin(), s.tokens.end());
    seq.logprobs.chosen.insert(seq.logprobs.chosen.end(), s.logprobs.chosen.begin(), s.logprobs.chosen.end());
    t.learned.insert(t.learned.end(), s.tokens.size(), 1.f);
    context.insert(context.end(), s.tokens.begin(), s.tokens.end());
    ++t.turns;
    seq.stop_reason = s.stop_reason;
    seq.stop_token = s.stop_token;
    if (s.stop_reason == StopReason::length) return end("length");
    // What the model wrote, as text, and the calls in it.
    const std::string text = tok.decode(s.tokens, true);
    auto reply = components::parse_tool_calls(text, format_, tools);
    t.tool_calls += static_cast<int64_t>(reply.calls.size());
    t.tool_call_errors += static_cast<int64_t>(reply.errors.size());
    json assistant = {{"role", "assistant"}, {"content", reply.calls.empty() ? text : reply.content}};
    if (!reply.calls.empty()) assistant["tool_calls"] = components::to_openai(reply.calls);
    t.messages.push_back(assistant);
    auto step = env->step({.content = reply.calls.empty() ? text : reply.content, .calls = reply.calls,
                           .errors = reply.errors});
    if (!step) return end("error", "the environment's step after " + at + ": " + context_of(step.error()));
    t.reward += step->reward;
    for (const auto& [k, v] : step->metrics) t.metrics[k] += v;
    if (step->done) return end("done");
    if (turn + 1 >= options_.max_turns) return end("max_turns");
    // The observation: the rest of the turn's markup as the template
    // writes it, then what the new messages add, generation prompt included.
    auto base = render(t.messages, false);
    for (const auto& m : step->messages) t.messages.push_back(m);
    auto full = base ? render(t.messages, true) : base;
    if (!full) return end("error", "rendering the environment's messages after " + at + ": " + context_of(full.error()));
    if (!starts_with(*full, *base))
      return end("error", "the chat template renders the conversation before the environment's messages after " + at +
                              " differently once they follow, so they cannot be appended to the model's tokens; "
                              "multi-turn rollouts need a template that renders a conversation's start the same "
                              "whatever follows");
    std::string glue;
    if (const auto pos = eot_text.empty() ? std::string::npos : base->rfind(eot_text); pos != std::string::npos)
      glue = base->substr(pos + eot_text.size());
    // A turn that stopped at another token (eos) gets the end-of-turn token too.
    const bool at_eot = !s.tokens.empty() && s.tokens.back() == eot;
    auto obs = tok.encode((at_eot ? "" : eot_text) + glue + full->substr(base->size()));
    if (!obs) return end("error", "encoding the environment's messages after " + at + ": " + context_of(obs.error()));
    if (static_cast<int64_t>(context.size() + obs->size()) >= options_.max_tokens)
      return end("context", "the environment's messages after " + at + " are " + std::to_string(obs->size()) +
                                " tokens; with the " + std::to_string(context.size()) +
                                " before them they leave no room in the trajectory's " +
                                std::to_string(options_.max_tokens));
    seq.tokens.insert(seq.tokens.end(), obs->begin(), obs->end());
    seq.logprobs.chosen.insert(seq.logprobs.chosen.end(), obs->size(), 0.f);
    t.learned.insert(t.learned.end(), obs->size(), 0.f);
    context.insert(context.end(), obs->begin(), obs->end());
    t.observation_tokens += static_cast<int64_t>(obs->size());
  }
}

Future<std::vector<Trajectory>> AgentRunner::run(const std::vector<DataRow>& rows,
                                                 const components::SamplingParams& params) {
  using Out = Future<std::vector<Trajectory>>;
  if (!chat_) return Out::ready_with(make_error(errc::invalid_argument, "multi-turn rollouts need a chat template"));
  if (rows.empty()) return Out::ready_with(make_error(errc::invalid_argument, "no rows to run episodes of"));
  if (options_.max_turns < 1 || options_.max_tokens < 2 || options_.max_concurrent < 1)
    return Out::ready_with(make_error(errc::invalid_argument,
                                      "agent options: max_turns >= 1, max_tokens >= 2 and max_concurrent >= 1"));
  if (auto ok = params.validate(); !ok) return Out::ready_with(ok.error());
  if (chat_->end_of_turn_id() < 0)
    return Out::ready_with(make_error(errc::invalid_argument, "the chat template has no end-of-turn token to stop turns at"));
  if (!params.stop.empty())
    return Out::ready_with(make_error(errc::invalid_argument,
                                      "stop strings do not apply to multi-turn rollouts: a turn ends at the template's "
                                      "end-of-turn token, and its tokens are kept as sampled"));
  struct Job {
    std::vector<DataRow> rows;
    components::SamplingParams params;
    std::vector<Trajectory> out;
    std::atomic<size_t> next{0};
  };
  auto job = std::make_shared<Job>();
  job->rows = rows;
  job->params = params;
  const auto g = static_cast<size_t>(params.num_samples);
  job->out.resize(rows.size() * g);
  auto state = std::make_shared<glint::detail::FutureState<std::vector<Trajectory>>>();
  const size_t workers = std::min(job->out.size(), static_cast<size_t>(options_.max_concurrent));
  std::lock_guard<std::mutex> guard{pool_->mx};
  auto& threads = pool_->threads;
  for (auto it = threads.begin(); it != threads.end();)
    if (it->second->load()) {
      it->first.join();
      it = threads.erase(it);
    } else {
      ++it;
    }
  auto finished = std::make_shared<std::atomic<bool>>(false);
  threads.emplace_back(std::thread{[this, job, state, workers, g, finished] {
                         std::vector<std::thread> pool;
                         for (size_t w = 0; w < workers; ++w)
                           pool.emplace_back([this, job, g] {
                             for (size_t i = job->next++; i < job->out.size(); i = job->next++)
                               job->out[i] = episode(job->rows[i / g], static_cast<int64_t>(i / g),
                                                     static_cast<int64_t>(i % g), job->params);
                           });
                         for (auto& t : pool) t.join();
                         state->set(std::move(job->out));
                         finished->store(true);
                       }},
                       finished);
  return Out{state};
}

AgentBatch agent_batch(const std::vector<Trajectory>& runs, const std::vector<double>& advantages) {
  AgentBatch b;
  for (size_t i = 0; i < runs.size(); ++i) {
    const auto& r = runs[i];
    if (std::count(r.learned.begin(), r.learned.end(), 1.f) == 0 || r.prompt.empty()) continue;
    b.prompts.push_back(r.prompt);
    b.sequences.push_back(r.sequence);
    b.sequences.back().index = static_cast<int64_t>(b.prompts.size() - 1);
    b.learned.push_back(r.learned);
    if (i < advantages.size()) b.advantages.push_back(advantages[i]);
  }
  return b;
}

std::map<std::string, double> agent_metrics(const std::vector<Trajectory>& runs) {
  std::map<std::string, double> m;
  if (runs.empty()) return m;
  const double n = static_cast<double>(runs.size());
  double prefill = 0, cached = 0;
  std::map<std::string, double> env;
  for (const auto& r : runs) {
    m["turns/mean"] += static_cast<double>(r.turns) / n;
    m["tool_calls/mean"] += static_cast<double>(r.tool_calls) / n;
    m["tool_call_errors/mean"] += static_cast<double>(r.tool_call_errors) / n;
    m["observation_tokens/mean"] += static_cast<double>(r.observation_tokens) / n;
    m["learned_tokens/mean"] += static_cast<double>(std::count(r.learned.begin(), r.learned.end(), 1.f)) / n;
    m["trajectory_seconds/mean"] += r.seconds / n;
    m["end/" + r.end] += 1 / n;
    for (const auto& [k, v] : r.metrics) env[k] += v;
    prefill += static_cast<double>(r.prefill_tokens);
    cached += static_cast<double>(r.cached_tokens);
  }
  for (const char* e : {"done", "max_turns", "length", "context", "error"}) m.emplace(std::string{"end/"} + e, 0.0);
  for (const auto& [k, v] : env) m["env/" + k + "/mean"] = v / n;
  m["prefix_cache/hit_rate"] = prefill > 0 ? cached / prefill : 0;
  return m;
}

}  // namespace glint::actors
