// Writes the seed corpus of every fuzz target under DIR/<target>/ (usage:
// fuzz_seeds DIR; scripts/fuzz.sh --seeds runs it into fuzz/corpus): small
// valid inputs made by glint's own writers (train_bpe, ModelConfig::to_json,
// LoraConfig::to_json, write_safetensors, AtomicDir::commit,
// trainer_state_json, save_jsonl) or the tree's test data, and near-valid
// variants of them. Nothing is downloaded. Names are the content's FNV-1a
// hash, so running it again adds only what changed.
#include "common.hpp"

#include "actors/trainer_state.hpp"
#include "components/checkpoint/atomic_dir.hpp"
#include "components/checkpoint/safetensors.hpp"
#include "components/data/bpe_trainer.hpp"
#include "components/data/dataset.hpp"
#include "components/model/config.hpp"
#include "components/model/lora_config.hpp"
#include "rpc/convert.hpp"
#include "tinker_public.pb.h"

#include <capnp/message.h>
#include <capnp/serialize.h>
#include <zstd.h>

#include <nlohmann/json.hpp>

#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

using namespace glint;
using namespace glint::components;
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

fs::path g_root;

std::string read(const fs::path& p) {
  std::ifstream in{p, std::ios::binary};
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

void seed(const std::string& target, const std::string& bytes) {
  uint64_t h = 1469598103934665603ULL;
  for (unsigned char c : bytes) h = (h ^ c) * 1099511628211ULL;
  char name[32];
  std::snprintf(name, sizeof name, "seed-%016llx", static_cast<unsigned long long>(h));
  fs::create_directories(g_root / target);
  std::ofstream{g_root / target / name, std::ios::binary} << bytes;
}

template <class T>
T ok(Result<T> r, const char* what) {
  if (!r) fuzz::fail(std::string{what} + ": " + describe(r.error()));
  return std::move(*r);
}
void ok(Result<void> r, const char* what) {
  if (!r) fuzz::fail(std::string{what} + ": " + describe(r.error()));
}

void safetensors_seeds(const fs::path& tmp) {
  auto f32 = ok(Tensor::from_values(std::vector<float>{1, 2, 3, 4, 5, 6}, {2, 3}), "f32");
  auto i64 = ok(Tensor::from_values(std::vector<int64_t>{7}, {1}), "i64");
  auto u8 = ok(Tensor::from_values(std::vector<uint8_t>{1, 2, 3}, {3}), "u8");
  auto bf16 = ok(Tensor::zeros(Dtype::bf16, {2, 0}), "bf16");
  auto i32 = ok(Tensor::zeros(Dtype::i32, {1, 1, 2}), "i32");
  const auto path = (tmp / "t.safetensors").string();
  for (const auto& [tensors, meta] :
       std::vector<std::pair<NamedTensors, std::map<std::string, std::string>>>{
           {{{"model.embed_tokens.weight", f32}, {"step", i64}}, {{"format", "pt"}}},
           {{{"a", u8}, {"b", bf16}, {"c", i32}}, {}},
           {{}, {}}}) {
    ok(write_safetensors(path, tensors, meta), "write_safetensors");
    auto bytes = read(path);
    seed("safetensors", bytes);
    seed("safetensors", bytes.substr(0, bytes.size() - 1));  // truncated
  }
  // An unpadded header: tensors misaligned, read by copy.
  std::string header = R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"__metadata__":{"k":"v"}})";
  std::string file(8, '\0');
  for (int i = 0; i < 8; ++i) file[static_cast<size_t>(i)] = static_cast<char>(header.size() >> (8 * i));
  seed("safetensors", file + header + std::string(8, '\x01'));
}

