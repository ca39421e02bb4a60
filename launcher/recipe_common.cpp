#include "launcher/recipe_common.hpp"
#include "components/model/compute_info.hpp"

#include "components/model/lora_config.hpp"
#include "placement/service.hpp"
#include "placement/toml.hpp"
#include "runtime/file.hpp"
#include "runtime/log.hpp"

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <optional>
#include <regex>
#include <sstream>
#include <thread>

namespace glint::launcher::recipe {

namespace fs = std::filesystem;
using components::Row;

int refuse(const std::string& name, const std::string& why) {
  std::fprintf(stderr, "glint %s: %s\n", name.c_str(), why.c_str());
  return 2;
}

int fail(const std::string& name, const std::string& what, const caf::error& e) {
  std::fprintf(stderr, "glint %s: %s: %s\n", name.c_str(), what.c_str(), describe(e).c_str());
  return 1;
}

bool any(const std::vector<std::string>& v) {
  return std::any_of(v.begin(), v.end(), [](const std::string& s) { return !s.empty(); });
}

void add_model_flags(CLI::App* c, RecipeArgs& a) {
  c->add_option("--model", a.model, "Hugging Face model directory (config.json, weights, tokenizer.json), or a LoRA adapter directory to train "
                "further on its base (as --adapter-from); required");
  c->add_option("--train-type", a.train_type, "lora (an adapter on the frozen model) or full")
      ->capture_default_str()
      ->check(CLI::IsMember({"lora", "full"}));
  c->add_option("--lora-rank", a.lora_rank, "LoRA rank")->capture_default_str()->check(CLI::Range(int64_t{1}, int64_t{4096}));
  c->add_option("--lora-alpha", a.lora_alpha, "LoRA alpha (scaling alpha / rank)")->capture_default_str();
  c->add_option("--lora-dropout", a.lora_dropout, "LoRA dropout")->capture_default_str()->check(CLI::Range(0.0, 0.99));
  c->add_option("--target-modules", a.target_modules, "all-linear, or a comma-separated list (q_proj,v_proj,...)")
      ->capture_default_str();
  c->add_option("--adapter-from", a.adapter_from,
                "Start from this PEFT adapter directory (adapter_config.json + adapter_model.safetensors, e.g. a "
                "run's best/) instead of a fresh adapter; its rank and targets replace the --lora flags");
}

void add_data_flags(CLI::App* c, RecipeArgs& a, const std::string& rows) {
  c->add_option("--dataset", a.dataset,
                "Training " + rows + ": a JSONL or JSON file, FILE:RATIO to use that share of its rows; repeat to mix "
                "files; required");
  c->add_option("--val-dataset", a.val_dataset, "Validation " + rows + " (as --dataset); else --val-split");
  c->add_option("--val-split", a.val_split, "Share of the training rows held out for validation (without --val-dataset)")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 0.9));
  c->add_option("--system", a.system, "System message for rows that have none");
  c->add_option("--template", a.chat_template,
                "Chat template: auto (the model's tokenizer_config.json; any Jinja template), jinja (the Jinja interpreter even "
                "where a C++ format renders it), chatml, qwen2.5, qwen3 or llama3")
      ->capture_default_str();
}

void add_optim_flags(CLI::App* c, RecipeArgs& a) {
  c->add_option("--max-steps", a.max_steps, "Optimizer steps; 0: --epochs over the training rows")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 30));
  c->add_option("--epochs", a.epochs, "Passes over the training rows (when --max-steps is 0)")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 1e6));
  c->add_option("--optimizer", a.optimizer, "adamw or sgd")->capture_default_str()->check(CLI::IsMember({"adamw", "sgd"}));
  c->add_option("--lr", a.lr, "Peak learning rate")->capture_default_str();
  c->add_option("--weight-decay", a.weight_decay, "Decoupled weight decay")->capture_default_str();
  c->add_option("--max-grad-norm", a.max_grad_norm, "Clip the global gradient norm to this; 0: no clipping")
      ->capture_default_str();
  c->add_option("--lr-scheduler", a.lr_scheduler, "constant, linear or cosine")
      ->capture_default_str()
      ->check(CLI::IsMember({"constant", "linear", "cosine"}));
  c->add_option("--warmup-ratio", a.warmup_ratio, "Share of the steps spent warming up (if --warmup-steps is 0)")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 1.0));
  c->add_option("--warmup-steps", a.warmup_steps, "Warm-up steps")->capture_default_str()->check(CLI::Range(int64_t{0}, int64_t{1} << 30));
  c->add_option("--min-lr-ratio", a.min_lr_ratio, "Where linear and cosine decay end, as a share of --lr")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 1.0));
}

void add_packing_flag(CLI::App* c, bool& packing, const std::string& help) {
  // add_flag captures no default: without default_str, config.toml would record packing = false.
  c->add_flag("--packing,!--no-packing", packing, help)->default_str(packing ? "true" : "false");
}

void add_model_restart_flag(CLI::App* c, RecipeArgs& a) {
  c->add_option("--model-max-restarts", a.model_max_restarts,
                "A model rank lost with its process poisons the model group's collective: the run starts again from "
                "its newest checkpoint (--save-every) once glint run --max-restarts has the process back, up to this "
                "many times, and ends with the weights of a run never interrupted (docs/faults.md)")
      ->capture_default_str()
      ->check(CLI::Range(0, 1000));
}

