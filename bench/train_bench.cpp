// glint bench train: tokens/s of Trainer::forward_backward + clip_grad_and_step
// against the same model, weights, tokens and step in Python PyTorch
// (bench/python/train_baseline.py), which runs as a child process driven over
// a socket so that its timed runs interleave with glint's: both sides then
// share whatever else loads the machine.
//
// The script is found in the source tree this binary was built from
// (GLINT_SOURCE_DIR, a compile definition set by bench/CMakeLists.txt).
#include "bench/train_bench.hpp"
#include "bench/bench_model.hpp"
#include "bench/measure.hpp"
#include "bench/python_child.hpp"

#include "components/checkpoint/safetensors.hpp"
#include "components/model/kernels.hpp"
#include "components/model/moe.hpp"
#include "components/model/trainer.hpp"
#include "components/model/transformer.hpp"
#include "components/tensor/block_cache.hpp"

// The few ATen pieces the matmul FLOP/s measurement needs, not <ATen/ATen.h>
// (compile time: see STYLE.md).
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/matmul.h>
#include <ATen/ops/randn.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <random>
#include <sstream>
#include <thread>
#include <utility>
#include <vector>

namespace glint::bench {

namespace {

namespace fs = std::filesystem;
using namespace glint::components;
using namespace std::chrono_literals;

constexpr const char* kName = "glint bench train";
constexpr uint64_t kSeed = 1;  // weights and tokens
constexpr int kWarmupSteps = 1;
// Each timed run starts from malloc_trim (for the peak it measures), which
// hands every freed block back to the kernel; one untimed step then faults
// the step's memory in again, so the timed steps run as a training loop's
// do (the trainer keeps freed memory: runtime/memory.hpp). Until 2026-11-28
// the timed steps included that one, on both sides: with the default
// --steps 1, every timed step was a first step after a trim.
constexpr int kSettleSteps = 1;

int fail(const std::string& what) {
  std::fprintf(stderr, "%s: %s\n", kName, what.c_str());
  return 1;
}


struct RunResult {
  double seconds = 0;
  double first_loss = 0;
  double last_loss = 0;
  /// Resident bytes the steps added at their peak, over what the process
  /// held before them (model, gradients and optimizer state after warm-up).
  double peak_bytes = 0;
};

constexpr int64_t kLoraRank = 8;
constexpr double kLoraAlpha = 16;

LoraConfig bench_lora() { return {.r = kLoraRank, .alpha = kLoraAlpha, .target_modules = {"all-linear"}}; }

// glint's side: training steps on a fixed batch, of every weight or of a
// LoRA adapter on the frozen base.
class GlintSide {
public:
  static Result<GlintSide> make(TrainMode mode, CausalLM model, Tensor ids, TrainConfig cfg) {
    if (mode == TrainMode::lora) {
      if (auto ok = model.add_adapter("bench", bench_lora(), kSeed);
          !ok)
        return ok.error();
      cfg.adapter = "bench";
    }
    auto trainer = Trainer::create(std::move(model), cfg);
    if (!trainer) return trainer.error();
    GlintSide s;
    s.trainer_ = std::move(*trainer);
    s.batch_.tokens.input_ids = std::move(ids);
    return s;
  }

  /// `settle` untimed steps, then `steps` timed ones: the wall time of the
  /// timed ones, the losses of the first and last step run, and the peak
  /// bytes of all of them (as the Python side's `run N S`).
  Result<RunResult> run(int steps, int settle = 0) {
    RunResult r;
    caf::error err;
    int done = 0;
    auto step = [&] {
      if (err) return;
      auto m = trainer_.forward_backward(batch_, {.kind = LossKind::cross_entropy});
      if (!m) {
        err = m.error();
        return;
      }
      if (done++ == 0) r.first_loss = m->at("loss");
      r.last_loss = m->at("loss");
      if (auto s = trainer_.clip_grad_and_step(); !s) err = s.error();
    };
    // What the trainer's block cache kept goes back with malloc_trim's.
    release_kept_tensor_blocks();
    r.peak_bytes = peak_bytes_added([&] {
      for (int i = 0; i < settle; ++i) step();
      r.seconds = seconds_of([&] {
        for (int i = 0; i < steps; ++i) step();
      });
    });
    if (err) return err;
    return r;
  }