void model_config_seeds() {
  auto llama = ModelConfig::make(Architecture::llama, 512, 64, 128, 2, 4, 2);
  llama.eos_token_ids = {2, 3};
  llama.bos_token_id = 1;
  llama.rope_scaling = {RopeScaling::Type::llama3, 8.0, 1.0, 4.0, 8192};
  llama.dtype = Dtype::bf16;
  seed("model_config", llama.to_json());
  auto qwen2 = ModelConfig::make(Architecture::qwen2, 300, 32, 64, 4, 4, 1);
  qwen2.sliding_window = 64;
  qwen2.sliding_layers = {false, false, true, true};
  qwen2.tie_word_embeddings = true;
  qwen2.hidden_act = Activation::gelu_tanh;
  seed("model_config", qwen2.to_json());
  auto qwen3 = ModelConfig::make(Architecture::qwen3, 1000, 64, 96, 1, 2, 2, 32);
  qwen3.rope_scaling = {RopeScaling::Type::linear, 2.0};
  qwen3.extra_json = R"({"use_cache": true, "transformers_version": "4.51.0"})";
  seed("model_config", qwen3.to_json());
  auto qwen3_moe = ModelConfig::make(Architecture::qwen3_moe, 1000, 64, 96, 4, 2, 2);
  qwen3_moe.moe.num_experts = 8;
  qwen3_moe.moe.num_experts_per_tok = 2;
  qwen3_moe.moe.moe_intermediate_size = 16;
  qwen3_moe.moe.norm_topk_prob = true;
  qwen3_moe.moe.decoder_sparse_step = 2;
  qwen3_moe.moe.mlp_only_layers = {3};
  seed("model_config", qwen3_moe.to_json());
  auto qwen2_moe = ModelConfig::make(Architecture::qwen2_moe, 1000, 64, 96, 2, 2, 2);
  qwen2_moe.moe.num_experts = 4;
  qwen2_moe.moe.num_experts_per_tok = 4;
  qwen2_moe.moe.moe_intermediate_size = 16;
  qwen2_moe.moe.shared_expert_intermediate_size = 32;
  seed("model_config", qwen2_moe.to_json());
  auto qwen3_5 = ModelConfig::make(Architecture::qwen3_5, 1000, 64, 96, 4, 4, 2, 16);
  qwen3_5.linear_attention = {.num_key_heads = 2, .key_head_dim = 8, .num_value_heads = 4, .value_head_dim = 8,
                              .conv_kernel_dim = 4};
  seed("model_config", qwen3_5.to_json());
  auto qwen3_5_moe = ModelConfig::make(Architecture::qwen3_5_moe, 1000, 64, 96, 2, 4, 2, 16);
  qwen3_5_moe.linear_attention = qwen3_5.linear_attention;
  qwen3_5_moe.moe.num_experts = 4;
  qwen3_5_moe.moe.num_experts_per_tok = 2;
  qwen3_5_moe.moe.moe_intermediate_size = 16;
  qwen3_5_moe.moe.shared_expert_intermediate_size = 16;
  seed("model_config", qwen3_5_moe.to_json());
  // A vision-language checkpoint's nesting.
  seed("model_config", R"({"architectures": ["Qwen3_5ForConditionalGeneration"], "image_token_id": 7,
    "tie_word_embeddings": true, "vision_config": {"depth": 1}, "text_config": {"model_type": "qwen3_5_text",
    "vocab_size": 10, "hidden_size": 8, "intermediate_size": 16, "num_hidden_layers": 2, "num_attention_heads": 2,
    "head_dim": 8, "linear_num_key_heads": 1, "linear_key_head_dim": 4, "linear_num_value_heads": 2,
    "linear_value_head_dim": 4, "layer_types": ["linear_attention", "full_attention"],
    "rope_parameters": {"rope_type": "default", "rope_theta": 1e7, "partial_rotary_factor": 0.5}}})");
  // The field spellings to_json does not write, and a few refusals.
  seed("model_config", R"({"model_type": "qwen2", "vocab_size": 10, "hidden_size": 8, "intermediate_size": 16,
    "num_hidden_layers": 2, "num_attention_heads": 2, "rope_parameters": {"rope_type": "default", "rope_theta": 1e6},
    "use_sliding_window": true, "sliding_window": null, "max_window_layers": 1, "eos_token_id": 3})");
  seed("model_config", R"({"architectures": ["LlamaForCausalLM"], "vocab_size": 10, "hidden_size": 8,
    "intermediate_size": 16, "num_hidden_layers": 1, "num_attention_heads": 2, "hidden_act": "swish",
    "attention_dropout": 0.1, "quantization_config": {"bits": 4}})");
  seed("model_config", R"({"architectures": ["Qwen3ForCausalLM"], "vocab_size": 10})");
  seed("model_config", R"({"model_type": "qwen3_moe", "vocab_size": 10, "hidden_size": 8, "num_hidden_layers": 2,
    "num_attention_heads": 2, "num_local_experts": 4, "num_experts": 4, "num_experts_per_tok": 5,
    "output_router_logits": true, "mlp_only_layers": [0, 9]})");
}