void add_run_flags(CLI::App* c, RecipeArgs& a) {
  c->add_option("--eval-every", a.eval_every, "Steps between evaluations; 0: at the end only")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 30));
  c->add_option("--save-every", a.save_every, "Steps between checkpoints; 0: at each evaluation")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 30));
  c->add_option("--output", a.output, "The run directory")->capture_default_str();
  c->add_flag("--resume", a.resume, "Continue the run in --output from its latest checkpoint");
  c->add_flag("--overwrite", a.overwrite, "Start the run in --output over (its checkpoints are deleted)");
  c->add_option("--max-shard-mib", a.max_shard_mib, "Full training: weight shards of at most this many MiB")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 30));
  c->add_option("--dp", a.dp, "Data-parallel model ranks")->capture_default_str()->check(CLI::Range(1, 4096));
  c->add_option("--mesh", a.mesh,
                "The model group's mesh beyond --dp: fsdp=N (parameters, gradients and optimizer state sharded), "
                "tp=N (tensor parallel) or pp=N (pipeline stages), e.g. fsdp=2 or tp=2,dp=2; the ranks are their "
                "product (docs/parallelism.md). LoRA trains with fsdp only");
  c->add_option("--seed", a.seed, "Seed of the adapter, the data order, the mix (and the sampling)")->capture_default_str();
  c->add_option("--config", a.config,
                "A TOML file of these flags (key = value, names without the leading dashes); flags given too win");
}

namespace {

/// A TOML value as the text a flag takes (strings as they are, numbers so
/// that they parse back to the same value, booleans true/false); nullopt
/// for a table, a date or a nested array.
std::optional<std::string> flag_text(const toml::node& n) {
  if (auto s = n.as_string()) return s->get();
  if (auto i = n.as_integer()) return std::to_string(i->get());
  if (auto b = n.as_boolean()) return std::string{b->get() ? "true" : "false"};
  if (auto d = n.as_floating_point()) {
    char buf[64];  // the shortest text that reads back as the same double
    auto end = std::to_chars(buf, buf + sizeof buf, d->get()).ptr;
    return std::string{buf, end};
  }
  return std::nullopt;
}

using FlagValues = std::vector<std::pair<std::string, std::vector<std::string>>>;

/// The keys of a recipe's TOML and their values as flag texts (a list for
/// an array). Error: malformed TOML, a table, a value no flag takes.
Result<FlagValues> read_flags(std::string_view text, std::string_view source) {
  auto parsed = placement::parse_toml(text, source);
  if (!parsed) return parsed.error();
  FlagValues out;
  for (auto&& [k, v] : *parsed) {
    const std::string key{k.str()};
    const auto at = std::string{source} + ":" + std::to_string(v.source().begin.line);
    std::vector<std::string> values;
    if (auto arr = v.as_array()) {
      for (const auto& e : *arr) {
        auto t = flag_text(e);
        if (!t) return make_error(errc::invalid_argument, at + ": key '" + key + "' holds a value no flag takes");
        values.push_back(std::move(*t));
      }
    } else if (auto t = flag_text(v)) {
      values.push_back(std::move(*t));
    } else {
      return make_error(errc::invalid_argument, at + ": key '" + key + "' is a " +
                                                    (v.is_table() ? "table; keys are flags, with no [sections]"
                                                                  : "value no flag takes"));
    }
    out.emplace_back(key, std::move(values));
  }
  return out;
}

enum class FlagKind { flag, text, number };

/// A flag's value as TOML: true/false for a flag, a number option's value
/// as a number (when it is one), else a string with TOML's escapes.
std::string toml_value(const std::string& text, FlagKind kind) {
  if (kind == FlagKind::flag) {
    try {  // as CLI11 reads a flag's value (yes, on, 2, ...)
      return CLI::detail::to_flag_value(text) > 0 ? "true" : "false";
    } catch (const std::exception&) {
      return "false";
    }
  }
  static const std::regex number{R"(-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][-+]?[0-9]+)?)"};
  if (kind == FlagKind::number && std::regex_match(text, number)) {
    // A fraction in its shortest form (3e-3 and 0.003 are written alike);
    // an integer beyond int64 (a seed) is not a TOML integer: text.
    if (text.find_first_of(".eE") != std::string::npos) {
      char buf[64];
      auto end = std::to_chars(buf, buf + sizeof buf, std::strtod(text.c_str(), nullptr)).ptr;
      return std::string{buf, end};
    }
    errno = 0;
    (void)std::strtoll(text.c_str(), nullptr, 10);
    if (errno != ERANGE) return text;
  }
  // A basic string: every character as it is, but for TOML's escapes.
  std::string out = "\"";
  for (unsigned char c : text) {
    if (c == '"') out += "\\\"";
    else if (c == '\\') out += "\\\\";
    else if (c == '\n') out += "\\n";
    else if (c == '\t') out += "\\t";
    else if (c == '\r') out += "\\r";
    else if (c < 0x20 || c == 0x7f) {
      char esc[8];
      std::snprintf(esc, sizeof esc, "\\u%04X", c);
      out += esc;
    } else {
      out += static_cast<char>(c);
    }
  }
  return out + "\"";
}

}  // namespace

Result<void> apply_config(CLI::App& cmd, const std::string& path) {
  if (!fs::is_regular_file(path)) return make_error(errc::not_found, "--config " + path + " is not a file");
  auto text = read_text_file(path);
  if (!text) return with_context(text.error(), "--config");
  auto items = read_flags(*text, path);
  if (!items) return items.error();
  for (const auto& [key, values] : *items) {
    if (key == "config") continue;  // a recorded config.toml names its own source
    CLI::Option* opt = cmd.get_option_no_throw("--" + key);
    if (!opt || key == "help")
      return make_error(errc::invalid_argument, path + ": unknown key '" + key + "' (keys are the flags of glint " +
                                                    cmd.get_name() + " --help)");
    if (opt->count() > 0) continue;  // the command line wins
    if (values.empty()) continue;    // an empty list: the flag's default
    if (values.size() > 1 && opt->get_items_expected_max() <= 1)
      return make_error(errc::invalid_argument, path + ": key '" + key + "' takes one value, not a list");
    try {
      opt->add_result(values);
      opt->run_callback();
    } catch (const CLI::Error& e) {
      return make_error(errc::invalid_argument, path + ": key '" + key + "': " + e.what());
    }
  }
  return {};
}

