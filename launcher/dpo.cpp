// `glint dpo`: preference training (DPO or IPO) of a user's Hugging Face
// model on the user's chosen/rejected pairs, LoRA or full, as a driver on
// the public API.
//
// Each micro-batch holds --batch-size pairs as rows (chosen, rejected,
// chosen, ...); the reference log-probs come from the same model group with
// the adapter off (LoRA: ModelGroup::base()) or from a frozen copy of the
// model in a second group (full); the model group trains with the dpo or ipo
// loss, which reads the rows in pairs and slices them over data-parallel
// ranks in whole pairs. The pairs' order follows from --seed and the step
// (a seeded permutation per epoch), so a resume needs no loader state. As
// glint sft, everything that can be checked is checked before anything is
// written; the run directory holds config.toml, data/ (the pairs in the
// canonical messages + rejected_response layout), checkpoints,
// metrics.jsonl, report.html, last/ and, with evaluation, best/ (the
// checkpoint with the lowest validation DPO loss).
#include "launcher/recipe_common.hpp"

#include "components/data/preference.hpp"
#include "placement/service.hpp"
#include "runtime/progress.hpp"
#include "runtime/report.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>

namespace glint::launcher {

namespace {

namespace fs = std::filesystem;
using components::EncodedPair;
using components::Row;

const std::string kName = "dpo";
const std::string kHint =
    "glint dpo reads {\"prompt\", \"chosen\", \"rejected\"} rows (strings or lists of messages; no prompt: two whole "
    "conversations) and messages rows ending with the chosen answer, with \"rejected_response\"";

int refuse(const std::string& why) { return recipe::refuse(kName, why); }
int fail(const std::string& what, const caf::error& e) { return recipe::fail(kName, what, e); }

/// The pairs of `rows` that encode within the limits, and what was skipped.
struct Pairs {
  std::vector<EncodedPair> pairs;
  components::SkipReport skipped;
};
Pairs encode_pairs(const std::vector<Row>& rows, const components::Template& chat, int64_t max_length,
                   components::Truncation truncation) {
  Pairs out;
  for (const auto& r : rows) {
    auto p = components::encode_preference(chat, r, max_length, truncation);
    if (p) out.pairs.push_back(std::move(*p));
    else ++out.skipped.counts[code_of(p.error()) == errc::resource_exhausted ? "too long" : context_of(p.error())];
  }
  return out;
}

/// A seeded permutation of 0..n-1 (Fisher-Yates on splitmix64: the same on
/// every platform and standard library).
std::vector<int64_t> permutation(int64_t n, uint64_t seed) {
  std::vector<int64_t> p(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) p[static_cast<size_t>(i)] = i;
  uint64_t state = seed;
  auto next = [&state] {
    uint64_t z = (state += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  };
  for (int64_t i = n - 1; i > 0; --i) std::swap(p[static_cast<size_t>(i)], p[static_cast<size_t>(next() % static_cast<uint64_t>(i + 1))]);
  return p;
}

/// Rows 2i and 2i + 1 of the batch: pair `which[i]`'s chosen and rejected
/// responses. `min_rows` > 0: packed instead (padding-free), each pair whole
/// in one row as segments 2k - 1 (chosen) and 2k (rejected), at least
/// min_rows rows.
Result<Batch> pair_batch(const std::vector<EncodedPair>& pairs, const std::vector<int64_t>& which, int64_t pad,
                         int64_t min_rows = 0) {
  std::vector<actors::DataRow> rows;
  std::vector<std::vector<float>> rejected;  // packed: 1 on a pair's rejected tokens
  for (auto i : which) {
    const auto& p = pairs[static_cast<size_t>(i)];
    if (min_rows > 0) {
      actors::DataRow r;
      for (const auto* e : {&p.chosen, &p.rejected}) {
        r.input_ids.insert(r.input_ids.end(), e->input_ids.begin(), e->input_ids.end());
        r.loss_mask.insert(r.loss_mask.end(), e->loss_mask.begin(), e->loss_mask.end());
      }
      std::vector<float> half(p.chosen.input_ids.size(), 0.f);
      half.resize(r.input_ids.size(), 1.f);
      rejected.push_back(std::move(half));
      rows.push_back(std::move(r));
      continue;
    }
    for (const auto* e : {&p.chosen, &p.rejected}) {
      actors::DataRow r;
      r.input_ids = e->input_ids;
      r.loss_mask = e->loss_mask;
      rows.push_back(std::move(r));
    }
  }
  if (min_rows == 0) return actors::train_batch_of(rows, pad);
  // A pair per segment, then each segment split in two: k -> 2k - 1, 2k.
  auto batch = actors::padding_free_batch_of(rows, pad, min_rows, {{"rejected", &rejected}});
  if (!batch) return batch;
  auto seg = batch->tensors.at("segment_ids").values<int64_t>();
  auto half = batch->tensors.at("rejected").values<float>();
  if (!seg || !half) return make_error(errc::internal, "a packed pair batch without its segment ids");
  std::vector<int64_t> ids(seg->begin(), seg->end());
  for (size_t i = 0; i < ids.size(); ++i)
    if (ids[i] > 0) ids[i] = 2 * ids[i] - 1 + ((*half)[i] > 0 ? 1 : 0);
  auto t = Tensor::from_values(ids, batch->tensors.at("segment_ids").shape());
  if (!t) return t.error();
  batch->tensors["segment_ids"] = std::move(*t);
  batch->tensors.erase("rejected");
  return batch;
}

/// Per row of `batch`, the sum of `logps` over its loss_mask (`mean`: their
/// mean, as the ipo loss reads them).
Result<std::vector<double>> response_logps(const Batch& batch, const Tensor& logps, bool mean) {
  auto lp = logps.values<float>();
  if (!lp) return lp.error();
  auto mask = batch.tensors.at("loss_mask").values<float>();
  if (!mask) return mask.error();
  const auto rows = static_cast<size_t>(logps.size(0)), T = static_cast<size_t>(logps.size(1));
  std::vector<double> out(rows, 0.0);
  for (size_t r = 0; r < rows; ++r) {
    double n = 0;
    for (size_t t = 0; t < T; ++t)
      if ((*mask)[r * T + t] > 0) {
        out[r] += (*lp)[r * T + t];
        n += 1;
      }
    if (mean && n > 0) out[r] /= n;
  }
  return out;
}

double log_sigmoid(double x) { return x >= 0 ? -std::log1p(std::exp(-x)) : x - std::log1p(std::exp(x)); }

/// The validation metrics of `pairs` (one pass, in order): the mean DPO
/// (or IPO) loss, reward margin and accuracy, as the trainer computes them
/// (docs/losses.md), from the policy's and the reference's log-probs.
Result<std::map<std::string, double>> evaluate(const actors::ModelGroup& model, const actors::ModelGroup& reference,
                                               const std::vector<EncodedPair>& pairs, const DpoArgs& a, int64_t pad) {
  double loss = 0, margin = 0, correct = 0;
  const auto n = static_cast<int64_t>(pairs.size());
  for (int64_t begin = 0; begin < n; begin += a.batch_size) {
    std::vector<int64_t> which;
    for (int64_t i = begin; i < std::min(n, begin + a.batch_size); ++i) which.push_back(i);
    const auto counted = which.size();
    // Every data-parallel rank needs a row: pad with copies, not counted.
    while (2 * which.size() < static_cast<size_t>(a.data_ranks())) which.push_back(which.front());
    auto batch = pair_batch(pairs, which, pad);
    if (!batch) return batch.error();
    auto policy_f = model.forward_only(*batch);
    auto ref_f = reference.forward_only(*batch);
    auto policy_t = policy_f.take();
    if (!policy_t) return policy_t.error();
    auto ref_t = ref_f.take();
    if (!ref_t) return ref_t.error();
    const bool ipo = a.loss == "ipo";
    auto policy = response_logps(*batch, *policy_t, ipo);
    if (!policy) return policy.error();
    auto ref = response_logps(*batch, *ref_t, ipo);
    if (!ref) return ref.error();
    for (size_t i = 0; i < counted; ++i) {
      const double z = ((*policy)[2 * i] - (*ref)[2 * i]) - ((*policy)[2 * i + 1] - (*ref)[2 * i + 1]);
      if (ipo) loss += std::pow(z - 1 / (2 * a.beta), 2);
      else loss += -(1 - a.label_smoothing) * log_sigmoid(a.beta * z) - a.label_smoothing * log_sigmoid(-a.beta * z);
      margin += a.beta * z;
      correct += z > 0 ? 1 : 0;
    }
  }
  const double d = static_cast<double>(std::max<int64_t>(n, 1));
  return std::map<std::string, double>{{"eval_loss", loss / d}, {"eval_reward_margin", margin / d},
                                       {"eval_reward_accuracy", correct / d}};
}

/// The canonical rows of a run's data file (data/train.jsonl, data/val.jsonl).
Result<std::vector<Row>> read_run_rows(const std::string& path) {
  auto ds = components::Dataset::load({.path = path});
  if (!ds) return ds.error();
  auto layout = components::preprocess::preference_layout("messages");
  if (!layout) return layout.error();
  ds->map(*layout);
  std::vector<Row> rows;
  for (size_t i = 0; i < ds->size(); ++i) rows.push_back(ds->row(i));
  return rows;
}

/// One adapter trained (or the full model): its pairs, run directory,
/// model handle and where it stands.
struct Task {
  std::string name;
  std::string out;  ///< its run directory
  bool resuming = false;
  std::vector<Row> rows, val_rows;  ///< as read, for data/
  std::vector<EncodedPair> train, val;
  std::string skipped;  ///< the training data's skip report
  int64_t steps = 0;
  /// Its run index, opened for each use: the adapters' runs share one
  /// index directory (--output), which a process opens once at a time.
  Result<actors::Checkpointer> checkpoints() const {
    return actors::Checkpointer::open(fs::path{out}.parent_path().string(), fs::path{out}.filename().string());
  }
  std::optional<actors::ModelGroup> model;
  recipe::RunPosition position{.best = 0};
  std::optional<RunReport> report;
  std::vector<int64_t> order;  ///< this epoch's pairs, in order
  int64_t order_epoch = -1;

  /// Pair k of the task's stream: epoch k / n in that epoch's seeded order.
  int64_t pair_at(int64_t k, uint64_t seed) {
    const auto n = static_cast<int64_t>(train.size());
    if (k / n != order_epoch) {
      order_epoch = k / n;
      order = permutation(n, seed * 1000003 + static_cast<uint64_t>(order_epoch));
    }
    return order[static_cast<size_t>(k % n)];
  }
};

/// The adapters of --adapter NAME=FILE[:RATIO] flags, in order of first
/// mention (empty without any); bad names and combinations refused.
Result<std::vector<std::string>> adapter_names(const DpoArgs& a) {
  std::vector<std::string> names;
  for (const auto& spec : a.adapters) {
    if (spec.empty()) continue;  // a config.toml's "" for none
    const auto eq = spec.find('=');
    if (eq == std::string::npos || eq == 0 || eq + 1 == spec.size())
      return make_error(errc::invalid_argument, "--adapter " + spec + ": write NAME=FILE or NAME=FILE:RATIO");
    auto name = spec.substr(0, eq);
    const bool ok_name = name.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-") ==
                             std::string::npos && name[0] != '-';
    if (!ok_name || name == "index")
      return make_error(errc::invalid_argument, "--adapter " + spec + ": the name '" + name +
                                                    "' must be letters, digits, '_' and '-' (not 'index'); it names a run "
                                                    "directory under --output");
    if (std::find(names.begin(), names.end(), name) == names.end()) names.push_back(name);
  }
  if (names.empty()) return names;
  if (recipe::any(a.dataset)) return make_error(errc::invalid_argument, "--adapter gives each adapter its data: leave out --dataset");
  if (recipe::any(a.val_dataset))
    return make_error(errc::invalid_argument, "--val-dataset does not apply with --adapter (use --val-split: each adapter holds out its own)");
  if (a.train_type != "lora") return make_error(errc::invalid_argument, "--adapter trains LoRA adapters: not with --train-type full");
  if (!a.adapter_from.empty())
    return make_error(errc::invalid_argument, "--adapter-from does not apply with --adapter (each adapter starts fresh)");
  return names;
}

/// The files of adapter `name`'s --adapter flags.
std::vector<std::string> adapter_files(const DpoArgs& a, const std::string& name) {
  std::vector<std::string> out;
  for (const auto& spec : a.adapters)
    if (spec.rfind(name + "=", 0) == 0) out.push_back(spec.substr(name.size() + 1));
  return out;
}

/// One optimizer step of `t`: its micro-batches against the reference's
/// log-probs, then the step. Answers the metrics row.
Result<std::map<std::string, double>> train_step(Task& t, const actors::ModelGroup& reference, const DpoArgs& a,
                                                 int64_t step, int64_t pad) {
  std::map<std::string, double> sums;
  double pairs = 0;
  for (int64_t micro = 0; micro < a.grad_accum; ++micro) {
    std::vector<int64_t> which;
    const int64_t first = ((step - 1) * a.grad_accum + micro) * a.batch_size;
    for (int64_t i = 0; i < a.batch_size; ++i) which.push_back(t.pair_at(first + i, a.seed));
    auto batch = pair_batch(t.train, which, pad, a.packing ? std::max(1, t.model->info().dp_size()) : 0);
    if (!batch) return with_context(batch.error(), "making a batch");
    auto ref = reference.forward_only(*batch).take();
    if (!ref) return with_context(ref.error(), "the reference log-probs");
    batch->tensors["ref_logps"] = std::move(*ref);
    auto m = t.model->forward_backward(*batch).take();
    if (!m) return with_context(m.error(), "forward_backward");
    const double n = static_cast<double>(which.size());
    for (const char* k : {"loss", "reward_margin", "reward_accuracy", "reward_chosen", "reward_rejected"})
      if (auto it = m->find(k); it != m->end()) sums[k] += it->second * n;
    pairs += n;
  }
  auto s = t.model->clip_grad_and_step().take();
  if (!s) return with_context(s.error(), "the optimizer step");
  std::map<std::string, double> row = {{"grad_norm", s->at("grad_norm")}, {"lr", s->at("lr")}, {"pairs", pairs}};
  for (const auto& [k, v] : sums) row[k] = v / pairs;
  return row;
}

/// Evaluates `t` when the step calls for it (adding to `row`) and saves a
/// checkpoint when it calls for one.
Result<void> evaluate_and_save(Task& t, const actors::ModelGroup& reference, const DpoArgs& a, int64_t step, int64_t pad,
                               std::map<std::string, double>& row) {
  const int64_t eval_every = a.eval_every > 0 ? a.eval_every : t.steps;
  const int64_t save_every = a.save_every > 0 ? a.save_every : eval_every;
  const bool eval_now = !t.val.empty() && (step % eval_every == 0 || step == t.steps);
  if (eval_now) {
    auto e = evaluate(*t.model, reference, t.val, a, pad);
    if (!e) return with_context(e.error(), "evaluating");
    for (const auto& [k, v] : *e) row[k] = v;
    if (t.position.improves(row["eval_loss"], false)) {
      t.position.best = row["eval_loss"];
      t.position.best_step = step;
    }
  }
  if (!(eval_now || step % save_every == 0 || step == t.steps)) return {};
  std::map<std::string, double> metrics = {{"loss", row["loss"]}, {"reward_margin", row["reward_margin"]}};
  if (eval_now) metrics["eval_loss"] = row["eval_loss"];
  recipe::record_best(metrics, t.position, "best_eval_loss");
  char summary[64];
  std::snprintf(summary, sizeof summary, eval_now ? "eval loss %.4f" : "loss %.4f", eval_now ? row["eval_loss"] : row["loss"]);
  auto index = t.checkpoints();
  if (!index) return with_context(index.error(), "opening the run index");
  auto saved = index->save("checkpoint-" + std::to_string(step), *t.model, nullptr,
                                   {.step = step, .consumed_samples = step * a.batch_size * a.grad_accum,
                                    .gradient_accumulation = a.grad_accum, .seed = a.seed, .phase = "dpo",
                                    .metrics = metrics},
                                   summary);
  if (!saved) return with_context(saved.error(), "saving a checkpoint");
  return {};
}

}  // namespace

CLI::App* add_dpo(CLI::App& app, DpoArgs& a) {
  auto* c = app.add_subcommand("dpo", "Preference-train your Hugging Face model on chosen/rejected pairs (DPO or IPO)");
  recipe::add_model_flags(c, a);
  recipe::add_data_flags(c, a, "preference pairs");
  c->add_option("--adapter", a.adapters,
                "Multi-LoRA: train adapter NAME on FILE (FILE:RATIO; repeat NAME to mix files), several adapters on "
                "one base in one run, each in --output/NAME; instead of --dataset");
  c->add_option("--layout", a.layout,
                "Row layout: auto, prompt (prompt/chosen/rejected) or messages (messages + rejected_response)")
      ->capture_default_str()
      ->check(CLI::IsMember(components::preprocess::preference_layout_names()));
  c->add_option("--max-length", a.max_length, "Tokens per prompt + response; 0: the model's context")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 24));
  c->add_option("--truncation", a.truncation,
                "Pairs over --max-length: refuse (skip them), left (drop the prompt's start) or right (the response's end)")
      ->capture_default_str()
      ->check(CLI::IsMember({"refuse", "left", "right"}));
  recipe::add_packing_flag(c, a.packing,
              "Train on the pairs packed end to end without padding, each pair whole in a row (padding-free "
              "batches; the default: the same loss, less compute); --no-packing pads every response to the longest");
  c->add_option("--batch-size", a.batch_size, "Pairs per micro-batch (the global batch, over --dp ranks)")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  c->add_option("--grad-accum", a.grad_accum, "Micro-batches per optimizer step")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{4096}));
  c->add_option("--loss", a.loss, "sigmoid (DPO) or ipo")->capture_default_str()->check(CLI::IsMember({"sigmoid", "ipo"}));
  c->add_option("--beta", a.beta, "How far the policy may move from the reference (DPO's beta; IPO's tau)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  c->add_option("--label-smoothing", a.label_smoothing,
                "Conservative DPO: the share of pairs assumed mislabelled, in [0, 0.5] (sigmoid only)")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 0.5));
  recipe::add_optim_flags(c, a);
  recipe::add_run_flags(c, a);
  recipe::add_model_restart_flag(c, a);
  c->footer(
      "Examples:\n"
      "  glint dpo --model models/qwen --dataset data/pairs.jsonl --output runs/pref\n"
      "  glint dpo --model models/qwen --adapter-from runs/chat/last --dataset pairs.jsonl --beta 0.2 --val-split 0.1\n"
      "  glint dpo --model models/qwen --train-type full --dataset pairs.jsonl --loss ipo\n"
      "  glint dpo --model models/qwen --adapter polite=polite.jsonl --adapter terse=terse.jsonl\n"
      "  glint dpo --config run.toml            (the same flags as a TOML file; docs/recipes.md)");
  return c;
}

