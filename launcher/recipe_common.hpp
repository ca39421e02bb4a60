#pragma once
/// What the recipes (`glint sft`, `glint grpo`, `glint dpo`) share: their common flags,
/// the config file, reading and mixing datasets, the checks made before
/// anything is written, the run directory and its final outputs. Each
/// function that refuses bad input answers an error whose context is the
/// one line to print.

#include "actors/checkpointer.hpp"
#include "actors/dataloader_group.hpp"
#include "actors/model_group.hpp"
#include "components/data/dataset.hpp"
#include "components/data/template.hpp"
#include "components/data/tokenizer.hpp"
#include "components/model/config.hpp"
#include "launcher/recipes.hpp"
#include "runtime/runtime.hpp"

#include <cstdio>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

namespace glint::launcher::recipe {

/// The adapter's name in the model (and sampler) group.
inline constexpr const char* kAdapter = "default";

/// True for an error of the user's input (invalid_argument, not_found):
/// refused with exit code 2 rather than failed with 1.
inline bool bad_input(const caf::error& e) {
  return code_of(e) == errc::invalid_argument || code_of(e) == errc::not_found;
}
/// "glint NAME: why" on stderr; exit code 2 (bad input: nothing was done).
int refuse(const std::string& name, const std::string& why);
/// "glint NAME: what: the error" on stderr; exit code 1.
int fail(const std::string& name, const std::string& what, const caf::error& e);

/// --model, --train-type, --lora-*, --target-modules, --adapter-from.
void add_model_flags(CLI::App* c, RecipeArgs& a);
/// --dataset, --val-dataset, --val-split, --system, --template; `rows`
/// says what a row is ("conversations", "prompts").
void add_data_flags(CLI::App* c, RecipeArgs& a, const std::string& rows);
/// --max-steps, --epochs, the optimizer and the schedule.
void add_optim_flags(CLI::App* c, RecipeArgs& a);
/// --packing / --no-packing (default on) with the recipe's `help`; the
/// default is stated, so config.toml records what the run did.
void add_packing_flag(CLI::App* c, bool& packing, const std::string& help);
/// --eval-every, --save-every, --output, --resume, --overwrite,
/// --max-shard-mib, --dp, --seed, --config.
void add_run_flags(CLI::App* c, RecipeArgs& a);

/// --model-max-restarts (sft, dpo, grpo): see run_with_model_restarts.
void add_model_restart_flag(CLI::App* c, RecipeArgs& a);

/// Applies the TOML file `path` (read with toml++: strings with TOML's
/// escapes, numbers, booleans, arrays for repeated flags) to the flags of
/// `cmd` not given on the command line. Every key must be a flag; a wrong
/// value is an error naming it.
Result<void> apply_config(CLI::App& cmd, const std::string& path);
/// The flags as config.toml records them, one `key = value` line each in
/// TOML (what the run computes; not
/// --resume, --overwrite, --config, nor `skip`, nor with --adapter-from the
/// lora flags its adapter holds).
std::string resolved_config(CLI::App& cmd, const RecipeArgs& a, const std::set<std::string>& skip = {});
/// The flags of `resolved` that differ from the run's config.toml in `out`,
/// other than those a resume may change (the common ones and `resumable`);
/// comma-separated, empty when none.
std::string changed_since(const std::string& out, const std::string& resolved, const std::set<std::string>& resumable);

/// Applies --config (apply_config), then model_from_adapter, then
/// check_flags: the refusal, or empty.
std::string prepare_flags(CLI::App& cmd, RecipeArgs& a);
/// --model naming a PEFT adapter directory (adapter_config.json and no
/// config.json, as `glint sft` leaves in runs/NAME/last): the run goes on
/// training that adapter on its base, as `--model BASE --adapter-from DIR`
/// does. BASE is the adapter's base_model_name_or_path, which must be a
/// model directory here (glint writes it absolute); else the refusal says
/// to give both flags. --model is then the base and --adapter-from the
/// adapter; config.toml keeps the flags as given. Empty: fine.
std::string model_from_adapter(RecipeArgs& a);
/// Refusals of flag combinations every recipe shares (--resume with
/// --overwrite, --val-split with --val-dataset, lora flags with
/// --adapter-from, a zero --epochs). Empty: none.
std::string check_flags(const RecipeArgs& a, CLI::App& cmd);

/// The model directory, checked: a directory with a config.json glint
/// reads and a tokenizer.json.
struct ModelFiles {
  std::string dir;  ///< absolute
  components::ModelConfig config;
  std::shared_ptr<const components::Tokenizer> tokenizer;
};
Result<ModelFiles> read_model(const RecipeArgs& a, const std::string& name);

/// The chat template of the flags for rows of at most `max_length` tokens
/// (0: the model's context; more is refused) under `truncation`, and that
/// limit. Errors are bad input, their context the line to print.
struct Chat {
  int64_t max_length;
  components::Template chat;
};
Result<Chat> chat_of(const RecipeArgs& a, const ModelFiles& files, int64_t max_length, const std::string& truncation);

/// The LoRA config of the flags (target modules checked against what glint
/// adapts), the optimizer's, and the schedule of a run of `steps` steps.
Result<components::LoraConfig> lora_of(const RecipeArgs& a);
Result<components::OptimizerConfig> optimizer_of(const RecipeArgs& a);
components::SchedulerConfig schedule_of(const RecipeArgs& a, int64_t steps);

/// The rows of the dataset arguments (FILE or FILE:RATIO), each file through
/// `layout`, mixed in one seeded order. `hint` ends the refusal of a file
/// with no usable row (which layouts the recipe reads).
Result<std::vector<components::Row>> read_mix(const std::vector<std::string>& args, const components::Preprocessor& layout,
                                              const std::string& layout_name, const std::string& hint,
                                              const std::string& name, uint64_t seed);
/// `rows` encoded with `chat` as the dataloader will encode them (prompts
/// to sample from with `prompts`): what it keeps, and its skip report.
Result<components::Dataset> encoded(const std::vector<components::Row>& rows, const components::Template& chat,
                                    bool prompts);
/// Moves a share `split` of `train` (the first rows) to `val`; a row a
/// ratio above 1 repeated goes with all its copies and is validated once.
Result<void> split_validation(std::vector<components::Row>& train, std::vector<components::Row>& val, double split);
/// The training and validation rows of the flags (read_mix, split_validation).
Result<void> read_data(const RecipeArgs& a, const components::Preprocessor& layout, const std::string& layout_name,
                       const std::string& hint, const std::string& name, std::vector<components::Row>& train,
                       std::vector<components::Row>& val);

/// The run directory `out` (config.toml, data/, checkpoints, metrics,
/// last/, best/), its index opened. A new run (not `resuming`) starts it
/// over: refused (failed_precondition) when it has checkpoints and not
/// --overwrite; its rows and config are written.
Result<actors::Checkpointer> open_run(const RecipeArgs& a, const std::string& out, bool resuming,
                                      const std::vector<components::Row>& train, const std::vector<components::Row>& val,
                                      const std::string& resolved);
/// --output as an absolute path without a trailing slash.
std::string output_dir(const RecipeArgs& a);

/// The name a recipe's adapter `name` gets in the model (and sampler)
/// group: `name` in local and cluster mode; in remote mode, where a
/// tenant's adapters outlive its connection, "glint-<run directory's
/// name>-<hash of its absolute path>" (with "-<name>" for another than
/// kAdapter), so that runs in different directories never collide and a
/// rerun of the same run directory replaces what a killed one left.
std::string adapter_name(const Runtime& rt, const RecipeArgs& a, const std::string& name = kAdapter);

/// Runs `add` (an add_adapter or load_adapter of `name` on `group`); in
/// remote mode, an adapter of that name that an earlier run of this run
/// directory left on the server is removed first and `add` run again.
template <class Group, class Add>
Result<void> add_replacing(const Runtime& rt, const Group& group, const std::string& name, Add add) {
  auto r = add();
  if (r || rt.mode() != Mode::remote || context_of(r.error()).find("' already") == std::string::npos) return r;
  std::fprintf(stderr, "glint: replacing the adapter %s that an earlier run of this run directory left on the server\n",
               name.c_str());
  if (auto ok = group.remove_adapter(name).get(); !ok) return ok.error();
  return add();
}

/// In remote mode, removes the adapter `handle` trains from the server at
/// the end of a run (its weights are in the run directory by then); nothing
/// in local and cluster mode, where the group goes with the process.
template <class Handle>
void release_adapter(const Runtime& rt, const Handle& handle) {
  if (rt.mode() != Mode::remote || handle.adapter().empty()) return;
  if (auto ok = handle.remove_adapter(handle.adapter()).get(); !ok)
    std::fprintf(stderr, "glint: could not remove adapter %s from the server: %s\n", handle.adapter().c_str(),
                 describe(ok.error()).c_str());
}

/// The model group of a.model_mesh() on `model_dir`, placed; with `lora`, the
/// handle of its adapter adapter_name(rt, a) (read from --adapter-from, or fresh).
Result<actors::ModelGroup> open_model(Runtime& rt, const RecipeArgs& a, const std::string& model_dir,
                                      const components::LoraConfig* lora);

/// The training dataloader of `spec` and, when `val_path` is not empty, a
/// validation one over that file (in order, short batches kept, batches of
/// `val_batch_size` rows, or spec's when 0).
struct Loaders {
  actors::DataLoaderGroup train;
  actors::LoaderInfo info;                   ///< of train
  std::optional<actors::DataLoaderGroup> val;
  int64_t val_batches = 0;                   ///< per validation epoch
};
Result<Loaders> open_loaders(Runtime& rt, const actors::DataLoaderSpec& spec, const std::string& val_path,
                             int64_t val_batch_size = 0);

/// One try of a run under `run_with_model_restarts`.
class Attempt {
public:
  explicit Attempt(int number) : number_(number) {}
  /// 1 for the first try, then 2, 3, ...
  int number() const { return number_; }
  /// A try after a lost model: it resumes from the run's newest checkpoint.
  bool resumes() const { return number_ > 1; }
  /// The nodes whose loss fails the try and starts it again: the model
  /// group's (its collective is poisoned when one of its ranks goes).
  void restart_on_loss_of(const GroupInfo& group) {
    for (const auto& r : group.ranks) nodes_.insert(r.node);
  }
  const std::set<int>& nodes() const { return nodes_; }

private:
  int number_;
  std::set<int> nodes_;
};

/// Runs `body` (a recipe's driver) and, when it fails after a node holding
/// one of its model ranks was lost, runs it again, up to `max_restarts`
/// times: the failed try's actors are stopped and its placement forgotten,
/// the node is waited for (`glint run --max-restarts` starts its process
/// again; up to the runtime's connect timeout), and the next try resumes
/// from the run's newest checkpoint (`Attempt::resumes`). A body whose
/// steps are keyed by (seed, step) ends with the weights of a run never
/// interrupted. Any other failure, or one past `max_restarts`, is the
/// answer: the body's exit code, after a line naming the node and why.
/// The whole driver belongs in `body`: groups placed before it are
/// forgotten by the placement service at a restart.
int run_with_model_restarts(Runtime& rt, const std::string& name, int max_restarts,
                            const std::function<int(Attempt&)>& body);

/// Where a run continues: the step after `start`, and the best evaluation
/// so far (its metric `best_key` and step, as save_metrics recorded them).
struct RunPosition {
  int64_t start = 0;
  double best;
  int64_t best_step = 0;
  bool improves(double value, bool higher_is_better) const {
    return best_step == 0 || (higher_is_better ? value > best : value < best);
  }
};
/// Loads the run's latest checkpoint into `model` and `train` (null: a
/// recipe whose data position follows from the step) when `resuming` (and
/// it has one), printing where it resumed.
Result<RunPosition> resume_run(actors::Checkpointer& checkpoints, bool resuming, const actors::ModelGroup& model,
                            const actors::DataLoaderGroup* train, const std::string& name, const std::string& best_key);
/// The metrics a checkpoint records so that a resume knows the best so far.
void record_best(std::map<std::string, double>& metrics, const RunPosition& p, const std::string& best_key);

/// Writes last/ (the model's weights now: a PEFT adapter directory, or a
/// Hugging Face model directory with the tokenizer) and, when best_step >
/// 0, best/ (that checkpoint's weights).
Result<void> publish_outputs(const actors::ModelGroup& model, const actors::Checkpointer& checkpoints,
                             const RecipeArgs& a, const std::string& out, const std::string& model_dir,
                             int64_t best_step);

/// The id padding gets (masked out; it only has to be in the vocabulary).
int64_t pad_id(const components::Tokenizer& tok);
/// Writes `text` to `path` through a temporary file and a rename.
Result<void> write_text(const std::string& path, const std::string& text);
/// True when some entry is not empty (a config.toml writes "" for none).
bool any(const std::vector<std::string>& v);

}  // namespace glint::launcher::recipe