std::string resolved_config(CLI::App& cmd, const RecipeArgs& a, const std::set<std::string>& skip) {
  std::string out = "# glint " + cmd.get_name() + ": every flag of this run as resolved (glint " + cmd.get_name() +
                    " --config this-file runs it again)\n";
  for (const CLI::Option* opt : cmd.get_options()) {
    if (opt->get_lnames().empty()) continue;
    const auto key = opt->get_lnames().front();
    if (key == "help" || key == "resume" || key == "overwrite" || key == "config" || skip.count(key)) continue;
    // With --adapter-from the adapter's own config holds these (and a
    // replay of this file must not give them).
    if (!a.adapter_from.empty() &&
        (key == "lora-rank" || key == "lora-alpha" || key == "lora-dropout" || key == "target-modules"))
      continue;
    const bool is_flag = opt->get_expected_min() == 0;
    const bool is_list = opt->get_items_expected_max() > 1;
    const auto type = opt->get_type_name();  // TEXT, INT, UINT, FLOAT, with checks after a ':'
    const FlagKind kind = is_flag ? FlagKind::flag : type.rfind("TEXT", 0) == 0 ? FlagKind::text : FlagKind::number;
    std::vector<std::string> values = opt->count() > 0 ? opt->reduced_results() : std::vector<std::string>{};
    if (values.empty() && !opt->get_default_str().empty()) values = {opt->get_default_str()};
    if (values.empty() && is_flag) values = {"false"};
    std::string line = key + " = ";
    if (is_list) {
      line += "[";
      for (size_t i = 0; i < values.size(); ++i) line += (i ? ", " : "") + toml_value(values[i], kind);
      line += "]";
    } else {
      line += toml_value(values.empty() ? std::string{} : values.front(), kind);
    }
    out += line + "\n";
  }
  return out;
}

std::string changed_since(const std::string& out, const std::string& resolved, const std::set<std::string>& resumable) {
  // Flags a resumed run may change: they do not change what was computed so far.
  static const std::set<std::string> common = {"resume", "overwrite", "max-steps", "epochs", "eval-every",
                                               "save-every", "config", "max-shard-mib", "dp",
                                               "model-max-restarts"};
  auto text = read_text_file(out + "/config.toml");
  if (!text) return "(its config.toml does not read: " + context_of(text.error()) + ")";
  // Both read the same way, so 3e-3 and 0.003 are one value.
  auto before = read_flags(*text, out + "/config.toml"), now = read_flags(resolved, "the flags");
  if (!before) return "(its config.toml does not read: " + context_of(before.error()) + ")";
  if (!now) return "(" + context_of(now.error()) + ")";
  // An empty list and one empty entry are the same "none" (an older
  // config.toml wrote `key=""` for an empty list).
  auto norm = [](std::vector<std::string> v) {
    std::erase(v, std::string{});
    return v;
  };
  // Flags added after runs were started, with the value every run before
  // them had: a config.toml without the key resumes with that value.
  static const std::map<std::string, std::string> added_later = {{"packing", "false"}, {"mesh", ""}, {"routing-replay", "false"}};
  std::map<std::string, std::vector<std::string>> was;
  for (const auto& [k, v] : *before) was[k] = norm(v);
  for (const auto& [k, v] : added_later) was.try_emplace(k, norm({v}));
  std::string changed;
  for (const auto& [k, v] : *now)
    if (!common.count(k) && !resumable.count(k) && (!was.count(k) || was.at(k) != norm(v)))
      changed += (changed.empty() ? "" : ", ") + k;
  return changed;
}

std::string prepare_flags(CLI::App& cmd, RecipeArgs& a) {
  if (!a.config.empty())
    if (auto ok = apply_config(cmd, a.config); !ok) return context_of(ok.error());
  if (auto why = model_from_adapter(a); !why.empty()) return why;
  return check_flags(a, cmd);
}

std::string model_from_adapter(RecipeArgs& a) {
  const fs::path dir{a.model};
  if (a.model.empty() || !fs::is_regular_file(dir / "adapter_config.json") || fs::exists(dir / "config.json")) return {};
  const std::string what = "--model " + a.model + " is a LoRA adapter directory (adapter_config.json, no config.json)";
  auto cfg = components::LoraConfig::load((dir / "adapter_config.json").string());
  if (!cfg) return what + ": " + context_of(cfg.error());
  const std::string& base = cfg->base_model_name_or_path;
  if (!a.adapter_from.empty())
    return what + " and --adapter-from " + a.adapter_from + " is given too: --model takes the base model directory";
  if (a.train_type != "lora")
    return what + ": --train-type " + a.train_type + " trains a whole model; give the base model's directory" +
           (base.empty() ? std::string{} : " (the adapter's base is " + base + ")");
  if (base.empty() || !fs::is_regular_file(fs::path{base} / "config.json"))
    return what + (base.empty() ? ": its base_model_name_or_path is empty"
                                : ": its base_model_name_or_path " + base + " is not a model directory here") +
           "; give the base and the adapter: --model BASE --adapter-from " + a.model;
  a.adapter_from = a.model;
  a.model = base;
  return {};
}

