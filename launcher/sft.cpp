// `glint sft`: supervised fine-tuning of a user's Hugging Face model on the
// user's conversations, LoRA or full, as a driver on the public API.
//
// Everything that can be checked is checked before anything is written: the
// model's config (architecture), its tokenizer and chat template, every
// dataset (a known layout, at least one row that encodes within
// --max-length). Then the run directory gets config.toml (every flag,
// resolved), data/ (the training and validation rows, mixed and split as
// asked, so a resume reads the same rows), checkpoints, metrics.jsonl,
// report.html, and at the end last/ (the final weights: a PEFT adapter
// directory, or a Hugging Face model directory with the tokenizer) and, when
// there is evaluation, best/ (the checkpoint with the lowest validation loss).
#include "launcher/recipes.hpp"

#include "actors/checkpointer.hpp"
#include "actors/dataloader_group.hpp"
#include "actors/model_group.hpp"
#include "components/data/dataset.hpp"
#include "components/data/tokenizer.hpp"
#include "components/model/config.hpp"
#include "placement/service.hpp"
#include "runtime/progress.hpp"
#include "runtime/report.hpp"
#include "runtime/runtime.hpp"

#include <stdlib.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <sstream>

namespace glint::launcher {

namespace {

namespace fs = std::filesystem;
using components::Row;

constexpr const char* kAdapter = "default";

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

/// The rows of one dataset in the chosen layout, sampled by its ratio.
Result<std::vector<Row>> read_rows(const DatasetArg& d, const SftArgs& a, uint64_t seed) {
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
  }
  auto layout = components::preprocess::layout(a.layout, a.system);
  if (!layout) return layout.error();
  ds->map(*layout);
  if (ds->size() == 0) {
    std::string keys;
    for (const auto& k : first_keys) keys += (keys.empty() ? "" : ", ") + k;
    return make_error(errc::invalid_argument,
                      d.path + " has no usable row in the " + a.layout + " layout (" + ds->skipped().summary() +
                          (keys.empty() ? "" : "; its first row has keys: " + keys) +
                          "); glint sft reads messages, query/response and alpaca (instruction/input/output) rows");
  }
  for (const auto& line : *notes) std::fprintf(stderr, "glint sft: %s\n", line.c_str());
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

/// The rows of several datasets, mixed in one seeded order.
Result<std::vector<Row>> read_mix(const std::vector<std::string>& args, const SftArgs& a, uint64_t seed) {
  std::vector<Row> rows;
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i].empty()) continue;  // a config.toml's "" for none
    auto d = parse_dataset_arg(args[i]);
    if (!d) return d.error();
    auto r = read_rows(*d, a, seed + i);
    if (!r) return r.error();
    rows.insert(rows.end(), std::make_move_iterator(r->begin()), std::make_move_iterator(r->end()));
  }
  auto mixed = components::Dataset::from_rows(std::move(rows), "mix");
  mixed.shuffle(seed);
  std::vector<Row> out;
  for (size_t i = 0; i < mixed.size(); ++i) out.push_back(mixed.row(i));
  return out;
}

/// How many rows encode within the limits (what the dataloader will keep).
Result<int64_t> usable_rows(const std::vector<Row>& rows, const components::Template& chat, std::string& skipped) {
  auto ds = components::Dataset::from_rows(rows, "check");
  ds.set_template(chat);
  if (auto ok = ds.encode(); !ok) return ok.error();
  skipped = ds.skipped().summary();
  return static_cast<int64_t>(ds.size());
}

/// The resolved flags as key -> value (config.toml's lines).
std::map<std::string, std::string> config_entries(const std::string& toml) {
  std::map<std::string, std::string> out;
  std::istringstream in{toml};
  for (std::string line; std::getline(in, line);) {
    if (line.empty() || line[0] == '#') continue;
    auto eq = line.find('=');
    if (eq == std::string::npos) continue;
    auto trim = [](std::string s) {
      s.erase(0, s.find_first_not_of(' '));
      s.erase(s.find_last_not_of(' ') + 1);
      return s;
    };
    out[trim(line.substr(0, eq))] = trim(line.substr(eq + 1));
  }
  return out;
}

