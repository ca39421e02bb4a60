// `glint grpo`: reinforcement learning of a user's Hugging Face model on the
// user's prompts with a GRPO-family loss, LoRA or full, as a driver on the
// public API (the loop of examples/grpo, without its made-up model and data).
//
// Each step: the sampler group generates --num-generations completions of
// --prompts-per-step prompts, the rewards score them (accuracy and format
// for GSM8K-style answers, and/or a user's command), advantages are
// normalised within each prompt's group, the model group trains on the
// completions against the sampler's log-probabilities (old_logps), and
// every --sync-every steps the trained weights (the adapter, or the whole
// model) go to the sampler. With --max-staleness N, an actors::RolloutPipeline
// samples the next steps' batches while the model trains (weights synced
// every step, each batch at most N updates stale). As glint sft, everything that can be checked is
// checked before anything is written; the run directory holds config.toml,
// data/, checkpoints, metrics.jsonl, report.html, last/ and, with
// evaluation, best/ (the checkpoint with the highest greedy reward on the
// validation prompts).
#include "launcher/recipe_common.hpp"

#include "actors/agents.hpp"
#include "actors/checkpoint_engine.hpp"
#include "actors/dataloader_group.hpp"
#include "actors/rollout.hpp"
#include "actors/sampler_group.hpp"
#include "components/rl/environment.hpp"
#include "components/rl/metrics.hpp"
#include "components/rl/reward_command.hpp"
#include "components/rl/rewards.hpp"
#include "placement/service.hpp"
#include "runtime/memory.hpp"
#include "runtime/progress.hpp"
#include "runtime/report.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>

namespace glint::launcher {

namespace {

namespace fs = std::filesystem;
using components::Row;

const std::string kName = "grpo";

int refuse(const std::string& why) { return recipe::refuse(kName, why); }
int fail(const std::string& what, const caf::error& e) { return recipe::fail(kName, what, e); }

/// The rewards of the flags: names in order, their weights, the command.
struct Rewards {
  std::vector<std::string> names;  ///< accuracy, format, command
  std::vector<double> weights;
  components::rl::RewardCommand command;
  const components::Tokenizer* tokenizer = nullptr;  ///< renders prompts for the command

  /// Each reward's scores and their weighted sum ("total").
  Result<std::map<std::string, std::vector<double>>> score(const std::vector<actors::DataRow>& rows, int64_t per_row,
                                                           const std::vector<actors::SampledSequence>& seqs) const {
    std::vector<std::string> texts, solutions;
    for (const auto& s : seqs) texts.push_back(s.text);
    for (const auto& r : rows)
      for (int64_t g = 0; g < per_row; ++g) solutions.push_back(r.fields.count("solution") ? r.fields.at("solution") : "");
    std::map<std::string, std::vector<double>> out;
    for (const auto& name : names) {
      if (name == "accuracy") {
        auto acc = components::rl::gsm8k_accuracy(texts, solutions);
        if (!acc) return acc.error();
        out[name] = std::move(*acc);
      } else if (name == "format") {
        out[name] = components::rl::gsm8k_format(texts);
      } else {
        std::vector<components::rl::RewardInput> inputs;
        for (size_t i = 0; i < seqs.size(); ++i) {
          const auto& row = rows[i / static_cast<size_t>(per_row)];
          inputs.push_back({.prompt = tokenizer->decode(row.input_ids, false), .completion = texts[i], .fields = row.fields});
        }
        auto scores = components::rl::run_reward_command(command, inputs);
        if (!scores) return scores.error();
        out[name] = std::move(*scores);
      }
    }
    std::vector<double> total(seqs.size(), 0.0);
    for (size_t k = 0; k < names.size(); ++k)
      for (size_t i = 0; i < total.size(); ++i) total[i] += weights[k] * out[names[k]][i];
    out["total"] = std::move(total);
    return out;
  }
};

/// Prompts of `rows`, and the sampler's requests for them.
std::vector<std::vector<int64_t>> prompt_ids(const std::vector<actors::DataRow>& rows) {
  std::vector<std::vector<int64_t>> out;
  for (const auto& r : rows) out.push_back(r.input_ids);
  return out;
}

std::vector<int64_t> completion_lengths(const std::vector<actors::SampledSequence>& seqs) {
  std::vector<int64_t> out;
  for (const auto& s : seqs) out.push_back(static_cast<int64_t>(s.tokens.size()));
  return out;
}

/// With --env: each episode's reward, as "env" and "total".
std::map<std::string, std::vector<double>> episode_scores(const std::vector<actors::Trajectory>& runs) {
  std::vector<double> r;
  for (const auto& t : runs) r.push_back(t.reward);
  return {{"env", r}, {"total", r}};
}

std::vector<int64_t> learned_lengths(const std::vector<actors::Trajectory>& runs) {
  std::vector<int64_t> out;
  for (const auto& t : runs) out.push_back(static_cast<int64_t>(std::count(t.learned.begin(), t.learned.end(), 1.f)));
  return out;
}

/// Appends the first episode of each prompt's group to `path`
/// (episodes.jsonl): what the agent did, as the conversation and its end.
void log_episodes(const std::string& path, int64_t step, const std::vector<actors::Trajectory>& runs) {
  std::ofstream out{path, std::ios::app};
  for (const auto& t : runs) {
    if (t.sample != 0) continue;
    nlohmann::ordered_json j{{"step", step}, {"prompt", t.index}, {"reward", t.reward}, {"end", t.end}};
    if (!t.error.empty()) j["error"] = t.error;
    j["messages"] = t.messages;
    out << j.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace) << '\n';
  }
}

/// A run that starts (again) after step `kept` drops the episodes of later
/// steps, which it will run again: episodes.jsonl goes with metrics.jsonl.
void keep_episodes(const std::string& path, int64_t kept) {
  std::ifstream in{path};
  if (!in) return;
  std::string line, text;
  while (std::getline(in, line)) {
    auto j = nlohmann::json::parse(line, nullptr, false);
    if (!j.is_discarded() && j.is_object() && j.value("step", int64_t{0}) <= kept) text += line + "\n";
  }
  in.close();
  const auto tmp = path + ".tmp";
  {
    std::ofstream out{tmp, std::ios::trunc};
    out << text;
  }
  std::error_code ec;
  fs::rename(tmp, path, ec);
}

/// Asynchronous episodes: what the rollout pipeline's sample hook ran, by
/// step, until the step trains.
struct EpisodeTable {
  std::mutex mx;
  std::map<int64_t, std::vector<actors::Trajectory>> runs;
};

/// The first refused request of a sample call, as an error.
Result<void> check_sampled(const std::vector<actors::SampledSequence>& seqs) {
  for (const auto& s : seqs)
    if (!s.error.empty())
      return make_error(errc::invalid_argument, "prompt " + std::to_string(s.index) + " was refused: " + s.error);
  return {};
}

}  // namespace

