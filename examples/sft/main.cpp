// LoRA SFT in the self-cognition style (Twinkle's first example): a model
// learns to say who it is. The shipped rows (examples/sft/self_cognition.jsonl)
// hold {{NAME}} and {{AUTHOR}}; a preprocessor fills them in. The first 8
// rows are held out; every --eval-every steps the held-out loss is measured
// and, when it is the best so far, the adapter is saved as a checkpoint
// (glint checkpoints sft lists them). At the end the adapter is synced to a
// sampler, which answers a question it never trained on. --adapter-from
// starts from a saved adapter (a checkpoint's model/, or any PEFT adapter
// directory made for this base) instead of a fresh one.
//
//   build/examples/sft                                  # local mode, about 10 seconds on 2 cores
//   glint run --nproc 2 -- build/examples/sft           # the same as a 2-process job
//   build/examples/sft --out runs/sft-more --adapter-from runs/sft/checkpoint-200/model
#include "actors/checkpoint_engine.hpp"
#include "actors/checkpointer.hpp"
#include "actors/dataloader_group.hpp"
#include "actors/model_group.hpp"
#include "actors/sampler_group.hpp"
#include "runtime/report.hpp"
#include "common/tiny_model.hpp"
#include "components/data/dataset.hpp"
#include "placement/service.hpp"
#include "runtime/progress.hpp"

#include <algorithm>

#include <algorithm>
#include <CLI/CLI.hpp>

#include <cmath>
#include <cstdio>
#include <filesystem>

namespace fs = std::filesystem;
using namespace glint;