std::string check_flags(const RecipeArgs& a, CLI::App& cmd) {
  auto given = [&](const char* flag) { return cmd.get_option(flag)->count() > 0; };
  auto mesh = a.model_mesh();
  if (!mesh) return context_of(mesh.error());
  if (auto ok = actors::check_model_mesh(*mesh, "--mesh " + a.mesh); !ok) return context_of(ok.error());
  if (a.train_type == "lora" && (mesh->size(placement::Dim::tp) > 1 || mesh->size(placement::Dim::pp) > 1))
    return "--mesh " + a.mesh + ": a LoRA adapter trains on fsdp and dp meshes only (tensor and pipeline parallel "
           "train the full model: --train-type full)";
  if (a.resume && a.overwrite) return "--resume continues a run and --overwrite starts it over: pick one";
  if (any(a.val_dataset) && a.val_split > 0) return "--val-split holds out training rows; with --val-dataset it is not used";
  if (!a.adapter_from.empty())
    for (const char* f : {"--lora-rank", "--lora-alpha", "--lora-dropout", "--target-modules"})
      if (given(f)) return std::string{f} + " does not apply with --adapter-from (the adapter's own config does)";
  if (a.max_steps == 0 && !(a.epochs > 0)) return "--epochs must be > 0 (or give --max-steps)";
  if (a.model.empty()) return "--model is required (a Hugging Face model directory)";
  return {};
}

Result<ModelFiles> read_model(const RecipeArgs& a, const std::string& name) {
  ModelFiles m;
  m.dir = fs::absolute(a.model).lexically_normal().string();
  if (!fs::is_directory(m.dir)) return make_error(errc::invalid_argument, "--model " + a.model + " is not a directory");
  auto cfg = components::ModelConfig::load(m.dir + "/config.json");
  if (!cfg) return with_context(cfg.error(), "reading the model");
  m.config = std::move(*cfg);
  // Expert parallelism splits experts: the model must have them, in a
  // number the ep size divides, and train whole (before anything is written).
  if (auto mesh = a.model_mesh(); mesh && mesh->size(placement::Dim::ep) > 1) {
    const int ep = mesh->size(placement::Dim::ep);
    const auto where = m.dir + "/config.json";
    if (!m.config.has_experts())
      return make_error(errc::invalid_argument,
                        "--mesh " + a.mesh + ": expert parallelism splits a model's experts, and this " +
                            std::string{components::hf_class_name(m.config.architecture)} + " (" + where +
                            ") has none; use dp or fsdp");
    if (m.config.moe.num_experts % ep != 0)
      return make_error(errc::invalid_argument, "--mesh " + a.mesh + ": num_experts " +
                                                    std::to_string(m.config.moe.num_experts) + " (" + where +
                                                    ") does not divide by ep " + std::to_string(ep) +
                                                    "; use an ep that divides it");
    if (a.train_type == "lora")
      return make_error(errc::unimplemented, "--mesh " + a.mesh + ": LoRA on an expert-parallel model is not built "
                                             "yet; use --train-type full, or dp/fsdp for an adapter");
  }
  if (!fs::exists(m.dir + "/tokenizer.json"))
    return make_error(errc::invalid_argument, m.dir + " has no tokenizer.json: glint " + name +
                                                  " needs the model's tokenizer (save it beside the weights, as "
                                                  "tokenizer.save_pretrained does)");
  auto tok = components::Tokenizer::load(m.dir + "/tokenizer.json");
  if (!tok) return with_context(tok.error(), "reading the tokenizer");
  m.tokenizer = std::make_shared<const components::Tokenizer>(std::move(*tok));
  if (!a.adapter_from.empty() && !fs::exists(fs::path{a.adapter_from} / "adapter_config.json"))
    return make_error(errc::invalid_argument,
                      "--adapter-from " + a.adapter_from + " has no adapter_config.json (a PEFT adapter directory)");
  if (!a.adapter_from.empty() && a.train_type != "lora")
    return make_error(errc::invalid_argument, "--adapter-from needs --train-type lora");
  return m;
}

Result<components::LoraConfig> lora_of(const RecipeArgs& a) {
  if (a.train_type == "lora" && !(a.lora_alpha > 0)) return make_error(errc::invalid_argument, "--lora-alpha must be > 0");
  components::LoraConfig lora{.r = a.lora_rank, .alpha = a.lora_alpha, .dropout = a.lora_dropout};
  lora.target_modules.clear();
  std::stringstream list{a.target_modules};
  const auto& known = components::projection_names();
  for (std::string m; std::getline(list, m, ',');) {
    m.erase(0, m.find_first_not_of(" \t"));
    m.erase(m.find_last_not_of(" \t") + 1);
    if (m.empty()) continue;
    auto names_it = [&](const std::string& k) { return k == m || k.substr(k.rfind('.') + 1) == m; };
    if (m != "all-linear" && std::none_of(known.begin(), known.end(), names_it)) {
      std::string names = "all-linear";
      for (const auto& k : known) names += ", " + k.substr(k.rfind('.') + 1);
      return make_error(errc::invalid_argument, "--target-modules: '" + m + "' is not a module glint adapts (" + names + ")");
    }
    lora.target_modules.push_back(m);
  }
  if (lora.target_modules.empty()) return make_error(errc::invalid_argument, "--target-modules is empty");
  if (lora.target_modules.size() > 1 &&
      std::find(lora.target_modules.begin(), lora.target_modules.end(), "all-linear") != lora.target_modules.end())
    return make_error(errc::invalid_argument, "--target-modules: all-linear takes every projection already; give it alone");
  return lora;
}

