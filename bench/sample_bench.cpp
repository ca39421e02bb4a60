// glint bench sample: see sample_bench.hpp.
#include "bench/sample_bench.hpp"
#include "bench/bench_model.hpp"
#include "bench/llamacpp.hpp"
#include "bench/measure.hpp"
#include "bench/python_child.hpp"

#include "components/checkpoint/safetensors.hpp"
#include "components/data/bpe_trainer.hpp"
#include "components/data/dataset.hpp"
#include "components/data/synthetic.hpp"
#include "components/model/gguf_export.hpp"
#include "components/model/kernels.hpp"
#include "components/sampler/engine.hpp"

#include <nlohmann/json.hpp>

#include <ATen/Parallel.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <optional>
#include <random>
#include <sstream>

namespace glint::bench {

namespace {

namespace fs = std::filesystem;
using namespace glint::components;

constexpr const char* kName = "glint bench sample";
constexpr uint64_t kSeed = 1;
constexpr int64_t kCheckPrompts = 4, kCheckTokens = 16;

int fail(const std::string& what) {
  std::fprintf(stderr, "%s: %s\n", kName, what.c_str());
  return 1;
}

// Prompts of uniform random lengths that start with the same prefix.
std::vector<std::vector<int64_t>> make_prompts(const SampleBenchArgs& a, int64_t vocab) {
  std::mt19937_64 rng{kSeed};
  std::uniform_int_distribution<int64_t> token{0, vocab - 1}, length{a.min_prompt, a.max_prompt};
  std::vector<int64_t> prefix(static_cast<size_t>(std::min(a.shared_prefix, a.min_prompt)));
  for (auto& t : prefix) t = token(rng);
  std::vector<std::vector<int64_t>> out;
  for (int64_t i = 0; i < a.prompts; ++i) {
    auto p = prefix;
    p.resize(static_cast<size_t>(length(rng)));
    for (size_t j = prefix.size(); j < p.size(); ++j) p[j] = token(rng);
    out.push_back(std::move(p));
  }
  return out;
}

// Right-padded input_ids [P, Lmax] and lengths [P], the baseline's input.
Result<void> write_prompts(const std::string& path, const std::vector<std::vector<int64_t>>& prompts) {
  size_t width = 0;
  for (const auto& p : prompts) width = std::max(width, p.size());
  std::vector<int64_t> ids(prompts.size() * width, 0), lengths;
  for (size_t i = 0; i < prompts.size(); ++i) {
    std::copy(prompts[i].begin(), prompts[i].end(), ids.begin() + static_cast<long>(i * width));
    lengths.push_back(static_cast<int64_t>(prompts[i].size()));
  }
  auto t = Tensor::from_values(ids, {static_cast<int64_t>(prompts.size()), static_cast<int64_t>(width)});
  auto l = Tensor::from_values(lengths, {static_cast<int64_t>(prompts.size())});
  return write_safetensors(path, {{"input_ids", *t}, {"lengths", *l}});
}

// The same prompts as a JSON list of id lists, llama.cpp's input.
Result<void> write_prompts_json(const std::string& path, const std::vector<std::vector<int64_t>>& prompts) {
  std::ofstream out{path};
  out << nlohmann::json(prompts).dump();
  if (!out) return make_error(errc::unavailable, "cannot write " + path);
  return {};
}

// llama.cpp runs the bench model from a GGUF file, which needs a vocabulary:
// a small byte-level BPE tokenizer trained on generated text, padded by the
// export with [PAD] tokens to the model's 8192 ids (the prompts are random
// ids, so no text is ever tokenized).
Result<std::string> export_for_llamacpp(const std::string& dir) {
  std::vector<std::string> texts;
  for (const auto& r : arithmetic_rows(200, {.seed = kSeed}))
    for (const auto& [k, v] : r.fields) texts.push_back(v);
  auto json = train_bpe(texts, {.vocab_size = 300});
  if (!json) return json.error();
  if (auto ok = save_chatml_tokenizer(dir, *json); !ok) return ok.error();
  const auto path = (fs::path{dir} / "model.gguf").string();
  if (auto ok = export_gguf(dir, path, {.dtype = Dtype::f32}); !ok) return ok.error();
  return path;
}

// node-llama-cpp's directory, installing it when asked and missing.
Result<std::string> llamacpp_modules(const std::string& mode) {
  const auto dir = llamacpp_dir();
  if (llamacpp_installed(dir)) return dir;
  if (mode != "auto")
    return make_error(errc::not_found, "llama.cpp is not installed in " + dir +
                                           " (scripts/setup_llamacpp.sh installs it; --llamacpp auto runs it)");
  auto setup = shipped_file("llamacpp/setup_llamacpp.sh", "scripts/setup_llamacpp.sh");
  if (!setup) return setup.error();
  std::printf("# installing llama.cpp for the baseline: %s\n", setup->c_str());
  std::fflush(stdout);
  const auto cmd = "'" + *setup + "' >/dev/null";
  if (std::system(cmd.c_str()) != 0 || !llamacpp_installed(dir))
    return make_error(errc::unavailable, *setup + " failed (it needs node, npm and the npm registry); pass "
                                                  "--llamacpp none to measure without llama.cpp");
  return dir;
}

struct GlintRun {
  double seconds = 0;
  int64_t tokens = 0;
  double hit_rate = 0;
};

// Every prompt x samples completions, all requests queued at once (as an RL
// step does), run to completion. The prefix cache starts empty each run, so
// hits come from prompts of this run only.
Result<GlintRun> run_glint(Engine& e, const std::vector<std::vector<int64_t>>& prompts, const SampleBenchArgs& a,
                           uint64_t seed) {
  e.reset_prefix_cache();
  auto before = e.stats();
  SamplingParams p{.num_samples = a.samples, .max_tokens = a.max_tokens, .temperature = 1.0, .ignore_eos = true,
                   .logprobs = 0};
  GlintRun r;
  caf::error err;
  std::vector<uint64_t> ids;
  r.seconds = seconds_of([&] {
    for (size_t i = 0; i < prompts.size() && !err; ++i) {
      p.seed = static_cast<int64_t>(seed + i);
      auto id = e.add_request(prompts[i], p);
      if (!id) err = id.error();
      else ids.push_back(*id);
    }
    while (!err && e.has_unfinished())
      if (auto s = e.step(); !s) err = s.error();
  });
  if (err) return err;
  for (auto id : ids) {
    auto out = e.take(id);
    for (const auto& s : out->sequences) r.tokens += static_cast<int64_t>(s.tokens.size());
  }
  auto after = e.stats();
  const auto prompt_tokens = after.prompt_tokens - before.prompt_tokens;
  r.hit_rate = prompt_tokens ? static_cast<double>(after.cached_tokens - before.cached_tokens) /
                                   static_cast<double>(prompt_tokens)
                             : 0.0;
  return r;
}

Result<std::pair<double, int64_t>> run_python(PythonChild& py, std::chrono::milliseconds timeout) {
  if (!py.send("run\n")) return make_error(errc::unavailable, "the Python baseline closed its input");
  auto reply = py.read_line(timeout);
  if (!reply) return reply.error();
  std::istringstream in{*reply};
  std::string tag;
  double seconds = 0;
  int64_t tokens = 0;
  if (!(in >> tag >> seconds >> tokens) || tag != "ran:")
    return make_error(errc::internal, "the Python baseline answered '" + *reply + "' to 'run'");
  return std::pair{seconds, tokens};
}

// Tokens equal up to the first difference of each prompt (after it the
// contexts differ), printed; whether 90% of them are. Near-ties of random
// weights may flip a late token (float rounding differs); a wrong model
// differs at once.
bool agree_with(const char* who, const std::vector<std::vector<int64_t>>& ours,
                const std::vector<std::vector<int64_t>>& theirs) {
  int64_t agree = 0, total = 0;
  for (size_t i = 0; i < ours.size(); ++i) {
    const auto& mine = ours[i];
    const auto& other = i < theirs.size() ? theirs[i] : std::vector<int64_t>{};
    size_t j = 0;
    while (j < mine.size() && j < other.size() && mine[j] == other[j]) ++j;
    agree += static_cast<int64_t>(j);
    total += static_cast<int64_t>(mine.size());
  }
  std::printf("# greedy check against %s, %lld prompts x %lld tokens: %lld tokens equal before the first "
              "difference\n",
              who, static_cast<long long>(ours.size()), static_cast<long long>(kCheckTokens),
              static_cast<long long>(agree));
  std::fflush(stdout);
  if (agree * 10 >= total * 9) return true;
  std::printf("# warning: glint and %s generate different greedy tokens: they compute different models, so the "
              "timings would compare different work\n",
              who);
  return false;
}

// glint's greedy tokens for the first kCheckPrompts prompts.
Result<std::vector<std::vector<int64_t>>> glint_greedy(Engine& e, const std::vector<std::vector<int64_t>>& prompts) {
  const auto k = std::min<size_t>(kCheckPrompts, prompts.size());
  std::vector<std::vector<int64_t>> first(prompts.begin(), prompts.begin() + static_cast<std::ptrdiff_t>(k));
  auto outs = e.generate(first, {.max_tokens = kCheckTokens, .temperature = 0, .ignore_eos = true});
  std::vector<std::vector<int64_t>> tokens;
  for (const auto& o : outs) {
    if (!o) return o.error();
    tokens.push_back(o->sequences[0].tokens);
  }
  return tokens;
}

// llama.cpp on the model saved in `dir`, exported to GGUF: one context with
// a sequence per sample, each as long as the longest prompt plus its
// tokens; its greedy tokens checked against `ours` (the first prompts').
// Prints what it runs.
Result<LlamaCpp> start_llamacpp(const SampleBenchArgs& a, const std::string& dir,
                                const std::vector<std::vector<int64_t>>& prompts,
                                const std::vector<std::vector<int64_t>>& ours, int64_t batch) {
  auto modules = llamacpp_modules(a.llamacpp);
  if (!modules) return modules.error();
  auto child_script = shipped_file("llamacpp/llamacpp_child.mjs", "bench/llamacpp/llamacpp_child.mjs");
  if (!child_script) return child_script.error();
  auto gguf = export_for_llamacpp(dir);
  if (!gguf) return with_context(gguf.error(), "exporting the bench model to GGUF");
  if (auto ok = write_prompts_json((fs::path{dir} / "prompts.json").string(), prompts); !ok) return ok.error();
  const int64_t sequences = std::min(a.llamacpp_parallel, a.prompts);
  const int64_t context = a.max_prompt + std::max(a.max_tokens, kCheckTokens);
  auto llama = LlamaCpp::start({.modules = *modules, .script = *child_script, .model = *gguf,
                                .threads = at::get_num_threads(), .sequences = sequences, .context = context,
                                .batch = batch});
  if (!llama) return llama.error();
  std::printf("# baseline llamacpp: %s (node-llama-cpp, bench/llamacpp/llamacpp_child.mjs) on the "
              "model exported to GGUF (f32): %lld parallel sequences in one context of %lld tokens each, as "
              "llama-server's slots with prompt caching: each takes the next prompt, evaluates it once and "
              "generates its samples one after another, rolling its KV cache back to the prompt in between (the "
              "binding cannot fork a sequence, so samples of one prompt do not run in parallel and prompts share "
              "no prefix); f16 KV cache (its default); the sequences' tokens batched into shared llama_decode "
              "calls of up to %lld; temperature 1 over the full vocabulary (top-p and min-p off; top-k off, which the "
              "binding turns into top-k = vocabulary, a sort of the vocabulary per token that glint does not do)\n",
              llama->banner().c_str(), static_cast<long long>(sequences), static_cast<long long>(context),
              static_cast<long long>(batch));
  std::vector<std::vector<int64_t>> greedy;
  for (size_t i = 0; i < ours.size(); ++i) {
    auto g = llama->greedy(kCheckTokens, prompts[i]);
    if (!g) return g.error();
    greedy.push_back(std::move(*g));
  }
  if (!agree_with("llama.cpp", ours, greedy))
    return make_error(errc::internal, "llama.cpp's greedy tokens are not glint's (above)");
  return llama;
}

// The timeout of a baseline's run: generous against glint's time.
std::chrono::milliseconds baseline_timeout(double glint_seconds) {
  return std::chrono::milliseconds{static_cast<int64_t>(1000 * (120 + 30 * glint_seconds))};
}

}  // namespace

// An MoE model's decode throughput against the dense model of the same
// active size, both on glint's engine, runs alternating which goes first.
int sample_moe(const SampleBenchArgs& a, Architecture arch) {
  auto moe_cfg = bench_model(a.small, a.max_prompt + a.max_tokens, arch);
  auto dense_cfg = bench_model(a.small, a.max_prompt + a.max_tokens);
  auto prompts = make_prompts(a, moe_cfg.vocab_size);
  std::printf("# %s: %s, %s parameters, %s active per token (%lld experts, %lld per token), against %s of %s "
              "parameters (the same attention, its MLP as wide as the active experts); %lld prompts x %lld samples x "
              "%lld new tokens, temperature 1; libtorch threads: %d; medians of %d runs each, alternating\n",
              kName, std::string{hf_class_name(moe_cfg.architecture)}.c_str(), millions(moe_cfg.num_parameters()).c_str(),
              millions(active_parameters(moe_cfg)).c_str(), static_cast<long long>(moe_cfg.moe.num_experts),
              static_cast<long long>(moe_cfg.moe.num_experts_per_tok),
              std::string{hf_class_name(dense_cfg.architecture)}.c_str(), millions(dense_cfg.num_parameters()).c_str(),
              static_cast<long long>(a.prompts), static_cast<long long>(a.samples), static_cast<long long>(a.max_tokens),
              at::get_num_threads(), a.repeats);
  std::printf("# no Python baseline for MoE models (its generate loop is dense)\n");
  std::fflush(stdout);
  const int64_t block_bytes = 2 * moe_cfg.num_hidden_layers * 16 * moe_cfg.num_key_value_heads * moe_cfg.head_dim * 4;
  const int64_t blocks = a.prompts * ((a.max_prompt + 15) / 16 + a.samples * ((a.max_tokens + 15) / 16 + 1));
  EngineConfig ecfg{.cache_bytes = blocks * block_bytes, .max_num_seqs = a.prompts * a.samples,
                    .max_num_batched_tokens = 2048};
  auto dir = TempDir::create();
  if (!dir) return fail(describe(dir.error()));
  std::vector<Engine> engines;
  for (const auto* cfg : {&moe_cfg, &dense_cfg}) {
    auto lm = CausalLM::init_random(*cfg, kSeed);
    if (!lm) return fail(describe(lm.error()));
    if (cfg == &moe_cfg)
      if (auto ok = lm->save(dir->path()); !ok) return fail(describe(ok.error()));
    auto e = Engine::create(std::move(*lm), ecfg);
    if (!e) return fail(describe(e.error()));
    engines.push_back(std::move(*e));
  }
  // llama.cpp on the MoE model (its qwen3moe; its qwen2moe does not
  // renormalise the experts' weights, which the bench model does, so that
  // export is refused and said so).
  std::optional<LlamaCpp> llama;
  if (a.llamacpp != "none" && arch == Architecture::qwen3_moe) {
    auto ours = glint_greedy(engines[0], prompts);
    if (!ours) return fail(describe(ours.error()));
    auto started = start_llamacpp(a, dir->path(), prompts, *ours, ecfg.max_num_batched_tokens);
    if (!started) return fail(describe(started.error()));
    llama.emplace(std::move(*started));
  } else if (a.llamacpp != "none") {
    std::printf("# no llama.cpp baseline for %s: the bench model renormalises its experts' weights "
                "(norm_topk_prob), which llama.cpp's qwen2moe does not\n",
                std::string{hf_class_name(arch)}.c_str());
  }
  std::vector<double> rate[3];
  double last_glint = 60;
  for (int rep = 0; rep <= a.repeats; ++rep)  // the first run warms every side up, untimed
    for (int i = 0; i < 3; ++i) {
      const int side = (rep + i) % 3;
      if (side == 2) {
        if (!llama || rep == 0) continue;
        auto l = llama->run((fs::path{dir->path()} / "prompts.json").string(), a.samples, a.max_tokens,
                            kSeed + 1000 * static_cast<uint64_t>(rep), baseline_timeout(last_glint));
        if (!l) return fail(describe(l.error()));
        rate[2].push_back(static_cast<double>(l->second) / l->first);
        continue;
      }
      auto g = run_glint(engines[static_cast<size_t>(side)], prompts, a, kSeed);
      if (!g) return fail(describe(g.error()));
      if (side == 0) last_glint = g->seconds;
      if (rep > 0) rate[side].push_back(static_cast<double>(g->tokens) / g->seconds);
    }
  print_metric("moe_sample_tokens_per_s", median(rate[0]), 1);
  print_metric("moe_sample_dense_tokens_per_s", median(rate[1]), 1);
  print_metric("moe_sample_vs_dense_same_active", median(rate[0]) / median(rate[1]), 3);
  if (llama) {
    print_metric("moe_sample_llamacpp_tokens_per_s", median(rate[2]), 1);
    print_metric("moe_sample_speedup_vs_llamacpp", median(rate[0]) / median(rate[2]), 3);
  }
  return 0;
}

// Qwen3.5's decode throughput at 64 sequences and at 1 against the
// full-attention Qwen3 of the same sizes, both on glint's engine, runs
// alternating; and what each keeps per sequence.
int sample_hybrid(const SampleBenchArgs& a, Architecture arch) {
  auto hybrid_cfg = bench_model(a.small, 4096, arch);
  auto dense_cfg = bench_model(a.small, 4096);
  const int64_t attention_layers = hybrid_cfg.layers_of(TokenMixer::attention);
  const int64_t state =
      hybrid_cfg.layers_of(TokenMixer::gated_deltanet) * hybrid_cfg.linear_attention.state_elements() * 4;  // f32
  auto kv_per_token = [](const ModelConfig& c, int64_t layers) {
    return 2 * layers * c.num_key_value_heads * c.head_dim * 4;  // f32 keys and values
  };
  const int64_t hybrid_kv_4k = 4096 * kv_per_token(hybrid_cfg, attention_layers);
  const int64_t dense_kv_4k = 4096 * kv_per_token(dense_cfg, dense_cfg.num_hidden_layers);
  std::printf("# %s: %s, %s parameters (%lld of %lld layers Gated DeltaNets), against %s of %s parameters (the same "
              "sizes, softmax attention in every layer); decode: sequences of a %lld-token prompt and %lld new tokens, "
              "temperature 1, all queued at once, at 64 sequences and at 1; libtorch threads: %d; medians of %d runs "
              "each, alternating\n",
              kName, std::string{hf_class_name(hybrid_cfg.architecture)}.c_str(),
              millions(hybrid_cfg.num_parameters()).c_str(),
              static_cast<long long>(hybrid_cfg.num_hidden_layers - attention_layers),
              static_cast<long long>(hybrid_cfg.num_hidden_layers), std::string{hf_class_name(dense_cfg.architecture)}.c_str(),
              millions(dense_cfg.num_parameters()).c_str(), static_cast<long long>(a.min_prompt),
              static_cast<long long>(a.max_tokens), at::get_num_threads(), a.repeats);
  std::printf("# per sequence, f32: the Gated DeltaNet layers' conv windows and recurrent states (fixed), the "
              "attention layers' keys and values at 4096 tokens (growing with the length)\n");
  print_metric("qwen35_state_bytes_per_sequence", static_cast<double>(state), 0);
  print_metric("qwen35_kv_bytes_per_sequence_4k", static_cast<double>(hybrid_kv_4k), 0);
  print_metric("qwen3_kv_bytes_per_sequence_4k", static_cast<double>(dense_kv_4k), 0);
  print_metric("qwen35_state_and_kv_vs_qwen3_kv_4k", static_cast<double>(state + hybrid_kv_4k) / static_cast<double>(dense_kv_4k), 3);
  std::fflush(stdout);
  for (const int64_t n : {int64_t{64}, int64_t{1}}) {
    auto b = a;
    b.prompts = n;
    b.samples = 1;
    b.max_prompt = b.min_prompt;
    b.shared_prefix = 0;
    auto prompts = make_prompts(b, hybrid_cfg.vocab_size);
    const int64_t tokens = b.min_prompt + b.max_tokens;
    std::vector<Engine> engines;
    for (const auto* cfg : {&hybrid_cfg, &dense_cfg}) {
      const int64_t layers = cfg->layers_of(TokenMixer::attention);
      // Room for every sequence's KV at once, and (Qwen3.5) twice its states: the engine gives them at most half.
      const int64_t blocks = n * ((tokens + 15) / 16 + 1);
      const int64_t states = cfg == &hybrid_cfg ? 2 * n * state : 0;
      EngineConfig ecfg{.cache_bytes = blocks * 16 * kv_per_token(*cfg, layers) + states, .max_num_seqs = n,
                        .max_num_batched_tokens = 2048};
      auto lm = CausalLM::init_random(*cfg, kSeed);
      if (!lm) return fail(describe(lm.error()));
      auto e = Engine::create(std::move(*lm), ecfg);
      if (!e) return fail(describe(e.error()));
      engines.push_back(std::move(*e));
    }
    std::vector<double> rate[2];
    for (int rep = 0; rep <= a.repeats; ++rep)  // the first run warms both up, untimed
      for (int i = 0; i < 2; ++i) {
        const int side = (rep + i) % 2;
        auto g = run_glint(engines[static_cast<size_t>(side)], prompts, b, kSeed);
        if (!g) return fail(describe(g.error()));
        if (rep > 0) rate[side].push_back(static_cast<double>(g->tokens) / g->seconds);
      }
    const auto at = "_" + std::to_string(n);
    print_metric(("qwen35_decode_tokens_per_s" + at).c_str(), median(rate[0]), 1);
    print_metric(("qwen3_decode_tokens_per_s" + at).c_str(), median(rate[1]), 1);
    print_metric(("qwen35_decode_vs_qwen3" + at).c_str(), median(rate[0]) / median(rate[1]), 3);
  }
  return 0;
}

int sample(const SampleBenchArgs& a) {
  if (a.repeats < 1 || a.prompts < 1 || a.samples < 1 || a.max_tokens < 1 || a.min_prompt < 1 ||
      a.max_prompt < a.min_prompt || a.shared_prefix < 0)
    return fail("--repeats, --prompts, --samples, --max-tokens and --min-prompt must be at least 1, --max-prompt at "
                "least --min-prompt, --shared-prefix at least 0");
  auto arch = parse_architecture(a.arch);
  if (!arch) return fail(describe(arch.error()));
  if (is_hybrid(*arch)) return sample_hybrid(a, *arch);
  if (is_moe(*arch)) return sample_moe(a, *arch);
  auto cfg = a.small ? ModelConfig::make(Architecture::qwen3, 512, 64, 128, 2, 4, 2)
                     : ModelConfig::make(Architecture::qwen3, 8192, 512, 1536, 6, 8, 4);
  cfg.max_position_embeddings = std::max<int64_t>(cfg.max_position_embeddings, a.max_prompt + a.max_tokens);
  const int threads = at::get_num_threads();
  const auto script_path = baseline_script("sample_baseline.py");
  if (!script_path) return fail(describe(script_path.error()));
  const std::string& script = *script_path;
  auto prompts = make_prompts(a, cfg.vocab_size);
  int64_t prompt_tokens = 0;
  for (const auto& p : prompts) prompt_tokens += static_cast<int64_t>(p.size());
  // Room for every sequence at once: forks share their prompt's blocks.
  const int64_t block_bytes = 2 * cfg.num_hidden_layers * 16 * cfg.num_key_value_heads * cfg.head_dim * 4;
  const int64_t blocks = a.prompts * ((a.max_prompt + 15) / 16 + a.samples * ((a.max_tokens + 15) / 16 + 1));
  EngineConfig ecfg{.cache_bytes = blocks * block_bytes, .max_num_seqs = a.prompts * a.samples,
                    .max_num_batched_tokens = 2048};

  std::printf("# %s: Qwen3 %.2fM parameters (vocab %lld, hidden %lld, %lld layers, %lld heads, %lld kv heads); "
              "%lld prompts of %lld-%lld tokens (%lld in all, the first %lld shared by every prompt) x %lld samples x "
              "%lld new tokens, temperature 1; libtorch threads: %d; medians of %d runs per side\n",
              kName, static_cast<double>(cfg.num_parameters()) / 1e6, static_cast<long long>(cfg.vocab_size),
              static_cast<long long>(cfg.hidden_size), static_cast<long long>(cfg.num_hidden_layers),
              static_cast<long long>(cfg.num_attention_heads), static_cast<long long>(cfg.num_key_value_heads),
              static_cast<long long>(a.prompts), static_cast<long long>(a.min_prompt),
              static_cast<long long>(a.max_prompt), static_cast<long long>(prompt_tokens),
              static_cast<long long>(std::min(a.shared_prefix, a.min_prompt)), static_cast<long long>(a.samples),
              static_cast<long long>(a.max_tokens), threads, a.repeats);
  std::printf("# glint: Engine with a %.0f MiB KV cache (%lld blocks of 16 tokens), max_num_batched_tokens %lld, "
              "every request queued at once; the prefix cache is emptied before each run\n",
              static_cast<double>(ecfg.cache_bytes) / (1 << 20), static_cast<long long>(blocks),
              static_cast<long long>(ecfg.max_num_batched_tokens));
  if (a.python != "none")
    std::printf("# baseline sample_python_*: %s %s: all prompts x samples in one left-padded batch, contiguous KV "
                "cache, torch.multinomial; runs interleaved with glint's\n",
                a.python.c_str(), script.c_str());
  std::fflush(stdout);

  auto dir = TempDir::create();
  if (!dir) return fail(describe(dir.error()));
  auto lm = CausalLM::init_random(cfg, kSeed);
  if (!lm) return fail(describe(lm.error()));
  const auto prompts_path = (fs::path{dir->path()} / "prompts.safetensors").string();
  const auto prompts_json = (fs::path{dir->path()} / "prompts.json").string();
  if (auto ok = lm->save(dir->path()); !ok) return fail(describe(ok.error()));
  if (auto ok = write_prompts(prompts_path, prompts); !ok) return fail(describe(ok.error()));
  auto engine = Engine::create(std::move(*lm), ecfg);
  if (!engine) return fail(describe(engine.error()));

  if (a.python == "none" && a.llamacpp == "none") {  // glint alone, for profiling
    auto g = run_glint(*engine, prompts, a, kSeed);
    if (!g) return fail(describe(g.error()));
    auto st = engine->stats();
    std::printf("# glint alone: %.1f tokens/s; schedule %.2f s, forward %.2f s, sample %.2f s; %lld steps\n",
                static_cast<double>(g->tokens) / g->seconds, st.schedule_seconds, st.forward_seconds,
                st.sample_seconds, static_cast<long long>(st.steps));
    return 0;
  }
  auto ours = glint_greedy(*engine, prompts);
  if (!ours) return fail(describe(ours.error()));
  const int64_t k = static_cast<int64_t>(ours->size());

  // The Python baseline, its greedy tokens first.
  std::optional<PythonChild> py;
  if (a.python != "none") {
    auto started = PythonChild::start({a.python, script, dir->path(), prompts_path, "--threads",
                                       std::to_string(threads), "--samples", std::to_string(a.samples),
                                       "--max-new-tokens", std::to_string(a.max_tokens), "--seed",
                                       std::to_string(kSeed)});
    const std::string install_hint =
        "; install python3-torch (scripts/setup.sh does), name another with --python, or pass --python none";
    if (!started) return fail(describe(started.error()) + install_hint);
    py.emplace(std::move(*started));
    auto ready = py->read_line(300s);
    if (!ready) return fail(describe(ready.error()) + " before it was ready" + install_hint);
    if (ready->rfind("ready: ", 0) != 0) return fail("the Python baseline says: " + *ready);
    if (!py->send("check " + std::to_string(k) + " " + std::to_string(kCheckTokens) + "\n"))
      return fail("the Python baseline closed its input");
    auto checked = py->read_line(600s);
    if (!checked) return fail(describe(checked.error()));
    if (checked->rfind("checked: ", 0) != 0)
      return fail("the Python baseline answered '" + *checked + "' to 'check'");
    std::vector<std::vector<int64_t>> theirs(1);
    std::istringstream in{checked->substr(9)};
    for (std::string word; in >> word;) {
      // "1 2 3; 4 5 6; ..." (a ';' may stick to either neighbour)
      for (size_t semi; (semi = word.find(';')) != std::string::npos; word.erase(0, semi + 1)) {
        if (semi > 0) theirs.back().push_back(std::stoll(word.substr(0, semi)));
        theirs.emplace_back();
      }
      if (!word.empty()) theirs.back().push_back(std::stoll(word));
    }
    if (!agree_with("the Python baseline", *ours, theirs)) return 1;
  }

  // llama.cpp on the same weights, exported to GGUF.
  std::optional<LlamaCpp> llama;
  if (a.llamacpp != "none") {
    auto started = start_llamacpp(a, dir->path(), prompts, *ours, ecfg.max_num_batched_tokens);
    if (!started) return fail(describe(started.error()));
    llama.emplace(std::move(*started));
  }

  std::vector<double> glint_rate, python_rate, llama_rate, hits;
  const auto timeout = baseline_timeout;
  double last_glint = 60;
  for (int rep = 0; rep < a.repeats; ++rep) {
    auto one_glint = [&]() -> caf::error {
      auto g = run_glint(*engine, prompts, a, kSeed + 1000 * static_cast<uint64_t>(rep));
      if (!g) return g.error();
      if (g->tokens != a.prompts * a.samples * a.max_tokens)
        return make_error(errc::internal, "glint generated " + std::to_string(g->tokens) + " tokens, expected " +
                                              std::to_string(a.prompts * a.samples * a.max_tokens));
      glint_rate.push_back(static_cast<double>(g->tokens) / g->seconds);
      hits.push_back(g->hit_rate);
      last_glint = g->seconds;
      return caf::none;
    };
    auto one_python = [&]() -> caf::error {
      if (!py) return caf::none;
      auto p = run_python(*py, timeout(last_glint));
      if (!p) return p.error();
      python_rate.push_back(static_cast<double>(p->second) / p->first);
      return caf::none;
    };
    auto one_llama = [&]() -> caf::error {
      if (!llama) return caf::none;
      auto l = llama->run(prompts_json, a.samples, a.max_tokens, kSeed + 1000 * static_cast<uint64_t>(rep),
                          timeout(last_glint));
      if (!l) return l.error();
      llama_rate.push_back(static_cast<double>(l->second) / l->first);
      return caf::none;
    };
    // Rotate which side goes first.
    const std::function<caf::error()> sides[] = {one_glint, one_python, one_llama};
    caf::error err;
    for (int i = 0; i < 3 && !err; ++i) err = sides[(rep + i) % 3]();
    if (err) return fail(describe(err));
    auto st = engine->stats();
    char others[96] = "";
    if (py) std::snprintf(others, sizeof others, ", python %.1f tokens/s", python_rate.back());
    if (llama)
      std::snprintf(others + std::strlen(others), sizeof others - std::strlen(others), ", llama.cpp %.1f tokens/s",
                    llama_rate.back());
    std::printf("# run %d: glint %.1f tokens/s%s; glint's time so far: schedule %.1f s, forward %.1f s, sample "
                "%.1f s\n",
                rep + 1, glint_rate.back(), others, st.schedule_seconds, st.forward_seconds, st.sample_seconds);
    std::fflush(stdout);
  }
  if (py) py->send("quit\n");
  const double rate = median(glint_rate);
  std::printf("# glint's matmuls: %s for decoding steps, %s for prefills of %lld rows or more (the default "
              "rule's choice; GLINT_MATMUL=aten|onednn|measure overrides)\n",
              onednn_matmul_enabled(1) ? "oneDNN" : "ATen (the system BLAS)",
              onednn_matmul_enabled() ? "oneDNN" : "ATen", static_cast<long long>(kLargeProductRows));
  print_metric("sample_tokens_per_s", rate, 1);
  if (py) {
    print_metric("sample_python_tokens_per_s", median(python_rate), 1);
    print_metric("sample_speedup_vs_python", rate / median(python_rate), 3);
  }
  if (llama) {
    print_metric("sample_llamacpp_tokens_per_s", median(llama_rate), 1);
    print_metric("sample_speedup_vs_llamacpp", rate / median(llama_rate), 3);
  }
  print_metric("prefix_cache_hit_rate", median(hits), 4);
  return 0;
}

}  // namespace glint::bench
