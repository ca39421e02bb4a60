// The `glint` binary: launcher, inspector, demo and benchmarks.
#include "bench/faults_bench.hpp"
#include "bench/parallel_bench.hpp"
#include "bench/remote_bench.hpp"
#include "bench/soak_bench.hpp"
#include "bench/agent_bench.hpp"
#include "bench/rl_bench.hpp"
#include "bench/template_bench.hpp"
#include "bench/sample_bench.hpp"
#include "bench/sync_bench.hpp"
#include "bench/train_bench.hpp"
#include "launcher/commands.hpp"
#include "launcher/launch.hpp"
#include "launcher/recipes.hpp"
#include "runtime/options.hpp"
#include "runtime/runtime.hpp"

#include <CLI/CLI.hpp>

#include <cstdio>
#include <cstdlib>
#include <string_view>

namespace glint::bench {
int actors(int repeats, const std::string& modes);  // bench/actors_bench.cpp
}

int main(int argc, char** argv) {
  // The recipes say what long work is doing (a step split into micro-batches,
  // a long sampling step's progress): info lines, unless GLINT_LOG says
  // otherwise. Their node processes too (`glint run -- glint grpo ...`).
  if (argc > 1) {
    const std::string_view sub{argv[1]};
    if (sub == "sft" || sub == "grpo" || sub == "dpo") ::setenv("GLINT_LOG", "info", 0);
  }
  // Under `glint run`, a process that is not rank 0 serves the driver, whatever
  // subcommand it was given: every process of a job runs the same command.
  if (auto opts = glint::Options::from_environment(); opts && opts->mode == glint::Mode::cluster &&
                                                        opts->cluster.rank != 0)
    return glint::serve_node(*opts);

  CLI::App app{"glint: an actor runtime for training and reinforcement learning of large language models"};
  app.set_version_flag("--version", "glint 0.1.0");
  app.require_subcommand(1);

  glint::launcher::LaunchSpec spec;
  auto* run = app.add_subcommand("run", "Start the processes of a cluster job on this machine (like torchrun)");
  run->add_option("--nproc,--nproc-per-node", spec.nproc, "Processes on this machine")
      ->capture_default_str()
      ->check(CLI::Range(1, 4096));
  run->add_option("--nnodes", spec.nnodes, "Machines in the job (default: $SLURM_NNODES or 1)")->check(CLI::Range(1, 65536));
  run->add_option("--node-rank", spec.node_rank, "This machine's index (default: $SLURM_NODEID or 0)")
      ->check(CLI::Range(0, 65535));
  run->add_option("--master-addr", spec.master_addr, "Address of machine 0 (default: $MASTER_ADDR or 127.0.0.1)");
  run->add_option("--master-port", spec.master_port, "Driver port (default: $MASTER_PORT, or a free one on one machine)")
      ->check(CLI::Range(0, 65535));
  run->add_option("--grace", spec.grace_seconds, "Seconds processes may outlive the driver")
      ->capture_default_str()
      ->check(CLI::Range(0, 3600));
  run->add_option("--max-restarts", spec.max_restarts,
                  "Start a node process that a signal kills (a crash, the OOM killer), or that the driver dropped "
                  "(frozen or cut off past --peer-timeout, then back), again, up to this many times in all; the "
                  "driver admits it in its old place (the driver itself is never restarted)")
      ->capture_default_str()
      ->check(CLI::Range(0, 1000));
  run->add_option("--peer-timeout", spec.peer_timeout_seconds,
                  "Seconds a process may send nothing, not even a heartbeat (frozen, its link cut), before the others "
                  "declare it lost (default: $GLINT_PEER_TIMEOUT_MS or 5)")
      ->check(CLI::Range(1.0, 3600.0));
  run->add_option("command", spec.command, "The program and its arguments, after --")->required();
  run->footer("Example: glint run --nproc 2 -- glint demo");

  glint::launcher::InfoArgs info;
  auto* info_cmd = app.add_subcommand("info", "Show this machine's topology and, given a job config, its placement");
  info_cmd->add_option("--config", info.config, "Job TOML with [[group]] entries to place");
  info_cmd->add_option("--nproc", info.nproc, "Plan as if this many processes shared the machine")
      ->capture_default_str()
      ->check(CLI::Range(1, 4096));
  info_cmd->add_flag("--probe", info.probe, "Spawn a probe on every process of the job and show where it runs");

  glint::launcher::DemoArgs demo;
  auto* demo_cmd = app.add_subcommand("demo", "Run the runtime demo: a group of ranks fed sliced batches");
  demo_cmd->add_option("--steps", demo.steps, "Steps to run")->capture_default_str()->check(CLI::Range(1, 1000000));
  // At most the demo's 64 rows (demo.cpp), each rank a slice of them: more
  // were spawned (1,024 threads) only to be refused at the first step.
  demo_cmd->add_option("--ranks", demo.ranks, "Ranks in the group (at most 64: each takes a slice of the demo's 64 rows)")
      ->capture_default_str()
      ->check(CLI::Range(1, 64));

  glint::launcher::InitModelArgs im;
  auto* init_cmd = app.add_subcommand("init-model", "Write a Hugging Face model directory with random weights");
  init_cmd->add_option("dir", im.out, "Directory to write (created if missing)")->required();
  init_cmd->add_option("--arch", im.arch, "Architecture")
      ->capture_default_str()
      ->check(CLI::IsMember({"llama", "qwen2", "qwen3", "qwen2_moe", "qwen3_moe", "qwen3_5", "qwen3_5_moe"}));
  init_cmd->add_option("--vocab", im.vocab, "Vocabulary size")->capture_default_str()->check(CLI::Range(int64_t{1}, int64_t{1} << 24));
  init_cmd->add_option("--hidden", im.hidden, "Hidden size")->capture_default_str()->check(CLI::Range(int64_t{1}, int64_t{1} << 17));
  init_cmd->add_option("--intermediate", im.intermediate, "MLP size")->capture_default_str()->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  init_cmd->add_option("--layers", im.layers, "Decoder layers")->capture_default_str()->check(CLI::Range(int64_t{1}, int64_t{1} << 12));
  init_cmd->add_option("--heads", im.heads, "Attention heads")->capture_default_str()->check(CLI::Range(int64_t{1}, int64_t{1} << 12));
  init_cmd->add_option("--kv-heads", im.kv_heads, "Key/value heads (0: as many as --heads)")->capture_default_str();
  init_cmd->add_option("--head-dim", im.head_dim, "Head size (0: hidden / heads)")->capture_default_str();
  init_cmd->add_option("--max-positions", im.max_positions, "max_position_embeddings")->capture_default_str();
  init_cmd->add_flag("--tie", im.tie, "Tie the output head to the embeddings");
  init_cmd->add_option("--dtype", im.dtype, "Stored dtype: f32, bf16 or f16")->capture_default_str();
  init_cmd->add_option("--seed", im.seed, "Random seed (the same seed writes the same weights)")->capture_default_str();
  init_cmd->add_option("--experts", im.experts, "MoE: routed experts per sparse layer (num_experts)")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{4096}));
  init_cmd->add_option("--experts-per-tok", im.experts_per_tok, "MoE: experts each token goes to (num_experts_per_tok)")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{4096}));
  init_cmd->add_option("--moe-intermediate", im.moe_intermediate,
                       "MoE: each expert's MLP size (moe_intermediate_size; 0: --intermediate / 4)")
      ->capture_default_str();
  init_cmd->add_option("--shared-intermediate", im.shared_intermediate,
                       "qwen2_moe: the shared expert's MLP size (0: --intermediate)")
      ->capture_default_str();
  init_cmd->add_option("--sparse-step", im.sparse_step, "MoE: every n-th layer is sparse (decoder_sparse_step)")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 12));
  init_cmd->add_flag("--norm-topk", im.norm_topk, "MoE: renormalise the chosen experts' weights (norm_topk_prob)");
  init_cmd->add_option("--linear-key-heads", im.linear_key_heads,
                       "qwen3_5: Gated DeltaNet query/key heads (linear_num_key_heads; 0: --heads)")
      ->capture_default_str();
  init_cmd->add_option("--linear-value-heads", im.linear_value_heads,
                       "qwen3_5: Gated DeltaNet value heads, a multiple of the key heads (0: twice them)")
      ->capture_default_str();
  init_cmd->add_option("--linear-head-dim", im.linear_head_dim,
                       "qwen3_5: Gated DeltaNet key and value head size (0: the attention's head size)")
      ->capture_default_str();
  init_cmd->add_option("--conv-kernel", im.conv_kernel, "qwen3_5: the short causal conv's width (linear_conv_kernel_dim)")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{64}));
  init_cmd->add_option("--full-attention-interval", im.full_attention_interval,
                       "qwen3_5: every n-th layer is full attention, the others Gated DeltaNets (the last layer is "
                       "full attention in a model of fewer layers)")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 12));
  init_cmd->add_option("--partial-rotary", im.partial_rotary,
                       "qwen3_5: the share of each head RoPE rotates (partial_rotary_factor)")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 1.0));
  init_cmd->add_option("--tokenizer-from", im.tokenizer_from,
                       "Train a ChatML byte-level BPE tokenizer of --vocab tokens on this JSONL/JSON dataset and write "
                       "it too (the model's vocab and eos follow it)");
  init_cmd->add_option("--chat-template", im.chat_template,
                       "With --tokenizer-from: the chat template written: chatml, or tools (ChatML that lists tools "
                       "and writes tool calls as <tool_call> JSON, for glint grpo --env)")
      ->capture_default_str()
      ->check(CLI::IsMember({"chatml", "tools"}));
  init_cmd->footer("Examples:\n  glint init-model models/tiny --arch qwen3 --hidden 256 --layers 4 --vocab 2048\n"
                   "  glint init-model models/tiny-moe --arch qwen3_moe --experts 8 --experts-per-tok 2 --norm-topk\n"
                   "  glint init-model models/tiny-35 --arch qwen3_5 --hidden 128 --layers 4 --heads 4 --kv-heads 2\n"
                   "  glint init-data arithmetic data/arith.jsonl && "
                   "glint init-model models/arith --vocab 512 --tokenizer-from data/arith.jsonl");

  glint::launcher::InitDataArgs idata;
  auto* data_cmd = app.add_subcommand("init-data", "Write a generated dataset as JSONL (no download needed)");
  data_cmd->add_option("kind", idata.kind,
                       "What to generate: arithmetic (GSM8K format), or calculator (arithmetic episodes with a "
                       "calculator tool: SFT rows for --env builtin:calculator)")
      ->required()
      ->check(CLI::IsMember({"arithmetic", "calculator"}));
  data_cmd->add_option("out", idata.out, "The .jsonl file to write")->required();
  data_cmd->add_option("--rows", idata.rows, "Rows")->capture_default_str()->check(CLI::Range(int64_t{1}, int64_t{100000000}));
  data_cmd->add_option("--max-operand", idata.max_operand, "Largest operand")->capture_default_str()->check(CLI::Range(int64_t{1}, int64_t{1000000000}));
  data_cmd->add_option("--max-terms", idata.max_terms, "Operands per question: 2 or 3")->capture_default_str()->check(CLI::Range(int64_t{2}, int64_t{3}));
  data_cmd->add_option("--seed", idata.seed, "Random seed (the same seed writes the same rows)")->capture_default_str();
  data_cmd->add_option("--tool-share", idata.tool_share, "calculator: the share of rows whose answer calls the tool")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 1.0));
  data_cmd->footer("Examples:\n  glint init-data arithmetic data/arith.jsonl --rows 5000 --seed 1\n"
                   "  glint init-data calculator data/calc.jsonl --rows 2000 --max-operand 99 --tool-share 0.3");

  glint::launcher::ExportGgufArgs gguf_args;
  auto* export_cmd = app.add_subcommand("export", "Write a model in another format");
  export_cmd->require_subcommand(1);
  auto* gguf_cmd = export_cmd->add_subcommand(
      "gguf", "Write a Llama, Qwen2 or Qwen3 model and its tokenizer as GGUF, for llama.cpp and the tools built on it");
  gguf_cmd->add_option("model", gguf_args.model, "The Hugging Face model directory (config.json, safetensors, "
                                                 "tokenizer.json)")
      ->required();
  gguf_cmd->add_option("out", gguf_args.out, "The .gguf file to write")->required();
  gguf_cmd->add_option("--dtype", gguf_args.dtype, "f32, f16 or bf16 (default: the model's stored dtype, lossless)")
      ->check(CLI::IsMember({"f32", "f16", "bf16"}));
  gguf_cmd->add_option("--adapter", gguf_args.adapter, "A LoRA adapter directory (PEFT layout) to merge in first");
  gguf_cmd->add_option("--tokenizer", gguf_args.tokenizer, "The directory with tokenizer.json, if not the model's");
  gguf_cmd->add_option("--name", gguf_args.name, "general.name (default: the model directory's name)");
  gguf_cmd->add_flag("--force", gguf_args.force, "Replace OUT if it exists");
  gguf_cmd->footer("Examples:\n  glint export gguf models/arith arith.gguf --dtype f16\n"
                   "  glint export gguf models/arith tuned.gguf --adapter runs/sft/step-200/adapter\n"
                   "Then, with llama.cpp: llama-cli -m arith.gguf -p 'Question: 3+4=' (docs/models.md, \"GGUF\")");

  glint::launcher::TemplateArgs tmpl;
  auto* tmpl_cmd = app.add_subcommand("template", "Print a conversation as a model's own chat template renders it");
  tmpl_cmd->add_option("--model", tmpl.model, "A model directory: its chat template (tokenizer_config.json or "
                                              "chat_template.jinja), special tokens and tokenizer");
  tmpl_cmd->add_option("--chat-template", tmpl.chat_template, "A Jinja template file instead of a model's");
  tmpl_cmd->add_option("--messages", tmpl.messages, "A JSON file: an array of messages, or an object with "
                                                    "\"messages\" (and \"tools\", \"documents\")")
      ->required();
  tmpl_cmd->add_option("--tools", tmpl.tools, "A JSON file: the tools (OpenAI's function format)");
  tmpl_cmd->add_option("--documents", tmpl.documents, "A JSON file: documents for retrieval-augmented templates");
  tmpl_cmd->add_flag("--add-generation-prompt", tmpl.add_generation_prompt, "End with the assistant's header, ready to sample");
  tmpl_cmd->add_flag("--no-thinking", tmpl.no_thinking, "Pass enable_thinking=false (Qwen3's and others' switch)");
  tmpl_cmd->add_option("--bos-token", tmpl.bos_token, "bos_token (default: the model's)");
  tmpl_cmd->add_option("--eos-token", tmpl.eos_token, "eos_token (default: the model's)");
  tmpl_cmd->add_flag("--ids", tmpl.ids, "Also print each token's id and whether the loss counts it (needs --model)");
  tmpl_cmd->footer("Prints the rendered text exactly, as transformers' apply_chat_template renders it (no newline is\n"
                   "added). A template's raise_exception exits 1 with its message. SOURCE_DATE_EPOCH sets strftime_now.\n"
                   "Example: glint template --model models/qwen --messages chat.json --add-generation-prompt");

  glint::launcher::RunsArgs runs_args;
  auto* runs_cmd = app.add_subcommand("runs", "List the runs saved under a root directory, with their latest checkpoint");
  runs_cmd->add_option("--root", runs_args.root, "Where the runs and their index live")->capture_default_str();
  runs_cmd->add_flag("--repair", runs_args.repair,
                     "Rebuild the run index from the checkpoint directories (a damaged index is kept aside)");
  runs_cmd->footer("Example: glint runs --root runs\n         glint runs --root runs --repair   # after 'the run index ... is damaged'");
  glint::launcher::RunsArgs ckpt_args;
  auto* ckpts_cmd = app.add_subcommand("checkpoints", "List the checkpoints of a run, oldest step first");
  ckpts_cmd->add_option("run", ckpt_args.run, "The run's name")->required();
  ckpts_cmd->add_option("--root", ckpt_args.root, "Where the runs and their index live")->capture_default_str();
  ckpts_cmd->add_flag("--repair", ckpt_args.repair,
                      "Rebuild the run index (of every run under --root) from the checkpoint directories first");
  ckpts_cmd->footer("Example: glint checkpoints grpo --root runs");

  auto* bench = app.add_subcommand("bench", "Run a benchmark and print `name: value` lines");
  bench->require_subcommand(1);
  int repeats = 5;
  auto* bench_actors = bench->add_subcommand("actors", "Actor call latency, throughput and tensor bandwidth");
  bench_actors->add_option("--repeats", repeats, "Runs per measurement (the median is printed)")
      ->capture_default_str()
      ->check(CLI::Range(1, 100));
  std::string bench_modes = "all";
  bench_actors->add_option("--mode", bench_modes, "Which transports to measure")
      ->capture_default_str()
      ->check(CLI::IsMember({"all", "local", "cluster"}));

  glint::bench::TrainBenchArgs train_args;
  auto* bench_train = bench->add_subcommand(
      "train", "Training tokens/s (forward_backward + step) of a ~27M-parameter Qwen3 model against the same "
               "model and step in Python PyTorch, interleaved in one run");
  bench_train->add_option("--repeats", train_args.repeats, "Timed runs per side (the median is printed)")
      ->capture_default_str()
      ->check(CLI::Range(1, 100));
  bench_train->add_option("--steps", train_args.steps, "Training steps per timed run (after one warm-up step)")
      ->capture_default_str()
      ->check(CLI::Range(1, 10000));
  bench_train->add_option("--batch", train_args.batch, "Sequences per batch")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{4096}));
  bench_train->add_option("--seq", train_args.seq, "Tokens per sequence")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{2}, int64_t{32768}));
  bench_train->add_flag("--small", train_args.small, "A ~0.1M-parameter model instead, for a quick smoke run");
  bench_train->add_option("--arch", train_args.arch,
                          "qwen3, or an MoE model of the same attention with 8 experts, 2 per token, in every layer "
                          "(qwen3_moe, qwen2_moe with its shared expert), or Qwen3.5 (qwen3_5: Gated DeltaNet layers "
                          "and one gated attention layer in four; qwen3_5_moe)")
      ->capture_default_str()
      ->check(CLI::IsMember({"qwen3", "qwen3_moe", "qwen2_moe", "qwen3_5", "qwen3_5_moe"}));
  bool bench_lora = false;
  bench_train->add_flag("--lora", bench_lora, "Train a LoRA adapter (r 8, all-linear) on the frozen base instead of every weight");
  bench_train->add_option("--python", train_args.python,
                          "Python interpreter with torch for the baseline (Debian's python3-torch)")
      ->capture_default_str();
  bench_train->footer(
      "Prints train_tokens_per_s, train_python_tokens_per_s, train_speedup_vs_python and train_mfu (achieved FLOP/s "
      "over this machine's at::matmul FLOP/s, measured in the same run). Both sides start from the same weights and "
      "tokens; if their initial losses differ by more than 1e-3 (relative) it warns and exits 1. The baseline is "
      "bench/python/train_baseline.py in the source tree glint was built from; it needs python3-torch "
      "(scripts/setup.sh installs it).");

  glint::bench::SampleBenchArgs sample_args;
  auto* bench_sample = bench->add_subcommand(
      "sample", "Generation tokens/s of the sampler engine (paged KV cache, continuous batching, prefix caching) on a "
                "~27M-parameter Qwen3 model against a Python PyTorch generate loop, interleaved in one run");
  bench_sample->add_option("--arch", sample_args.arch,
                           "qwen3, or an MoE model (qwen3_moe, qwen2_moe: 8 experts, 2 per token) measured against the "
                           "dense model of the same active size on glint's engine, or Qwen3.5 (qwen3_5, qwen3_5_moe: "
                           "decode at 64 sequences and at 1 against the same-size Qwen3, and the state per sequence)")
      ->capture_default_str()
      ->check(CLI::IsMember({"qwen3", "qwen3_moe", "qwen2_moe", "qwen3_5", "qwen3_5_moe"}));
  bench_sample->add_option("--repeats", sample_args.repeats, "Timed runs per side (medians are printed)")
      ->capture_default_str()
      ->check(CLI::Range(1, 100));
  bench_sample->add_option("--prompts", sample_args.prompts, "Prompts per run")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{4096}));
  bench_sample->add_option("--samples", sample_args.samples, "Completions per prompt")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{64}));
  bench_sample->add_option("--max-tokens", sample_args.max_tokens, "New tokens per completion")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{4096}));
  bench_sample->add_option("--min-prompt", sample_args.min_prompt, "Shortest prompt (tokens)")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{8192}));
  bench_sample->add_option("--max-prompt", sample_args.max_prompt, "Longest prompt (tokens)")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{8192}));
  bench_sample->add_option("--shared-prefix", sample_args.shared_prefix,
                           "Leading tokens all prompts share, like a system prompt (at most --min-prompt)")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{0}, int64_t{8192}));
  bench_sample->add_flag("--small", sample_args.small, "A ~0.1M-parameter model instead, for a quick smoke run");
  bench_sample->add_option("--python", sample_args.python,
                           "Python interpreter with torch for the baseline (Debian's python3-torch)")
      ->capture_default_str();
  bench_sample->add_option("--llamacpp", sample_args.llamacpp,
                           "llama.cpp baseline: auto (install node-llama-cpp from npm with scripts/setup_llamacpp.sh "
                           "if missing), installed (only if there already) or none")
      ->capture_default_str()
      ->check(CLI::IsMember({"auto", "installed", "none"}));
  bench_sample->add_option("--llamacpp-parallel", sample_args.llamacpp_parallel,
                           "llama.cpp's parallel sequences (llama-server's slots): each takes the next prompt and "
                           "generates its samples one after another, reusing the prompt's KV cache")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{256}));
  bench_sample->footer(
      "Prints sample_tokens_per_s, sample_python_tokens_per_s, sample_speedup_vs_python, "
      "sample_llamacpp_tokens_per_s, sample_speedup_vs_llamacpp and prefix_cache_hit_rate. Every side uses the same "
      "weights (llama.cpp's exported to GGUF by glint, f32), prompts and threads; greedy cross-checks first exit 1 if "
      "a baseline generates different tokens. The baselines are bench/python/sample_baseline.py and "
      "bench/llamacpp/llamacpp_child.mjs in the source tree glint was built from.");

  glint::bench::FaultsBenchArgs faults_args;
  auto* bench_faults = bench->add_subcommand(
      "faults", "How fast a cluster job finds a killed or frozen process and replaces a lost sampler rank");
  bench_faults->add_option("--repeats", faults_args.repeats, "Runs per measurement (the median is printed)")
      ->capture_default_str()
      ->check(CLI::Range(1, 100));
  bench_faults->add_option("--chaos", faults_args.chaos,
                           "GRPO runs whose sampler process is killed at a random step (scripts/chaos.sh; 0: none)")
      ->capture_default_str()
      ->check(CLI::Range(0, 1000));
  bench_faults->footer("Prints kill_detect_s, freeze_detect_s, peer_timeout_s, sampler_spawn_s, sampler_respawn_s, "
                       "then chaos_runs, chaos_hangs, chaos_mismatches, chaos_failures and chaos_respawns. Runs from the build tree "
                       "(scripts/chaos.sh).");
  glint::bench::ParallelBenchArgs parallel_args;
  auto* bench_parallel = bench->add_subcommand(
      "parallel", "FSDP and tensor parallelism against data parallelism on 2 ranks: state bytes, tokens/s, bytes moved");
  bench_parallel->add_option("--repeats", parallel_args.repeats, "Timed runs per scheme (the median is printed)")
      ->capture_default_str()
      ->check(CLI::Range(1, 100));
  bench_parallel->add_option("--steps", parallel_args.steps, "Steps per timed run (after one warm-up step)")
      ->capture_default_str()
      ->check(CLI::Range(1, 1000));
  bench_parallel->add_option("--batch", parallel_args.batch, "Sequences per rank")
      ->capture_default_str()
      ->check(CLI::Range(1, 4096));
  bench_parallel->add_option("--seq", parallel_args.seq, "Tokens per sequence")
      ->capture_default_str()
      ->check(CLI::Range(2, 65536));
  bench_parallel->add_flag("--small", parallel_args.small, "A ~0.1M-parameter model instead, for a quick smoke run");
  bench_parallel->add_option("--arch", parallel_args.arch,
                             "qwen3 (dp, fsdp, tp, pp), or an MoE model (qwen3_moe, qwen2_moe: 8 experts, 2 per "
                             "token): expert parallelism ep2 against ep1 (dp2 on it)")
      ->capture_default_str()
      ->check(CLI::IsMember({"qwen3", "qwen3_moe", "qwen2_moe"}));
  bench_parallel->footer("Prints, for dp2, fsdp2 and tp2: *_state_bytes (and *_vs_dp; goals fsdp2 <= 0.55, tp2 <= "
                         "0.6), *_tokens_per_s (and *_vs_dp), and the bytes each moves per step against the least it "
                         "needs (*_bytes_per_step, *_bytes_theory). Pipeline parallelism is not built yet "
                         "(docs/parallelism.md).");
  glint::bench::SyncBenchArgs sync_args;
  auto* bench_sync = bench->add_subcommand(
      "sync", "Weight sync GB/s of the checkpoint engine (model group -> sampler group) for ~30M and ~300M-parameter "
              "models, against one memcpy of the same bytes measured in the same run");
  bench_sync->add_option("--repeats", sync_args.repeats, "Timed syncs per model (the median is printed)")
      ->capture_default_str()
      ->check(CLI::Range(1, 100));
  bench_sync->add_option("--mode", sync_args.mode, "local (the goal: at least half of memcpy), cluster or all")
      ->capture_default_str()
      ->check(CLI::IsMember({"local", "cluster", "all"}));
  bench_sync->add_flag("--small", sync_args.small, "~1M and ~5M-parameter models instead, for a quick smoke run");
  bench_sync->footer("Prints memcpy_gbps, weight_sync_gbps_<size> and weight_sync_vs_memcpy_<size> (local), "
                     "weight_sync_cluster_{messages,c10d,stream}_gbps_<size>, weight_sync_cluster_gbps_<size> (the fastest), "
                     "tcp_loopback_gbps and weight_sync_cluster_vs_tcp_300m (cluster). Needs about 6 GB of memory for the 300M model.");

  glint::bench::RemoteBenchArgs remote_args;
  auto* bench_remote = bench->add_subcommand(
      "remote", "Remote mode's cost and sharing's gain: RPC round trips and training steps against the same calls "
                "made locally, and 4 tenants' tokens/s against one tenant's, all in one run over loopback");
  bench_remote->add_option("--repeats", remote_args.repeats, "No-op calls per mode (the median is printed)")
      ->capture_default_str()
      ->check(CLI::Range(10, 100000));
  bench_remote->add_option("--steps", remote_args.steps, "Training steps per timing and per tenant")
      ->capture_default_str()
      ->check(CLI::Range(2, 10000));
  bench_remote->footer("Prints local_noop_rtt_us, remote_noop_rtt_us, remote_forward_backward_vs_local (goal <= 1.2), "
                       "tenants1_tokens_per_s, tenants4_tokens_per_s and tenants4_vs_1_tokens_per_s (goal >= 1.5).");

  glint::bench::SoakBenchArgs soak_args;
  auto* bench_soak = bench->add_subcommand(
      "serve-soak", "A server under a steady load for a bounded time: N tenants running SDK-shaped Tinker calls "
                    "(train steps, sampler saves, sample calls); calls, errors, latency, RSS and descriptors");
  bench_soak->add_option("--minutes", soak_args.minutes, "How long it runs")->capture_default_str()->check(CLI::Range(0.1, 600.0));
  bench_soak->add_option("--tenants", soak_args.tenants, "Tenants, each its own key, adapter and connection")
      ->capture_default_str()
      ->check(CLI::Range(1, 64));
  bench_soak->add_option("--sample-every", soak_args.sample_every,
                          "Training steps between a tenant's save_weights_for_sampler + sample calls (0: none)")
      ->capture_default_str()
      ->check(CLI::Range(0, 1000));
  bench_soak->footer("Prints soak_calls, soak_errors (goal 0), soak_p50_ms, soak_p99_ms, soak_rss_start_mib, "
                     "soak_rss_end_mib, soak_rss_growth (goal < 0.05), soak_fds_start, soak_fds_end and soak_fds_leaked "
                     "(goal 0); exits 1 when a goal is missed.");

  glint::bench::TemplateBenchArgs template_args;
  auto* bench_template = bench->add_subcommand(
      "template", "Chat template rendering: glint's Jinja interpreter against Python's Jinja2, and the C++ formats");
  bench_template->add_option("--repeats", template_args.repeats, "Timed rounds (medians are printed)")
      ->capture_default_str()
      ->check(CLI::Range(1, 100));
  bench_template->footer("Prints jinja_render_us, jinja2_render_us, jinja_vs_jinja2 (goal > 1), jinja_vs_jinja2_min and "
                         "chat_cpp_vs_jinja_encode, over tests/data/chat_templates (run from the source tree's build)");
  glint::bench::RlBenchArgs rl_args;
  auto* bench_rl = bench->add_subcommand(
      "rl", "Asynchronous RL: the GRPO example at --max-staleness 0, 1 and 2 (model and sampler on different cores), "
            "steps per hour and greedy accuracy of each, and the ideal speedup from the same runs");
  bench_rl->add_option("--seeds", rl_args.seeds, "Runs per staleness, with seeds 1..N (medians and means are printed)")
      ->capture_default_str()
      ->check(CLI::Range(1, 100));
  bench_rl->add_option("--steps", rl_args.steps, "GRPO steps per run")->capture_default_str()->check(CLI::Range(4, 100000));
  bench_rl->add_option("--grpo", rl_args.grpo, "The GRPO example binary (default: examples/grpo of this build)");
  glint::bench::AgentBenchArgs agent_args;
  agent_args.env.clear();
  bench_rl->add_option("--env", agent_args.env,
                       "Multi-turn instead: episodes of the calculator agent (docs/recipes.md, Agents) in this "
                       "environment (builtin:calculator), the multi-turn loop against a naive one that re-renders, "
                       "re-tokenises and re-prefills each turn");
  bench_rl->add_option("--repeats", agent_args.repeats, "With --env: rounds of both loops (medians are printed)")
      ->capture_default_str()
      ->check(CLI::Range(1, 100));
  bench_rl->add_option("--prompts", agent_args.prompts, "With --env: prompts per round")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{4096}));
  bench_rl->add_option("--generations", agent_args.generations, "With --env: episodes per prompt")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{256}));
  bench_rl->footer("Prints async_eta1_speedup, async_eta2_speedup, async_ideal_speedup, async_eta2_of_ideal (goal >= "
                   "0.8), sync_accuracy, async_eta1_accuracy, async_eta2_accuracy and accuracy_seed_std. About 3 "
                   "minutes per seed on 2 cores.\n"
                   "With --env builtin:calculator: multiturn_tokens_per_s, naive_tokens_per_s, multiturn_vs_naive "
                   "(goal >= 2), prefix_cache_hit_rate and the turns per episode of each loop; about 2 minutes.");

  glint::launcher::ServeArgs serve_args;
  auto* serve_cmd = app.add_subcommand(
      "serve", "Serve a base model to many tenants, each training its own LoRA adapters (remote mode)");
  serve_cmd->add_option("--config", serve_args.config, "The server's TOML (model, listen, tls, groups, limits)");
  serve_cmd->add_flag("--insecure", serve_args.insecure,
                      "Allow plain TCP on a non-loopback address (keys and data travel in clear text)");
  serve_cmd->add_option("--port", serve_args.port, "Listen on this port instead of the config's (0: any free one)")
      ->check(CLI::Range(0, 65535));
  serve_cmd->add_option("--grace", serve_args.grace_seconds, "Seconds calls in flight may take to finish at SIGTERM")
      ->capture_default_str()
      ->check(CLI::Range(0, 3600));
  serve_cmd->footer("Example: glint serve --config serve.toml   (docs/remote.md; drivers attach with "
                    "GLINT_REMOTE_URL=host:port GLINT_API_KEY=tml-...)");
  glint::launcher::ServeKeysArgs keys_args;
  auto* keys_cmd = serve_cmd->add_subcommand("keys", "Manage the server's API keys (stored as salted hashes)");
  keys_cmd->require_subcommand(1);
  for (auto* k : {keys_cmd->add_subcommand("create", "Make a key for a tenant; it is printed once"),
                  keys_cmd->add_subcommand("list", "List the keys: id, tenant, creation, state"),
                  keys_cmd->add_subcommand("revoke", "Revoke a key (by the key or its id); it stops working at once")}) {
    k->add_option("--config", keys_args.config, "The server's TOML (its state_dir holds the keys)");
    k->add_option("--state-dir", keys_args.state_dir, "The server's state directory, instead of --config");
    k->callback([k, &keys_args] { keys_args.action = k->get_name(); });
    if (k->get_name() == "create") k->add_option("--tenant", keys_args.tenant, "The tenant the key belongs to")->required();
    if (k->get_name() == "revoke") k->add_option("key", keys_args.key, "The key, or its id (keys list shows ids)")->required();
  }

  glint::launcher::SftArgs sft_args;
  auto* sft_cmd = glint::launcher::add_sft(app, sft_args);
  glint::launcher::GrpoArgs grpo_args;
  auto* grpo_cmd = glint::launcher::add_grpo(app, grpo_args);
  glint::launcher::DpoArgs dpo_args;
  auto* dpo_cmd = glint::launcher::add_dpo(app, dpo_args);

  CLI11_PARSE(app, argc, argv);

  if (*run) {
    auto code = glint::launcher::launch(spec);
    if (!code) {
      std::fprintf(stderr, "glint run: %s\n", glint::describe(code.error()).c_str());
      return 2;
    }
    return *code;
  }
  if (*keys_cmd) return glint::launcher::serve_keys(keys_args);
  if (*serve_cmd) {
    if (serve_args.config.empty()) {
      std::fprintf(stderr, "glint serve: --config is required (a serve.toml; see docs/remote.md)\n");
      return 2;
    }
    return glint::launcher::serve(serve_args);
  }
  if (*sft_cmd) return glint::launcher::sft(sft_args, *sft_cmd);
  if (*grpo_cmd) return glint::launcher::grpo(grpo_args, *grpo_cmd);
  if (*dpo_cmd) return glint::launcher::dpo(dpo_args, *dpo_cmd);
  if (*info_cmd) return glint::launcher::info(info);
  if (*demo_cmd) return glint::launcher::demo(demo);
  if (*init_cmd) {
    // The expert options change nothing on a dense family: refused, not ignored.
    if (im.arch != "qwen2_moe" && im.arch != "qwen3_moe" && im.arch != "qwen3_5_moe")
      for (const char* o : {"--experts", "--experts-per-tok", "--moe-intermediate", "--shared-intermediate",
                            "--sparse-step", "--norm-topk"})
        if (init_cmd->count(o) > 0) {
          std::fprintf(stderr,
                       "glint init-model: %s is for a mixture-of-experts --arch (qwen2_moe, qwen3_moe, qwen3_5_moe), "
                       "not %s\n",
                       o, im.arch.c_str());
          return 2;
        }
    if (im.arch == "qwen3_moe" && init_cmd->count("--shared-intermediate") > 0) {
      std::fprintf(stderr, "glint init-model: --shared-intermediate is for --arch qwen2_moe and qwen3_5_moe (Qwen3-MoE "
                           "has no shared expert)\n");
      return 2;
    }
    if (im.arch == "qwen3_5_moe")
      for (const char* o : {"--sparse-step", "--norm-topk"})
        if (init_cmd->count(o) > 0) {
          std::fprintf(stderr, "glint init-model: %s: Qwen3.5-MoE makes every layer sparse and always renormalises\n", o);
          return 2;
        }
    if (im.arch != "qwen3_5" && im.arch != "qwen3_5_moe")
      for (const char* o : {"--linear-key-heads", "--linear-value-heads", "--linear-head-dim", "--conv-kernel",
                            "--full-attention-interval", "--partial-rotary"})
        if (init_cmd->count(o) > 0) {
          std::fprintf(stderr, "glint init-model: %s is for the Qwen3.5 family (--arch qwen3_5, qwen3_5_moe), not %s\n", o,
                       im.arch.c_str());
          return 2;
        }
    return glint::launcher::init_model(im);
  }
  if (*gguf_cmd) return glint::launcher::export_gguf(gguf_args);
  if (*data_cmd) return glint::launcher::init_data(idata);
  if (*runs_cmd) return glint::launcher::runs(runs_args);
  if (*tmpl_cmd) return glint::launcher::chat_template(tmpl);
  if (*ckpts_cmd) return glint::launcher::runs(ckpt_args);
  if (*bench_actors) return glint::bench::actors(repeats, bench_modes);
  if (*bench_sample) return glint::bench::sample(sample_args);
  if (*bench_sync) return glint::bench::sync(sync_args);
  if (*bench_faults) return glint::bench::faults(faults_args);
  if (*bench_parallel) return glint::bench::parallel(parallel_args);
  if (*bench_remote) return glint::bench::remote(remote_args);
  if (*bench_soak) return glint::bench::serve_soak(soak_args);
  if (*bench_rl) {
    const bool multiturn = !agent_args.env.empty();
    for (const char* flag : {"--seeds", "--steps", "--grpo"})
      if (multiturn && bench_rl->get_option(flag)->count() > 0) {
        std::fprintf(stderr, "glint bench rl: %s is for the asynchronous benchmark; --env runs the multi-turn one\n", flag);
        return 2;
      }
    for (const char* flag : {"--repeats", "--prompts", "--generations"})
      if (!multiturn && bench_rl->get_option(flag)->count() > 0) {
        std::fprintf(stderr, "glint bench rl: %s is for the multi-turn benchmark: give --env builtin:calculator\n", flag);
        return 2;
      }
    return multiturn ? glint::bench::agents(agent_args) : glint::bench::rl(rl_args);
  }
  if (*bench_template) return glint::bench::templates(template_args);
  if (*bench_train) {
    if (bench_lora) train_args.mode = glint::bench::TrainMode::lora;
    return glint::bench::train(train_args);
  }
  return 0;
}
