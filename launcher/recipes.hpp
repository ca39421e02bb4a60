#pragma once
/// The training recipes of the `glint` binary (`glint sft`, `glint grpo`, `glint dpo`):
/// drivers on the public API (actors/), like the examples, that train a
/// user's own Hugging Face model directory on the user's own data.
/// docs/recipes.md documents every flag.

#include "placement/device_mesh.hpp"

#include <CLI/CLI.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace glint::launcher {

/// The flags every recipe has: the model and what is trained, the data
/// files, the optimisation, the run directory (recipe_common.hpp adds them).
struct RecipeArgs {
  // The model and what is trained.
  std::string model;                  ///< an HF directory with config.json, weights, tokenizer.json
  std::string train_type = "lora";    ///< lora or full
  int64_t lora_rank = 8;
  double lora_alpha = 32;
  double lora_dropout = 0.0;  ///< masks seeded by step, micro-batch and rank (docs/recipes.md)
  std::string target_modules = "all-linear";  ///< or a comma-separated list
  std::string adapter_from{};         ///< start from this PEFT adapter directory instead of a fresh one
  // The data.
  std::vector<std::string> dataset;   ///< FILE or FILE:RATIO
  std::vector<std::string> val_dataset;
  double val_split = 0.0;             ///< share of the training rows held out when no val_dataset
  std::string system{};               ///< a system message for rows without one
  std::string chat_template = "auto";
  // The optimisation.
  int64_t max_steps = 0;              ///< 0: epochs over the training rows
  double epochs = 1;
  std::string optimizer = "adamw";
  double lr = 1e-4;
  double weight_decay = 0.01;
  double max_grad_norm = 1.0;
  std::string lr_scheduler = "cosine";
  double warmup_ratio = 0.0;
  int64_t warmup_steps = 0;
  double min_lr_ratio = 0.0;
  // Evaluation, checkpoints, output.
  int64_t eval_every = 50;            ///< steps; 0: at the end only
  int64_t save_every = 0;             ///< steps between checkpoints; 0: at each evaluation (or eval_every)
  std::string output;
  bool resume = false;
  bool overwrite = false;
  int64_t max_shard_mib = 5000;       ///< a full model's weights go in shards of at most this
  int dp = 1;                         ///< data-parallel model ranks
  std::string mesh{};                 ///< --mesh: the model group's other dimensions (fsdp=2, tp=2, pp=2)
  /// The model group's mesh: --mesh, with --dp's dp where --mesh names none.
  Result<placement::DeviceMesh> model_mesh() const;
  /// What a batch is cut into: dp x fsdp (tp and pp ranks share their part).
  int data_ranks() const;
  /// The model group's ranks.
  int model_ranks() const;
  uint64_t seed = 42;
  std::string config{};               ///< the TOML the flags came from, if any
  int model_max_restarts = 0;         ///< sft, grpo: restarts from the newest checkpoint after a lost model rank
};

struct SftArgs : RecipeArgs {
  SftArgs() { output = "runs/sft"; }
  bool eval_only = false;             ///< only the validation loss of the model (and --adapter-from)
  std::string layout = "auto";        ///< components::preprocess::layout_names()
  int64_t max_length = 0;             ///< 0: the model's context
  std::string truncation = "refuse";  ///< refuse (skip the row), left or right
  bool packing = true;                ///< padding-free batches (--no-packing: padded)
  int64_t batch_size = 8;
  int64_t grad_accum = 1;
};

struct GrpoArgs : RecipeArgs {
  GrpoArgs() {
    output = "runs/grpo";
    lr = 1e-5;
    lr_scheduler = "constant";
    eval_every = 0;
  }
  std::string layout = "auto";        ///< components::preprocess::prompt_layout_names()
  int64_t max_prompt_length = 512;
  std::string truncation = "refuse";  ///< refuse (skip the prompt) or left
  // What is sampled.
  int64_t prompts_per_step = 8;
  int64_t num_generations = 8;        ///< completions per prompt: the group
  int64_t max_tokens = 256;           ///< new tokens per completion
  double temperature = 1.0;
  double top_p = 1.0;
  int64_t top_k = 0;
  std::vector<std::string> stop{};
  // How it is scored and trained.
  std::vector<std::string> reward{};  ///< accuracy, format (empty: accuracy and format, or none with a command)
  std::string reward_command{};       ///< a shell command: JSON lines in, one score per line out
  std::vector<double> reward_weights{};
  double reward_timeout = 600;        ///< seconds the command may take per step
  std::string loss = "grpo";          ///< grpo, gspo, dr_grpo or cispo
  std::string advantage_scale = "auto";
  double epsilon = 0.2;
  double epsilon_high = 0.0;          ///< 0: epsilon
  int64_t sync_every = 1;             ///< steps between weight syncs to the sampler
  int64_t max_staleness = 0;          ///< asynchronous: batches sample this many updates ahead
  int sampler_dp = 1;
  int sampler_max_restarts = 0;       ///< respawns of lost sampler ranks over the run
  int64_t sampler_cache_mib = 256;
  bool packing = true;                ///< padding-free training batches (--no-packing: padded)
  bool routing_replay = false;        ///< train on the sampler's expert routes (a model with experts)
  // Multi-turn rollouts in an environment (actors/agents.hpp).
  std::string env{};                  ///< builtin:calculator or a shell command speaking JSON lines; "": single-turn
  int64_t max_turns = 4;              ///< assistant turns per episode
  int64_t max_trajectory_tokens = 0;  ///< prompt, turns and observations; 0: --max-prompt-length + --max-turns x --max-tokens
  double env_timeout = 30;            ///< seconds the environment may take per answer
};

struct DpoArgs : RecipeArgs {
  DpoArgs() {
    output = "runs/dpo";
    lr = 5e-6;
    lr_scheduler = "constant";
  }
  std::string layout = "auto";        ///< components::preprocess::preference_layout_names()
  int64_t max_length = 0;             ///< tokens per prompt + response; 0: the model's context
  std::string truncation = "refuse";  ///< refuse (skip the pair), left or right
  int64_t batch_size = 8;             ///< pairs per micro-batch (over --dp ranks)
  int64_t grad_accum = 1;
  std::string loss = "sigmoid";       ///< sigmoid (DPO) or ipo
  double beta = 0.1;
  double label_smoothing = 0.0;       ///< sigmoid only
  std::vector<std::string> adapters{};  ///< NAME=FILE[:RATIO]: several adapters, each on its files
  bool packing = true;                ///< padding-free training batches, each pair whole in a row
};

/// Adds `glint sft` to `app`, its flags bound to `args`.
CLI::App* add_sft(CLI::App& app, SftArgs& args);
/// Runs it; `cmd` is the subcommand add_sft made: --config's keys fill the
/// flags not given, and the resolved flags are written to the run
/// directory. prepare_flags may rewrite --model and --adapter-from in `a`
/// (recipe::model_from_adapter). Returns the exit code.
int sft(SftArgs& a, CLI::App& cmd);

/// `glint grpo`, as `glint sft`.
CLI::App* add_grpo(CLI::App& app, GrpoArgs& args);
int grpo(GrpoArgs& a, CLI::App& cmd);

/// `glint dpo`, as `glint sft`.
CLI::App* add_dpo(CLI::App& app, DpoArgs& args);
int dpo(DpoArgs& a, CLI::App& cmd);

}  // namespace glint::launcher