CLI::App* add_grpo(CLI::App& app, GrpoArgs& a) {
  auto* c = app.add_subcommand(
      "grpo", "Reinforcement learning of your Hugging Face model on your prompts (GRPO, GSPO, Dr. GRPO, CISPO)");
  recipe::add_model_flags(c, a);
  recipe::add_data_flags(c, a, "prompts");
  c->add_option("--layout", a.layout, "Prompt layout: auto, gsm8k, prompt, messages or query_response")
      ->capture_default_str()
      ->check(CLI::IsMember(components::preprocess::prompt_layout_names()));
  c->add_option("--max-prompt-length", a.max_prompt_length, "Tokens per prompt")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 24));
  c->add_option("--truncation", a.truncation, "Prompts over --max-prompt-length: refuse (skip them) or left")
      ->capture_default_str()
      ->check(CLI::IsMember({"refuse", "left"}));
  c->add_option("--prompts-per-step", a.prompts_per_step, "Prompts sampled per step")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  c->add_option("--num-generations", a.num_generations, "Completions per prompt (the group its advantages compare)")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{2}, int64_t{4096}));
  c->add_option("--max-tokens", a.max_tokens, "New tokens per completion")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 24));
  c->add_option("--temperature", a.temperature, "Sampling temperature")->capture_default_str();
  c->add_option("--top-p", a.top_p, "Nucleus sampling: keep the likeliest tokens up to this probability")
      ->capture_default_str();
  c->add_option("--top-k", a.top_k, "Keep the k likeliest tokens; 0: all")->capture_default_str();
  c->add_option("--stop", a.stop,
                "Stop strings (the completion is cut before the first); repeat for several");
  c->add_option("--reward", a.reward,
                "Rewards by name, repeat or comma-separate: accuracy (the final answer, '#### n' or \\boxed{n}, equals "
                "the row's solution), format (the completion ends with its answer in that form); default: both, or "
                "none when --reward-command is given")
      ->delimiter(',')
      ->check(CLI::IsMember({"accuracy", "format"}));
  c->add_option("--reward-command", a.reward_command,
                "A shell command that scores completions: JSON lines in (prompt, completion and the row's fields), one "
                "number per line out (docs/recipes.md)");
  c->add_option("--reward-weights", a.reward_weights,
                "Weights of the rewards in order (the --reward names, then the command); default: all 1")
      ->delimiter(',');
  c->add_option("--reward-timeout", a.reward_timeout, "Seconds the reward command may take per call")
      ->capture_default_str()
      ->check(CLI::Range(0.001, 1e6));
  c->add_option("--loss", a.loss,
                "grpo, gspo (sequence-level ratio), dr_grpo (constant normaliser), cispo, or decoupled_ppo (corrects "
                "for samples from older weights, as with --sync-every > 1: docs/losses.md)")
      ->capture_default_str()
      ->check(CLI::IsMember({"grpo", "gspo", "dr_grpo", "cispo", "decoupled_ppo"}));
  c->add_option("--advantage-scale", a.advantage_scale,
                "auto (none for dr_grpo, else group), group (divide by the group's std), batch or none")
      ->capture_default_str()
      ->check(CLI::IsMember({"auto", "group", "batch", "none"}));
  c->add_option("--epsilon", a.epsilon, "Lower clip of the ratio (1 - epsilon)")->capture_default_str()->check(CLI::Range(0.0, 100.0));
  c->add_option("--epsilon-high", a.epsilon_high, "Upper clip of the ratio (1 + epsilon-high); 0: --epsilon")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 100.0));
  c->add_option("--sync-every", a.sync_every,
                "Steps between weight syncs to the sampler (1: on-policy; more: the ratio to the sampler's "
                "log-probabilities corrects the lag)")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  c->add_option("--max-staleness", a.max_staleness,
                "Asynchronous RL: the sampler generates later steps' batches while the model trains, each at most "
                "this many weight updates stale (0: synchronous; the weights sync every step then; use --loss "
                "decoupled_ppo: docs/rl.md)")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{0}, int64_t{8}));
  recipe::add_packing_flag(c, a.packing,
              "Train on the completions packed end to end without padding (padding-free batches; the default: the "
              "same loss, per sequence, less compute); --no-packing pads every sequence to the longest");
  // add_flag captures no default: without default_str, config.toml would not record it.
  c->add_flag("--routing-replay", a.routing_replay,
              "A model with experts: the sampler returns each token's experts and the trainer routes through them, "
              "so that its log-probabilities are the sampler's policy's (docs/models.md, routing replay)")
      ->default_str("false");
  c->add_option("--sampler-dp", a.sampler_dp, "Sampler ranks (each with its own copy of the model)")
      ->capture_default_str()
      ->check(CLI::Range(1, 4096));
  c->add_option("--sampler-max-restarts", a.sampler_max_restarts,
                "Sampler ranks lost with their process (glint run --max-restarts restarts it) or crashed are spawned again, up "
                "to this many times in the run: on their restarted node, else on a live one; a new rank samples once "
                "the next weight sync reaches it (docs/faults.md)")
      ->capture_default_str()
      ->check(CLI::Range(0, 1000));
  c->add_option("--sampler-cache-mib", a.sampler_cache_mib, "KV cache per sampler rank, MiB")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 30));
  c->add_option("--env", a.env,
                "Multi-turn episodes in an environment: builtin:calculator (arithmetic rows, a calculator tool), or a "
                "shell command speaking JSON lines (reset with the row, step with each assistant turn and its tool "
                "calls; docs/rl.md, Agents). Its reward replaces --reward; --max-tokens is per turn");
  c->add_option("--max-turns", a.max_turns, "With --env: assistant turns per episode")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{1024}));
  c->add_option("--max-trajectory-tokens", a.max_trajectory_tokens,
                "With --env: tokens per episode, prompt, turns and observations together (0: --max-prompt-length + "
                "--max-turns x --max-tokens)")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 24));
  c->add_option("--env-timeout", a.env_timeout, "With --env: seconds the environment may take per answer")
      ->capture_default_str()
      ->check(CLI::Range(0.001, 1e6));
  recipe::add_optim_flags(c, a);
  recipe::add_run_flags(c, a);
  recipe::add_model_restart_flag(c, a);
  c->footer(
      "Examples:\n"
      "  glint grpo --model models/qwen --dataset gsm8k.jsonl --output runs/math\n"
      "  glint grpo --model models/qwen --dataset prompts.jsonl --reward-command 'python3 score.py'\n"
      "  glint grpo --model models/qwen --dataset arithmetic.jsonl --env builtin:calculator --max-turns 3\n"
      "  glint grpo --config run.toml            (the same flags as a TOML file; docs/recipes.md)\n"
      "  glint run --nproc 2 -- glint grpo --model models/qwen --dataset gsm8k.jsonl --dp 2 --sampler-dp 2");
  return c;
}