/// Flags a resumed run may change: they do not change what was computed so far.
const std::set<std::string> resumable_changes = {"resume", "overwrite", "max-steps", "epochs", "eval-every",
                                                 "save-every", "config", "max-shard-mib", "dp"};

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
    if (!e.is_regular_file() || e.path().filename() == "optimizer.safetensors") continue;
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

int refuse(const std::string& why) {
  std::fprintf(stderr, "glint sft: %s\n", why.c_str());
  return 2;
}

int fail(const std::string& what, const caf::error& e) {
  std::fprintf(stderr, "glint sft: %s: %s\n", what.c_str(), describe(e).c_str());
  return 1;
}

/// Padding is masked out; its id only has to be in the vocabulary.
int64_t pad_id(const components::Tokenizer& tok) {
  for (const char* role : {"pad_token", "eos_token"})
    if (auto it = tok.config().special_tokens.find(role); it != tok.config().special_tokens.end())
      if (auto id = tok.token_id(it->second); id >= 0) return id;
  return 0;
}

/// The model group of `a.dp` ranks on `model_dir`, placed; with `lora`,
/// the handle of its adapter kAdapter (read from --adapter-from, or fresh).
Result<actors::ModelGroup> open_model(Runtime& rt, const SftArgs& a, const std::string& model_dir,
                                      const components::LoraConfig* lora) {
  if (auto svc = placement::service(rt, {.strategy = placement::Strategy::spread}); !svc)
    return with_context(svc.error(), "placement");
  auto mesh = placement::DeviceMesh::from_sizes({.dp = a.dp});
  if (!mesh) return with_context(mesh.error(), "the device mesh");
  auto base = actors::open_model_group(rt, placement::DeviceGroup::of("model", a.dp), *mesh, {.model_dir = model_dir});
  if (!base) return with_context(base.error(), "opening the model group");
  if (!lora) return *base;
  auto added = a.adapter_from.empty() ? base->add_adapter(kAdapter, *lora, a.seed).get()
                                      : base->load_adapter(kAdapter, fs::absolute(a.adapter_from).string()).get();
  if (!added) return with_context(added.error(), a.adapter_from.empty() ? "adding the LoRA adapter" : "loading --adapter-from");
  return base->with_adapter(kAdapter);
}

/// The validation loss: the mean negative log-likelihood of the trained
/// tokens of `batches` batches of `val` (one epoch).
Result<double> validation_loss(const actors::ModelGroup& model, const actors::DataLoaderGroup& val, int64_t batches,
                               int64_t pad, int dp) {
  double nll = 0, n = 0;
  for (int64_t i = 0; i < batches; ++i) {
    auto b = val.next_batch().take();
    if (!b) return b.error();
    // A short last batch with fewer rows than ranks gets copies of its first
    // row that count nothing (loss mask 0), so every row is measured.
    auto rows = b->rows;
    while (!rows.empty() && rows.size() < static_cast<size_t>(dp)) {
      rows.push_back(rows.front());
      std::fill(rows.back().loss_mask.begin(), rows.back().loss_mask.end(), 0.f);
    }
    auto batch = actors::train_batch_of(rows, pad);
    if (!batch) return batch.error();
    auto lp = model.forward_only(*batch).take();
    if (!lp) return lp.error();
    auto logps = lp->values<float>();
    if (!logps) return logps.error();
    auto mask = batch->tensors.at("loss_mask").values<float>();
    if (!mask) return mask.error();
    for (size_t j = 0; j < logps->size(); ++j)
      if ((*mask)[j] > 0) {
        nll -= (*logps)[j];
        n += 1;
      }
  }
  if (n == 0) return make_error(errc::invalid_argument, "the validation rows have no trained token");
  return nll / n;
}

