#pragma once
/// Environments for multi-turn rollouts: the world an agent acts in. An
/// episode starts from a dataset row (reset: the conversation's first
/// messages and the tools offered); each assistant turn is answered (step:
/// the tools' results or the next user message, a reward, whether the
/// episode is over):
///
///   auto env = rl::make_environment("builtin:calculator", {});
///   auto start = (*env)->reset(row.fields);            // messages, tools
///   auto reply = parse_tool_calls(text, format, start->tools);
///   auto next = (*env)->step({text, reply.calls, reply.errors});
///   // next->messages: tool results to render and append; next->reward, next->done
///
/// A program in any language is an environment (CommandEnvironment): it is
/// started once (under /bin/sh -c, in its own process group) and speaks JSON
/// lines, one request and one answer per line:
///
///   -> {"type": "reset", "row": {"question": "...", "answer": "..."}}
///   <- {"messages": [{"role": "user", "content": "..."}], "tools": [...]}
///   -> {"type": "step", "message": {"role": "assistant", "content": "...",
///       "tool_calls": [...]}, "errors": ["tool call 2: invalid JSON ..."]}
///   <- {"messages": [{"role": "tool", "content": "84"}], "reward": 0, "done": false}
///
/// What goes wrong is an error naming the environment and what it did: a
/// program that exits or is killed (its status), stays silent past the
/// timeout (it is killed), or answers a line that is not such JSON (the
/// line). The rollout ends that trajectory with the error and a zero reward;
/// nothing else stops. Not thread-safe: one trajectory drives one.

#include "components/data/dataset.hpp"
#include "components/data/tool_calls.hpp"
#include "runtime/error.hpp"

#include <nlohmann/json.hpp>

#include <chrono>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace glint::components::rl {

/// An episode's start.
struct EpisodeStart {
  nlohmann::ordered_json messages = nlohmann::ordered_json::array();  ///< the conversation so far
  nlohmann::ordered_json tools;                                       ///< null: none offered
};

/// An assistant turn, as the environment sees it.
struct AgentTurn {
  std::string content;               ///< the text outside tool calls
  std::vector<ToolCall> calls;       ///< parsed from what the model wrote
  std::vector<std::string> errors;   ///< calls that could not be read
};

/// The environment's answer to a turn.
struct StepResult {
  nlohmann::ordered_json messages = nlohmann::ordered_json::array();  ///< to append (tool results, a user turn)
  double reward = 0;
  bool done = false;
  std::map<std::string, double> metrics{};  ///< the environment's own (tool_calls, correct_calls, ...)
};

class Environment {
public:
  virtual ~Environment() = default;
  /// A new episode from a dataset row's fields.
  virtual Result<EpisodeStart> reset(const std::map<std::string, std::string>& row) = 0;
  virtual Result<StepResult> step(const AgentTurn& turn) = 0;
};

struct EnvironmentOptions {
  std::chrono::milliseconds timeout{std::chrono::seconds(30)};  ///< per answer
};

/// "builtin:calculator" (CalculatorEnvironment), or a shell command line (CommandEnvironment).
Result<std::unique_ptr<Environment>> make_environment(const std::string& spec, const EnvironmentOptions& options);

/// The JSON-lines program above. The process starts at the first reset and
/// is killed (its whole group) when the object goes.
class CommandEnvironment : public Environment {
public:
  CommandEnvironment(std::string command, EnvironmentOptions options);
  ~CommandEnvironment() override;
  CommandEnvironment(const CommandEnvironment&) = delete;
  CommandEnvironment& operator=(const CommandEnvironment&) = delete;

  Result<EpisodeStart> reset(const std::map<std::string, std::string>& row) override;
  Result<StepResult> step(const AgentTurn& turn) override;

private:
  Result<nlohmann::ordered_json> ask(const nlohmann::ordered_json& request);
  Result<void> start();
  void stop();

  std::string command_;
  EnvironmentOptions options_;
  int pid_ = -1, to_child_ = -1, from_child_ = -1;
  std::string pending_;  ///< bytes read past the last answer's line
};

/// builtin:calculator, on arithmetic rows (question, and answer ending
/// "#### n"): the model is offered a `calculator` tool ({"expression": "12*7"}:
/// + - * / and parentheses over decimal numbers); a call is answered with
/// its value (or what is wrong with it, for the model to see); a turn
/// without calls is the final answer, rewarded 1 when its last number is
/// the row's answer, else 0. Metrics: tool_calls, tool_calls_valid (called
/// well: known tool, an expression that evaluates).
class CalculatorEnvironment : public Environment {
public:
  Result<EpisodeStart> reset(const std::map<std::string, std::string>& row) override;
  Result<StepResult> step(const AgentTurn& turn) override;

  /// The calculator's arithmetic: the value, or what is wrong.
  static Result<double> evaluate(const std::string& expression);

private:
  std::string answer_;
};

/// SFT rows for builtin:calculator, from arithmetic rows (question, and an
/// answer ending "#### n"): each keeps its question and answer (so the same
/// file serves `glint grpo --env builtin:calculator --layout gsm8k`) and
/// gets the episode as messages and tools: the environment's first
/// messages, then, for a share `tool_share` of the rows (drawn with
/// `seed`), an assistant turn calling the calculator on the question's
/// expression, the tool's result and the final "#### n"; for the others
/// the row's worked answer without the tool. Rows whose question is not
/// "What is <expression>?" are left out.
std::vector<Row> calculator_rows(const std::vector<Row>& arithmetic, double tool_share, uint64_t seed);

}  // namespace glint::components::rl