Result<components::OptimizerConfig> optimizer_of(const RecipeArgs& a) {
  components::OptimizerConfig opt{.lr = a.lr, .weight_decay = a.weight_decay, .max_grad_norm = a.max_grad_norm};
  if (auto k = components::OptimizerConfig::parse_kind(a.optimizer); k) opt.kind = *k;
  if (auto ok = opt.validate(); !ok) return with_context(ok.error(), "the optimizer flags");
  return opt;
}

components::SchedulerConfig schedule_of(const RecipeArgs& a, int64_t steps) {
  components::SchedulerConfig sched{
      .warmup_steps = a.warmup_steps > 0 ? a.warmup_steps : static_cast<int64_t>(a.warmup_ratio * static_cast<double>(steps)),
      .total_steps = steps,
      .min_lr_ratio = a.min_lr_ratio};
  if (auto k = components::SchedulerConfig::parse_kind(a.lr_scheduler); k) sched.kind = *k;
  return sched;
}

namespace {

/// A dataset argument: FILE, or FILE:RATIO (RATIO > 0: that share of its
/// rows, drawn without replacement; above 1, whole passes and then a share).
struct DatasetArg {
  std::string path;
  double ratio = 1.0;
};

Result<DatasetArg> parse_dataset_arg(const std::string& arg) {
  DatasetArg d{arg, 1.0};
  if (auto colon = arg.rfind(':'); colon != std::string::npos && colon + 1 < arg.size()) {
    const auto tail = arg.substr(colon + 1);
    char* end = nullptr;
    const double r = std::strtod(tail.c_str(), &end);
    if (end && *end == '\0') {
      if (!(r > 0) || !std::isfinite(r))
        return make_error(errc::invalid_argument, "dataset '" + arg + "': the ratio after ':' must be a number > 0");
      d.path = arg.substr(0, colon);
      d.ratio = r;
    }
  }
  if (!fs::is_regular_file(d.path)) return make_error(errc::not_found, "dataset " + d.path + " is not a file");
  return d;
}

/// The rows of one dataset through `layout`, sampled by its ratio.
Result<std::vector<Row>> read_rows(const DatasetArg& d, const components::Preprocessor& layout,
                                   const std::string& layout_name, const std::string& hint, const std::string& name,
                                   uint64_t seed) {
  // Skipped rows are reported once the data is found usable; a refusal's
  // one line says how many were skipped and why.
  auto notes = std::make_shared<std::vector<std::string>>();
  auto ds = components::Dataset::load({.path = d.path, .log = [notes](const std::string& line) { notes->push_back(line); }});
  if (!ds) return ds.error();
  std::set<std::string> first_keys;
  if (ds->size() > 0) {
    const auto& r0 = ds->row(0);
    if (!r0.messages.empty()) first_keys.insert("messages");
    for (const auto& [k, _] : r0.fields) first_keys.insert(k);
    for (const auto& k : r0.nested) first_keys.insert(k);
    for (const auto& [k, _] : r0.conversations) first_keys.insert(k);
  }
  ds->map(layout);
  if (ds->size() == 0) {
    std::string keys;
    for (const auto& k : first_keys) keys += (keys.empty() ? "" : ", ") + k;
    return make_error(errc::invalid_argument, d.path + " has no usable row in the " + layout_name + " layout (" +
                                                  ds->skipped().summary() +
                                                  (keys.empty() ? "" : "; its first row has keys: " + keys) + "); " + hint);
  }
  for (const auto& line : *notes) std::fprintf(stderr, "glint %s: %s\n", name.c_str(), line.c_str());
  ds->shuffle(seed);
  std::vector<Row> all;
  for (size_t i = 0; i < ds->size(); ++i) all.push_back(ds->row(i));
  const auto want = static_cast<size_t>(std::llround(d.ratio * static_cast<double>(all.size())));
  if (want == 0)
    return make_error(errc::invalid_argument, d.path + ":" + std::to_string(d.ratio) + " keeps no row of its " +
                                                  std::to_string(all.size()) + "; use a larger ratio");
  std::vector<Row> out;
  for (size_t i = 0; i < want; ++i) out.push_back(all[i % all.size()]);
  return out;
}

}  // namespace

Result<std::vector<Row>> read_mix(const std::vector<std::string>& args, const components::Preprocessor& layout,
                                  const std::string& layout_name, const std::string& hint, const std::string& name,
                                  uint64_t seed) {
  std::vector<Row> rows;
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i].empty()) continue;  // a config.toml's "" for none
    auto d = parse_dataset_arg(args[i]);
    if (!d) return d.error();
    auto r = read_rows(*d, layout, layout_name, hint, name, seed + i);
    if (!r) return r.error();
    rows.insert(rows.end(), std::make_move_iterator(r->begin()), std::make_move_iterator(r->end()));
  }
  auto mixed = components::Dataset::from_rows(std::move(rows), "mix");
  mixed.shuffle(seed);
  std::vector<Row> out;
  for (size_t i = 0; i < mixed.size(); ++i) out.push_back(mixed.row(i));
  return out;
}

Result<components::Dataset> encoded(const std::vector<Row>& rows, const components::Template& chat, bool prompts) {
  auto ds = components::Dataset::from_rows(rows, "check");
  ds.set_template(chat);
  if (auto ok = ds.encode({.add_generation_prompt = prompts}); !ok) return ok.error();
  return ds;
}