  /// The Gated DeltaNet layers' chunk (0: the token-by-token recurrence).
  void set_gdn_chunk(int64_t chunk) { trainer_.model().impl().gdn_chunk = chunk; }

private:
  Trainer trainer_;
  TrainBatch batch_;
};

// The Python side, over PythonChild's line protocol (see train_baseline.py).
Result<RunResult> run_python(PythonChild& py, int steps, std::chrono::milliseconds timeout, int settle = 0) {
  if (!py.send("run " + std::to_string(steps) + " " + std::to_string(settle) + "\n"))
    return make_error(errc::unavailable, "the Python baseline closed its input");
  auto reply = py.read_line(timeout);
  if (!reply) return reply.error();
  std::istringstream in{*reply};
  std::string tag;
  RunResult r;
  if (!(in >> tag >> r.seconds >> r.first_loss >> r.last_loss >> r.peak_bytes) || tag != "ran:")
    return make_error(errc::internal, "the Python baseline answered '" + *reply + "' to 'run'");
  return r;
}

// at::matmul of two 1024 x 1024 f32 matrices, in FLOP/s: what this machine's
// libtorch gives the model's largest operations.
// This machine's f32 matmul FLOP/s on 1024 x 1024: the faster of ATen's
// (the system BLAS) and oneDNN's (what glint's model uses when present).
struct MatmulRate {
  double aten = 0, onednn = 0;
  double best() const { return std::max(aten, onednn); }
};

Result<MatmulRate> matmul_flops() try {
  constexpr int64_t n = 1024;
  auto a = at::randn({n, n});
  auto b = at::randn({n, n});
  MatmulRate r;
  r.aten = 2.0 * n * n * n / seconds_of([&] { (void)at::matmul(a, b); });
  const bool small = components::onednn_matmul_enabled(1), large = components::onednn_matmul_enabled();
  if (components::set_onednn_matmul(true)) {
    (void)components::fast_linear(a, b);  // first use sets oneDNN up
    r.onednn = 2.0 * n * n * n / seconds_of([&] { (void)components::fast_linear(a, b); });
    components::set_onednn_matmul(small, large);
  }
  return r;
} catch (const std::exception& e) {
  return make_error(errc::internal, std::string{"measuring matmul FLOP/s failed: "} + e.what());
}

}  // namespace

int train(const TrainBenchArgs& a) {
  if (auto bad = bad_sizes(a.repeats, a.steps, a.batch, a.seq); !bad.empty()) return fail(bad);
  auto arch = parse_architecture(a.arch);
  if (!arch) return fail(describe(arch.error()));
  const bool moe = is_moe(*arch);
  const auto cfg = bench_model(a.small, a.seq, *arch);
  const int threads = at::get_num_threads();
  const auto script_path = baseline_script("train_baseline.py");
  if (!script_path) return fail(describe(script_path.error()));
  const std::string& script = *script_path;

  // FLOPs per trained token: 6 per weight that takes part in a matmul (the
  // input embedding is a lookup, so it is left out unless it is also the
  // head) plus PaLM's attention term 12 * layers * (heads * head_dim) * seq
  // (scores and weighted sum, forward and backward, full T x T as computed).
  // On an MoE model, the weights a token's pass multiplies by: its k
  // experts', not every expert's.
  const int64_t matmul_params =
      active_parameters(cfg) - (cfg.tie_word_embeddings ? 0 : cfg.vocab_size * cfg.hidden_size);
  // LoRA: the frozen weights need no weight gradients, so 4 per weight
  // (forward, and backward to the activations); the adapters are small.
  const bool lora = a.mode == TrainMode::lora;
  // Softmax attention's term over its layers only (a Gated DeltaNet layer's
  // chunked rule is linear in seq and left out).
  const int64_t attention_layers = cfg.layers_of(TokenMixer::attention);
  const double flops_per_token =
      (lora ? 4.0 : 6.0) * static_cast<double>(matmul_params) +
      12.0 * static_cast<double>(attention_layers * cfg.num_attention_heads * cfg.head_dim * a.seq);
  const double tokens_per_step = static_cast<double>(a.batch * a.seq);

  if (is_hybrid(cfg.architecture))
    std::printf("# %s: %s, %lld of %lld layers Gated DeltaNets (%lld key heads, %lld value heads of %lld, conv width "
                "%lld; the chunked rule in chunks of 64), the others gated attention rotating %lld of %lld dimensions "
                "per head\n",
                kName, std::string{hf_class_name(cfg.architecture)}.c_str(),
                static_cast<long long>(cfg.num_hidden_layers - attention_layers), static_cast<long long>(cfg.num_hidden_layers),
                static_cast<long long>(cfg.linear_attention.num_key_heads),
                static_cast<long long>(cfg.linear_attention.num_value_heads),
                static_cast<long long>(cfg.linear_attention.value_head_dim),
                static_cast<long long>(cfg.linear_attention.conv_kernel_dim), static_cast<long long>(cfg.rotary_dim()),
                static_cast<long long>(cfg.head_dim));
  if (moe)
    std::printf("# %s: %s, %lld experts of width %lld in every layer, %lld per token%s, %s of its parameters active "
                "per token\n",
                kName, std::string{hf_class_name(cfg.architecture)}.c_str(), static_cast<long long>(cfg.moe.num_experts),
                static_cast<long long>(cfg.moe.moe_intermediate_size),
                static_cast<long long>(cfg.moe.num_experts_per_tok),
                cfg.moe.shared_expert_intermediate_size > 0
                    ? (", a shared expert of width " + std::to_string(cfg.moe.shared_expert_intermediate_size)).c_str()
                    : "",
                millions(active_parameters(cfg)).c_str());
  std::printf("# %s: %s, %s parameters (vocab %lld, hidden %lld, intermediate %lld, %lld layers, %lld heads, "
              "%lld kv heads), %s AdamW lr 1e-4, batch %lld x %lld tokens, libtorch threads: %d; medians of %d "
              "runs of %d timed steps, each run after a malloc_trim (and glint's release_kept_tensor_blocks) and %d untimed step "
              "(the peak counts it), after %d "
              "warm-up step\n",
              kName, std::string{hf_class_name(cfg.architecture)}.c_str(), millions(cfg.num_parameters()).c_str(),
              static_cast<long long>(cfg.vocab_size),
              static_cast<long long>(cfg.hidden_size), static_cast<long long>(cfg.intermediate_size),
              static_cast<long long>(cfg.num_hidden_layers), static_cast<long long>(cfg.num_attention_heads),
              static_cast<long long>(cfg.num_key_value_heads),
              lora ? "LoRA (r 8, alpha 16, all-linear; base frozen)" : "full-parameter", static_cast<long long>(a.batch),
              static_cast<long long>(a.seq), threads, a.repeats, a.steps, kSettleSteps, kWarmupSteps);
  std::printf("# baseline train_python_*: the same model, weights, tokens and step in PyTorch (%s, %s), its runs "
              "interleaved with glint's (alternately first)\n",
              a.python.c_str(), script.c_str());
  std::printf("# train_mfu: achieved FLOP/s / this machine's best 1024x1024 f32 matmul FLOP/s in this run (at::matmul or "
              "oneDNN); %.3g FLOPs per token = "
              "%d x %s matmul weights (input embedding excluded) + 12 x attention layers x heads x head_dim x seq\n",
              flops_per_token, lora ? 4 : 6, millions(matmul_params).c_str());
  std::fflush(stdout);

  auto dir = TempDir::create();
  if (!dir) return fail(describe(dir.error()));
  auto lm = CausalLM::init_random(cfg, kSeed);
  if (!lm) return fail(describe(lm.error()));
  auto ids = random_tokens(a.batch, a.seq, cfg.vocab_size, kSeed);
  const auto tokens_path = (fs::path{dir->path()} / "tokens.safetensors").string();
  if (auto ok = lm->save(dir->path()); !ok) return fail(describe(ok.error()));
  if (auto ok = write_safetensors(tokens_path, {{"input_ids", ids}}); !ok) return fail(describe(ok.error()));

  TrainConfig train_cfg{.optimizer = {.lr = 1e-4, .max_grad_norm = 1.0}};
  auto number = [](double v) {
    std::ostringstream s;
    s.precision(17);
    s << v;
    return s.str();
  };
  auto py = PythonChild::start({a.python, script, dir->path(), tokens_path, "--threads",
                                std::to_string(threads), "--mode", lora ? "lora" : "full", "--lr", number(train_cfg.optimizer.lr),
                                "--weight-decay", number(train_cfg.optimizer.weight_decay), "--max-grad-norm",
                                number(train_cfg.optimizer.max_grad_norm)});
  const std::string install_hint = "; install python3-torch (scripts/setup.sh does) or name another with --python";
  if (!py) return fail(describe(py.error()) + install_hint);
  auto ready = py->read_line(300s);
  if (!ready) return fail(describe(ready.error()) + " before it was ready" + install_hint);
  if (ready->rfind("ready: ", 0) != 0) {
    if (ready->find("cannot import torch") != std::string::npos)
      return fail(a.python + " cannot import torch" + install_hint);
    return fail("the Python baseline says: " + *ready);
  }
  {
    std::istringstream in{ready->substr(7)};
    int64_t py_params = 0;
    int py_threads = 0;
    in >> py_params >> py_threads;
    // Trainable parameters: every weight, or r x (in + out) per projection.
    const int64_t trainable = lora ? bench_lora().parameters(cfg) : cfg.num_parameters();
    if (py_params != trainable || py_threads != threads)
      return fail("the Python baseline trains " + std::to_string(py_params) + " parameters with " +
                  std::to_string(py_threads) + " threads; glint trains " + std::to_string(trainable) + " with " +
                  std::to_string(threads));
  }

  auto glint = GlintSide::make(a.mode, std::move(*lm), ids, train_cfg);
  if (!glint) return fail(describe(glint.error()));

  // Warm-up (allocations, optimizer state); its first step is each side's
  // loss at the initial weights, which must agree.
  auto g0 = glint->run(kWarmupSteps);
  if (!g0) return fail(describe(g0.error()));
  // The Python step does the same work; allow it far more time than glint took.
  auto timeout = [](double glint_seconds) {
    return std::chrono::milliseconds{static_cast<int64_t>(1000 * (60 + 20 * glint_seconds))};
  };
  auto p0 = run_python(*py, kWarmupSteps, timeout(g0->seconds));
  if (!p0) return fail(describe(p0.error()));
  const double loss_rel = std::abs(g0->first_loss - p0->first_loss) / std::max(std::abs(p0->first_loss), 1e-12);
  if (!(loss_rel <= 1e-3)) {
    std::printf("# warning: initial losses disagree: glint %.9g, python %.9g (relative difference %.3g > 1e-3); "
                "glint's model or the baseline is wrong, so the timings compare different computations\n",
                g0->first_loss, p0->first_loss, loss_rel);
    std::fflush(stdout);
    return 1;
  }

  std::vector<MatmulRate> flops;
  std::vector<double> glint_rate, python_rate, glint_peak, python_peak;
  for (int i = 0; i < 3; ++i) {
    auto f = matmul_flops();
    if (!f) return fail(describe(f.error()));
    flops.push_back(*f);
  }
  RunResult g_last = *g0, p_last = *p0;
  // Runs alternate which side goes first, so that neither always follows the
  // other (caches, a neighbour's load that rises or falls).
  for (int rep = 0; rep < a.repeats; ++rep) {
    Result<RunResult> g = make_error(errc::internal, "not run"), p = g;
    if (rep % 2 == 0) {
      g = glint->run(a.steps, kSettleSteps);
      if (g) p = run_python(*py, a.steps, timeout(g->seconds * (a.steps + kSettleSteps) / a.steps), kSettleSteps);
    } else {
      p = run_python(*py, a.steps, timeout(g0->seconds * (a.steps + kSettleSteps)), kSettleSteps);
      if (p) g = glint->run(a.steps, kSettleSteps);
    }
    if (!g) return fail(describe(g.error()));
    if (!p) return fail(describe(p.error()));
    auto f = matmul_flops();
    if (!f) return fail(describe(f.error()));
    glint_rate.push_back(tokens_per_step * a.steps / g->seconds);
    glint_peak.push_back(g->peak_bytes);
    python_peak.push_back(p->peak_bytes);
    python_rate.push_back(tokens_per_step * a.steps / p->seconds);
    flops.push_back(*f);
    g_last = *g;
    p_last = *p;
  }
  py->send("quit\n");

  std::vector<double> aten, onednn, best;
  for (const auto& f : flops) {
    aten.push_back(f.aten);
    onednn.push_back(f.onednn);
    best.push_back(f.best());
  }
  const double matmul = median(best);
  const double rate = median(glint_rate), py_rate = median(python_rate);
  std::printf("# 1024x1024 f32 matmul: at::matmul %.2f GFLOP/s, oneDNN %.2f GFLOP/s (medians of %zu); loss at the "
              "initial weights: glint %.6f, python %.6f (relative difference %.1e); after %d updates: glint %.6f, "
              "python %.6f\n",
              median(aten) / 1e9, median(onednn) / 1e9, flops.size(), g0->first_loss, p0->first_loss, loss_rel,
              kWarmupSteps + a.repeats * (kSettleSteps + a.steps) - 1, g_last.last_loss, p_last.last_loss);
  std::printf("# glint's matmuls: %s for this step's products of %lld rows (the default rule's "
              "choice: oneDNN for large products on AVX-512 CPUs; GLINT_MATMUL=aten|onednn|measure overrides)\n",
              components::onednn_matmul_enabled(a.batch * a.seq) ? "oneDNN" : "ATen (the system BLAS)",
              static_cast<long long>(a.batch * a.seq));
  print_metric("train_tokens_per_s", rate, 1);
  print_metric("train_python_tokens_per_s", py_rate, 1);
  print_metric("train_speedup_vs_python", rate / py_rate, 3);
  print_metric("train_mfu", rate * flops_per_token / matmul, 4);
  std::printf("# peak resident bytes a step adds (over the model, gradients and optimizer state held after warm-up): "
              "glint %.1f MiB, python %.1f MiB (medians; /proc/self VmHWM after clear_refs, minus VmRSS before)\n",
              median(glint_peak) / (1 << 20), median(python_peak) / (1 << 20));
  if (median(python_peak) > 0) print_metric("train_peak_bytes_vs_python", median(glint_peak) / median(python_peak), 3);
  if (is_hybrid(cfg.architecture)) {
    print_metric("qwen35_train_speedup_vs_python", rate / py_rate, 3);
    // The chunked rule (hand-written backward) against the recurrence token
    // by token (autograd through every step), glint both, alternating.
    std::vector<double> chunked_rate, recurrent_rate;
    for (int rep = 0; rep < a.repeats; ++rep)
      for (bool recurrent : {rep % 2 == 1, rep % 2 == 0}) {
        glint->set_gdn_chunk(recurrent ? 0 : 64);
        auto g = glint->run(a.steps, kSettleSteps);
        glint->set_gdn_chunk(64);
        if (!g) return fail(describe(g.error()));
        (recurrent ? recurrent_rate : chunked_rate).push_back(tokens_per_step * a.steps / g->seconds);
      }
    std::printf("# gdn_*: the same step with the Gated DeltaNet layers' delta rule chunked (64) and token by token "
                "(the definition, differentiated by autograd), medians of %d runs each, alternating\n",
                a.repeats);
    print_metric("gdn_chunked_tokens_per_s", median(chunked_rate), 1);
    print_metric("gdn_recurrent_tokens_per_s", median(recurrent_rate), 1);
    print_metric("gdn_chunked_vs_recurrent_train", median(chunked_rate) / median(recurrent_rate), 3);
  }
  if (!moe) return 0;
  print_metric("moe_train_speedup_vs_python", rate / py_rate, 3);

  // The grouped block against every expert on every token (weighted by the
  // router, 0 where a token did not choose the expert), glint both, runs
  // alternating which goes first.
  std::vector<double> grouped_rate, dense_rate;
  auto timed = [&](bool dense) -> Result<double> {
    set_dense_experts(dense);
    auto g = glint->run(a.steps, kSettleSteps);
    set_dense_experts(false);
    if (!g) return g.error();
    return tokens_per_step * a.steps / g->seconds;
  };
  for (int rep = 0; rep < a.repeats; ++rep)
    for (bool dense : {rep % 2 == 1, rep % 2 == 0}) {
      auto r = timed(dense);
      if (!r) return fail(describe(r.error()));
      (dense ? dense_rate : grouped_rate).push_back(*r);
    }
  std::printf("# moe_dense_experts_*: the same step with every expert run on every token (%lld of them, where a "
              "token needs %lld), medians of %d runs alternating with the grouped block's\n",
              static_cast<long long>(cfg.moe.num_experts), static_cast<long long>(cfg.moe.num_experts_per_tok),
              a.repeats);
  print_metric("moe_grouped_tokens_per_s", median(grouped_rate), 1);
  print_metric("moe_dense_experts_tokens_per_s", median(dense_rate), 1);
  print_metric("moe_grouped_vs_dense_experts", median(grouped_rate) / median(dense_rate), 3);
  return 0;
}

}  // namespace glint::bench
