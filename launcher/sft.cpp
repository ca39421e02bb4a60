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
#include "launcher/recipe_common.hpp"

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
using recipe::pad_id;

const std::string kName = "sft";

int refuse(const std::string& why) { return recipe::refuse(kName, why); }
int fail(const std::string& what, const caf::error& e) { return recipe::fail(kName, what, e); }

/// How many rows encode within the limits (what the dataloader will keep).
Result<int64_t> usable_rows(const std::vector<Row>& rows, const components::Template& chat, std::string& skipped) {
  auto ds = recipe::encoded(rows, chat, false);
  if (!ds) return ds.error();
  skipped = ds->skipped().summary();
  return static_cast<int64_t>(ds->size());
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
    auto opened = recipe::open_model(rt, a, model_dir, a.adapter_from.empty() ? nullptr : &from_dir);
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
    auto loss = validation_loss(model, *val, info->batches_per_epoch, pad_id(*tok), a.data_ranks());
    if (!loss) return fail("evaluating", loss.error());
    std::printf("eval_loss: %.6f\n", *loss);
    return 0;
  });
}

}  // namespace

CLI::App* add_sft(CLI::App& app, SftArgs& a) {
  auto* c = app.add_subcommand("sft", "Fine-tune your Hugging Face model on your conversations (LoRA or full)");
  recipe::add_model_flags(c, a);
  c->add_flag("--eval-only", a.eval_only,
              "Print the validation loss (eval_loss) of the model, with --adapter-from if given, and write nothing");
  recipe::add_data_flags(c, a, "conversations");
  c->add_option("--layout", a.layout, "Row layout: auto, messages, query_response, alpaca or gsm8k (question/answer)")
      ->capture_default_str()
      ->check(CLI::IsMember(components::preprocess::layout_names()));
  c->add_option("--max-length", a.max_length, "Tokens per row; 0: the model's context")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 24));
  c->add_option("--truncation", a.truncation, "Rows over --max-length: refuse (skip them), left or right")
      ->capture_default_str()
      ->check(CLI::IsMember({"refuse", "left", "right"}));
  recipe::add_packing_flag(c, a.packing, "Pack each batch's rows end to end without padding (padding-free batches; the default: the same loss, less "
              "compute); --no-packing pads every row to the longest");
  c->add_option("--batch-size", a.batch_size, "Rows per micro-batch (the global batch, over --dp ranks)")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  c->add_option("--grad-accum", a.grad_accum, "Micro-batches per optimizer step")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{4096}));
  recipe::add_optim_flags(c, a);
  recipe::add_run_flags(c, a);
  recipe::add_model_restart_flag(c, a);
  c->footer(
      "Examples:\n"
      "  glint sft --model models/qwen --dataset data/chat.jsonl --output runs/chat\n"
      "  glint sft --model models/qwen --dataset a.jsonl:0.5 --dataset b.jsonl --val-split 0.05 --no-packing\n"
      "  glint sft --config run.toml            (the same flags as a TOML file; docs/recipes.md)\n"
      "  glint run --nproc 2 -- glint sft --model models/qwen --dataset d.jsonl --dp 2");
  return c;
}