Result<void> split_validation(std::vector<Row>& train, std::vector<Row>& val, double split) {
  const auto held = static_cast<size_t>(std::llround(split * static_cast<double>(train.size())));
  if (held == 0 || held >= train.size())
    return make_error(errc::invalid_argument, "--val-split " + std::to_string(split) + " of " +
                                                  std::to_string(train.size()) + " rows leaves no " +
                                                  (held == 0 ? "validation" : "training") + " row");
  val.assign(train.begin(), train.begin() + static_cast<std::ptrdiff_t>(held));
  // A row a ratio above 1 repeated is held out with all its copies.
  std::set<std::string> held_out;
  for (const auto& r : val) held_out.insert(r.origin);
  std::set<std::string> seen;  // each held-out row once in validation
  std::erase_if(val, [&](const Row& r) { return !seen.insert(r.origin).second; });
  std::erase_if(train, [&](const Row& r) { return held_out.count(r.origin) > 0; });
  if (train.empty()) return make_error(errc::invalid_argument, "--val-split leaves no training row");
  return {};
}

Result<void> read_data(const RecipeArgs& a, const components::Preprocessor& layout, const std::string& layout_name,
                       const std::string& hint, const std::string& name, std::vector<Row>& train, std::vector<Row>& val) {
  auto rows = read_mix(a.dataset, layout, layout_name, hint, name, a.seed);
  if (!rows) return with_context(rows.error(), "reading the training data");
  train = std::move(*rows);
  if (any(a.val_dataset)) {
    auto v = read_mix(a.val_dataset, layout, layout_name, hint, name, a.seed + 1000);
    if (!v) return with_context(v.error(), "reading the validation data");
    val = std::move(*v);
  } else if (a.val_split > 0) {
    return split_validation(train, val, a.val_split);
  }
  return {};
}

std::string output_dir(const RecipeArgs& a) {
  auto out_path = fs::absolute(a.output).lexically_normal();
  if (out_path.filename().empty()) out_path = out_path.parent_path();  // "runs/chat/"
  return out_path.string();
}

Result<void> write_text(const std::string& path, const std::string& text) {
  const auto tmp = path + ".tmp";
  {
    std::ofstream out{tmp, std::ios::trunc};
    out << text;
    if (!out.flush()) return make_error(errc::unavailable, "cannot write " + tmp);
  }
  std::error_code ec;
  fs::rename(tmp, path, ec);
  if (ec) return make_error(errc::unavailable, "cannot rename " + tmp + ": " + ec.message());
  return {};
}

Result<actors::Checkpointer> open_run(const RecipeArgs& a, const std::string& out, bool resuming,
                                      const std::vector<Row>& train, const std::vector<Row>& val,
                                      const std::string& resolved) {
  auto checkpoints = actors::Checkpointer::open(fs::path{out}.parent_path().string(), fs::path{out}.filename().string());
  if (!checkpoints) return with_context(checkpoints.error(), "opening the run index");
  // What decides the bits beyond the config (components/model/compute_info.hpp):
  // recorded with the run, compared when it resumes.
  const auto compute = components::compute_info().json();
  if (resuming) {
    auto recorded = read_text_file(out + "/compute.json");
    if (recorded && *recorded != compute)
      log::warn("this run was started with " + *recorded + "and resumes with " + compute +
                "its steps from here may differ from an uninterrupted run's in the last bits");
    return checkpoints;
  }
  if (auto ok = checkpoints->start_over(a.overwrite); !ok) {
    if (code_of(ok.error()) != errc::failed_precondition) return with_context(ok.error(), "starting the run over");
    return make_error(errc::failed_precondition, context_of(ok.error()) + ": pass --resume to continue it, --overwrite "
                                                                          "to start it over, or another --output");
  }
  const auto data_dir = out + "/data";
  std::error_code ec;
  if (a.overwrite)
    for (const char* old : {"last", "best", ".last.save", "last.tmp", "best.tmp"}) fs::remove_all(out + "/" + old, ec);
  fs::create_directories(data_dir, ec);
  if (ec) return make_error(errc::unavailable, "cannot create " + data_dir + ": " + ec.message());
  if (auto ok = components::save_jsonl(train, data_dir + "/train.jsonl"); !ok) return with_context(ok.error(), "writing data");
  fs::remove(data_dir + "/val.jsonl", ec);
  if (!val.empty())
    if (auto ok = components::save_jsonl(val, data_dir + "/val.jsonl"); !ok) return with_context(ok.error(), "writing data");
  if (auto ok = write_text(out + "/config.toml", resolved); !ok) return with_context(ok.error(), "writing config.toml");
  if (auto ok = write_text(out + "/compute.json", compute); !ok) return with_context(ok.error(), "writing compute.json");
  return checkpoints;
}

Result<Chat> chat_of(const RecipeArgs& a, const ModelFiles& files, int64_t max_length, const std::string& truncation) {
  auto t = components::parse_truncation(truncation);
  if (!t) return with_context(t.error(), "--truncation");
  const int64_t context = files.config.max_position_embeddings;
  if (max_length > context)
    return make_error(errc::invalid_argument, "--max-length " + std::to_string(max_length) +
                                                  " is beyond the model's max_position_embeddings " +
                                                  std::to_string(context) + " (config.json)");
  const int64_t limit = max_length > 0 ? max_length : context;
  auto chat = components::Template::make(files.tokenizer, {.name = a.chat_template, .max_length = limit, .truncation = *t});
  if (!chat) return make_error(errc::invalid_argument, "the chat template: " + context_of(chat.error()));
  return Chat{limit, std::move(*chat)};
}

std::string adapter_name(const Runtime& rt, const RecipeArgs& a, const std::string& name) {
  if (rt.mode() != Mode::remote) return name;
  // The run directory's name to read, and a hash of its whole path, so that
  // runs/a/pref and runs/b/pref (or two checkouts' runs/dpo) differ.
  const auto out = output_dir(a);
  std::string run = fs::path{out}.filename().string();
  for (auto& c : run)
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '-' && c != '_') c = '_';
  uint64_t h = 1469598103934665603ULL;  // FNV-1a
  for (unsigned char c : out) h = (h ^ c) * 1099511628211ULL;
  char hex[9];
  std::snprintf(hex, sizeof hex, "%08x", static_cast<unsigned>(h ^ (h >> 32)));
  return "glint-" + run + "-" + hex + (name == kAdapter ? "" : "-" + name);
}