/// --eval-only: the validation loss of the model (with --adapter-from),
/// its rows written to a temporary directory only.
int evaluate_only(const SftArgs& a, const std::string& model_dir, int64_t max_length, const std::vector<Row>& rows) {
  char tmpl[] = "/tmp/glint-sft-eval-XXXXXX";
  if (!::mkdtemp(tmpl)) return refuse("cannot make a temporary directory");
  const std::string tmp = tmpl;
  struct Cleanup {
    std::string dir;
    ~Cleanup() {
      std::error_code ec;
      fs::remove_all(dir, ec);
    }
  } cleanup{tmp};
  if (auto ok = components::save_jsonl(rows, tmp + "/val.jsonl"); !ok) return fail("writing data", ok.error());
  return run_main([&](Runtime& rt) -> int {
    const components::LoraConfig from_dir{};  // its own config is read
    auto opened = open_model(rt, a, model_dir, a.adapter_from.empty() ? nullptr : &from_dir);
    if (!opened) return fail("the model", opened.error());
    const auto& model = *opened;
    auto val = actors::open_dataloader(rt, placement::DeviceGroup::of("val-data", 1),
                                       {.dataset = tmp + "/val.jsonl", .tokenizer = model_dir, .template_name = a.chat_template,
                                        .max_length = max_length, .truncation = a.truncation, .batch_size = a.batch_size,
                                        .min_batch_size = 1, .shuffle = false, .seed = a.seed, .epochs = 0});
    if (!val) return fail("opening the validation data", val.error());
    auto info = val->loader_info().take();
    if (!info) return fail("reading the validation data", info.error());
    auto tok = components::Tokenizer::load(model_dir + "/tokenizer.json");
    if (!tok) return fail("reading the tokenizer", tok.error());
    auto loss = validation_loss(model, *val, info->batches_per_epoch, pad_id(*tok), a.dp);
    if (!loss) return fail("evaluating", loss.error());
    std::printf("eval_loss: %.6f\n", *loss);
    return 0;
  });
}

}  // namespace

CLI::App* add_sft(CLI::App& app, SftArgs& a) {
  auto* c = app.add_subcommand("sft", "Fine-tune your Hugging Face model on your conversations (LoRA or full)");
  c->add_option("--config", a.config,
                "A TOML file of these flags (key = value, names without the leading dashes); flags given too win");
  c->add_option("--model", a.model, "Hugging Face model directory (config.json, weights, tokenizer.json); required");
  c->add_option("--dataset", a.dataset,
                "Training data: a JSONL or JSON file, FILE:RATIO to use that share of its rows; repeat to mix files; "
                "required");
  c->add_option("--val-dataset", a.val_dataset, "Validation data (as --dataset); else --val-split");
  c->add_option("--val-split", a.val_split, "Share of the training rows held out for validation (without --val-dataset)")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 0.9));
  c->add_option("--layout", a.layout, "Row layout: auto, messages, query_response or alpaca")
      ->capture_default_str()
      ->check(CLI::IsMember(components::preprocess::layout_names()));
  c->add_option("--system", a.system, "System message for rows that have none");
  c->add_option("--template", a.chat_template,
                "Chat template: auto (the model's tokenizer_config.json), chatml, qwen2.5, qwen3 or llama3")
      ->capture_default_str();
  c->add_option("--max-length", a.max_length, "Tokens per row; 0: the model's context")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 24));
  c->add_option("--truncation", a.truncation, "Rows over --max-length: refuse (skip them), left or right")
      ->capture_default_str()
      ->check(CLI::IsMember({"refuse", "left", "right"}));
  c->add_flag("--packing,!--no-packing", a.packing, "Pack rows end to end without padding (padding-free batches)");
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
  c->add_flag("--eval-only", a.eval_only,
              "Print the validation loss (eval_loss) of the model, with --adapter-from if given, and write nothing");
  c->add_option("--batch-size", a.batch_size, "Rows per micro-batch (the global batch, over --dp ranks)")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  c->add_option("--grad-accum", a.grad_accum, "Micro-batches per optimizer step")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{4096}));
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
  c->add_option("--seed", a.seed, "Seed of the adapter, the data order and the mix")->capture_default_str();
  c->footer(
      "Examples:\n"
      "  glint sft --model models/qwen --dataset data/chat.jsonl --output runs/chat\n"
      "  glint sft --model models/qwen --dataset a.jsonl:0.5 --dataset b.jsonl --val-split 0.05 --packing\n"
      "  glint sft --config run.toml            (the same flags as a TOML file; docs/recipes.md)\n"
      "  glint run --nproc 2 -- glint sft --model models/qwen --dataset d.jsonl --dp 2");
  return c;
}

