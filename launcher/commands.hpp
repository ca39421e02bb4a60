#pragma once
/// The subcommands of the `glint` binary, each returning an exit code.

#include <cstdint>
#include <string>

namespace glint::launcher {

struct InfoArgs {
  std::string config;  ///< a job TOML to plan (empty: none)
  int nproc = 1;       ///< plan as if this many processes shared the machine
  bool probe = false;  ///< also spawn a probe per node and show where it runs
};
int info(const InfoArgs& args);

struct DemoArgs {
  int steps = 20;
  int ranks = 2;
};
/// The local-mode (or, under `glint run`, cluster-mode) demo of the runtime.
int demo(const DemoArgs& args);

struct InitModelArgs {
  std::string out;
  std::string arch = "qwen3";
  int64_t vocab = 1024;
  int64_t hidden = 128;
  int64_t intermediate = 384;
  int64_t layers = 2;
  int64_t heads = 4;
  int64_t kv_heads = 2;   ///< 0: as many as heads
  int64_t head_dim = 0;   ///< 0: hidden / heads
  int64_t max_positions = 2048;
  bool tie = false;
  std::string dtype = "f32";
  uint64_t seed = 0;
  // Mixture-of-experts (--arch qwen2_moe, qwen3_moe); 0: transformers' default.
  int64_t experts = 8;
  int64_t experts_per_tok = 2;
  int64_t moe_intermediate = 0;     ///< 0: intermediate / 4
  int64_t shared_intermediate = 0;  ///< qwen2_moe; 0: intermediate
  int64_t sparse_step = 1;
  bool norm_topk = false;
  // Qwen3.5 (--arch qwen3_5, qwen3_5_moe): the Gated DeltaNet layers.
  int64_t linear_key_heads = 0;    ///< 0: --heads
  int64_t linear_value_heads = 0;  ///< 0: twice the key heads
  int64_t linear_head_dim = 0;     ///< 0: --head-dim (or hidden / heads)
  int64_t conv_kernel = 4;
  int64_t full_attention_interval = 4;  ///< every n-th layer full attention (at least the last)
  double partial_rotary = 0.25;
  /// A JSONL/JSON dataset to train a ChatML byte-level BPE tokenizer of
  /// `vocab` tokens on; written as tokenizer.json + tokenizer_config.json,
  /// and the model's vocabulary and eos follow it. Empty: no tokenizer.
  std::string tokenizer_from{};
  std::string chat_template = "chatml";  ///< chatml, or tools (ChatML with hermes tool calls)
};
/// Writes a random model directory (config.json + model.safetensors, and a
/// trained tokenizer when asked).
int init_model(const InitModelArgs& args);

struct InitDataArgs {
  std::string kind = "arithmetic";
  std::string out;
  int64_t rows = 2000;
  int64_t max_operand = 20;
  int64_t max_terms = 2;
  uint64_t seed = 0;
  double tool_share = 0.5;  ///< calculator: the rows whose answer calls the tool
};
/// Writes a generated dataset as JSONL (GSM8K format for arithmetic).
int init_data(const InitDataArgs& args);

struct ExportGgufArgs {
  std::string model;      ///< a Hugging Face model directory
  std::string out;        ///< the .gguf file to write
  std::string dtype{};    ///< f32, f16 or bf16; empty: the model's stored dtype
  std::string adapter{};  ///< a PEFT LoRA adapter directory to merge in
  std::string tokenizer{};///< where tokenizer.json is, if not in the model directory
  std::string name{};     ///< general.name
  bool force = false;     ///< replace an existing file
};
/// `glint export gguf`: writes the model (and its tokenizer) as GGUF for llama.cpp.
int export_gguf(const ExportGgufArgs& args);

struct TemplateArgs {
  std::string model{};          ///< a model directory: its chat template and tokenizer
  std::string chat_template{};  ///< or a template file
  std::string messages;         ///< a JSON file: an array of messages, or {"messages": [...], "tools": [...]}
  std::string tools{}, documents{};
  bool add_generation_prompt = false;
  bool no_thinking = false;
  std::string bos_token{}, eos_token{};
  bool ids = false;
};
/// `glint template`: prints a conversation as the model's chat template renders it.
int chat_template(const TemplateArgs& args);

struct RunsArgs {
  std::string root = "runs";
  std::string run{};  ///< empty: list the runs; else that run's checkpoints
  bool repair = false;  ///< rebuild the index from the checkpoint directories first
};
/// Lists the runs (or one run's checkpoints) of the run index under root.
int runs(const RunsArgs& args);

struct ServeArgs {
  std::string config;      ///< the server's TOML (rpc/serve_config.hpp)
  bool insecure = false;   ///< allow plain TCP on a non-loopback address
  int port = -1;           ///< overrides [listen] port when >= 0 (0: any free port)
  int grace_seconds = 30;  ///< how long calls in flight may finish at SIGTERM
};
/// Serves the config's base model to tenants until SIGTERM or SIGINT.
int serve(const ServeArgs& args);

struct ServeKeysArgs {
  std::string action;      ///< create, list or revoke
  std::string config;      ///< the server's TOML, for its state_dir
  std::string state_dir;   ///< or the state directory itself
  std::string tenant;      ///< create: whose key
  std::string key;         ///< revoke: the key or its id
};
int serve_keys(const ServeKeysArgs& args);

}  // namespace glint::launcher