void tokenizer_seeds() {
  const auto& base = fuzz::chat_tokenizer_json();
  seed("tokenizer", base);
  auto j = json::parse(base);
  j["normalizer"] = {{"type", "Sequence"},
                     {"normalizers",
                      {{{"type", "NFKC"}},
                       {{"type", "Lowercase"}},
                       {{"type", "Strip"}, {"strip_left", true}, {"strip_right", false}},
                       {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", "\xe2\x96\x81"}},
                       {{"type", "Replace"}, {"pattern", {{"Regex", "\\d+"}}}, {"content", "0"}},
                       {{"type", "Prepend"}, {"prepend", "\xe2\x96\x81"}}}}};
  j["added_tokens"].push_back({{"id", 400}, {"content", "hello"}, {"special", false}, {"normalized", true},
                               {"lstrip", true}, {"rstrip", true}, {"single_word", true}});
  seed("tokenizer", j.dump());
  j = json::parse(base);
  j["pre_tokenizer"] = {{"type", "Sequence"},
                        {"pretokenizers",
                         {{{"type", "Split"}, {"pattern", {{"String", "\n"}}}, {"behavior", "Isolated"}},
                          {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"use_regex", true}}}}};
  j["model"]["ignore_merges"] = true;
  j["model"]["unk_token"] = "<|endoftext|>";
  j["model"]["fuse_unk"] = true;
  j["model"]["dropout"] = 0.1;
  seed("tokenizer", j.dump());
  // A SentencePiece-style vocabulary (decode only), with byte fallback.
  seed("tokenizer", R"({"model": {"type": "BPE", "byte_fallback": true, "unk_token": "<unk>",
    "vocab": {"<unk>": 0, "<0x0A>": 1, "<0x41>": 2, "\u2581a": 3, "b": 4, "\u2581ab": 5},
    "merges": [["\u2581a", "b"]]}, "decoder": {"type": "Sequence", "decoders": [{"type": "ByteFallback"}]},
    "added_tokens": [{"id": 6, "content": "</s>", "special": true}]})");
  // A tiny byte-level one with merges as strings.
  seed("tokenizer", R"({"model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2, "\u0120": 3, "\u0120a": 4},
    "merges": ["a b", "\u0120 a"]}, "pre_tokenizer": {"type": "ByteLevel"}, "decoder": {"type": "ByteLevel"},
    "added_tokens": [{"id": 5, "content": "<s>", "special": true, "normalized": false}]})");
}

const char* kChatml =
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + "
    "'<|im_end|>' + '\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

void tokenizer_config_seeds(const fs::path& tmp) {
  ok(save_chatml_tokenizer((tmp / "tok").string(), fuzz::chat_tokenizer_json()), "save_chatml_tokenizer");
  seed("tokenizer_config", read(tmp / "tok" / "tokenizer_config.json"));
  json j = {{"bos_token", {{"__type", "AddedToken"}, {"content", "<|endoftext|>"}, {"lstrip", false}}},
            {"eos_token", "<|eot_id|>"},
            {"unk_token", nullptr},
            {"clean_up_tokenization_spaces", true},
            {"add_bos_token", false},
            {"errors", "replace"},
            {"split_special_tokens", false},
            {"model_max_length", 131072},
            {"added_tokens_decoder", {{"397", {{"content", "<|eot_id|>"}, {"special", true}}}}},
            {"chat_template", {{{"name", "default"}, {"template", kChatml}}, {{"name", "tool_use"}, {"template", "x"}}}}};
  seed("tokenizer_config", j.dump(2));
  seed("tokenizer_config", R"({"do_lower_case": true, "add_prefix_space": false})");
}

void chat_template_seeds() {
  seed("chat_template", kChatml);
  for (const auto& e : fs::directory_iterator(fs::path{GLINT_SOURCE_DIR} / "tests" / "data" / "chat_templates"))
    seed("chat_template", read(e.path()));
  seed("chat_template",
       "{% if messages[0]['role'] != 'system' %}<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n"
       "{% endif %}{% for message in messages %}<|im_start|>{{ message['role'] }}\\n{{ message['content'] }}"
       "<|im_end|>\\n{% endfor %}");
}

