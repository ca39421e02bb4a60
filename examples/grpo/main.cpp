// GRPO on arithmetic, end to end, with the loop in plain sight (as
// Twinkle's GRPO example): a model group trains, a sampler group generates,
// a dataloader feeds prompts, rewards and group advantages score the
// completions, and the checkpoint engine syncs the weights every step.
//
//   build/examples/grpo                          # local mode, about 2 minutes on 2 cores
//   glint run --nproc 2 -- build/examples/grpo   # the same, model and sampler in 2 processes
//   build/examples/grpo --max-staleness 2        # asynchronous: sampling overlaps training
//
// On first run it makes what it needs under --out (default runs/grpo): a
// generated dataset of sums and differences (GSM8K format) and a tiny Qwen3
// model with random weights and a tokenizer trained on that data. A short
// SFT warm-up teaches the answer format; GRPO then raises the share of right
// answers. It writes metrics.jsonl (one JSON object per step) and
// report.html (reward and loss per step) there.
#include "actors/checkpoint_engine.hpp"
#include "actors/checkpointer.hpp"
#include "actors/dataloader_group.hpp"
#include "actors/model_group.hpp"
#include "actors/rollout.hpp"
#include "actors/sampler_group.hpp"
#include "runtime/report.hpp"
#include "common/tiny_model.hpp"
#include "components/data/dataset.hpp"
#include "components/data/synthetic.hpp"
#include "components/data/tokenizer.hpp"
#include "components/rl/metrics.hpp"
#include "components/rl/rewards.hpp"
#include "placement/service.hpp"
#include "runtime/memory.hpp"
#include "runtime/progress.hpp"

#include <CLI/CLI.hpp>

#include <chrono>
#include <numeric>
#include <cstdio>
#include <filesystem>

namespace fs = std::filesystem;
using namespace glint;