static bool any(const std::vector<std::string>& v) {
  return std::any_of(v.begin(), v.end(), [](const std::string& s) { return !s.empty(); });
}

/// The learning-rate schedule of a run of `steps` steps.
static components::SchedulerConfig schedule_of(const SftArgs& a, int64_t steps) {
  components::SchedulerConfig sched{
      .warmup_steps = a.warmup_steps > 0 ? a.warmup_steps : static_cast<int64_t>(a.warmup_ratio * static_cast<double>(steps)),
      .total_steps = steps,
      .min_lr_ratio = a.min_lr_ratio};
  if (auto k = components::SchedulerConfig::parse_kind(a.lr_scheduler); k) sched.kind = *k;
  return sched;
}

/// Applies the TOML file `path` to the flags of `cmd` not given on the
/// command line. Every key must be a flag; a wrong value is an error naming it.
static Result<void> apply_config(CLI::App& cmd, const std::string& path) {
  if (!fs::is_regular_file(path)) return make_error(errc::not_found, "--config " + path + " is not a file");
  std::vector<CLI::ConfigItem> items;
  try {
    items = CLI::ConfigTOML{}.from_file(path);
  } catch (const std::exception& e) {
    return make_error(errc::invalid_argument, path + ": " + e.what());
  }
  for (const auto& item : items) {
    const auto key = item.fullname();
    if (key == "config") continue;  // a recorded config.toml names its own source
    CLI::Option* opt = cmd.get_option_no_throw("--" + key);
    if (!opt || key == "help")
      return make_error(errc::invalid_argument, path + ": unknown key '" + key + "' (keys are the flags of glint sft --help)");
    if (opt->count() > 0) continue;  // the command line wins
    try {
      opt->add_result(item.inputs);
      opt->run_callback();
    } catch (const CLI::Error& e) {
      return make_error(errc::invalid_argument, path + ": key '" + key + "': " + e.what());
    }
  }
  return {};
}