// A format byte (ToolCallFormat) and what a model might write in it.
void tool_calls_seeds() {
  const std::pair<char, const char*> seeds[] = {
      {1, "Checking.\n<tool_call>\n{\"name\": \"f\", \"arguments\": {\"n\": 1}}\n</tool_call><|im_end|>"},
      {1, "<tool_call>{\"name\": \"f\", \"arguments\": \"{\\\"n\\\": 2}\"}</tool_call><tool_call>{bad</tool_call>"},
      {2, "<tool_call>\n<function=f>\n<parameter=n>\n3\n</parameter>\n<parameter=s>\nx\n</parameter>\n</function>\n</tool_call>"},
      {3, "<|python_tag|>{\"name\": \"f\", \"parameters\": {\"n\": 4}}; {\"name\": \"g\", \"parameters\": {}}<|eot_id|>"},
      {4, "[TOOL_CALLS][{\"name\": \"f\", \"arguments\": {\"n\": 5}, \"id\": \"abcdefghi\"}]</s>"},
      {4, "[TOOL_CALLS]f[ARGS]{\"n\": 6}[TOOL_CALLS]g[ARGS]{}"},
      {0, "plain text"},
  };
  for (const auto& [format, text] : seeds) seed("tool_calls", std::string(1, format) + text);
}

// A kind byte (bit 0: chat) and an OpenAI request body.
void openai_seeds() {
  const std::pair<char, const char*> seeds[] = {
      {1, R"({"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "n": 2, "seed": 1})"},
      {1, R"({"model": "m", "messages": [{"role": "system", "content": "s"}, {"role": "user", "content": [{"type": "text", "text": "a"}]}],
          "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}], "tool_choice": "auto",
          "logprobs": true, "top_logprobs": 2, "stream": true, "stream_options": {"include_usage": true}, "stop": ["x"]})"},
      {1, R"({"model": "m", "messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": null,
          "tool_calls": [{"id": "c", "type": "function", "function": {"name": "f", "arguments": "{\"n\": 1}"}}]},
          {"role": "tool", "tool_call_id": "c", "content": "1"}], "temperature": 0})"},
      {0, R"({"model": "m", "prompt": "the quick", "max_tokens": 3, "logprobs": 2, "stream": true})"},
      {0, R"({"model": "m", "prompt": [1, 2, 3], "n": 2, "best_of": 2})"},
  };
  for (const auto& [kind, body] : seeds) seed("openai", std::string(1, kind) + body);
}

void lora_config_seeds() {
  LoraConfig c;
  seed("lora_config", c.to_json());
  c.target_modules = {"all-linear"};
  c.rslora = true;
  c.alpha = 32;
  c.dropout = 0.05;
  c.base_model_name_or_path = "Qwen/Qwen2.5-0.5B";
  seed("lora_config", c.to_json());
  LoraConfig d;
  d.target_modules = {"q_proj", "v_proj", "model.layers.0.mlp.up_proj"};
  d.rank_pattern = {{"q_proj", 4}, {"layers\\.1\\..*", 2}};
  d.alpha_pattern = {{"v_proj", 8.5}};
  d.layers_to_transform = {0, 1};
  d.layers_pattern = {"layers"};
  d.exclude_modules = {"k_proj"};
  d.other_fields = R"({"inference_mode": false, "peft_version": "0.15.0", "task_type": "CAUSAL_LM"})";
  seed("lora_config", d.to_json());
  LoraConfig e;
  e.target_regex = R"(.*\.(q|v)_proj)";
  e.exclude_regex = R"(.*layers\.0\..*)";
  seed("lora_config", e.to_json());
  seed("lora_config", R"({"peft_type": "LORA", "r": 16, "lora_alpha": 32, "target_modules": ["q_proj"],
    "use_dora": true, "bias": "all", "fan_in_fan_out": false, "modules_to_save": null})");
}