int sft(SftArgs& a, CLI::App& cmd) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  // --config, then flags that would be read and then ignored are refused.
  if (auto why = recipe::prepare_flags(cmd, a); !why.empty()) return refuse(why);
  if (a.eval_only && recipe::any(a.dataset)) return refuse("--eval-only reads --val-dataset only; leave out --dataset");
  // 1. Checks that write nothing.
  auto files = recipe::read_model(a, kName);
  if (!files) return refuse(context_of(files.error()));  // nothing is written yet
  const auto& model_dir = files->dir;
  auto made = recipe::chat_of(a, *files, a.max_length, a.truncation);
  if (!made) return refuse(context_of(made.error()));
  const int64_t max_length = made->max_length;
  const auto* chat = &made->chat;
  if (a.batch_size < a.data_ranks())
    return refuse("--batch-size " + std::to_string(a.batch_size) + " is smaller than the data-parallel ranks (--dp x "
                  "--mesh's fsdp) " + std::to_string(a.data_ranks()) +
                  ": every data-parallel rank needs a row");
  auto lora = recipe::lora_of(a);
  if (!lora) return refuse(context_of(lora.error()));
  auto opt = recipe::optimizer_of(a);
  if (!opt) return refuse(context_of(opt.error()));

  const auto out = recipe::output_dir(a);
  const auto data_dir = out + "/data";
  // The flags as config.toml records them: what the run computes, not how
  // this invocation was asked to treat the directory.
  const auto resolved = recipe::resolved_config(cmd, a, {"eval-only"});
  const bool resuming = a.resume && fs::exists(out + "/config.toml");
  std::vector<Row> train_rows, val_rows;
  if (resuming && a.max_steps > 0)
    if (auto ok = recipe::schedule_of(a, a.max_steps).validate(); !ok)
      return refuse("the schedule flags: " + context_of(ok.error()));
  if (resuming) {
    // The run's own rows and flags: a resume computes what the run would have.
    if (auto changed = recipe::changed_since(out, resolved, {}); !changed.empty())
      return refuse("--resume: the run in " + out + " was started with other values of " + changed +
                    " (see its config.toml); use them, or start another --output");
  } else {
    if (!recipe::any(a.dataset) && !a.eval_only) return refuse("--dataset is required");
    if (a.eval_only && !recipe::any(a.val_dataset)) return refuse("--eval-only needs --val-dataset");
    auto layout = components::preprocess::layout(a.layout, a.system);
    if (!layout) return refuse(context_of(layout.error()));
    if (auto ok = recipe::read_data(a, *layout, a.layout,
                                    "glint sft reads messages, query/response, alpaca (instruction/input/output) and gsm8k (question/answer) rows",
                                    kName, train_rows, val_rows);
        !ok)
      return recipe::bad_input(ok.error()) ? refuse(context_of(ok.error())) : fail("reading the data", ok.error());
    std::string skipped;
    auto usable = usable_rows(train_rows, *chat, skipped);
    if (!usable) return fail("encoding the training data", usable.error());
    if (*usable < a.data_ranks() && !a.eval_only)
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
      const int64_t per_epoch = *usable / a.batch_size + (*usable % a.batch_size >= a.data_ranks() ? 1 : 0);
      const int64_t steps = a.max_steps > 0 ? a.max_steps
                                            : std::max<int64_t>(1, static_cast<int64_t>(std::ceil(
                                                                       a.epochs * static_cast<double>(per_epoch) /
                                                                       static_cast<double>(a.grad_accum))));
      if (auto ok = recipe::schedule_of(a, steps).validate(); !ok)
        return refuse("the schedule flags: " + context_of(ok.error()));
    }
  }

  if (a.eval_only) return evaluate_only(a, model_dir, max_length, val_rows);

  // 2. The run directory.
  auto checkpoints = recipe::open_run(a, out, resuming, train_rows, val_rows, resolved);
  if (!checkpoints) return code_of(checkpoints.error()) == errc::failed_precondition
                               ? refuse(context_of(checkpoints.error()))
                               : fail("the run directory", checkpoints.error());
  const bool has_val = fs::exists(data_dir + "/val.jsonl");

  return run_main([&](Runtime& rt) -> int {
    return recipe::run_with_model_restarts(rt, kName, a.model_max_restarts, [&](recipe::Attempt& attempt) -> int {
      auto opened = recipe::open_model(rt, a, model_dir, a.train_type == "lora" ? &*lora : nullptr);
      if (!opened) return fail("the model", opened.error());
      const auto& model = *opened;
      attempt.restart_on_loss_of(model.info());
      // A try after a lost model rank resumes from the newest checkpoint.
      const bool resumes = resuming || attempt.resumes();
      if (auto ok = model.set_optimizer(*opt).get(); !ok) return fail("setting the optimizer", ok.error());

      actors::DataLoaderSpec spec{.dataset = data_dir + "/train.jsonl", .tokenizer = model_dir,
                                  .template_name = a.chat_template, .max_length = max_length,
                                  .truncation = a.truncation, .batch_size = a.batch_size, .min_batch_size = a.data_ranks(),
                                  .seed = a.seed, .epochs = 0};
      auto loaders = recipe::open_loaders(rt, spec, has_val ? data_dir + "/val.jsonl" : "");
      if (!loaders) return fail("the data", loaders.error());
      auto& train = loaders->train;
      const auto& info = loaders->info;
      const int64_t steps =
          a.max_steps > 0 ? a.max_steps
                          : std::max<int64_t>(1, static_cast<int64_t>(std::ceil(a.epochs * static_cast<double>(info.batches_per_epoch) /
                                                                                static_cast<double>(a.grad_accum))));
      if (auto ok = model.set_lr_scheduler(recipe::schedule_of(a, steps)).get(); !ok) return fail("setting the schedule", ok.error());
      std::printf("glint sft: %s training of %s on %lld rows (%s), %lld steps of %lld x %lld rows%s\n",
                  a.train_type.c_str(), model_dir.c_str(), static_cast<long long>(info.rows), info.skipped.c_str(),
                  static_cast<long long>(steps), static_cast<long long>(a.grad_accum), static_cast<long long>(a.batch_size),
                  a.packing ? ", packed" : "");

      // Where a resume starts, and the best evaluation so far.
      auto position = recipe::resume_run(*checkpoints, resumes, model, &train, kName, "best_eval_loss");
      if (!position) return fail("resuming", position.error());
      auto& [start, best, best_step] = *position;
      // No checkpoint yet (start 0): the run starts afresh, so its rows do too.
      RunReport report{out, "sft", resumes && start > 0 ? static_cast<int>(start) : -1};
      const int64_t pad = pad_id(chat->tokenizer());

      auto batch_of = [&](const std::vector<actors::DataRow>& rows, bool pack) {
        // Packed rows as long as the longest row: never more attention than padding.
        return pack ? actors::padding_free_batch_of(rows, pad, a.data_ranks()) : actors::train_batch_of(rows, pad);
      };
      auto evaluate = [&]() { return validation_loss(model, *loaders->val, loaders->val_batches, pad, a.data_ranks()); };
      const int64_t eval_every = a.eval_every > 0 ? a.eval_every : steps;
      const int64_t save_every = a.save_every > 0 ? a.save_every : eval_every;

      Progress bar{"sft", static_cast<int>(steps)};
      for (int64_t step = start + 1; step <= steps; ++step) {
        double loss_sum = 0, tokens = 0;
        for (int64_t micro = 0; micro < a.grad_accum; ++micro) {
          auto b = train.next_batch().take();
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
          if (position->improves(*e, false)) {
            best = *e;
            best_step = step;
          }
        }
        report.add(static_cast<int>(step), "sft", row);
        if (eval_now || step % save_every == 0 || step == steps) {
          std::map<std::string, double> metrics = {{"loss", row["loss"]}};
          if (eval_now) metrics["eval_loss"] = row["eval_loss"];
          recipe::record_best(metrics, *position, "best_eval_loss");
          char summary[64];
          std::snprintf(summary, sizeof summary, eval_now ? "eval loss %.4f" : "loss %.4f",
                        eval_now ? row["eval_loss"] : row["loss"]);
          auto saved = checkpoints->save("checkpoint-" + std::to_string(step), model, &train,
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
      if (auto ok = recipe::publish_outputs(model, *checkpoints, a, out, model_dir, best_step); !ok)
        return fail("the outputs", ok.error());
      recipe::release_adapter(rt, model);
      if (best_step > 0)
        std::printf("best validation loss %.6f at step %lld: %s/best\n", best, static_cast<long long>(best_step), out.c_str());
      std::vector<std::pair<std::string, std::string>> charts = {{"sft", "loss"}, {"sft", "lr"}, {"sft", "grad_norm"}};
      if (has_val) charts.insert(charts.begin() + 1, {"sft", "eval_loss"});
      auto html = report.write_html("glint sft: " + fs::path{model_dir}.filename().string(), charts);
      std::printf("metrics: %s/metrics.jsonl\nreport:  %s\n", out.c_str(), html.c_str());
      return 0;
    });
  });
}

}  // namespace glint::launcher