int dpo(DpoArgs& a, CLI::App& cmd) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  if (auto why = recipe::prepare_flags(cmd, a); !why.empty()) return refuse(why);
  if (a.label_smoothing != 0 && a.loss != "sigmoid")
    return refuse("--label-smoothing applies to --loss sigmoid only, not " + a.loss);
  auto names = adapter_names(a);
  if (!names) return refuse(context_of(names.error()));
  const bool multi = !names->empty();
  if (names->size() > 1)
    if (auto m = a.model_mesh(); m && m->size(placement::Dim::fsdp) > 1)
      return refuse("--adapter: several adapters share one model group, which --mesh " + a.mesh +
                    " cuts for the first of them; train them one per run");
  // 1. Checks that write nothing.
  auto files = recipe::read_model(a, kName);
  if (!files) return refuse(context_of(files.error()));
  const auto& model_dir = files->dir;
  auto made = recipe::chat_of(a, *files, a.max_length, a.truncation);
  if (!made) return refuse(context_of(made.error()));
  const int64_t max_length = made->max_length;
  // Pairs are truncated by encode_preference (the response kept whole or
  // cut at its end), so the template it uses has no limit of its own.
  auto unlimited = components::Template::make(files->tokenizer, {.name = a.chat_template});
  if (!unlimited) return refuse("the chat template: " + context_of(unlimited.error()));
  const auto& chat = *unlimited;
  const auto truncation = made->chat.options().truncation;
  auto lora = recipe::lora_of(a);
  if (!lora) return refuse(context_of(lora.error()));
  auto opt = recipe::optimizer_of(a);
  if (!opt) return refuse(context_of(opt.error()));
  if (a.batch_size < a.data_ranks())
    return refuse("--batch-size " + std::to_string(a.batch_size) + " is smaller than the data-parallel ranks (--dp x "
                  "--mesh's fsdp) " + std::to_string(a.data_ranks()) +
                  ": every data-parallel rank trains whole pairs");
  const components::LossSpec loss{.kind = a.loss == "ipo" ? components::LossKind::ipo : components::LossKind::dpo,
                                  .beta = a.beta, .label_smoothing = a.label_smoothing};
  if (auto ok = loss.validate(); !ok) return refuse(context_of(ok.error()));

  // One task per adapter trained: the run's own (--dataset) or each --adapter's,
  // in its own run directory (--output, or --output/NAME).
  const auto out = recipe::output_dir(a);
  const auto resolved = recipe::resolved_config(cmd, a);
  const int64_t per_step = a.batch_size * a.grad_accum;
  std::vector<Task> tasks;
  for (const auto& name : multi ? *names : std::vector<std::string>{recipe::kAdapter}) {
    Task t;
    t.name = name;
    t.out = multi ? out + "/" + name : out;
    t.resuming = a.resume && fs::exists(t.out + "/config.toml");
    const std::string who = multi ? "adapter " + name + ": " : "";
    std::vector<Row> train_rows, val_rows;
    if (t.resuming) {
      if (auto changed = recipe::changed_since(t.out, resolved, {}); !changed.empty())
        return refuse("--resume: the run in " + t.out + " was started with other values of " + changed +
                      " (see its config.toml); use them, or start another --output");
      auto r = read_run_rows(t.out + "/data/train.jsonl");
      if (!r) return fail("reading the run's data", r.error());
      train_rows = std::move(*r);
      if (fs::exists(t.out + "/data/val.jsonl")) {
        auto v = read_run_rows(t.out + "/data/val.jsonl");
        if (!v) return fail("reading the run's data", v.error());
        val_rows = std::move(*v);
      }
    } else {
      RecipeArgs data = a;  // this task's files
      if (multi) data.dataset = adapter_files(a, name);
      if (!recipe::any(data.dataset)) return refuse("--dataset (or --adapter NAME=FILE) is required");
      auto layout = components::preprocess::preference_layout(a.layout, a.system);
      if (!layout) return refuse(context_of(layout.error()));
      if (auto ok = recipe::read_data(data, *layout, a.layout, kHint, kName, train_rows, val_rows); !ok)
        return recipe::bad_input(ok.error()) ? refuse(who + context_of(ok.error())) : fail("reading the data", ok.error());
    }
    auto train = encode_pairs(train_rows, chat, max_length, truncation);
    if (train.pairs.empty())
      return refuse(who + "the training data has " + std::to_string(train.pairs.size()) +
                    " usable pairs within --max-length " + std::to_string(max_length) + " (" + train.skipped.summary() +
                    "); check the layout, --max-length and --truncation");
    auto val = encode_pairs(val_rows, chat, max_length, truncation);
    if (!val_rows.empty() && val.pairs.empty())
      return refuse(who + "the validation data has no usable pair (" + val.skipped.summary() + ")");
    t.skipped = train.skipped.summary();
    t.train = std::move(train.pairs);
    t.val = std::move(val.pairs);
    const auto n = static_cast<double>(t.train.size());
    t.steps = a.max_steps > 0 ? a.max_steps
                              : std::max<int64_t>(1, static_cast<int64_t>(std::ceil(a.epochs * n / static_cast<double>(per_step))));
    if (auto ok = recipe::schedule_of(a, t.steps).validate(); !ok)
      return refuse("the schedule flags: " + context_of(ok.error()));
    t.rows = std::move(train_rows);
    t.val_rows = std::move(val_rows);
    tasks.push_back(std::move(t));
  }

  // 2. The run directories: none is started over unless all may be.
  if (multi && !a.overwrite)
    for (auto& t : tasks) {
      if (t.resuming || !fs::exists(t.out)) continue;
      auto index = t.checkpoints();
      if (!index) return fail("opening the run index", index.error());
      auto list = index->list();
      if (!list) return fail("reading the run index", list.error());
      if (!list->empty())
        return refuse("adapter " + t.name + ": " + t.out + " has checkpoints (the latest " + list->back() +
                      "): pass --resume to continue the run, --overwrite to start it over, or another --output");
    }
  for (auto& t : tasks) {
    auto c = recipe::open_run(a, t.out, t.resuming, t.rows, t.val_rows, resolved);
    if (!c) return code_of(c.error()) == errc::failed_precondition ? refuse(context_of(c.error()))
                                                                     : fail("the run directory", c.error());
    // (closed again: each use opens it)
  }

  return run_main([&](Runtime& rt) -> int {
    return recipe::run_with_model_restarts(rt, kName, a.model_max_restarts, [&](recipe::Attempt& attempt) -> int {
      const bool full = a.train_type == "full";
      auto opened = recipe::open_model(rt, a, model_dir, full || multi ? nullptr : &*lora);
      if (!opened) return fail("the model", opened.error());
      attempt.restart_on_loss_of(opened->info());
      // The reference: the same weights without the adapters, or a frozen copy.
      actors::ModelGroup reference = opened->base();
      if (full) {
        auto mesh = placement::DeviceMesh::from_sizes({.dp = a.dp});
        if (!mesh) return fail("the device mesh", mesh.error());
        auto ref = actors::open_model_group(rt, placement::DeviceGroup::of("reference", a.dp), *mesh, {.model_dir = model_dir});
        if (!ref) return fail("opening the reference model", ref.error());
        reference = *ref;
        attempt.restart_on_loss_of(reference.info());
      }
      // A try after a lost model rank resumes each run from its newest checkpoint.
      const bool resumes_all = attempt.resumes();
      for (size_t i = 0; i < tasks.size(); ++i) {
        auto& t = tasks[i];
        if (multi) {
          // Each adapter its own A, drawn from the seed and its place.
          const auto name = recipe::adapter_name(rt, a, t.name);
          auto added = recipe::add_replacing(rt, *opened, name, [&] { return opened->add_adapter(name, *lora, a.seed + i).get(); });
          if (!added) return fail("adding adapter " + t.name, added.error());
          t.model.emplace(opened->with_adapter(name));
        } else {
          t.model.emplace(*opened);
        }
        const auto& model = *t.model;
        if (auto ok = model.set_optimizer(*opt).get(); !ok) return fail("setting the optimizer", ok.error());
        if (auto ok = model.set_loss(loss).get(); !ok) return fail("setting the loss", ok.error());
        if (auto ok = model.set_lr_scheduler(recipe::schedule_of(a, t.steps)).get(); !ok)
          return fail("setting the schedule", ok.error());
        std::printf("glint dpo: %s training of %s%s on %lld pairs (%s), %s loss with beta %g, %lld steps of %lld x %lld pairs\n",
                    a.train_type.c_str(), model_dir.c_str(), multi ? (", adapter " + t.name).c_str() : "",
                    static_cast<long long>(t.train.size()), t.skipped.c_str(), a.loss == "ipo" ? "ipo" : "dpo", a.beta,
                    static_cast<long long>(t.steps), static_cast<long long>(a.grad_accum), static_cast<long long>(a.batch_size));
        auto index = t.checkpoints();
        if (!index) return fail("opening the run index", index.error());
        auto position = recipe::resume_run(*index, t.resuming || resumes_all, model, nullptr, kName + (multi ? " " + t.name : ""),
                                           "best_eval_loss");
        if (!position) return fail("resuming", position.error());
        t.position = *position;
      }
      // Each adapter continues from its own latest checkpoint: they share
      // nothing but the base (own data, optimizer and steps).
      int64_t start = tasks.front().position.start, steps = 0;
      for (auto& t : tasks) {
        start = std::min(start, t.position.start);
        steps = std::max(steps, t.steps);
        // No checkpoint yet (start 0): the run starts afresh, so its rows do too.
        t.report.emplace(t.out, "dpo",
                         (t.resuming || resumes_all) && t.position.start > 0 ? static_cast<int>(t.position.start) : -1);
      }
      const int64_t pad = recipe::pad_id(chat.tokenizer());

      Progress bar{"dpo", static_cast<int>(steps)};
      for (int64_t step = start + 1; step <= steps; ++step) {
        std::string status;
        for (auto& t : tasks) {
          if (step <= t.position.start || step > t.steps) continue;
          auto row = train_step(t, reference, a, step, pad);
          if (!row) return fail((multi ? "adapter " + t.name + ": " : std::string{}) + "step " + std::to_string(step), row.error());
          char line[128];
          std::snprintf(line, sizeof line, "%s%sloss %.4f  margin %.3f", status.empty() ? "" : "  |  ",
                        multi ? (t.name + ": ").c_str() : "", (*row)["loss"], (*row)["reward_margin"]);
          status += line;
          if (auto ok = evaluate_and_save(t, reference, a, step, pad, *row); !ok)
            return fail((multi ? "adapter " + t.name + ": " : std::string{}) + "step " + std::to_string(step), ok.error());
          t.report->add(static_cast<int>(step), "dpo", *row);
        }
        bar.update(static_cast<int>(step), status);
      }
      bar.finish();

      for (auto& t : tasks) {
        auto index = t.checkpoints();
        if (!index) return fail("opening the run index", index.error());
        if (auto ok = recipe::publish_outputs(*t.model, *index, a, t.out, model_dir, t.position.best_step); !ok)
          return fail("the outputs", ok.error());
        recipe::release_adapter(rt, *t.model);
        if (t.position.best_step > 0)
          std::printf("best validation loss %.6f at step %lld: %s/best\n", t.position.best,
                      static_cast<long long>(t.position.best_step), t.out.c_str());
        std::vector<std::pair<std::string, std::string>> charts = {
            {"dpo", "loss"}, {"dpo", "reward_margin"}, {"dpo", "reward_accuracy"}, {"dpo", "grad_norm"}};
        if (!t.val.empty()) charts.insert(charts.begin() + 1, {"dpo", "eval_loss"});
        auto html = t.report->write_html("glint dpo: " + fs::path{model_dir}.filename().string() +
                                             (multi ? ", adapter " + t.name : ""),
                                         charts);
        std::printf("metrics: %s/metrics.jsonl\nreport:  %s\n", t.out.c_str(), html.c_str());
      }
      return 0;
    });
  });
}

}  // namespace glint::launcher
