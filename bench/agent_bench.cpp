// glint bench rl --env: see agent_bench.hpp.
#include "bench/agent_bench.hpp"
#include "bench/measure.hpp"
#include "bench/python_child.hpp"

#include "actors/agents.hpp"
#include "actors/sampler_group.hpp"
#include "components/data/dataset.hpp"
#include "components/data/template.hpp"
#include "components/rl/environment.hpp"
#include "placement/service.hpp"
#include "runtime/file.hpp"
#include "runtime/process.hpp"
#include "runtime/runtime.hpp"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>

namespace glint::bench {

namespace {

namespace fs = std::filesystem;
constexpr const char* kName = "glint bench rl --env";

int fail(const std::string& what) {
  std::fprintf(stderr, "%s: %s\n", kName, what.c_str());
  return 1;
}

/// Runs this binary with `args`, its output in `log`.
bool glint(const std::string& args, const std::string& log) {
  const auto cmd = "'" + self_executable() + "' " + args + " > '" + log + "' 2>&1";
  return std::system(cmd.c_str()) == 0;
}

struct Loop {
  std::vector<double> tokens_per_s, turns, hit_rate;
};

}  // namespace

int agents(const AgentBenchArgs& a) {
  auto tmp = TempDir::create();
  if (!tmp) return fail(describe(tmp.error()));
  const auto dir = tmp->path();
  // The agent of docs/recipes.md ("Agents"), made and warmed up here.
  std::fprintf(stderr, "%s: making the calculator data and model, and its SFT warm-up (%lld steps) ...\n", kName,
               static_cast<long long>(a.sft_steps));
  if (!glint("init-data calculator " + dir + "/calc.jsonl --rows 1200 --max-operand 99 --tool-share 0.5 --seed 1",
             dir + "/data.log") ||
      !glint("init-model " + dir + "/model --arch qwen3 --hidden 64 --intermediate 128 --layers 2 --heads 4 "
             "--kv-heads 2 --vocab 600 --max-positions 512 --tokenizer-from " + dir + "/calc.jsonl --chat-template tools",
             dir + "/model.log") ||
      !glint("sft --model " + dir + "/model --dataset " + dir + "/calc.jsonl --train-type full --lr 3e-3 "
             "--batch-size 32 --max-steps " + std::to_string(a.sft_steps) +
             " --lr-scheduler constant --max-length 384 --output " + dir + "/sft", dir + "/sft.log"))
  {
    std::string logs;
    for (const char* f : {"/data.log", "/model.log", "/sft.log"})
      if (auto t = read_text_file(dir + f)) logs += *t;
    return fail("making the agent failed:\n" + logs);
  }
  const auto model_dir = dir + "/sft/last";
  auto ds = components::Dataset::load({.path = dir + "/calc.jsonl"});
  if (!ds) return fail(describe(ds.error()));
  std::vector<actors::DataRow> rows;
  for (size_t i = 0; i < ds->size() && static_cast<int64_t>(rows.size()) < a.prompts; ++i) {
    actors::DataRow r;
    r.index = static_cast<int64_t>(i);
    r.fields = ds->row(i).fields;
    rows.push_back(std::move(r));
  }
  auto tok = components::Tokenizer::load(model_dir);
  if (!tok) return fail(describe(tok.error()));
  auto chat = components::Template::make(std::make_shared<const components::Tokenizer>(std::move(*tok)), {});
  if (!chat) return fail(describe(chat.error()));
  auto shared_chat = std::make_shared<const components::Template>(std::move(*chat));
  if (auto env = components::rl::make_environment(a.env, {}); !env) return fail("--env " + a.env + ": " + describe(env.error()));

  auto rt = initialize(Options{});
  if (!rt) return fail(describe(rt.error()));
  const int64_t max_len = 448;
  auto mesh = placement::DeviceMesh::from_sizes({.dp = 1});
  if (!mesh) return fail(describe(mesh.error()));
  auto open = [&](const std::string& name, bool cache) {
    return actors::open_sampler_group(**rt, placement::DeviceGroup::of(name, 1), *mesh,
                                      {.model_dir = model_dir, .sampling_seed = 7, .cache_bytes = int64_t{64} << 20,
                                       .max_model_len = max_len, .enable_prefix_caching = cache});
  };
  auto cached = open("multiturn", true);
  auto naive = open("naive", false);
  if (!cached || !naive) return fail(describe(cached ? naive.error() : cached.error()));
  auto make_env = [&a] { return components::rl::make_environment(a.env, {}); };
  actors::AgentRunner multiturn{*cached, shared_chat, make_env, {.max_turns = 3, .max_tokens = max_len}};
  actors::AgentRunner rerender{*naive, shared_chat, make_env, {.max_turns = 3, .max_tokens = max_len, .rerender = true}};
  // Re-rendering onto the cached sampler: what the cache alone gives back.
  actors::AgentRunner rerender_cached{*cached, shared_chat, make_env,
                                      {.max_turns = 3, .max_tokens = max_len, .rerender = true}};
  print_metric("multiturn_episodes", static_cast<double>(a.prompts * a.generations), 0);
  Loop loops[3];
  const char* names[3] = {"multiturn", "naive", "rerender_cached"};
  std::vector<double> ratio, ratio_cached;
  for (int r = 0; r < a.repeats + 1; ++r) {  // the first round warms up, uncounted
    double rate[3] = {0, 0, 0};
    for (int k = 0; k < 3; ++k) {
      components::SamplingParams p{.num_samples = a.generations, .max_tokens = 64, .temperature = 1.0,
                                   .seed = 1000 + r, .stop_token_ids = {shared_chat->end_of_turn_id()}};
      auto& runner = k == 0 ? multiturn : k == 1 ? rerender : rerender_cached;
      // Each loop starts from an empty cache: the same seeds would find the last loop's episodes in it.
      if (auto ok = (k == 1 ? *naive : *cached).reset_prefix_cache().get(); !ok) return fail(describe(ok.error()));
      Result<std::vector<actors::Trajectory>> runs = std::vector<actors::Trajectory>{};
      const double s = seconds_of([&] { runs = runner.run(rows, p).take(); });
      if (!runs) return fail(describe(runs.error()));
      double tokens = 0;
      for (const auto& t : *runs) tokens += static_cast<double>(std::count(t.learned.begin(), t.learned.end(), 1.f));
      auto m = actors::agent_metrics(*runs);
      rate[k] = tokens / s;
      if (r == 0) continue;
      loops[k].tokens_per_s.push_back(rate[k]);
      loops[k].turns.push_back(m["turns/mean"]);
      loops[k].hit_rate.push_back(m["prefix_cache/hit_rate"]);
      std::fprintf(stderr, "%s: repeat %d, %s: %.0f tokens in %.2f s, %.2f turns per episode, prefix cache %.3f\n",
                   kName, r, names[k], tokens, s, m["turns/mean"], m["prefix_cache/hit_rate"]);
    }
    if (r > 0) {
      ratio.push_back(rate[0] / rate[1]);
      ratio_cached.push_back(rate[0] / rate[2]);
    }
  }
  print_metric("multiturn_tokens_per_s", median(loops[0].tokens_per_s), 1);
  print_metric("naive_tokens_per_s", median(loops[1].tokens_per_s), 1);
  print_metric("multiturn_vs_naive", median(ratio), 3);
  print_metric("rerender_cached_tokens_per_s", median(loops[2].tokens_per_s), 1);
  print_metric("multiturn_vs_rerender_cached", median(ratio_cached), 3);
  print_metric("prefix_cache_hit_rate", median(loops[0].hit_rate), 3);
  print_metric("rerender_cached_hit_rate", median(loops[2].hit_rate), 3);
  print_metric("multiturn_turns_mean", median(loops[0].turns), 2);
  print_metric("naive_turns_mean", median(loops[1].turns), 2);
  return 0;
}

}  // namespace glint::bench