Result<actors::ModelGroup> open_model(Runtime& rt, const RecipeArgs& a, const std::string& model_dir,
                                      const components::LoraConfig* lora) {
  if (auto svc = placement::service(rt, {.strategy = placement::Strategy::spread}); !svc)
    return with_context(svc.error(), "placement");
  auto mesh = a.model_mesh();
  if (!mesh) return with_context(mesh.error(), "the device mesh");
  auto base = actors::open_model_group(rt, placement::DeviceGroup::of("model", mesh->world_size()), *mesh,
                                       {.model_dir = model_dir});
  if (!base) return with_context(base.error(), "opening the model group");
  if (!lora) return *base;
  const auto name = adapter_name(rt, a);
  auto added = add_replacing(rt, *base, name, [&] {
    return a.adapter_from.empty() ? base->add_adapter(name, *lora, a.seed).get()
                                  : base->load_adapter(name, fs::absolute(a.adapter_from).string()).get();
  });
  if (!added) return with_context(added.error(), a.adapter_from.empty() ? "adding the LoRA adapter" : "loading --adapter-from");
  return base->with_adapter(name);
}

Result<Loaders> open_loaders(Runtime& rt, const actors::DataLoaderSpec& spec, const std::string& val_path,
                             int64_t val_batch_size) {
  auto train = actors::open_dataloader(rt, placement::DeviceGroup::of("train-data", 1), spec);
  if (!train) return with_context(train.error(), "opening the training data");
  auto info = train->loader_info().take();
  if (!info) return with_context(info.error(), "reading the training data");
  Loaders l{.train = std::move(*train), .info = std::move(*info), .val = std::nullopt, .val_batches = 0};
  if (val_path.empty()) return l;
  auto vspec = spec;
  vspec.dataset = val_path;
  vspec.shuffle = false;
  vspec.min_batch_size = 1;
  if (val_batch_size > 0) vspec.batch_size = val_batch_size;
  auto v = actors::open_dataloader(rt, placement::DeviceGroup::of("val-data", 1), vspec);
  if (!v) return with_context(v.error(), "opening the validation data");
  auto vi = v->loader_info().take();
  if (!vi) return with_context(vi.error(), "reading the validation data");
  l.val_batches = vi->batches_per_epoch;
  l.val.emplace(std::move(*v));
  return l;
}

int run_with_model_restarts(Runtime& rt, const std::string& name, int max_restarts,
                            const std::function<int(Attempt&)>& body) {
  for (int number = 1;; ++number) {
    Attempt attempt{number};
    std::vector<int> restarts_before;
    for (const auto& n : rt.nodes()) restarts_before.push_back(n.restarts);
    const auto mark = rt.spawned_mark();
    const int code = body(attempt);
    if (code == 0) return 0;
    // Was a node of the model group lost during this try (lost now, or
    // lost and already back: restarted since it began)? A rank's failure
    // can reach the driver a moment before its node is marked lost: give
    // the mark up to 2 s.
    std::vector<NodeInfo> lost;
    for (int wait = 0; wait < 100 && lost.empty() && !attempt.nodes().empty(); ++wait) {
      if (wait > 0) std::this_thread::sleep_for(std::chrono::milliseconds(20));
      for (int n : attempt.nodes()) {
        auto node = rt.node(n);
        if (node.lost || node.restarts != restarts_before.at(static_cast<size_t>(n))) lost.push_back(node);
      }
    }
    if (lost.empty()) return code;
    std::string which;
    for (const auto& n : lost)
      which += (which.empty() ? "" : ", ") + n.describe() + (n.lost_reason.empty() ? "" : " (" + n.lost_reason + ")");
    if (number > max_restarts) {
      std::fprintf(stderr, "glint %s: the model group lost %s; %s\n", name.c_str(), which.c_str(),
                   max_restarts == 0 ? "not restarting it (--model-max-restarts 0)"
                                     : ("giving up after " + std::to_string(max_restarts) + " restart(s) of the "
                                        "model group (--model-max-restarts)").c_str());
      return code;
    }
    std::fprintf(stderr, "glint %s: the model group lost %s; restarting the run from its newest checkpoint "
                 "(restart %d of %d)\n", name.c_str(), which.c_str(), number, max_restarts);
    // The try's actors go, and the placement service with what it placed:
    // the next try places afresh, over the nodes as they are then.
    rt.stop_spawned_since(mark);
    rt.set_service("placement", caf::actor{});
    const auto limit = rt.options().connect_timeout;
    const auto until = std::chrono::steady_clock::now() + limit;
    for (const auto& n : lost) {
      while (rt.node(n.index).lost && std::chrono::steady_clock::now() < until)
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
      if (rt.node(n.index).lost) {
        std::fprintf(stderr, "glint %s: %s did not come back within %lld s, so the model group cannot be placed "
                     "as before; run the job under `glint run --max-restarts N`, which starts a node process that "
                     "dies again, or resume it later with --resume\n", name.c_str(), n.describe().c_str(),
                     static_cast<long long>(std::chrono::duration_cast<std::chrono::seconds>(limit).count()));
        return code;
      }
    }
  }
}