int sft(const SftArgs& args, CLI::App& cmd) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  if (!args.config.empty())
    if (auto ok = apply_config(cmd, args.config); !ok) {
      std::fprintf(stderr, "glint sft: %s\n", context_of(ok.error()).c_str());
      return 2;
    }
  const SftArgs& a = args;
  if (a.model.empty()) return refuse("--model is required (a Hugging Face model directory)");
  // Flags that would be read and then ignored are refused.
  auto given = [&](const char* flag) { return cmd.get_option(flag)->count() > 0; };
  if (a.resume && a.overwrite) return refuse("--resume continues a run and --overwrite starts it over: pick one");
  if (any(a.val_dataset) && a.val_split > 0) return refuse("--val-split holds out training rows; with --val-dataset it is not used");
  if (a.eval_only && any(a.dataset)) return refuse("--eval-only reads --val-dataset only; leave out --dataset");
  if (!a.adapter_from.empty())
    for (const char* f : {"--lora-rank", "--lora-alpha", "--lora-dropout", "--target-modules"})
      if (given(f)) return refuse(std::string{f} + " does not apply with --adapter-from (the adapter's own config does)");
  if (a.max_steps == 0 && !(a.epochs > 0)) return refuse("--epochs must be > 0 (or give --max-steps)");
  // 1. Checks that write nothing.
  const auto model_dir = fs::absolute(a.model).lexically_normal().string();
  if (!fs::is_directory(model_dir)) return refuse("--model " + a.model + " is not a directory");
  auto mcfg = components::ModelConfig::load(model_dir + "/config.json");
  if (!mcfg) return fail("reading the model", mcfg.error());
  if (!fs::exists(model_dir + "/tokenizer.json"))
    return refuse(model_dir + " has no tokenizer.json: glint sft needs the model's tokenizer (save it beside the "
                              "weights, as tokenizer.save_pretrained does)");
  auto tok = components::Tokenizer::load(model_dir + "/tokenizer.json");
  if (!tok) return fail("reading the tokenizer", tok.error());
  auto truncation = components::parse_truncation(a.truncation);
  if (!truncation) return fail("--truncation", truncation.error());
  if (a.max_length > mcfg->max_position_embeddings)
    return refuse("--max-length " + std::to_string(a.max_length) + " is beyond the model's max_position_embeddings " +
                  std::to_string(mcfg->max_position_embeddings) + " (config.json)");
  const int64_t max_length = a.max_length > 0 ? a.max_length : mcfg->max_position_embeddings;
  auto chat = components::Template::make(std::make_shared<const components::Tokenizer>(std::move(*tok)),
                                         {.name = a.chat_template, .max_length = max_length, .truncation = *truncation});
  if (!chat) return fail("the chat template", chat.error());
  if (a.train_type == "lora" && !(a.lora_alpha > 0)) return refuse("--lora-alpha must be > 0");
  if (a.batch_size < a.dp)
    return refuse("--batch-size " + std::to_string(a.batch_size) + " is smaller than --dp " + std::to_string(a.dp) +
                  ": every data-parallel rank needs a row");
  components::LoraConfig lora{.r = a.lora_rank, .alpha = a.lora_alpha, .dropout = a.lora_dropout};
  lora.target_modules.clear();
  {
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
        return refuse("--target-modules: '" + m + "' is not a module glint adapts (" + names + ")");
      }
      lora.target_modules.push_back(m);
    }
    if (lora.target_modules.empty()) return refuse("--target-modules is empty");
    if (lora.target_modules.size() > 1 &&
        std::find(lora.target_modules.begin(), lora.target_modules.end(), "all-linear") != lora.target_modules.end())
      return refuse("--target-modules: all-linear takes every projection already; give it alone");
  }
  components::OptimizerConfig opt{.lr = a.lr, .weight_decay = a.weight_decay, .max_grad_norm = a.max_grad_norm};
  if (auto k = components::OptimizerConfig::parse_kind(a.optimizer); k) opt.kind = *k;
  if (auto ok = opt.validate(); !ok) return fail("the optimizer flags", ok.error());

  auto out_path = fs::absolute(a.output).lexically_normal();
  if (out_path.filename().empty()) out_path = out_path.parent_path();  // "runs/chat/"
  const auto out = out_path.string();
  const auto data_dir = out + "/data";
  // The flags as config.toml records them: what the run computes, not how
  // this invocation was asked to treat the directory.
  std::string resolved;
  {
    std::istringstream in{cmd.config_to_str(true, false)};
    for (std::string line; std::getline(in, line);) {
      const auto key = line.substr(0, line.find('='));
      if (key == "resume" || key == "overwrite" || key == "eval-only" || key == "config") continue;
      // With --adapter-from the adapter's own config holds these (and a
      // replay of this file must not give them).
      if (!a.adapter_from.empty() &&
          (key == "lora-rank" || key == "lora-alpha" || key == "lora-dropout" || key == "target-modules"))
        continue;
      resolved += line + "\n";
    }
  }
  const bool resuming = a.resume && fs::exists(out + "/config.toml");
  std::vector<Row> train_rows, val_rows;
  if (resuming && a.max_steps > 0)
    if (auto ok = schedule_of(a, a.max_steps).validate(); !ok) return refuse("the schedule flags: " + context_of(ok.error()));
  if (resuming) {
    // The run's own rows and flags: a resume computes what the run would have.
    std::ifstream in{out + "/config.toml"};
    std::stringstream text;
    text << in.rdbuf();
    auto before = config_entries(text.str()), now = config_entries(resolved);
    std::string changed;
    for (const auto& [k, v] : now)
      if (!resumable_changes.count(k) && before[k] != v) changed += (changed.empty() ? "" : ", ") + k;
    if (!changed.empty())
      return refuse("--resume: the run in " + out + " was started with other values of " + changed +
                    " (see its config.toml); use them, or start another --output");
  } else {
    if (!any(a.dataset) && !a.eval_only) return refuse("--dataset is required");
    if (a.eval_only && !any(a.val_dataset)) return refuse("--eval-only needs --val-dataset");
    if (!a.adapter_from.empty() && !fs::exists(fs::path{a.adapter_from} / "adapter_config.json"))
      return refuse("--adapter-from " + a.adapter_from + " has no adapter_config.json (a PEFT adapter directory)");
    if (!a.adapter_from.empty() && a.train_type != "lora") return refuse("--adapter-from needs --train-type lora");
    auto rows = a.eval_only ? Result<std::vector<Row>>{std::vector<Row>{}} : read_mix(a.dataset, a, a.seed);
    if (!rows) return fail("reading the training data", rows.error());
    train_rows = std::move(*rows);
    if (any(a.val_dataset)) {
      auto v = read_mix(a.val_dataset, a, a.seed + 1000);
      if (!v) return fail("reading the validation data", v.error());
      val_rows = std::move(*v);
    } else if (a.val_split > 0) {
      const auto held = static_cast<size_t>(std::llround(a.val_split * static_cast<double>(train_rows.size())));
      if (held == 0 || held >= train_rows.size())
        return refuse("--val-split " + std::to_string(a.val_split) + " of " + std::to_string(train_rows.size()) +
                      " rows leaves no " + (held == 0 ? "validation" : "training") + " row");
      val_rows.assign(train_rows.begin(), train_rows.begin() + static_cast<std::ptrdiff_t>(held));
      // A row a ratio above 1 repeated is held out with all its copies.
      std::set<std::string> held_out;
      for (const auto& r : val_rows) held_out.insert(r.origin);
      std::set<std::string> seen;  // each held-out row once in validation
      std::erase_if(val_rows, [&](const Row& r) { return !seen.insert(r.origin).second; });
      std::erase_if(train_rows, [&](const Row& r) { return held_out.count(r.origin) > 0; });
      if (train_rows.empty()) return refuse("--val-split leaves no training row");
    }
    std::string skipped;
    auto usable = usable_rows(train_rows, *chat, skipped);
    if (!usable) return fail("encoding the training data", usable.error());
    if (*usable < a.dp && !a.eval_only)
      return refuse("the training data has " + std::to_string(*usable) + " usable rows within --max-length " +
                    std::to_string(max_length) + " (" + skipped + "); check the layout, --max-length and --truncation");
    if (!val_rows.empty()) {
      auto v = usable_rows(val_rows, *chat, skipped);
      if (!v) return fail("encoding the validation data", v.error());
      if (*v == 0) return refuse("the validation data has no usable row (" + skipped + ")");
    }
    if (!a.eval_only) {
      // The schedule the run will set, checked now: batches of batch_size
      // (a last one of at least dp rows) per epoch.
      const int64_t per_epoch = *usable / a.batch_size + (*usable % a.batch_size >= a.dp ? 1 : 0);
      const int64_t steps = a.max_steps > 0 ? a.max_steps
                                            : std::max<int64_t>(1, static_cast<int64_t>(std::ceil(
                                                                       a.epochs * static_cast<double>(per_epoch) /
                                                                       static_cast<double>(a.grad_accum))));
      if (auto ok = schedule_of(a, steps).validate(); !ok) return refuse("the schedule flags: " + context_of(ok.error()));
    }
  }

  if (a.eval_only) return evaluate_only(a, model_dir, max_length, val_rows);

  // 2. The run directory.
  auto checkpoints = actors::Checkpointer::open(fs::path{out}.parent_path().string(), fs::path{out}.filename().string());
  if (!checkpoints) return fail("opening the run index", checkpoints.error());
  if (!resuming) {
    if (auto ok = checkpoints->start_over(a.overwrite); !ok) {
      if (code_of(ok.error()) != errc::failed_precondition) return fail("starting the run over", ok.error());
      return refuse(context_of(ok.error()) + ": pass --resume to continue it, --overwrite to start it over, or "
                                             "another --output");
    }
    std::error_code ec;
    if (a.overwrite)
      for (const char* old : {"last", "best", ".last.save", "last.tmp", "best.tmp"}) fs::remove_all(out + "/" + old, ec);
    fs::create_directories(data_dir, ec);
    if (ec) return refuse("cannot create " + data_dir + ": " + ec.message());
    if (auto ok = components::save_jsonl(train_rows, data_dir + "/train.jsonl"); !ok) return fail("writing data", ok.error());
    fs::remove(data_dir + "/val.jsonl", ec);
    if (!val_rows.empty())
      if (auto ok = components::save_jsonl(val_rows, data_dir + "/val.jsonl"); !ok) return fail("writing data", ok.error());
    if (auto ok = write_text(out + "/config.toml", resolved); !ok) return fail("writing config.toml", ok.error());
  }
  const bool has_val = fs::exists(data_dir + "/val.jsonl");

  return run_main([&](Runtime& rt) -> int {
    auto opened = open_model(rt, a, model_dir, a.train_type == "lora" ? &lora : nullptr);
    if (!opened) return fail("the model", opened.error());
    const auto& model = *opened;
    if (auto ok = model.set_optimizer(opt).get(); !ok) return fail("setting the optimizer", ok.error());

    actors::DataLoaderSpec spec{.dataset = data_dir + "/train.jsonl", .tokenizer = model_dir,
                                .template_name = a.chat_template, .max_length = max_length,
                                .truncation = a.truncation, .batch_size = a.batch_size, .min_batch_size = a.dp,
                                .seed = a.seed, .epochs = 0};
    auto train = actors::open_dataloader(rt, placement::DeviceGroup::of("train-data", 1), spec);
    if (!train) return fail("opening the training data", train.error());
    auto info = train->loader_info().take();
    if (!info) return fail("reading the training data", info.error());
    std::optional<actors::DataLoaderGroup> val;
    int64_t val_batches = 0;
    if (has_val) {
      auto vspec = spec;
      vspec.dataset = data_dir + "/val.jsonl";
      vspec.shuffle = false;
      vspec.min_batch_size = 1;
      auto v = actors::open_dataloader(rt, placement::DeviceGroup::of("val-data", 1), vspec);
      if (!v) return fail("opening the validation data", v.error());
      auto vi = v->loader_info().take();
      if (!vi) return fail("reading the validation data", vi.error());
      val_batches = vi->batches_per_epoch;
      val.emplace(std::move(*v));
    }
    const int64_t steps =
        a.max_steps > 0 ? a.max_steps
                        : std::max<int64_t>(1, static_cast<int64_t>(std::ceil(a.epochs * static_cast<double>(info->batches_per_epoch) /
                                                                              static_cast<double>(a.grad_accum))));
    if (auto ok = model.set_lr_scheduler(schedule_of(a, steps)).get(); !ok) return fail("setting the schedule", ok.error());
    std::printf("glint sft: %s training of %s on %lld rows (%s), %lld steps of %lld x %lld rows%s\n",
                a.train_type.c_str(), model_dir.c_str(), static_cast<long long>(info->rows), info->skipped.c_str(),
                static_cast<long long>(steps), static_cast<long long>(a.grad_accum), static_cast<long long>(a.batch_size),
                a.packing ? ", packed" : "");

    // Where a resume starts, and the best evaluation so far.
    int64_t start = 0;
    double best = INFINITY;
    int64_t best_step = 0;
    if (resuming) {
      auto state = checkpoints->resume(model, &*train);
      if (!state) return fail("resuming", state.error());
      if (*state) {
        start = (*state)->step;
        if (auto it = (*state)->metrics.find("best_eval_loss"); it != (*state)->metrics.end()) best = it->second;
        if (auto it = (*state)->metrics.find("best_step"); it != (*state)->metrics.end())
          best_step = static_cast<int64_t>(it->second);
        std::printf("glint sft: resumed at step %lld\n", static_cast<long long>(start));
      }
    }
    RunReport report{out, "sft", resuming ? static_cast<int>(start) : -1};
    const int64_t pad = pad_id(chat->tokenizer());

    auto batch_of = [&](const std::vector<actors::DataRow>& rows, bool pack) {
      // Packed rows as long as the longest row: never more attention than padding.
      size_t longest = 0;
      for (const auto& r : rows) longest = std::max(longest, r.input_ids.size());
      return pack ? actors::packed_batch_of(rows, pad, static_cast<int64_t>(longest), a.dp)
                  : actors::train_batch_of(rows, pad);
    };
    auto evaluate = [&]() { return validation_loss(model, *val, val_batches, pad, a.dp); };
    const int64_t eval_every = a.eval_every > 0 ? a.eval_every : steps;
    const int64_t save_every = a.save_every > 0 ? a.save_every : eval_every;

    Progress bar{"sft", static_cast<int>(steps)};
    for (int64_t step = start + 1; step <= steps; ++step) {
      double loss_sum = 0, tokens = 0;
      for (int64_t micro = 0; micro < a.grad_accum; ++micro) {
        auto b = train->next_batch().take();
        if (!b) return fail("reading a batch", b.error());
        auto batch = batch_of(b->rows, a.packing);
        if (!batch) return fail("making a batch", batch.error());
        auto m = model.forward_backward(*batch).take();
        if (!m) return fail("forward_backward at step " + std::to_string(step), m.error());
        const double t = m->count("tokens") ? m->at("tokens") : 1.0;
        loss_sum += m->at("loss") * t;
        tokens += t;
      }
      auto s = model.clip_grad_and_step().take();
      if (!s) return fail("the optimizer step at " + std::to_string(step), s.error());
      std::map<std::string, double> row = {{"loss", loss_sum / std::max(tokens, 1.0)}, {"grad_norm", s->at("grad_norm")},
                                           {"lr", s->at("lr")}, {"tokens", tokens}};
      char status[96];
      std::snprintf(status, sizeof status, "loss %.4f", row["loss"]);
      const bool eval_now = has_val && (step % eval_every == 0 || step == steps);
      if (eval_now) {
        auto e = evaluate();
        if (!e) return fail("evaluating at step " + std::to_string(step), e.error());
        row["eval_loss"] = *e;
        std::snprintf(status, sizeof status, "loss %.4f  eval %.4f", row["loss"], *e);
        if (*e < best) {
          best = *e;
          best_step = step;
        }
      }
      report.add(static_cast<int>(step), "sft", row);
      if (eval_now || step % save_every == 0 || step == steps) {
        std::map<std::string, double> metrics = {{"loss", row["loss"]}};
        if (eval_now) metrics["eval_loss"] = row["eval_loss"];
        if (best_step > 0) {
          metrics["best_eval_loss"] = best;
          metrics["best_step"] = static_cast<double>(best_step);
        }
        char summary[64];
        std::snprintf(summary, sizeof summary, eval_now ? "eval loss %.4f" : "loss %.4f",
                      eval_now ? row["eval_loss"] : row["loss"]);
        auto saved = checkpoints->save("checkpoint-" + std::to_string(step), model, &*train,
                                       {.step = step, .consumed_samples = step * a.batch_size * a.grad_accum,
                                        .gradient_accumulation = a.grad_accum, .seed = a.seed, .phase = "sft",
                                        .metrics = metrics},
                                       summary);
        if (!saved) return fail("saving a checkpoint", saved.error());
      }
      bar.update(static_cast<int>(step), status);
    }
    bar.finish();

    // The final weights, and the best checkpoint's.
    const std::string tokenizer_dir = a.train_type == "full" ? model_dir : "";
    const auto staged = out + "/.last.save";
    std::error_code ec;
    fs::remove_all(staged, ec);
    if (auto ok = model.save({.dir = staged, .max_shard_bytes = a.max_shard_mib << 20}).take(); !ok)
      return fail("saving the final weights", ok.error());
    if (auto ok = publish_model(staged, out + "/last", tokenizer_dir); !ok) return fail("writing last/", ok.error());
    fs::remove_all(staged, ec);
    std::printf("final weights: %s/last (%s)\n", out.c_str(),
                a.train_type == "lora" ? "a PEFT adapter directory" : "a Hugging Face model directory");
    if (best_step > 0) {
      const auto from = checkpoints->run_dir() + "/checkpoint-" + std::to_string(best_step) + "/model";
      if (auto ok = publish_model(from, out + "/best", tokenizer_dir); !ok) return fail("writing best/", ok.error());
      std::printf("best validation loss %.6f at step %lld: %s/best\n", best, static_cast<long long>(best_step), out.c_str());
    }
    std::vector<std::pair<std::string, std::string>> charts = {{"sft", "loss"}, {"sft", "lr"}, {"sft", "grad_norm"}};
    if (has_val) charts.insert(charts.begin() + 1, {"sft", "eval_loss"});
    auto html = report.write_html("glint sft: " + fs::path{model_dir}.filename().string(), charts);
    std::printf("metrics: %s/metrics.jsonl\nreport:  %s\n", out.c_str(), html.c_str());
    return 0;
  });
}

}  // namespace glint::launcher
