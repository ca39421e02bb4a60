#pragma once
/// Multi-turn rollouts: an agent (the sampler's model) acting in an
/// environment (components/rl/environment.hpp) over several turns, with
/// tool calls, as veRL, slime and the Tinker cookbook train agents:
///
///   actors::AgentRunner agents{sampler, chat, [] { return rl::make_environment("builtin:calculator", {}); },
///                              {.max_turns = 4, .max_tokens = 1024}};
///   auto runs = agents.run(batch.rows, params).take();   // rows x params.num_samples trajectories
///   // (*runs)[i].sequence: its tokens after the prompt; .learned: 1 where the model sampled them
///   auto batch = actors::training_batch(prompts_of(*runs), sequences_of(*runs),
///                                       {.advantages = adv, .learned = learned_of(*runs)});
///
/// A trajectory is token in, token out. It starts from the environment's
/// reset (messages and tools), rendered with the model's own chat template
/// and a generation prompt. Each turn samples from everything so far; the
/// model's tokens are kept as sampled, never decoded and encoded again.
/// Its text is parsed for tool calls (the template's format) and the
/// environment's step answers them. Only the environment's messages are
/// rendered: the text the template adds after the assistant's turn (the
/// rest of its end-of-turn markup), the new messages, and the next
/// generation prompt, found as the part a render with the new messages
/// adds to one without. Those observation tokens stay in the context and
/// out of the loss (learned 0, log-probability 0).
///
/// Bounds: max_turns assistant turns; max_tokens per trajectory (prompt,
/// turns and observations), each turn sampling at most what is left of it
/// and the params' max_tokens; the environment's own timeout per answer.
/// How a trajectory ends is its `end`:
/// - done: the environment said so; its reward stands;
/// - max_turns: the turns ran out; the rewards so far stand;
/// - length: a turn stopped at its token limit before its end-of-turn
///   token (reward 0: the answer was cut);
/// - context: the next observation would not fit in max_tokens (reward 0);
/// - error: the environment crashed, hung or answered garbage, the sampler
///   refused the request, or the template rewrote the conversation's start
///   (reward 0, `error` says which). Nothing else stops: the other
///   trajectories go on.
///
/// Trajectories run concurrently (one thread each, at most
/// max_concurrent), so the sampler's continuous batching decodes their
/// turns together. Each conversation's turns go to one sampler rank
/// (SamplerGroup::sample_on), where its earlier turns are in the prefix
/// cache: a turn prefills only its observation. Draws are seeded by
/// (params.seed, row, sample, turn); which turns the engine batches
/// together depends on when environments answer, and logits differ in
/// their last bits with the batch, so a rerun is close, not bit for bit.
///
/// Environments are pooled: one serves one trajectory at a time and is
/// reused (a new reset) by later ones; one that failed is dropped, and a
/// new one made.

#include "actors/dataloader.hpp"
#include "actors/sampler_group.hpp"
#include "components/data/template.hpp"
#include "components/data/tool_calls.hpp"
#include "components/rl/environment.hpp"
#include "runtime/future.hpp"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace glint::actors {

struct AgentOptions {
  int64_t max_turns = 4;      ///< assistant turns per trajectory
  int64_t max_tokens = 2048;  ///< prompt, turns and observations together
  int64_t max_concurrent = 256;  ///< trajectories running at once
  /// The naive loop, as a baseline (glint bench rl --env): each turn samples
  /// from the conversation rendered and encoded afresh, the model's earlier
  /// turns re-tokenised from their text, instead of the tokens so far. The
  /// trajectory still records the sampled tokens; not for training.
  bool rerender = false;
};

/// One episode of one row.
struct Trajectory {
  int64_t index = 0;   ///< its row's position in the call's rows
  int64_t sample = 0;  ///< which of the row's num_samples
  std::vector<int64_t> prompt;  ///< the environment's first messages, rendered with a generation prompt
  /// The tokens after the prompt (turns and observations) and their
  /// log-probabilities (0 at observations); weight versions span its turns.
  SampledSequence sequence;
  std::vector<float> learned;  ///< per sequence token: 1 sampled, 0 observation
  double reward = 0;           ///< the environment's, summed over its steps (0 unless done or max_turns)
  std::string end;             ///< done, max_turns, length, context or error
  std::string error;           ///< with end "error": what went wrong
  int64_t turns = 0;
  int64_t tool_calls = 0;        ///< calls parsed from the model's turns
  int64_t tool_call_errors = 0;  ///< calls that could not be read
  int64_t observation_tokens = 0;
  int64_t prefill_tokens = 0;  ///< prompt tokens of its sample calls (turn 2 on: all but the observation are cached ideally)
  int64_t cached_tokens = 0;   ///< of them, what the prefix cache served
  std::map<std::string, double> metrics;  ///< the environment's, summed over steps
  nlohmann::ordered_json messages = nlohmann::ordered_json::array();  ///< the conversation as rendered
  double seconds = 0;
};

class AgentRunner {
public:
  using MakeEnvironment = std::function<Result<std::unique_ptr<components::rl::Environment>>()>;

  AgentRunner(SamplerGroup sampler, std::shared_ptr<const components::Template> chat, MakeEnvironment make,
              AgentOptions options);
  ~AgentRunner();
  AgentRunner(const AgentRunner&) = delete;
  AgentRunner& operator=(const AgentRunner&) = delete;

  /// rows x params.num_samples trajectories (row by row, as sample orders
  /// sequences), on threads of their own; the future completes when all
  /// have ended. Errors (the call's, not a trajectory's): bad options, no
  /// rows, params that do not validate, no end-of-turn token. params:
  /// max_tokens is per turn; stop_token_ids should hold the template's
  /// end-of-turn token (a turn that ends at any other is a final answer).
  Future<std::vector<Trajectory>> run(const std::vector<DataRow>& rows, const components::SamplingParams& params);

  /// The tool-call format parsed from turns (the template's).
  components::ToolCallFormat format() const { return format_; }

private:
  struct Pool;
  Trajectory episode(const DataRow& row, int64_t index, int64_t sample, const components::SamplingParams& params);

  SamplerGroup sampler_;
  std::shared_ptr<const components::Template> chat_;
  components::ToolCallFormat format_ = components::ToolCallFormat::none;
  AgentOptions options_;
  std::shared_ptr<Pool> pool_;
};

/// The columns training_batch takes, in the trajectories' order: each
/// trajectory's prompt (its sequence's index renumbered to it), sequence
/// and learned mask.
struct AgentBatch {
  std::vector<std::vector<int64_t>> prompts;
  std::vector<SampledSequence> sequences;
  std::vector<std::vector<float>> learned;
  std::vector<double> advantages;
};
/// Of `runs` with their advantages (one each), the trajectories with at
/// least one learned token (one that failed at its reset has none).
AgentBatch agent_batch(const std::vector<Trajectory>& runs, const std::vector<double>& advantages);

/// Means over trajectories: reward, turns, tool calls (and errors),
/// observation and learned tokens, each environment metric, the share of
/// each end, and the prefix cache's hit rate after the first turn.
std::map<std::string, double> agent_metrics(const std::vector<Trajectory>& runs);

}  // namespace glint::actors