namespace {

struct Args {
  std::string out = "runs/sft";
  std::string data = GLINT_EXAMPLES_DIR "/sft/self_cognition.jsonl";
  std::string name = "glint bot";
  std::string author = "the glint team";
  int steps = 200;
  int eval_every = 20;
  int64_t batch = 8;
  double lr = 1e-2;
  int64_t rank = 8;
  uint64_t seed = 1;
  bool fresh = false;  ///< start over, deleting the run's earlier checkpoints
  std::string adapter_from{};  ///< a PEFT adapter directory to start from
  std::string mesh = "dp=1";   ///< the model group's mesh
};

constexpr int64_t kHeldOut = 8;

int fail(const std::string& what, const caf::error& e) {
  std::fprintf(stderr, "sft: %s: %s\n", what.c_str(), describe(e).c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  CLI::App app{"LoRA SFT in the self-cognition style, with evaluation and best-checkpoint saving"};
  app.add_option("--out", a.out, "Where the model, metrics.jsonl, report.html and checkpoints go")->capture_default_str();
  app.add_option("--data", a.data, "Self-cognition rows (query/response with {{NAME}} and {{AUTHOR}}, or messages)")
      ->capture_default_str();
  app.add_option("--name", a.name, "What {{NAME}} becomes")->capture_default_str();
  app.add_option("--author", a.author, "What {{AUTHOR}} becomes")->capture_default_str();
  app.add_option("--steps", a.steps, "Training steps")->capture_default_str()->check(CLI::Range(1, 1000000));
  app.add_option("--eval-every", a.eval_every, "Steps between evaluations")->capture_default_str()->check(CLI::Range(1, 1000000));
  app.add_option("--batch", a.batch, "Rows per step")->capture_default_str()->check(CLI::Range(int64_t{1}, int64_t{4096}));
  app.add_option("--lr", a.lr, "Learning rate of the adapter")->capture_default_str();
  app.add_option("--rank", a.rank, "LoRA rank (all linear layers)")->capture_default_str()->check(CLI::Range(int64_t{1}, int64_t{256}));
  app.add_option("--seed", a.seed, "Seed of the weights, the adapter and the data order")->capture_default_str();
  app.add_flag("--fresh", a.fresh, "Start the run over: delete its earlier checkpoints (the data and model stay)");
  app.add_option("--adapter-from", a.adapter_from,
                 "Start from this saved LoRA adapter (adapter_config.json + adapter_model.safetensors, e.g. a "
                 "checkpoint's model/) instead of a fresh one; its own rank and targets replace --rank");
  app.add_option("--mesh", a.mesh,
                 "The model group's mesh: dp=N and fsdp=N (the base sharded, the adapter trained data-parallel), "
                 "e.g. fsdp=2; a rank each (docs/parallelism.md). tp and pp do not train adapters yet")
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  auto model_mesh = placement::DeviceMesh::parse(a.mesh);
  if (model_mesh && (model_mesh->size(placement::Dim::tp) > 1 || model_mesh->size(placement::Dim::pp) > 1))
    model_mesh = make_error(errc::invalid_argument, a.mesh + ": tp and pp train the full model, and this example "
                                                             "trains a LoRA adapter (use fsdp=N, dp=N)");
  if (!model_mesh) {
    std::fprintf(stderr, "sft: --mesh: %s\n", describe(model_mesh.error()).c_str());
    return 2;
  }
  std::setvbuf(stdout, nullptr, _IOLBF, 0);

  return run_main([&](Runtime& rt) -> int {
    const auto out = fs::absolute(a.out).lexically_normal().string();
    const auto model_dir = out + "/model";
    auto cognition = components::preprocess::self_cognition(a.name, a.author);
    if (!fs::exists(model_dir + "/config.json")) {
      auto ds = components::Dataset::load({.path = a.data});
      if (!ds) return fail("reading " + a.data, ds.error());
      ds->map(cognition);
      if (auto ok = examples::make_tiny_model(model_dir, components::texts_of(*ds), {.seed = a.seed}); !ok)
        return fail("making the model", ok.error());
    }
    auto checkpoints = actors::Checkpointer::open(fs::path{out}.parent_path().string(), fs::path{out}.filename().string());
    if (!checkpoints) return fail("opening the run index", checkpoints.error());
    // A run's best checkpoint is of that run: an earlier run's checkpoints
    // are deleted only when asked.
    if (auto ok = checkpoints->start_over(a.fresh); !ok) {
      if (code_of(ok.error()) != errc::failed_precondition) return fail("starting the run over", ok.error());
      std::fprintf(stderr, "sft: %s: pass --fresh to start it over (they are deleted), or another --out\n",
                   context_of(ok.error()).c_str());
      return 2;
    }
    RunReport report{out};
    if (auto svc = placement::service(rt, {.strategy = placement::Strategy::spread}); !svc)
      return fail("placement", svc.error());
    auto base = actors::open_model_group(rt, placement::DeviceGroup::of("model", model_mesh->world_size()), *model_mesh,
                                         {.model_dir = model_dir});
    if (!base) return fail("opening the model group", base.error());
    const std::string adapter = "default";
    const std::vector<std::string> all_linear = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};
    const components::LoraConfig lora{.r = a.rank, .alpha = 2.0 * static_cast<double>(a.rank),
                                      .target_modules = all_linear};
    if (a.adapter_from.empty()) {
      if (auto ok = base->add_adapter(adapter, lora, a.seed).get(); !ok) return fail("adding the adapter", ok.error());
    } else if (auto ok = base->load_adapter(adapter, a.adapter_from).get(); !ok) {
      return fail("loading the adapter from " + a.adapter_from, ok.error());
    }
    auto model = base->with_adapter(adapter);  // every call below trains or reads the adapter
    if (auto ok = model.set_optimizer({.lr = a.lr}).get(); !ok) return fail("setting the optimizer", ok.error());
    // Five warm-up steps, fewer in a run too short for them: a decaying
    // schedule needs steps after its warm-up (--steps 4 used to fail on a
    // warmup_steps nobody had set).
    const int64_t warmup = std::min<int64_t>(5, (a.steps - 1) / 2);
    if (auto ok = model.set_lr_scheduler({.kind = components::SchedulerConfig::Kind::cosine, .warmup_steps = warmup, .total_steps = a.steps}).get(); !ok)
      return fail("setting the schedule", ok.error());

    actors::DataLoaderSpec train_spec{.dataset = a.data, .slice_begin = kHeldOut, .preprocess = "self_cognition",
                                      .model_name = a.name, .model_author = a.author, .tokenizer = model_dir,
                                      .batch_size = a.batch, .min_batch_size = 1, .seed = a.seed, .epochs = 0};
    auto train = actors::open_dataloader(rt, placement::DeviceGroup::of("train-data", 1), train_spec);
    if (!train) return fail("opening the training dataloader", train.error());
    auto eval_spec = train_spec;
    eval_spec.slice_begin = 0;
    eval_spec.slice_end = kHeldOut;
    eval_spec.batch_size = kHeldOut;
    eval_spec.shuffle = false;
    auto held_out = actors::open_dataloader(rt, placement::DeviceGroup::of("eval-data", 1), eval_spec);
    if (!held_out) return fail("opening the eval dataloader", held_out.error());
    auto tok = components::Tokenizer::load(model_dir + "/tokenizer.json");
    if (!tok) return fail("loading the tokenizer", tok.error());
    const int64_t pad = tok->token_id("<|endoftext|>");

    // The held-out loss: mean negative log-likelihood of the answers' tokens.
    auto evaluate = [&]() -> Result<double> {
      auto b = held_out->next_batch().take();
      if (!b) return b.error();
      auto batch = actors::train_batch_of(b->rows, pad);
      if (!batch) return batch.error();
      auto lp = model.forward_only(*batch).take();
      if (!lp) return lp.error();
      auto logps_r = lp->values<float>();
      if (!logps_r) return logps_r.error();
      auto mask_r = batch->tensors.at("loss_mask").values<float>();
      if (!mask_r) return mask_r.error();
      const auto &logps = *logps_r, &mask = *mask_r;
      double nll = 0, n = 0;
      for (size_t i = 0; i < logps.size(); ++i)
        if (mask[i] > 0) {
          nll -= logps[i];
          n += 1;
        }
      return n > 0 ? nll / n : NAN;
    };

    if (!a.adapter_from.empty()) {
      auto e = evaluate();
      if (!e) return fail("evaluating the loaded adapter", e.error());
      std::printf("held-out loss of the adapter from %s: %.4f\n", a.adapter_from.c_str(), *e);
    }

    double best = INFINITY;
    std::string best_name;
    Progress bar{"sft", a.steps};
    for (int step = 1; step <= a.steps; ++step) {
      auto b = train->next_batch().take();
      if (!b) return fail("reading a batch", b.error());
      // Padding-free: the rows end to end, told apart by segment ids.
      auto batch = actors::padding_free_batch_of(b->rows, pad, model.info().dp_size());
      if (!batch) return fail("making a batch", batch.error());
      auto m = model.forward_backward(*batch).take();
      if (!m) return fail("forward_backward", m.error());
      auto s = model.clip_grad_and_step().take();
      if (!s) return fail("step", s.error());
      std::map<std::string, double> row = {{"loss", m->at("loss")}, {"grad_norm", s->at("grad_norm")}, {"lr", s->at("lr")}};
      char status[96];
      std::snprintf(status, sizeof status, "loss %.3f", row["loss"]);
      if (step % a.eval_every == 0 || step == a.steps) {
        auto e = evaluate();
        if (!e) return fail("evaluating", e.error());
        row["eval_loss"] = *e;
        std::snprintf(status, sizeof status, "loss %.3f  eval %.3f", row["loss"], *e);
        if (*e < best) {
          best = *e;
          best_name = "checkpoint-" + std::to_string(step);
          char summary[48];
          std::snprintf(summary, sizeof summary, "eval loss %.4f", *e);
          auto saved = checkpoints->save(best_name, model, &*train,
                                         {.step = step, .consumed_samples = step * a.batch, .seed = a.seed,
                                          .phase = "sft", .metrics = {{"eval_loss", *e}}},
                                         summary);
          if (!saved) return fail("saving the best checkpoint", saved.error());
        }
      }
      report.add(step, "sft", row);
      bar.update(step, status);
    }
    bar.finish();
    std::printf("best held-out loss %.4f: %s/%s (the adapter in PEFT layout under model/)\n", best,
                checkpoints->run_dir().c_str(), best_name.c_str());

    // The adapter, synced to a sampler, answers a question of the held-out rows.
    auto one = placement::DeviceMesh::from_sizes({.dp = 1});
    if (!one) return fail("the sampler's mesh", one.error());
    auto sampler = actors::open_sampler_group(rt, placement::DeviceGroup::of("sampler", 1), *one,
                                              {.model_dir = model_dir, .cache_bytes = 4 << 20});
    if (!sampler) return fail("opening the sampler", sampler.error());
    // The sampler's adapter has the trained one's shape (read from the same
    // directory when it came from one); the sync then brings its weights.
    auto added = a.adapter_from.empty() ? sampler->add_adapter(adapter, lora).get()
                                        : sampler->load_adapter(adapter, a.adapter_from).get();
    if (!added) return fail("adding the adapter to the sampler", added.error());
    actors::CheckpointEngine sync{model, *sampler};
    if (auto r = sync.sync_weights(); !r) return fail("syncing the adapter", r.error());
    auto prompts = held_out->next_batch().take();
    if (!prompts) return fail("reading the held-out rows", prompts.error());
    // The held-out row's prompt: its tokens up to the assistant's first (learned) token.
    const auto& row = prompts->rows.front();
    auto first = std::find(row.loss_mask.begin(), row.loss_mask.end(), 1.f) - row.loss_mask.begin();
    std::vector<int64_t> prompt(row.input_ids.begin(), row.input_ids.begin() + first + 1);
    components::SamplingParams greedy{.max_tokens = 32, .temperature = 0, .stop_token_ids = {tok->token_id("<|im_end|>")}};
    auto q = row.fields.find("query");
    std::printf("held-out question: %s\n", q != row.fields.end() ? q->second.c_str() : tok->decode(prompt).c_str());
    for (const std::string& which : {std::string{}, adapter}) {
      auto seqs = sampler->with_adapter(which).sample({prompt}, greedy).take();
      if (!seqs) return fail("sampling", seqs.error());
      std::printf("%s: %s\n", which.empty() ? "  the base model answers" : "  with the adapter", (*seqs)[0].text.c_str());
    }
    auto html = report.write_html("glint LoRA SFT (self-cognition)", {{"sft", "loss"}, {"sft", "eval_loss"}, {"sft", "lr"}});
    std::printf("metrics: %s/metrics.jsonl\nplot:    %s\n", out.c_str(), html.c_str());
    return 0;
  });
}