Result<RunPosition> resume_run(actors::Checkpointer& checkpoints, bool resuming, const actors::ModelGroup& model,
                            const actors::DataLoaderGroup* train, const std::string& name, const std::string& best_key) {
  RunPosition p{.best = 0};
  if (!resuming) return p;
  auto state = checkpoints.resume(model, train);
  if (!state) return with_context(state.error(), "resuming");
  if (!*state) return p;
  p.start = (*state)->step;
  const auto& m = (*state)->metrics;
  if (auto it = m.find(best_key); it != m.end()) p.best = it->second;
  if (auto it = m.find("best_step"); it != m.end()) p.best_step = static_cast<int64_t>(it->second);
  std::printf("glint %s: resumed at step %lld\n", name.c_str(), static_cast<long long>(p.start));
  return p;
}

void record_best(std::map<std::string, double>& metrics, const RunPosition& p, const std::string& best_key) {
  if (p.best_step == 0) return;
  metrics[best_key] = p.best;
  metrics["best_step"] = static_cast<double>(p.best_step);
}

namespace {

/// Copies the model files of `from` (not optimizer.safetensors) into a new
/// directory `to`, replacing an older one whole.
Result<void> publish_model(const std::string& from, const std::string& to, const std::string& tokenizer_dir) {
  const auto tmp = to + ".tmp";
  std::error_code ec;
  fs::remove_all(tmp, ec);
  fs::create_directories(tmp, ec);
  if (ec) return make_error(errc::unavailable, "cannot create " + tmp + ": " + ec.message());
  fs::directory_iterator it{from, ec}, end;
  if (ec) return make_error(errc::not_found, "cannot read " + from + ": " + ec.message());
  for (; it != end; it.increment(ec)) {
    const auto& e = *it;
    // The optimizer state stays with the checkpoint (optimizer.safetensors, or
    // a model-parallel group's optimizer-<dim><k>-of-<n>.safetensors).
    const auto file = e.path().filename().string();
    if (!e.is_regular_file() || (file.rfind("optimizer", 0) == 0 && e.path().extension() == ".safetensors")) continue;
    fs::copy_file(e.path(), fs::path{tmp} / e.path().filename(), fs::copy_options::overwrite_existing, ec);
    if (ec) return make_error(errc::unavailable, "cannot copy " + e.path().string() + ": " + ec.message());
  }
  if (ec) return make_error(errc::unavailable, "cannot read " + from + ": " + ec.message());
  // A full model directory is only usable with its tokenizer beside it.
  if (!tokenizer_dir.empty())
    for (const char* f : {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "generation_config.json"})
      if (auto src = fs::path{tokenizer_dir} / f; fs::exists(src) && !fs::exists(fs::path{tmp} / f)) {
        fs::copy_file(src, fs::path{tmp} / f, ec);
        if (ec) return make_error(errc::unavailable, "cannot copy " + src.string() + ": " + ec.message());
      }
  fs::remove_all(to, ec);
  fs::rename(tmp, to, ec);
  if (ec) return make_error(errc::unavailable, "cannot rename " + tmp + " to " + to + ": " + ec.message());
  return {};
}

}  // namespace

Result<void> publish_outputs(const actors::ModelGroup& model, const actors::Checkpointer& checkpoints,
                             const RecipeArgs& a, const std::string& out, const std::string& model_dir,
                             int64_t best_step) {
  const std::string tokenizer_dir = a.train_type == "full" ? model_dir : "";
  const auto staged = out + "/.last.save";
  std::error_code ec;
  fs::remove_all(staged, ec);
  if (auto ok = model.save({.dir = staged, .max_shard_bytes = a.max_shard_mib << 20}).take(); !ok)
    return with_context(ok.error(), "saving the final weights");
  if (auto ok = publish_model(staged, out + "/last", tokenizer_dir); !ok) return with_context(ok.error(), "writing last/");
  fs::remove_all(staged, ec);
  std::printf("final weights: %s/last (%s)\n", out.c_str(),
              a.train_type == "lora" ? "a PEFT adapter directory" : "a Hugging Face model directory");
  if (best_step > 0) {
    const auto from = checkpoints.run_dir() + "/checkpoint-" + std::to_string(best_step) + "/model";
    if (auto ok = publish_model(from, out + "/best", tokenizer_dir); !ok) return with_context(ok.error(), "writing best/");
  }
  return {};
}

int64_t pad_id(const components::Tokenizer& tok) {
  for (const char* role : {"pad_token", "eos_token"})
    if (auto it = tok.config().special_tokens.find(role); it != tok.config().special_tokens.end())
      if (auto id = tok.token_id(it->second); id >= 0) return id;
  return 0;
}

}  // namespace glint::launcher::recipe

namespace glint::launcher {

Result<placement::DeviceMesh> RecipeArgs::model_mesh() const {
  if (mesh.empty()) return placement::DeviceMesh::from_sizes({.dp = dp});
  auto m = placement::DeviceMesh::parse(mesh);
  if (!m) return with_context(m.error(), "--mesh");
  // Whether --mesh names dp itself (dp=1 too).
  const bool names_dp = ("," + mesh).find(",dp=") != std::string::npos;
  if (dp != 1 && names_dp && m->size(placement::Dim::dp) != dp)
    return make_error(errc::invalid_argument, "--dp " + std::to_string(dp) + " and --mesh " + mesh +
                                                  " give two data-parallel sizes: give it once");
  if (dp == 1 || names_dp) return m;
  auto sizes = m->sizes();
  sizes[static_cast<size_t>(placement::Dim::dp)] = dp;
  return placement::DeviceMesh::from_dims(sizes);
}

int RecipeArgs::data_ranks() const {
  auto m = model_mesh();
  return m ? m->data_size() : dp;
}

int RecipeArgs::model_ranks() const {
  auto m = model_mesh();
  return m ? m->world_size() : dp;
}

}  // namespace glint::launcher