void dataset_seeds(const fs::path& tmp) {
  std::vector<Row> rows = {
      {{{"system", "Be brief."}, {"user", "What is 2 + 6?"}, {"assistant", "8"}}, {}, ""},
      {{}, {{"question", "Tom has 3 apples and buys 4. How many?"}, {"answer", "3 + 4 = 7\n#### 7"}}, ""},
      {{}, {{"query", "Who are you?"}, {"response", "I am {{NAME}}, made by {{AUTHOR}}."}}, ""},
      {{{"user", "hi"}, {"assistant", "hello"}, {"user", "bye"}, {"assistant", "bye!"}}, {{"id", "42"}}, ""}};
  const auto path = (tmp / "rows.jsonl").string();
  ok(save_jsonl(rows, path), "save_jsonl");
  const auto jsonl = read(path);
  seed("dataset", "\x01" + jsonl);  // first byte: bit 0 set, JSONL
  seed("dataset", "\x0b" + jsonl + "not json\n{\"messages\": 3}\n[1]\n\n");
  std::string array = "[";
  std::istringstream in{jsonl};
  for (std::string line; std::getline(in, line);) array += (array.size() > 1 ? "," : "") + line;
  seed("dataset", std::string(1, '\0') + array + "]");  // JSON array
  seed("dataset", std::string{"\x04"} + R"([{"question": "1+1?", "answer": "#### 2", "n": 12345678901234567890, "f": 1.5, "b": true}, {"messages": [{"role": "user", "content": null}]}])");
}

void job_toml_seeds() {
  seed("job_toml", "strategy = \"pack\"\nallow_cpu_oversubscribe = true\n\n[[group]]\nname = \"model\"\nranks = 2\n"
                   "device_type = \"cpu\"\nmesh = { dp = 2 }\n");
  seed("job_toml", "strategy = \"spread\"\n[[group]]\nname = \"model\"\nranks = 4\ndevice_type = \"cuda\"\n"
                   "mesh = { dp = 2, tp = 2 }\n[[group]]\nname = \"sampler\"\nranks = [4, 5]\ndevice_type = \"cuda\"\n");
  seed("job_toml", "allow_cpu_oversubscribe = false\n[[group]]\nname = \"a\"\nranks = [0, 1, 2]\n[[group]]\n"
                   "name = \"b\"\nranks = 3\nmesh = { fsdp = 3, pp = 1, cp = 1, ep = 1 }\n");
  seed("job_toml", "[[group]]\nname = \"m\"\nranks = 4\nmesh = { dp = 3 }\n");
}

void trainer_state_seeds() {
  actors::TrainerState s;
  s.step = 40;
  s.consumed_samples = 320;
  s.gradient_accumulation = 2;
  s.seed = 1;
  s.phase = "grpo";
  s.loader = {7, 1, 16};
  s.metrics = {{"loss", 0.31}, {"reward", 0.5}};
  s.train_configs = R"({"lr": 1e-4})";
  seed("trainer_state", actors::trainer_state_json(s, "loss 0.31", 1700000000000));
  seed("trainer_state", actors::trainer_state_json({}, "", 0));
  seed("trainer_state", R"({"step": 3, "saved_ms": 12, "summary": "only what the index needs"})");
}

void manifest_seeds(const fs::path& tmp) {
  auto dir = ok(AtomicDir::begin((tmp / "run" / "step-1").string()), "AtomicDir::begin");
  ok(dir.write_file("trainer_state.json", "{\"step\": 1}"), "write_file");
  fs::create_directories(fs::path{dir.path()} / "model");
  ok(dir.write_file("model/config.json", "{}"), "write_file");
  ok(dir.commit(), "commit");
  seed("manifest", read(tmp / "run" / "step-1" / "manifest.json"));
  seed("manifest", R"({"files": {}})");
  seed("manifest", R"({"files": {"../x": {"bytes": 1, "fnv1a": "00"}, "a": 3}})");
}

// The Tinker API's JSON bodies, as SDK 0.16 (no type fields) and 0.18
// (every default) send them; byte 0 picks the endpoint (0 forward_backward,
// 1 forward, 2 asample; +0x80: the rest is a zstd frame).
void tinker_json_seeds() {
  const std::string datum =
      R"({"model_input": {"chunks": [{"tokens": [1, 2, 3], "type": "encoded_text"}]}, "loss_fn_inputs": )"
      R"({"target_tokens": {"data": [2, 3, 4], "dtype": "int64", "shape": [3]},)"
      R"( "weights": {"data": [1.0, 1.0, 0.5], "dtype": "float32", "shape": [3]}}})";
  const std::string fb = R"({"model_id": "m-1", "seq_id": 1, "forward_backward_input": {"data": [)" + datum +
                         R"(], "loss_fn": "cross_entropy", "loss_fn_config": null}})";
  const std::string fwd = R"({"model_id": "m-1", "seq_id": 2, "forward_input": {"data": [)" + datum +
                          R"(], "loss_fn": "importance_sampling", "loss_fn_config": {"clip": 0.2}}})";
  const std::string sparse =
      R"({"model_id": "m", "seq_id": 3, "forward_backward_input": {"loss_fn": "cross_entropy", "data": [)"
      R"({"model_input": {"chunks": [{"tokens": [5, 6]}]}, "loss_fn_inputs": {"target_tokens": {"data": [6, 7],)"
      R"( "dtype": "int64"}, "weights": {"sparse_crow_indices": [0, 1], "sparse_col_indices": [1], "data": [1.0],)"
      R"( "dtype": "float32", "shape": [1, 2]}}}]}})";
  const std::string sample =
      R"({"sampling_session_id": "s-1", "seq_id": 1, "num_samples": 2, "prompt": {"chunks": [{"tokens": [1, 2, 3]}]},)"
      R"( "sampling_params": {"max_tokens": 8, "temperature": 0.7, "top_k": -1, "top_p": 0.95, "seed": 3,)"
      R"( "stop": ["\n"]}, "prompt_logprobs": true, "topk_prompt_logprobs": 2, "type": "sample"})";
  const std::string sample_ids =
      R"({"sampling_session_id": "s-1", "prompt": {"chunks": [{"tokens": [9]}]}, "sampling_params": {"stop": [0, 7]}})";
  auto put = [](uint8_t how, const std::string& body) { seed("tinker_json", std::string(1, static_cast<char>(how)) + body); };
  put(0, fb);
  put(0, sparse);
  put(1, fwd);
  put(2, sample);
  put(2, sample_ids);
  put(0, R"({"model_id": "m", "seq_id": 1, "forward_backward_input": {"data": [], "loss_fn": "x"}})");
  for (const auto& body : {fb, sample}) {
    std::string frame(ZSTD_compressBound(body.size()), '\0');
    frame.resize(ZSTD_compress(frame.data(), frame.size(), body.data(), body.size(), 3));
    put(body == fb ? 0x80 : 0x82, frame);
  }
}

// Protobuf forward_backward bodies (SDK 0.19 and newer), dense and sparse.
void tinker_proto_seeds() {
  auto i32 = [](std::initializer_list<int32_t> v) {
    return std::string(reinterpret_cast<const char*>(std::data(v)), v.size() * 4);
  };
  auto i64 = [](std::initializer_list<int64_t> v) {
    return std::string(reinterpret_cast<const char*>(std::data(v)), v.size() * 8);
  };
  auto f32 = [](std::initializer_list<float> v) {
    return std::string(reinterpret_cast<const char*>(std::data(v)), v.size() * 4);
  };
  tinker_public::ForwardBackwardRequest r;
  r.set_model_id("model-123");
  r.set_seq_id(1);
  r.set_loss_fn("cross_entropy");
  auto* d = r.add_data();
  d->add_model_input()->mutable_encoded_text()->set_tokens(i32({1, 2, 3}));
  auto& targets = (*d->mutable_loss_fn_inputs())["target_tokens"];
  targets.set_dense(i64({2, 3, 4}));
  targets.set_dtype(tinker_public::DTYPE_INT64);
  auto& weights = (*d->mutable_loss_fn_inputs())["weights"];
  weights.set_dense(f32({1, 1, 0.5f}));
  weights.set_dtype(tinker_public::DTYPE_FLOAT32);
  weights.add_shape(3);
  seed("tinker_proto", r.SerializeAsString());
  auto* sparse = (*d->mutable_loss_fn_inputs())["advantages"].mutable_sparse_csr();
  sparse->set_values(f32({0.25f}));
  sparse->set_crow_indices(i64({0, 1}));
  sparse->set_col_indices(i64({2}));
  (*d->mutable_loss_fn_inputs())["advantages"].set_dtype(tinker_public::DTYPE_FLOAT32);
  (*d->mutable_loss_fn_inputs())["advantages"].add_shape(1);
  (*d->mutable_loss_fn_inputs())["advantages"].add_shape(3);
  (*r.mutable_loss_fn_config())["clip_low"] = 0.8;
  r.set_loss_fn("ppo");
  r.set_forward_only(true);
  *r.add_data() = *d;
  seed("tinker_proto", r.SerializeAsString());
}

// The Cap'n Proto requests' parameters, written by glint's own writers;
// byte 0 picks the method as fuzz/targets/capnp_request.cpp reads it.
void capnp_request_seeds() {
  using S = rpc::wire::Session;
  auto put = [](uint8_t method, capnp::MallocMessageBuilder& m) {
    auto words = capnp::messageToFlatArray(m);
    seed("capnp_request", std::string(1, static_cast<char>(method)) +
                              std::string(reinterpret_cast<const char*>(words.begin()), words.size() * sizeof(capnp::word)));
  };
  {
    capnp::MallocMessageBuilder m;
    auto p = m.initRoot<S::AddAdapterParams>();
    p.setName("alice-1");
    LoraConfig lora;
    lora.r = 4;
    lora.target_modules = {"all-linear"};
    rpc::write_lora(p.initLora(), lora);
    put(0, m);
  }
  {
    capnp::MallocMessageBuilder m;
    LossSpec loss;
    loss.kind = LossKind::ppo;
    loss.reduction = LossReduction::sum;
    rpc::write_loss(m.initRoot<S::SetLossParams>().initLoss(), loss);
    put(1, m);
  }
  {
    capnp::MallocMessageBuilder m;
    rpc::write_optimizer(m.initRoot<S::SetOptimizerParams>().initOptimizer(), OptimizerConfig{});
    put(2, m);
  }
  {
    capnp::MallocMessageBuilder m;
    SchedulerConfig sc;
    sc.kind = SchedulerConfig::Kind::cosine;
    sc.warmup_steps = 2;
    sc.total_steps = 10;
    rpc::write_scheduler(m.initRoot<S::SetLrSchedulerParams>().initScheduler(), sc);
    put(3, m);
  }
  {
    capnp::MallocMessageBuilder m;
    Batch b;
    b.tensors.emplace("input_ids", ok(Tensor::from_values(std::vector<int64_t>{1, 2, 3, 4, 5, 6}, {2, 3}), "ids"));
    b.tensors.emplace("loss_mask", ok(Tensor::from_values(std::vector<float>{0, 1, 1, 0, 1, 1}, {2, 3}), "mask"));
    b.fields["prompt"] = {"a", "b"};
    rpc::write_batch(m.initRoot<S::ForwardBackwardParams>().initBatch(), b, nullptr);
    put(4, m);
  }
  {
    capnp::MallocMessageBuilder m;
    auto p = m.initRoot<S::SampleParams>();
    SamplingParams sp;
    sp.num_samples = 2;
    sp.max_tokens = 4;
    sp.stop = {"\n"};
    rpc::write_sampling(p.initParams(), sp);
    rpc::write_requests(p.initRequests(2), {actors::SampleRequest{0, {1, 2, 3}}, actors::SampleRequest{1, {7}}});
    put(5, m);
  }
  {
    capnp::MallocMessageBuilder m;
    rpc::write_files(m.initRoot<S::LoadAdapterParams>().initFiles(2),
                     {{"adapter_config.json", "{}"}, {"adapter_model.safetensors", std::string(16, '\0')}});
    put(6, m);
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s CORPUS_DIR\n", argv[0]);
    return 2;
  }
  g_root = argv[1];
  const auto tmp = fs::temp_directory_path() / ("glint-fuzz-seeds-" + std::to_string(::getpid()));
  fs::remove_all(tmp);
  fs::create_directories(tmp);
  safetensors_seeds(tmp);
  model_config_seeds();
  tokenizer_seeds();
  tokenizer_config_seeds(tmp);
  chat_template_seeds();
  tool_calls_seeds();
  openai_seeds();
  lora_config_seeds();
  dataset_seeds(tmp);
  job_toml_seeds();
  trainer_state_seeds();
  manifest_seeds(tmp);
  tinker_json_seeds();
  tinker_proto_seeds();
  capnp_request_seeds();
  fs::remove_all(tmp);
  return 0;
}