int grpo(GrpoArgs& a, CLI::App& cmd) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  // --config, then flags that would be read and then ignored are refused.
  if (auto why = recipe::prepare_flags(cmd, a); !why.empty()) return refuse(why);

  // 1. Checks that write nothing.
  auto files = recipe::read_model(a, kName);
  if (!files) return refuse(context_of(files.error()));  // nothing is written yet
  const auto& model_dir = files->dir;
  const auto& mcfg = files->config;
  if (a.env.empty() && a.max_prompt_length + a.max_tokens > mcfg.max_position_embeddings)
    return refuse("--max-prompt-length " + std::to_string(a.max_prompt_length) + " + --max-tokens " +
                  std::to_string(a.max_tokens) + " is beyond the model's max_position_embeddings " +
                  std::to_string(mcfg.max_position_embeddings) + " (config.json)");
  auto truncation = components::parse_truncation(a.truncation);
  if (!truncation) return fail("--truncation", truncation.error());
  auto chat = components::Template::make(files->tokenizer, {.name = a.chat_template, .max_length = a.max_prompt_length,
                                                            .truncation = *truncation});
  if (!chat) return refuse("the chat template: " + context_of(chat.error()));
  auto lora = recipe::lora_of(a);
  if (!lora) return refuse(context_of(lora.error()));
  auto opt = recipe::optimizer_of(a);
  if (!opt) return refuse(context_of(opt.error()));
  if (a.prompts_per_step < a.sampler_dp)
    return refuse("--prompts-per-step " + std::to_string(a.prompts_per_step) + " is smaller than --sampler-dp " +
                  std::to_string(a.sampler_dp) + ": every sampler rank needs a prompt");
  if (a.lora_dropout > 0)
    return refuse("--lora-dropout does not apply to glint grpo: the sampler generates without dropout, so the ratio to "
                  "its log-probabilities would measure the dropout noise, not the policy's change");
  if (a.max_staleness > 0 && a.sync_every != 1)
    return refuse("--max-staleness syncs the weights after every step; it does not combine with --sync-every " +
                  std::to_string(a.sync_every));
  if (a.loss == "cispo" && cmd.get_option("--epsilon")->count() > 0)
    return refuse("--epsilon does not apply to --loss cispo (its weight has only the upper bound --epsilon-high)");
  if (a.prompts_per_step * a.num_generations < a.data_ranks())
    return refuse("--prompts-per-step x --num-generations is " + std::to_string(a.prompts_per_step * a.num_generations) +
                  " completions, fewer than the data-parallel ranks (--dp x --mesh's fsdp) " +
                  std::to_string(a.data_ranks()) + ": every data-parallel rank needs one");
  // Multi-turn episodes.
  const bool agentic = !a.env.empty();
  const int64_t trajectory_tokens =
      a.max_trajectory_tokens > 0 ? a.max_trajectory_tokens : a.max_prompt_length + a.max_turns * a.max_tokens;
  components::rl::EnvironmentOptions env_options{
      .timeout = std::chrono::milliseconds{static_cast<int64_t>(std::ceil(a.env_timeout * 1000))}};
  if (!agentic) {
    // Values other than the defaults: config.toml records every flag, so a replay gives them all.
    const GrpoArgs defaults;
    for (auto [flag, differs] : {std::pair{"--max-turns", a.max_turns != defaults.max_turns},
                                 std::pair{"--max-trajectory-tokens", a.max_trajectory_tokens != defaults.max_trajectory_tokens},
                                 std::pair{"--env-timeout", a.env_timeout != defaults.env_timeout}})
      if (differs) return refuse(std::string{flag} + " applies to multi-turn episodes: give --env too");
  } else {
    if (!a.reward.empty() || !a.reward_command.empty())
      return refuse("--env scores each episode with the environment's reward; leave out --reward and --reward-command");
    if (!a.stop.empty())
      return refuse("--stop does not apply with --env: a turn ends at the chat template's end-of-turn token, and its "
                    "tokens are kept as sampled");
    const GrpoArgs defaults;
    if (!a.reward_weights.empty() || a.reward_timeout != defaults.reward_timeout)
      return refuse(std::string{!a.reward_weights.empty() ? "--reward-weights" : "--reward-timeout"} +
                    " does not apply with --env: the episode's reward is the environment's (its timeout is "
                    "--env-timeout)");
    if (a.routing_replay) return refuse("--routing-replay is not built for multi-turn episodes yet; leave it out");
    if (trajectory_tokens > mcfg.max_position_embeddings)
      return refuse("an episode's " + std::to_string(trajectory_tokens) +
                    " tokens (--max-trajectory-tokens, or --max-prompt-length + --max-turns x --max-tokens) are beyond "
                    "the model's max_position_embeddings " + std::to_string(mcfg.max_position_embeddings) +
                    " (config.json)");
    if (trajectory_tokens <= a.max_prompt_length)
      return refuse("--max-trajectory-tokens " + std::to_string(trajectory_tokens) +
                    " leaves no room after a prompt of --max-prompt-length " + std::to_string(a.max_prompt_length));
    if (auto env = components::rl::make_environment(a.env, env_options); !env)
      return refuse("--env " + a.env + ": " + context_of(env.error()));
  }
  // The rewards.
  Rewards rewards;
  rewards.names = a.reward;
  if (agentic) rewards.names = {"env"};
  if (rewards.names.empty() && a.reward_command.empty()) rewards.names = {"accuracy", "format"};
  for (size_t i = 0; i < rewards.names.size(); ++i)
    if (std::count(rewards.names.begin(), rewards.names.end(), rewards.names[i]) > 1)
      return refuse("--reward " + rewards.names[i] + " is given twice");
  if (!a.reward_command.empty()) rewards.names.push_back("command");
  rewards.command = {.command = a.reward_command, .timeout_seconds = a.reward_timeout};
  rewards.weights = a.reward_weights;
  if (rewards.weights.empty()) rewards.weights.assign(rewards.names.size(), 1.0);
  if (rewards.weights.size() != rewards.names.size()) {
    std::string names;
    for (const auto& n : rewards.names) names += (names.empty() ? "" : ", ") + n;
    return refuse("--reward-weights has " + std::to_string(rewards.weights.size()) + " weights for " +
                  std::to_string(rewards.names.size()) + " rewards (" + names + ")");
  }
  for (double w : rewards.weights)
    if (!std::isfinite(w)) return refuse("--reward-weights must be finite numbers");
  rewards.tokenizer = files->tokenizer.get();
  const bool wants_solution = std::count(rewards.names.begin(), rewards.names.end(), "accuracy") > 0;
  // The loss and the advantages.
  auto kind = components::parse_loss_kind(a.loss);
  if (!kind) return refuse(context_of(kind.error()));
  components::LossSpec loss{.kind = *kind, .epsilon = a.epsilon, .epsilon_high = a.epsilon_high > 0 ? a.epsilon_high : a.epsilon,
                            .max_tokens = *kind == components::LossKind::dr_grpo ? a.max_tokens : 0};
  if (auto ok = loss.validate(); !ok) return refuse("the loss flags: " + context_of(ok.error()));
  auto scale = components::rl::parse_scale(
      a.advantage_scale != "auto" ? a.advantage_scale : (*kind == components::LossKind::dr_grpo ? "none" : "group"));
  if (!scale) return refuse(context_of(scale.error()));
  // The sampling.
  for (const auto& text : a.stop)
    if (text.empty()) return refuse("--stop is empty: give the text a completion stops at");
  components::SamplingParams sampling{.num_samples = a.num_generations, .max_tokens = a.max_tokens,
                                      .temperature = a.temperature, .top_k = a.top_k, .top_p = a.top_p,
                                      .stop_token_ids = {chat->end_of_turn_id()}, .stop = a.stop,
                                      .return_routes = a.routing_replay};
  if (a.routing_replay && !mcfg.has_experts())
    return refuse("--routing-replay replays the experts the sampler chose, and this model (" +
                  std::string{components::hf_class_name(mcfg.architecture)} + ", " + model_dir +
                  "/config.json) has none; leave it out");
  if (a.routing_replay)
    if (auto mesh = a.model_mesh(); mesh && mesh->size(placement::Dim::pp) > 1)
      return refuse("--routing-replay is not built for pipeline parallelism yet (--mesh " + a.mesh +
                    "); train without pp, or leave it out");
  if (auto ok = sampling.validate(); !ok) return refuse("the sampling flags: " + context_of(ok.error()));
  if (!(a.temperature > 0)) return refuse("--temperature must be > 0: a group of greedy completions has no spread to learn from");
  // Evaluations and saves land on steps after which the sampler is synced
  // anyway, so that they change nothing the run computes.
  for (auto [flag, every] : {std::pair{"--eval-every", a.eval_every}, std::pair{"--save-every", a.save_every}})
    if (every > 0 && every % a.sync_every != 0)
      return refuse(std::string{flag} + " " + std::to_string(every) + " is not a multiple of --sync-every " +
                    std::to_string(a.sync_every));
  // A step holds every completion in the driver and the training batch
  // (ids, masks, log-probabilities, advantages: about 48 bytes a token).
  const double step_tokens = static_cast<double>(a.prompts_per_step * a.num_generations) *
                             static_cast<double>(agentic ? trajectory_tokens : a.max_tokens + a.max_prompt_length);
  if (auto ok = check_memory(48 * step_tokens, "a step of " + std::to_string(a.prompts_per_step) + " prompts x " +
                                                   std::to_string(a.num_generations) + " completions");
      !ok)
    return refuse(context_of(ok.error()) + ": lower --prompts-per-step, --num-generations or --max-tokens");

  const auto out = recipe::output_dir(a);
  const auto data_dir = out + "/data";
  const auto resolved = recipe::resolved_config(cmd, a);
  const bool resuming = a.resume && fs::exists(out + "/config.toml");
  std::vector<Row> train_rows, val_rows;
  int64_t planned_steps = a.max_steps;
  if (resuming) {
    if (auto changed = recipe::changed_since(out, resolved, {"reward-timeout", "env-timeout", "sampler-dp", "sampler-max-restarts", "sampler-cache-mib"});
        !changed.empty())
      return refuse("--resume: the run in " + out + " was started with other values of " + changed +
                    " (see its config.toml); use them, or start another --output");
  } else {
    if (!recipe::any(a.dataset)) return refuse("--dataset is required");
    auto layout = components::preprocess::prompt_layout(a.layout, a.system);
    if (!layout) return refuse(context_of(layout.error()));
    if (auto ok = recipe::read_data(a, *layout, a.layout,
                                    "glint grpo reads gsm8k (question/answer), prompt, messages and query/response rows",
                                    kName, train_rows, val_rows);
        !ok)
      return recipe::bad_input(ok.error()) ? refuse(context_of(ok.error())) : fail("reading the data", ok.error());
    // What the dataloader will keep: prompts that encode within the limit.
    auto usable = [&](const std::vector<Row>& rows, const char* what) -> Result<int64_t> {
      auto encoded = recipe::encoded(rows, *chat, true);
      if (!encoded) return encoded.error();
      const auto& ds = *encoded;
      if (ds.size() == 0)
        return make_error(errc::invalid_argument, std::string{"the "} + what + " prompts have no usable row within "
                                                      "--max-prompt-length " + std::to_string(a.max_prompt_length) +
                                                      " (" + ds.skipped().summary() + ")");
      if (wants_solution)
        for (size_t i = 0; i < ds.size(); ++i)
          if (!ds.row(i).fields.count("solution"))
            return make_error(errc::invalid_argument,
                              ds.row(i).origin + " has no solution, which the accuracy reward needs (a \"solution\" or "
                              "\"answer\" field, a gsm8k answer with '#### n'); give one, or choose other rewards");
      return static_cast<int64_t>(ds.size());
    };
    auto n = usable(train_rows, "training");
    if (!n) return refuse(context_of(n.error()));
    if (*n < a.prompts_per_step)
      return refuse("the training data has " + std::to_string(*n) + " usable prompts, fewer than --prompts-per-step " +
                    std::to_string(a.prompts_per_step));
    if (!val_rows.empty())
      if (auto v = usable(val_rows, "validation"); !v) return refuse(context_of(v.error()));
    if (planned_steps == 0)
      planned_steps = std::max<int64_t>(
          1, static_cast<int64_t>(std::ceil(a.epochs * static_cast<double>(*n / a.prompts_per_step))));
  }
  if (planned_steps > 0)
    if (auto ok = recipe::schedule_of(a, planned_steps).validate(); !ok)
      return refuse("the schedule flags: " + context_of(ok.error()));

  // 2. The run directory.
  auto checkpoints = recipe::open_run(a, out, resuming, train_rows, val_rows, resolved);
  if (!checkpoints) return code_of(checkpoints.error()) == errc::failed_precondition
                               ? refuse(context_of(checkpoints.error()))
                               : fail("the run directory", checkpoints.error());
  const bool has_val = fs::exists(data_dir + "/val.jsonl");

  return run_main([&](Runtime& rt) -> int {
    return recipe::run_with_model_restarts(rt, kName, a.model_max_restarts, [&](recipe::Attempt& attempt) -> int {
      const bool use_lora = a.train_type == "lora";
      auto opened = recipe::open_model(rt, a, model_dir, use_lora ? &*lora : nullptr);
      if (!opened) return fail("the model", opened.error());
      const auto& model = *opened;
      attempt.restart_on_loss_of(model.info());
      // A try after a lost model rank resumes from the newest checkpoint.
      const bool resumes = resuming || attempt.resumes();
      auto mesh = placement::DeviceMesh::from_sizes({.dp = a.sampler_dp});
      if (!mesh) return fail("the sampler mesh", mesh.error());
      auto sampler_base = actors::open_sampler_group(
          rt, placement::DeviceGroup::of("sampler", a.sampler_dp), *mesh,
          {.model_dir = model_dir, .sampling_seed = a.seed, .cache_bytes = a.sampler_cache_mib << 20,
           .max_model_len = agentic ? trajectory_tokens : a.max_prompt_length + a.max_tokens},
          RestartPolicy{.max_restarts = a.sampler_max_restarts});
      if (!sampler_base) return fail("opening the sampler group", sampler_base.error());
      auto sampler = *sampler_base;
      auto nodes = [](const GroupInfo& info) {
        std::set<int> n;
        for (const auto& r : info.ranks) n.insert(r.node);
        std::string out;
        for (int x : n) out += (out.empty() ? "" : ",") + std::to_string(x);
        return out;
      };
      std::printf("glint grpo: %d model rank(s) on node %s, %d sampler rank(s) on node %s\n", a.model_ranks(),
                  nodes(model.info()).c_str(), a.sampler_dp, nodes(sampler.info()).c_str());
      if (use_lora) {
        // The sampler holds the same adapter; each sync replaces its tensors.
        const auto name = model.adapter();
        auto added = recipe::add_replacing(rt, sampler, name, [&] {
          return a.adapter_from.empty() ? sampler.add_adapter(name, *lora).get()
                                        : sampler.load_adapter(name, fs::absolute(a.adapter_from).string()).get();
        });
        if (!added) return fail("adding the adapter to the sampler", added.error());
        sampler = sampler.with_adapter(name);
      }
      // The loss and the optimizer come before a resume: the checkpoint's
      // optimizer state loads into them.
      if (auto ok = model.set_loss(loss).get(); !ok) return fail("setting the loss", ok.error());
      if (auto ok = model.set_optimizer(*opt).get(); !ok) return fail("setting the optimizer", ok.error());

      actors::DataLoaderSpec spec{.dataset = data_dir + "/train.jsonl", .tokenizer = model_dir,
                                  .template_name = a.chat_template, .max_length = a.max_prompt_length,
                                  .truncation = a.truncation, .add_generation_prompt = true,
                                  .batch_size = a.prompts_per_step, .seed = a.seed, .epochs = 0};
      auto loaders = recipe::open_loaders(rt, spec, has_val ? data_dir + "/val.jsonl" : "", 64);
      if (!loaders) return fail("the prompts", loaders.error());
      auto& train = loaders->train;
      const auto& info = loaders->info;
      const int64_t steps =
          a.max_steps > 0 ? a.max_steps
                          : std::max<int64_t>(1, static_cast<int64_t>(std::ceil(a.epochs * static_cast<double>(info.batches_per_epoch))));
      if (auto ok = model.set_lr_scheduler(recipe::schedule_of(a, steps)).get(); !ok)
        return fail("setting the schedule", ok.error());
      std::printf("glint grpo: %s training of %s on %lld prompts (%s), %lld steps of %lld prompts x %lld completions, "
                  "loss %s, rewards",
                  a.train_type.c_str(), model_dir.c_str(), static_cast<long long>(info.rows), info.skipped.c_str(),
                  static_cast<long long>(steps), static_cast<long long>(a.prompts_per_step),
                  static_cast<long long>(a.num_generations), a.loss.c_str());
      for (size_t k = 0; k < rewards.names.size(); ++k) {
        std::printf(" %s", rewards.names[k].c_str());
        if (rewards.weights[k] != 1.0) std::printf(" x %g", rewards.weights[k]);
      }
      if (agentic)
        std::printf(" (episodes in %s: at most %lld turns of %lld tokens, %lld tokens each; tool calls read as %s)",
                    a.env.c_str(), static_cast<long long>(a.max_turns), static_cast<long long>(a.max_tokens),
                    static_cast<long long>(trajectory_tokens),
                    std::string(components::to_string(components::tool_call_format_of(
                                    files->tokenizer->config().chat_template.value_or(""))))
                        .c_str());
      std::printf("\n");

      auto position = recipe::resume_run(*checkpoints, resumes, model, &train, kName, "best_eval_reward");
      if (!position) return fail("resuming", position.error());
      auto& [start, best, best_step] = *position;
      // No checkpoint yet (start 0): the run starts afresh, so its rows do too
      // (a step-0 evaluation row would otherwise be written twice).
      RunReport report{out, "grpo", resumes && start > 0 ? static_cast<int>(start) : -1};
      if (agentic) keep_episodes(out + "/episodes.jsonl", resumes ? start : 0);
      const int64_t pad = recipe::pad_id(*files->tokenizer);
      actors::CheckpointEngine engine{model, sampler};
      // --env: episodes in the environment, sampled by the sampler (with its adapter).
      std::optional<actors::AgentRunner> agents;
      if (agentic)
        agents.emplace(sampler, std::make_shared<const components::Template>(*chat),
                       [&a, env_options] { return components::rl::make_environment(a.env, env_options); },
                       actors::AgentOptions{.max_turns = a.max_turns, .max_tokens = trajectory_tokens});
      int64_t synced_after = -1;  // the step whose weights the sampler holds
      auto sync = [&](int64_t after) -> Result<double> {
        if (synced_after == after) return 0.0;
        auto s = engine.sync_weights();
        if (!s) return s.error();
        synced_after = after;
        return s->seconds;
      };

      // The greedy mean reward of the validation prompts (and each reward's).
      auto evaluate = [&](int64_t after) -> Result<std::map<std::string, double>> {
        if (auto s = sync(after); !s) return s.error();
        std::map<std::string, double> sums;
        double n = 0;
        for (int64_t i = 0; i < loaders->val_batches; ++i) {
          auto b = loaders->val->next_batch().take();
          if (!b) return b.error();
          auto greedy = sampling;
          greedy.num_samples = 1;
          greedy.temperature = 0;
          if (agents) {
            auto runs = agents->run(b->rows, greedy).take();
            if (!runs) return runs.error();
            for (const auto& [k, v] : episode_scores(*runs))
              for (double x : v) sums[k] += x;
            n += static_cast<double>(runs->size());
            continue;
          }
          // A short last batch gets copies of its first prompt (their answers
          // dropped), so every sampler rank has one.
          auto prompts = prompt_ids(b->rows);
          const size_t asked = prompts.size();
          while (prompts.size() < static_cast<size_t>(a.sampler_dp)) prompts.push_back(prompts.front());
          auto seqs = sampler.sample(prompts, greedy).take();
          if (!seqs) return seqs.error();
          seqs->resize(asked);
          if (auto ok = check_sampled(*seqs); !ok) return ok.error();
          auto scores = rewards.score(b->rows, 1, *seqs);
          if (!scores) return scores.error();
          for (const auto& [k, v] : *scores)
            for (double x : v) sums[k] += x;
          n += static_cast<double>(seqs->size());
        }
        std::map<std::string, double> means;
        for (const auto& [k, s] : sums) means["eval_reward" + (k == "total" ? std::string{} : "/" + k)] = s / n;
        return means;
      };

      if (has_val && start == 0) {
        // Where the model starts: step 0 of the charts.
        auto e = evaluate(0);
        if (!e) return fail("evaluating before training", e.error());
        report.add(0, "grpo", *e);
        std::printf("glint grpo: greedy validation reward before training: %.4f\n", e->at("eval_reward"));
      }
      components::rl::CompletionRewardMetric metrics;
      const int64_t eval_every = a.eval_every > 0 ? a.eval_every : steps;
      const int64_t save_every = a.save_every > 0 ? a.save_every : eval_every;
      Progress bar{"grpo", static_cast<int>(steps)};
      // Each step's draws come from (seed, step), so a resumed run repeats them.
      auto params_of = [&](int64_t step) {
        auto p = sampling;
        p.seed = static_cast<int64_t>((a.seed * 1000003 + static_cast<uint64_t>(step)) & 0x7fffffffffff);
        return p;
      };
      // --max-staleness: later steps' batches sample while this one trains.
      std::optional<actors::RolloutPipeline> rollouts;
      auto episodes = std::make_shared<EpisodeTable>();
      // With --env the pipeline runs each batch's episodes, and keeps them here for its step.
      auto run_episodes = [&agents, episodes, g = a.num_generations](int64_t step, const actors::RolloutBatch& b,
                                                                       const std::vector<actors::SampleRequest>& reqs) {
        std::vector<actors::DataRow> rows;
        for (const auto& q : reqs) rows.push_back(b.rows[static_cast<size_t>(q.index)]);
        const int64_t offset = reqs.empty() ? 0 : reqs.front().index;
        const size_t n = b.rows.size() * static_cast<size_t>(g);
        return agents->run(rows, b.params)
            .then([episodes, step, offset, n, g](const Result<std::vector<actors::Trajectory>>& r)
                      -> Result<std::vector<actors::SampledSequence>> {
              if (!r) return r.error();
              std::vector<actors::SampledSequence> seqs;
              std::lock_guard<std::mutex> guard{episodes->mx};
              auto& slot = episodes->runs[step];
              slot.resize(n);
              for (auto t : *r) {
                t.index += offset;
                t.sequence.index = t.index;
                seqs.push_back(t.sequence);
                slot[static_cast<size_t>(t.index * g + t.sample)] = std::move(t);
              }
              return seqs;
            });
      };
      if (a.max_staleness > 0)
        rollouts.emplace(
            engine, sampler,
            [&](int64_t step) -> Result<std::optional<actors::RolloutBatch>> {
              auto b = train.next_batch().take();
              if (!b) return b.error();
              auto prompts = prompt_ids(b->rows);
              return actors::RolloutBatch{.prompts = std::move(prompts), .params = params_of(step),
                                          .rows = std::move(b->rows), .loader_state = b->state};
            },
            actors::RolloutOptions{.max_staleness = a.max_staleness, .first_batch = start + 1, .last_batch = steps,
                                   .sample = agents ? decltype(actors::RolloutOptions::sample){run_episodes}
                                                    : decltype(actors::RolloutOptions::sample){}});
      for (int64_t step = start + 1; step <= steps; ++step) {
        metrics.reset();
        double sync_seconds = 0;
        // The step's prompts and completions.
        actors::RolloutBatch batch;
        std::vector<actors::SampledSequence> sampled;
        std::vector<actors::Trajectory> runs;  // --env
        std::optional<actors::Rollout> rollout;
        if (rollouts) {
          auto r = rollouts->next();
          if (!r) return fail("sampling at step " + std::to_string(step), r.error());
          sampled = std::move(r->sequences);
          batch = std::move(r->batch);
          rollout = std::move(*r);
          if (agents) {
            std::lock_guard<std::mutex> guard{episodes->mx};
            runs = std::move(episodes->runs[step]);
            episodes->runs.erase(step);
          }
        } else {
          auto b = train.next_batch().take();
          if (!b) return fail("reading prompts", b.error());
          // Every --sync-every steps, and first thing in a process (a resume
          // from a run's last step, extended, may start between syncs).
          if ((step - 1) % a.sync_every == 0 || synced_after < 0) {
            auto s = sync(step - 1);
            if (!s) return fail("syncing weights", s.error());
            sync_seconds = *s;
          }
          batch = {.prompts = prompt_ids(b->rows), .params = params_of(step), .rows = std::move(b->rows)};
          if (agents) {
            auto r = agents->run(batch.rows, batch.params).take();
            if (!r) return fail("the episodes of step " + std::to_string(step), r.error());
            runs = std::move(*r);
          } else {
            auto seqs = sampler.sample(batch.prompts, batch.params).take();
            if (!seqs) return fail("sampling at step " + std::to_string(step), seqs.error());
            sampled = std::move(*seqs);
          }
        }
        const auto& prompts = batch.prompts;
        Result<std::map<std::string, std::vector<double>>> scores = std::map<std::string, std::vector<double>>{};
        if (agents) {
          scores = episode_scores(runs);
        } else {
          if (auto ok = check_sampled(sampled); !ok) return fail("sampling at step " + std::to_string(step), ok.error());
          scores = rewards.score(batch.rows, a.num_generations, sampled);
        }
        if (!scores) return fail("scoring at step " + std::to_string(step), scores.error());
        if (auto ok = metrics.accumulate(agents ? learned_lengths(runs) : completion_lengths(sampled), *scores); !ok)
          return fail("the reward metrics", ok.error());
        auto adv = components::rl::advantages(scores->at("total"), {.group_size = a.num_generations, .scale = *scale});
        if (!adv) return fail("the advantages", adv.error());
        Result<Batch> inputs = Batch{};
        // Episodes that failed before the model's first token have none to
        // learn from; a step where every one did trains nothing, and goes on.
        bool trains = true;
        if (agents) {
          auto episodes_batch = actors::agent_batch(runs, *adv);
          trains = !episodes_batch.sequences.empty();
          if (!trains)
            std::fprintf(stderr, "glint grpo: step %lld trains nothing: no episode got as far as a sampled token (%s)\n",
                         static_cast<long long>(step), runs.empty() ? "none ran" : runs.front().error.c_str());
          else
            inputs = actors::training_batch(episodes_batch.prompts, episodes_batch.sequences,
                                          {.pad_id = pad, .advantages = episodes_batch.advantages, .pack = a.packing,
                                           .min_rows = model.info().dp_size(), .learned = episodes_batch.learned});
        } else {
          inputs = actors::training_batch(
              prompts, sampled,
              {.pad_id = pad, .advantages = *adv, .pack = a.packing, .min_rows = model.info().dp_size(),
               .routing_replay = a.routing_replay});
        }
        if (!inputs) return fail("making the training batch", inputs.error());
        Result<Metrics> m = Metrics{}, s = Metrics{};
        if (trains) {
          m = model.forward_backward(*inputs).take();
          if (!m) return fail("forward_backward at step " + std::to_string(step), m.error());
          s = model.clip_grad_and_step().take();
          if (!s) return fail("the optimizer step at " + std::to_string(step), s.error());
        }
        if (rollouts) {
          auto synced = rollouts->weights_updated();
          if (!synced) return fail("syncing weights after step " + std::to_string(step), synced.error());
          sync_seconds = synced->seconds;
          synced_after = step;  // an evaluation now needs no sync of its own
        }

        auto row = metrics.calculate();
        for (const char* k : {"loss", "clip_fraction"})
          if (m->count(k)) row[k] = m->at(k);
        for (const char* k : {"grad_norm", "lr"})
          if (s->count(k)) row[k] = s->at(k);
        row["weight_sync_seconds"] = sync_seconds;
        if (agents) {
          for (const auto& [k, v] : actors::agent_metrics(runs)) row[k] = v;
          log_episodes(out + "/episodes.jsonl", step, runs);
        }
        if (rollout) {
          row["staleness/max"] = static_cast<double>(rollout->staleness_max);
          row["staleness/mean"] = rollout->staleness_mean;
        }
        char status[128];
        std::snprintf(status, sizeof status, "reward %.3f", row["reward/total/mean"]);
        const bool eval_now = has_val && (step % eval_every == 0 || step == steps);
        if (eval_now) {
          auto e = evaluate(step);
          if (!e) return fail("evaluating at step " + std::to_string(step), e.error());
          row.insert(e->begin(), e->end());
          std::snprintf(status, sizeof status, "reward %.3f  eval %.3f", row["reward/total/mean"], row["eval_reward"]);
          if (position->improves(row["eval_reward"], true)) {
            best = row["eval_reward"];
            best_step = step;
          }
        }
        report.add(static_cast<int>(step), "grpo", row);
        if (eval_now || step % save_every == 0 || step == steps) {
          std::map<std::string, double> kept = {{"reward", row["reward/total/mean"]}};
          if (eval_now) kept["eval_reward"] = row["eval_reward"];
          recipe::record_best(kept, *position, "best_eval_reward");
          char summary[64];
          std::snprintf(summary, sizeof summary, eval_now ? "eval reward %.4f" : "reward %.4f",
                        eval_now ? row["eval_reward"] : row["reward/total/mean"]);
          // Asynchronous: the loader is ahead by the batches in flight; the
          // checkpoint keeps its position after this step's batch.
          auto saved = checkpoints->save("checkpoint-" + std::to_string(step), model, rollouts ? nullptr : &train,
                                         {.step = step, .consumed_samples = step * a.prompts_per_step, .seed = a.seed,
                                          .phase = "grpo", .loader = batch.loader_state.value_or(actors::LoaderState{}),
                                          .metrics = kept},
                                         summary);
          if (!saved) return fail("saving a checkpoint", saved.error());
        }
        bar.update(static_cast<int>(step), status);
      }
      bar.finish();
      if (rollouts) rollouts->close();

      if (auto ok = recipe::publish_outputs(model, *checkpoints, a, out, model_dir, best_step); !ok)
        return fail("the outputs", ok.error());
      recipe::release_adapter(rt, model);
      recipe::release_adapter(rt, sampler);
      if (best_step > 0)
        std::printf("best validation reward %.6f at step %lld: %s/best\n", best, static_cast<long long>(best_step), out.c_str());
      std::vector<std::pair<std::string, std::string>> charts = {{"grpo", "reward/total/mean"}};
      if (has_val) charts.push_back({"grpo", "eval_reward"});
      for (const auto& n : rewards.names)
        if (rewards.names.size() > 1) charts.push_back({"grpo", "reward/" + n + "/mean"});
      if (agents)
        for (const char* k : {"turns/mean", "tool_calls/mean", "end/done"}) charts.push_back({"grpo", k});
      for (const char* k : {"loss", "completion_length/mean", "grad_norm"}) charts.push_back({"grpo", k});
      auto html = report.write_html("glint grpo: " + fs::path{model_dir}.filename().string(), charts);
      std::printf("metrics: %s/metrics.jsonl\nreport:  %s\n", out.c_str(), html.c_str());
      return 0;
    });
  });
}

}  // namespace glint::launcher