namespace {

struct Args {
  std::string out = "runs/grpo";
  int sft_steps = 150;
  int steps = 120;
  int64_t prompts = 16;      ///< per GRPO step
  int64_t generations = 8;   ///< completions per prompt
  int64_t max_tokens = 16;
  double sft_lr = 3e-3;
  double lr = 1e-4;  ///< GRPO moves a tiny model far per step: 1e-3 collapses it
  uint64_t seed = 1;
  int save_every = 40;       ///< GRPO steps between checkpoints; 0: none
  std::string resume{};      ///< "latest" or a checkpoint name
  bool fresh = false;        ///< start over, deleting the run's checkpoints
  int64_t max_staleness = 0;  ///< eta: 0 is the synchronous loop
  std::string update_policy = "finish_old";
  std::string loss = "auto";  ///< auto: grpo when synchronous, decoupled_ppo when not
  double weight_cap = 5.0;
  std::string cap_mode = "mask";
  std::string mesh = "dp=1";  ///< the model group's mesh
};

constexpr const char* kSystem = "Compute.";

// The dataset and the model, made once.
Result<void> prepare(const Args& a, const std::string& data, const std::string& model_dir) {
  if (!fs::exists(data)) {
    fs::create_directories(fs::path{data}.parent_path());
    auto rows = components::arithmetic_rows(4000, {.seed = a.seed, .max_operand = 9});
    if (auto ok = components::save_jsonl(rows, data); !ok) return ok;
    std::printf("wrote %s: 4000 generated sums and differences\n", data.c_str());
  }
  if (!fs::exists(model_dir + "/config.json")) {
    auto ds = components::Dataset::load({.path = data});
    if (!ds) return ds.error();
    auto texts = components::texts_of(*ds);
    texts.push_back(kSystem);
    if (auto ok = examples::make_tiny_model(model_dir, texts, {.seed = a.seed}); !ok) return ok;
  }
  return {};
}

int fail(const std::string& what, const caf::error& e) {
  std::fprintf(stderr, "grpo: %s: %s\n", what.c_str(), describe(e).c_str());
  return 1;
}

// The mean of the `n` values before index `end`.
double window_mean(const std::vector<double>& v, size_t end, size_t n) {
  n = std::min(n, end);
  double sum = 0;
  for (size_t i = end - n; i < end; ++i) sum += v[i];
  return n ? sum / static_cast<double>(n) : NAN;
}

// A batch's prompts, and each prompt's reference solution repeated for its
// `generations` completions (the sampler answers them prompt by prompt).
struct Prompts {
  std::vector<std::vector<int64_t>> ids;
  std::vector<std::string> solutions;
};
Prompts prompts_of(const std::vector<actors::DataRow>& rows, int64_t generations) {
  Prompts p;
  for (const auto& r : rows) {
    p.ids.push_back(r.input_ids);
    for (int64_t g = 0; g < generations; ++g) p.solutions.push_back(r.fields.at("solution"));
  }
  return p;
}

std::vector<std::string> texts_of(const std::vector<actors::SampledSequence>& seqs) {
  std::vector<std::string> out;
  for (const auto& s : seqs) out.push_back(s.text);
  return out;
}

std::vector<int64_t> completion_lengths(const std::vector<actors::SampledSequence>& seqs) {
  std::vector<int64_t> out;
  for (const auto& s : seqs) out.push_back(static_cast<int64_t>(s.tokens.size()));
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  CLI::App app{"GRPO on generated arithmetic: SFT warm-up, then sample, reward, advantage, train, sync"};
  app.add_option("--out", a.out, "Where the data, model, metrics.jsonl and report.html go")->capture_default_str();
  app.add_option("--sft-steps", a.sft_steps, "Supervised warm-up steps")->capture_default_str()->check(CLI::Range(0, 100000));
  app.add_option("--steps", a.steps, "GRPO steps")->capture_default_str()->check(CLI::Range(1, 100000));
  app.add_option("--prompts", a.prompts, "Prompts per GRPO step")->capture_default_str()->check(CLI::Range(int64_t{1}, int64_t{4096}));
  app.add_option("--generations", a.generations, "Completions per prompt (the group)")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{2}, int64_t{256}));
  app.add_option("--max-tokens", a.max_tokens, "New tokens per completion")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{65536}));
  app.add_option("--sft-lr", a.sft_lr, "Learning rate of the warm-up")->capture_default_str();
  app.add_option("--lr", a.lr, "Learning rate of GRPO")->capture_default_str();
  app.add_option("--seed", a.seed, "Seed of the data, the weights and the sampling")->capture_default_str();
  app.add_option("--save-every", a.save_every, "Save a checkpoint every N GRPO steps (0: never)")
      ->capture_default_str()
      ->check(CLI::Range(0, 1000000));
  app.add_option("--resume", a.resume,
                 "Continue the run from a checkpoint: latest, or a name (glint checkpoints RUN lists them); the "
                 "steps after it repeat an uninterrupted run's exactly");
  app.add_flag("--fresh", a.fresh, "Start the run over: delete its earlier checkpoints (the data and model stay)");
  app.add_option("--max-staleness", a.max_staleness,
                 "Asynchronous RL: the sampler keeps generating while the model trains, and a batch may be trained "
                 "up to this many weight updates after the weights that sampled it (0: synchronous)")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{0}, int64_t{8}));
  app.add_option("--update-policy", a.update_policy,
                 "What samples in flight do when new weights arrive: finish_old (finish on the weights they began "
                 "with; runs do not depend on timing) or continue_new (go on with the new ones)")
      ->capture_default_str()
      ->check(CLI::IsMember({"finish_old", "continue_new"}));
  app.add_option("--loss", a.loss,
                 "GRPO's loss: auto (grpo when synchronous, decoupled_ppo when --max-staleness > 0), grpo, "
                 "decoupled_ppo, ...")
      ->capture_default_str();
  app.add_option("--weight-cap", a.weight_cap,
                 "decoupled_ppo: the cap of the off-policy weight pi_prox / pi_behav (AReaL 5, veRL 2)")
      ->capture_default_str();
  app.add_option("--cap-mode", a.cap_mode, "decoupled_ppo: mask (tokens above the cap count nothing) or clamp")
      ->capture_default_str()
      ->check(CLI::IsMember({"mask", "clamp"}));
  app.add_option("--mesh", a.mesh,
                 "The model group's mesh: dp=N and one of fsdp=N (sharded data parallel), tp=N (tensor parallel), "
                 "pp=N (pipeline stages), e.g. fsdp=2; a rank each (docs/parallelism.md)")
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // results in order with the progress lines on stderr
  auto model_mesh = placement::DeviceMesh::parse(a.mesh);
  if (!model_mesh) {
    std::fprintf(stderr, "grpo: --mesh: %s\n", describe(model_mesh.error()).c_str());
    return 2;
  }
  components::LossSpec grpo_loss;
  {
    auto kind = components::parse_loss_kind(a.loss == "auto" ? (a.max_staleness > 0 ? "decoupled_ppo" : "grpo") : a.loss);
    if (!kind) {
      std::fprintf(stderr, "grpo: --loss: %s\n", context_of(kind.error()).c_str());
      return 2;
    }
    grpo_loss.kind = *kind;
    if (*kind == components::LossKind::decoupled_ppo) {
      grpo_loss.weight_cap = a.weight_cap;
      grpo_loss.cap_mode = a.cap_mode == "clamp" ? components::LossSpec::CapMode::clamp : components::LossSpec::CapMode::mask;
    } else if (a.weight_cap != 5.0 || a.cap_mode != "mask") {
      std::fprintf(stderr, "grpo: --weight-cap and --cap-mode apply to --loss decoupled_ppo only\n");
      return 2;
    }
    if (auto ok = grpo_loss.validate(); !ok) {
      std::fprintf(stderr, "grpo: %s\n", context_of(ok.error()).c_str());
      return 2;
    }
  }
  const auto update_policy = components::parse_update_policy(a.update_policy);
  if (*update_policy == components::UpdatePolicy::continue_new && a.max_staleness == 0) {
    std::fprintf(stderr, "grpo: --update-policy continue_new needs --max-staleness above 0: a synchronous loop has no "
                         "samples in flight when new weights arrive\n");
    return 2;
  }

  // A step holds every completion of its prompts in the driver and in the
  // training batch (ids, masks, log-probabilities, advantages: about 48
  // bytes a token, prompts of up to 512 tokens); the model trains them in
  // micro-batches, so this is what must fit at once.
  const double step_tokens = static_cast<double>(a.prompts * a.generations) * static_cast<double>(a.max_tokens + 512);
  if (auto ok = check_memory(48 * step_tokens, "a GRPO step of " + std::to_string(a.prompts) + " prompts x " +
                                                   std::to_string(a.generations) + " completions of " +
                                                   std::to_string(a.max_tokens) + " tokens");
      !ok) {
    std::fprintf(stderr, "grpo: %s: lower --prompts, --generations or --max-tokens\n", context_of(ok.error()).c_str());
    return 2;
  }

  return run_main([&](Runtime& rt) -> int {
    const auto out = fs::absolute(a.out).lexically_normal().string();
    const auto data = out + "/arith.jsonl", model_dir = out + "/model";
    if (auto ok = prepare(a, data, model_dir); !ok) return fail("preparing " + out, ok.error());
    // Checkpoints: the run is --out's name, indexed in its parent (glint runs --root <parent>).
    auto checkpoints = actors::Checkpointer::open(fs::path{out}.parent_path().string(), fs::path{out}.filename().string());
    if (!checkpoints) return fail("opening the run index", checkpoints.error());
    auto tok = components::Tokenizer::load(model_dir + "/tokenizer.json");
    if (!tok) return fail("loading the tokenizer", tok.error());
    const int64_t im_end = tok->token_id("<|im_end|>"), pad = tok->token_id("<|endoftext|>");

    // Placement: the model and the sampler each get a group (in cluster mode,
    // spread over the processes); the dataloaders sit with the driver.
    if (auto svc = placement::service(rt, {.strategy = placement::Strategy::spread}); !svc)
      return fail("placement", svc.error());
    auto mesh = placement::DeviceMesh::from_sizes({.dp = 1});
    if (!mesh) return fail("the device mesh", mesh.error());
    const auto& one = *mesh;
    // As Twinkle's DeviceGroup(ranks=...): the model on the first core of the
    // job, the sampler on the last, so in a 2-process job they are in
    // different processes and in local mode on different cores.
    auto resources = placement::cluster_resources(rt);
    if (!resources) return fail("reading the job's resources", resources.error());
    int cores = 0;
    for (const auto& node : *resources) cores += static_cast<int>(node.cores.size());
    auto on = [&](const char* name, int core) {
      return cores >= 2 ? placement::DeviceGroup::on(name, {core}) : placement::DeviceGroup::of(name, 1);
    };
    // A mesh of several ranks: its own cores where there are enough, else shared.
    const int model_ranks = model_mesh->world_size();
    auto model_group = placement::DeviceGroup::of("model", model_ranks);
    if (model_ranks == 1) model_group = on("model", 0);
    else if (cores > model_ranks) {
      std::vector<int> first(static_cast<size_t>(model_ranks));
      std::iota(first.begin(), first.end(), 0);
      model_group = placement::DeviceGroup::on("model", first);
    }
    auto model = actors::open_model_group(rt, model_group, *model_mesh, {.model_dir = model_dir});
    if (!model) return fail("opening the model group", model.error());
    auto sampler = actors::open_sampler_group(rt, on("sampler", cores - 1), one,
                                              {.model_dir = model_dir, .sampling_seed = a.seed, .cache_bytes = 16 << 20});
    if (!sampler) return fail("opening the sampler group", sampler.error());
    // The model's nodes, rank by rank ("0", or "0,1" for a mesh over both).
    std::string model_nodes;
    for (const auto& r : model->info().ranks) model_nodes += (model_nodes.empty() ? "" : ",") + std::to_string(r.node);
    std::printf("%s mode: the model group runs on node %s (mesh %s), the sampler group on node %d\n",
                std::string{to_string(rt.mode())}.c_str(), model_nodes.c_str(), model_mesh->describe().c_str(),
                sampler->info().ranks[0].node);
    actors::DataLoaderSpec loader{.dataset = data, .slice_begin = 256, .preprocess = "gsm8k", .system_prompt = kSystem,
                                  .tokenizer = model_dir, .seed = a.seed, .epochs = 0};

    // GRPO's loss and optimizer come first when resuming: the checkpoint's
    // optimizer state loads into them.
    auto set_grpo = [&]() -> Result<void> {
      if (auto ok = model->set_loss(grpo_loss).get(); !ok) return ok;
      return model->set_optimizer({.lr = a.lr}).get();
    };
    auto rl_spec = loader;
    rl_spec.add_generation_prompt = true;
    rl_spec.batch_size = a.prompts;
    rl_spec.seed = a.seed + 1;
    auto dataloader = actors::open_dataloader(rt, placement::DeviceGroup::of("rl-data", 1), rl_spec);
    if (!dataloader) return fail("opening the GRPO dataloader", dataloader.error());
    std::optional<actors::TrainerState> resumed;
    if (a.resume.empty()) {
      if (auto ok = checkpoints->start_over(a.fresh); !ok) {
        if (code_of(ok.error()) != errc::failed_precondition) return fail("starting the run over", ok.error());
        std::fprintf(stderr, "grpo: %s: pass --resume latest to continue it, --fresh to start it over, or another --out\n",
                     context_of(ok.error()).c_str());
        return 2;
      }
    } else {
      auto earlier = checkpoints->list();
      if (!earlier) return fail("reading the run index", earlier.error());
      if (earlier->empty() && a.resume == "latest") {
        // Nothing to resume (a job killed before its first save): the run
        // starts with its SFT warm-up, so GRPO's loss is not installed yet.
        std::printf("run %s has no checkpoint yet: starting afresh\n", checkpoints->run().c_str());
      } else {
        if (auto ok = set_grpo(); !ok) return fail("setting up GRPO", ok.error());
        auto r = checkpoints->resume(*model, &*dataloader, a.resume);
        if (!r) return fail("resuming", r.error());
        resumed = *r;
        if (!resumed) return fail("resuming", make_error(errc::not_found, "run " + checkpoints->run() + " has no checkpoint"));
        std::printf("resumed run %s at GRPO step %lld\n", checkpoints->run().c_str(), static_cast<long long>(resumed->step));
      }
    }
    const int start = resumed ? static_cast<int>(resumed->step) : 0;
    RunReport report{out, "grpo", resumed ? start : -1};
    if (!report.ok()) return fail("writing " + out + "/metrics.jsonl", make_error(errc::unavailable, "cannot open it"));

    // 1. SFT warm-up: the answer format, and some arithmetic.
    if (a.sft_steps > 0 && !resumed) {
      auto sft_spec = loader;
      sft_spec.batch_size = 32;
      auto sft_data = actors::open_dataloader(rt, placement::DeviceGroup::of("sft-data", 1), sft_spec);
      if (!sft_data) return fail("opening the SFT dataloader", sft_data.error());
      if (auto ok = model->set_optimizer({.lr = a.sft_lr}).get(); !ok) return fail("setting the optimizer", ok.error());
      Progress bar{"sft", a.sft_steps};
      for (int step = 1; step <= a.sft_steps; ++step) {
        auto b = sft_data->next_batch().take();
        if (!b) return fail("reading an SFT batch", b.error());
        // Padding-free: the rows end to end, told apart by segment ids.
        auto batch = actors::padding_free_batch_of(b->rows, pad, model->info().dp_size());
        if (!batch) return fail("making an SFT batch", batch.error());
        auto m = model->forward_backward(*batch).take();
        if (!m) return fail("SFT forward_backward", m.error());
        auto s = model->clip_grad_and_step().take();
        if (!s) return fail("SFT step", s.error());
        const double loss = m->count("loss") ? m->at("loss") : NAN;
        report.add(step, "sft", {{"loss", loss}, {"grad_norm", s->count("grad_norm") ? s->at("grad_norm") : NAN}});
        char status[64];
        std::snprintf(status, sizeof status, "loss %.3f", loss);
        bar.update(step, status);
      }
      bar.finish();
    }

    // Greedy accuracy on held-out prompts (rows the loaders never read).
    actors::DataLoaderSpec eval_spec = loader;
    eval_spec.slice_begin = 0;
    eval_spec.slice_end = 256;
    eval_spec.add_generation_prompt = true;
    eval_spec.batch_size = 256;
    eval_spec.shuffle = false;
    eval_spec.epochs = 0;
    auto eval_data = actors::open_dataloader(rt, placement::DeviceGroup::of("eval-data", 1), eval_spec);
    if (!eval_data) return fail("opening the eval dataloader", eval_data.error());
    // As Twinkle's CheckpointEngineManager: model -> sampler, every step.
    actors::CheckpointEngine ckpt_manager{*model, *sampler};
    auto evaluate = [&]() -> Result<double> {
      if (auto s = ckpt_manager.sync_weights(); !s) return s.error();
      auto b = eval_data->next_batch().take();
      if (!b) return b.error();
      auto prompts = prompts_of(b->rows, 1);
      auto seqs = sampler->sample(prompts.ids, {.max_tokens = a.max_tokens, .temperature = 0, .stop_token_ids = {im_end}})
                      .take();
      if (!seqs) return seqs.error();
      auto acc = components::rl::gsm8k_accuracy(texts_of(*seqs), prompts.solutions);
      if (!acc) return acc.error();
      return window_mean(*acc, acc->size(), acc->size());
    };
    auto before = evaluate();
    if (!before) return fail("evaluating", before.error());
    std::printf("greedy accuracy on 256 held-out prompts after the warm-up: %.3f\n", *before);

    // 2. GRPO, step for step as Twinkle's loop.
    if (!resumed)
      if (auto ok = set_grpo(); !ok) return fail("setting up GRPO", ok.error());
    components::SamplingParams sampling_params{.num_samples = a.generations, .max_tokens = a.max_tokens,
                                               .temperature = 1.0, .stop_token_ids = {im_end}};
    // The rollouts: each step's prompts, sampled with the weights synced
    // before (--max-staleness 0), or while earlier steps train (above 0).
    auto source = [&](int64_t step) -> Result<std::optional<actors::RolloutBatch>> {
      auto batch = dataloader->next_batch().take();
      if (!batch) return with_context(batch.error(), "reading prompts");
      actors::RolloutBatch b{.prompts = prompts_of(batch->rows, 1).ids, .params = sampling_params,
                             .rows = std::move(batch->rows), .loader_state = batch->state};
      // Each step's draws come from (seed, step), so a resumed run repeats
      // them, and a batch's samples do not depend on when it was sampled.
      b.params.seed = static_cast<int64_t>((a.seed * 1000003 + static_cast<uint64_t>(step)) & 0x7fffffffffff);
      return b;
    };
    actors::RolloutPipeline rollouts{ckpt_manager, *sampler, source,
                                     {.max_staleness = a.max_staleness, .first_batch = start + 1,
                                      .last_batch = a.steps, .sync = {.policy = *update_policy}}};
    if (a.max_staleness > 0)
      std::printf("asynchronous GRPO: up to %lld steps of staleness, loss %s, policy %s\n",
                  static_cast<long long>(a.max_staleness), std::string{components::to_string(grpo_loss.kind)}.c_str(),
                  a.update_policy.c_str());
    components::rl::CompletionRewardMetric metrics;
    Progress bar{"grpo", a.steps};
    std::vector<double> rewards;  // per step, for the running mean
    using clock = std::chrono::steady_clock;
    const auto grpo_start = clock::now();
    double sample_s = 0, train_s = 0;
    for (int step = start + 1; step <= a.steps; ++step) {
      metrics.reset();
      // The step's completions: num_samples per prompt, every group whole.
      auto rollout = rollouts.next();
      if (!rollout) return fail("sampling", rollout.error());
      const auto& sequences = rollout->sequences;
      auto prompts = prompts_of(rollout->batch.rows, a.generations);

      // Rewards.
      auto texts = texts_of(sequences);
      auto accuracy = components::rl::gsm8k_accuracy(texts, prompts.solutions);
      if (!accuracy) return fail("scoring", accuracy.error());
      auto format = components::rl::gsm8k_format(texts);
      std::vector<double> total(texts.size());
      for (size_t i = 0; i < total.size(); ++i) total[i] = (*accuracy)[i] + format[i];
      (void)metrics.accumulate(completion_lengths(sequences),
                               {{"total", total}, {"accuracy", *accuracy}, {"format", format}});

      // GRPO advantages: normalised within each prompt's group.
      auto advantages =
          components::rl::advantages(total, {.group_size = a.generations, .scale = components::rl::Scale::group});
      if (!advantages) return fail("advantages", advantages.error());

      // Train on the completions, then hand the new weights to the sampler.
      const auto train_start = clock::now();
      // Padding-free: the completions end to end, told apart by segment ids.
      auto inputs = actors::training_batch(
          rollout->batch.prompts, sequences,
          {.pad_id = pad, .advantages = *advantages, .pack = true, .min_rows = model->info().dp_size()});
      if (!inputs) return fail("making the training batch", inputs.error());
      auto m = model->forward_backward(*inputs).take();
      if (!m) return fail("forward_backward", m.error());
      auto s = model->clip_grad_and_step().take();
      if (!s) return fail("step", s.error());
      auto sync = rollouts.weights_updated();
      if (!sync) return fail("syncing weights", sync.error());
      const double train_seconds = std::chrono::duration<double>(clock::now() - train_start).count();
      sample_s += rollout->sample_seconds;
      train_s += train_seconds;

      auto row = metrics.calculate();
      for (const char* k : {"loss", "clip_fraction", "capped_fraction", "behavior_weight_mean"})
        if (m->count(k)) row[k] = m->at(k);
      for (const char* k : {"grad_norm", "lr"})
        if (s->count(k)) row[k] = s->at(k);
      row["weight_sync_seconds"] = sync->seconds;
      row["sample_seconds"] = rollout->sample_seconds;
      row["train_seconds"] = train_seconds;  // forward_backward, step and sync
      row["wait_seconds"] = rollout->wait_seconds;  // the trainer idle, waiting for samples
      row["staleness/max"] = static_cast<double>(rollout->staleness_max);
      row["staleness/mean"] = rollout->staleness_mean;
      report.add(step, "grpo", row);
      rewards.push_back(row["reward/total/mean"]);
      char status[96];
      std::snprintf(status, sizeof status, "reward %.2f (last 20: %.2f)  accuracy %.2f", rewards.back(),
                    window_mean(rewards, rewards.size(), 20), row["reward/accuracy/mean"]);
      bar.update(step, status);
      if (a.save_every > 0 && step % a.save_every == 0) {
        char summary[64];
        std::snprintf(summary, sizeof summary, "reward %.3f, accuracy %.3f", rewards.back(), row["reward/accuracy/mean"]);
        // The loader's position after this step's batch: with
        // --max-staleness the loader itself is ahead by the batches in
        // flight, which a resumed run samples again (from these weights).
        auto saved = checkpoints->save("step-" + std::to_string(step), *model, nullptr,
                                       {.step = step, .consumed_samples = step * a.prompts, .seed = a.seed,
                                        .phase = "grpo", .loader = *rollout->batch.loader_state,
                                        .metrics = {{"reward", rewards.back()}}},
                                       summary);
        if (!saved) return fail("saving a checkpoint", saved.error());
      }
    }
    rollouts.close();
    const double grpo_seconds = std::chrono::duration<double>(clock::now() - grpo_start).count();
    const int done_steps = a.steps - start;
    if (done_steps > 0)
      std::printf("grpo phase: %d steps in %.2f s (%.0f steps/hour), max staleness %lld; sampling %.2f s, training "
                  "%.2f s, the trainer waited %.2f s for samples\n",
                  done_steps, grpo_seconds, done_steps * 3600.0 / grpo_seconds,
                  static_cast<long long>(a.max_staleness), sample_s, train_s, rollouts.stats().wait_seconds);
    bar.finish();
    auto after = evaluate();
    if (!after) return fail("evaluating", after.error());
    std::printf("greedy accuracy on 256 held-out prompts: %.3f after the warm-up, %.3f after GRPO\n", *before, *after);
    const size_t w = std::min<size_t>(20, rewards.size());
    if (w == 0) return 0;
    std::printf("mean reward (accuracy + format, at most 2) over %zu steps: %.3f at the start, %.3f at the end\n", w,
                window_mean(rewards, w, w), window_mean(rewards, rewards.size(), w));
    auto html = report.write_html("glint GRPO on arithmetic",
                                  {{"grpo", "reward/total/mean"}, {"grpo", "reward/accuracy/mean"}, {"grpo", "loss"},
                                   {"grpo", "completion_length/mean"}, {"sft", "loss"}});
    std::printf("metrics: %s/metrics.jsonl\nplot:    %s\n", out.c_str(), html.c_str());
    return 0;
  });
}
