// GGUF: the file writer and reader, and the export of Llama, Qwen2 and
// Qwen3 models with their tokenizer, checked byte by byte against the
// Hugging Face weights (the llama.cpp cross-check is in
// gguf_llamacpp_test.cpp).
#include "components/checkpoint/gguf.hpp"
#include "components/data/tokenizer.hpp"
#include "components/model/gguf_export.hpp"
#include "components/model/lora_config.hpp"
#include "components/model/model.hpp"
#include "components/tensor/torch_bridge.hpp"
#include "support/gguf_models.hpp"
#include "support/temp_dir.hpp"

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>

namespace glint::components {
namespace {

namespace fs = std::filesystem;

template <class T>
const T& value(const GgufFile& f, const std::string& key) {
  const auto* v = f.find(key);
  EXPECT_NE(v, nullptr) << key;
  EXPECT_TRUE(v && std::holds_alternative<T>(*v)) << key;
  static const T none{};
  return v && std::holds_alternative<T>(*v) ? std::get<T>(*v) : none;
}

// The bytes of `name` in the file, as an f32 at::Tensor of its shape.
at::Tensor tensor_of(const std::string& path, const GgufFile& f, const std::string& name) {
  for (const auto& t : f.tensors)
    if (t.name == name) {
      auto out = *Tensor::zeros(t.dtype, t.shape);
      std::ifstream in{path, std::ios::binary};
      in.seekg(static_cast<std::streamoff>(f.data_offset + t.offset));
      in.read(reinterpret_cast<char*>(out.mutable_data()), static_cast<std::streamsize>(out.nbytes()));
      EXPECT_TRUE(in) << name;
      return to_torch(out).to(at::kFloat).clone();
    }
  ADD_FAILURE() << "no tensor " << name;
  return {};
}

std::string file_bytes(const std::string& path) {
  std::ifstream in{path, std::ios::binary};
  return {std::istreambuf_iterator<char>(in), {}};
}

TEST(Gguf, WritesTheLayoutOfTheSpecAndReadsItBack) {
  auto dir = glint::testing::fresh_dir("gguf-layout");
  const auto path = dir + "/t.gguf";
  GgufFile f;
  f.metadata = {{"a.u32", uint32_t{7}},
                {"a.i32", int32_t{-3}},
                {"a.u64", uint64_t{1} << 40},
                {"a.f32", 0.5f},
                {"a.bool", true},
                {"a.str", std::string{"héllo"}},
                {"a.strs", std::vector<std::string>{"x", "", "y z"}},
                {"a.i32s", std::vector<int32_t>{1, -2, 3}},
                {"a.f32s", std::vector<float>{1.5f}}};
  auto m = *Tensor::from_values(std::vector<float>{1, 2, 3, 4, 5, 6}, {2, 3});
  auto v = *Tensor::from_values(std::vector<float>{9}, {1});
  f.tensors.push_back({.name = "m", .shape = {2, 3}, .dtype = Dtype::f32, .data = [m] { return Result<Tensor>{m}; }});
  f.tensors.push_back({.name = "v", .shape = {1}, .dtype = Dtype::f32, .data = [v] { return Result<Tensor>{v}; }});
  std::vector<size_t> progress;
  ASSERT_TRUE(write_gguf(path, f, [&](size_t done) { progress.push_back(done); }));
  EXPECT_EQ(progress, (std::vector<size_t>{1, 2}));

  // The header as the spec lays it out: magic, version 3, counts.
  const auto bytes = file_bytes(path);
  ASSERT_GE(bytes.size(), 24u);
  EXPECT_EQ(bytes.substr(0, 4), "GGUF");
  uint32_t version = 0;
  uint64_t n_tensors = 0, n_kv = 0;
  std::memcpy(&version, bytes.data() + 4, 4);
  std::memcpy(&n_tensors, bytes.data() + 8, 8);
  std::memcpy(&n_kv, bytes.data() + 16, 8);
  EXPECT_EQ(version, 3u);
  EXPECT_EQ(n_tensors, 2u);
  EXPECT_EQ(n_kv, 9u);

  auto back = read_gguf_header(path);
  ASSERT_TRUE(back) << describe(back.error());
  EXPECT_EQ(back->metadata, f.metadata);
  ASSERT_EQ(back->tensors.size(), 2u);
  EXPECT_EQ(back->tensors[0].shape, (std::vector<int64_t>{2, 3}));  // ne {3, 2} in the file
  EXPECT_EQ(back->data_offset % 32, 0u);
  EXPECT_EQ(back->tensors[0].offset, 0u);
  EXPECT_EQ(back->tensors[1].offset, 32u);  // 24 bytes, padded to the alignment
  EXPECT_EQ(bytes.size(), back->data_offset + 32 + 32);  // the last tensor padded too, as ggml counts it
  EXPECT_TRUE(at::equal(tensor_of(path, *back, "m"), to_torch(m)));
  EXPECT_TRUE(at::equal(tensor_of(path, *back, "v"), to_torch(v)));
}

TEST(Gguf, RefusesWhatItCannotWriteAndDamagedFiles) {
  auto dir = glint::testing::fresh_dir("gguf-refuse");
  auto t = *Tensor::from_values(std::vector<float>{1, 2}, {2});
  auto data = [t] { return Result<Tensor>{t}; };
  GgufFile twice;
  twice.metadata = {{"k", uint32_t{1}}, {"k", uint32_t{2}}};
  EXPECT_FALSE(write_gguf(dir + "/a.gguf", twice));
  GgufFile wrong_shape;
  wrong_shape.tensors.push_back({.name = "t", .shape = {3}, .dtype = Dtype::f32, .data = data});
  auto r = write_gguf(dir + "/b.gguf", wrong_shape);
  ASSERT_FALSE(r);
  EXPECT_NE(describe(r.error()).find("declared"), std::string::npos) << describe(r.error());
  EXPECT_FALSE(fs::exists(dir + "/b.gguf"));  // nothing half-written under the name
  GgufFile int_tensor;
  int_tensor.tensors.push_back({.name = "t", .shape = {2}, .dtype = Dtype::i64, .data = data});
  EXPECT_FALSE(write_gguf(dir + "/c.gguf", int_tensor));

  GgufFile ok;
  ok.metadata = {{"k", std::string{"v"}}};
  ok.tensors.push_back({.name = "t", .shape = {2}, .dtype = Dtype::f32, .data = data});
  ASSERT_TRUE(write_gguf(dir + "/d.gguf", ok));
  auto bytes = file_bytes(dir + "/d.gguf");
  const auto tensor_at = read_gguf_header(dir + "/d.gguf")->data_offset;
  for (size_t cut : {size_t{3}, size_t{20}, size_t{30}, static_cast<size_t>(tensor_at + 4)}) {  // the last inside the tensor
    std::ofstream(dir + "/cut.gguf", std::ios::binary) << bytes.substr(0, cut);
    EXPECT_FALSE(read_gguf_header(dir + "/cut.gguf")) << "cut at " << cut;
  }
  std::ofstream(dir + "/magic.gguf", std::ios::binary) << "GGML" << bytes.substr(4);
  EXPECT_FALSE(read_gguf_header(dir + "/magic.gguf"));
}

struct ArchCase {
  Architecture arch;
  bool tie;
};

class GgufExport : public ::testing::TestWithParam<ArchCase> {};

TEST_P(GgufExport, WritesEveryWeightUnderGgmlsNameWithTheMetadataLlamaCppReads) {
  const auto [arch, tie] = GetParam();
  auto model_dir = glint::testing::tiny_model_dir("gguf-export", {.arch = arch, .tie = tie});
  const auto out = model_dir + "/model.gguf";
  auto done = export_gguf(model_dir, out);
  ASSERT_TRUE(done) << describe(done.error());
  auto lm = *CausalLM::load(model_dir);
  const auto& c = lm.config();
  auto f = read_gguf_header(out);
  ASSERT_TRUE(f) << describe(f.error());
  const std::string a = done->architecture;
  EXPECT_EQ(a, arch == Architecture::llama ? "llama" : arch == Architecture::qwen2 ? "qwen2" : "qwen3");
  EXPECT_EQ(value<std::string>(*f, "general.architecture"), a);
  EXPECT_EQ(value<uint32_t>(*f, "general.file_type"), 0u);  // all f32
  EXPECT_EQ(value<uint32_t>(*f, a + ".block_count"), 2u);
  EXPECT_EQ(value<uint32_t>(*f, a + ".embedding_length"), 64u);
  EXPECT_EQ(value<uint32_t>(*f, a + ".feed_forward_length"), 96u);
  EXPECT_EQ(value<uint32_t>(*f, a + ".attention.head_count"), 4u);
  EXPECT_EQ(value<uint32_t>(*f, a + ".attention.head_count_kv"), 2u);
  EXPECT_EQ(value<uint32_t>(*f, a + ".attention.key_length"), 16u);
  EXPECT_EQ(value<uint32_t>(*f, a + ".context_length"), static_cast<uint32_t>(c.max_position_embeddings));
  EXPECT_EQ(value<float>(*f, a + ".rope.freq_base"), static_cast<float>(c.rope_theta));
  EXPECT_EQ(value<float>(*f, a + ".attention.layer_norm_rms_epsilon"), static_cast<float>(c.rms_norm_eps));

  // The tokenizer: every id, the model's padding as [PAD] tokens of type unused.
  auto tok = *Tokenizer::load(model_dir);
  const auto& tokens = value<std::vector<std::string>>(*f, "tokenizer.ggml.tokens");
  const auto& types = value<std::vector<int32_t>>(*f, "tokenizer.ggml.token_type");
  ASSERT_EQ(static_cast<int64_t>(tokens.size()), c.vocab_size);
  ASSERT_EQ(types.size(), tokens.size());
  EXPECT_EQ(done->padded_tokens, 13);
  EXPECT_EQ(tokens[static_cast<size_t>(c.vocab_size - 1)], "[PAD" + std::to_string(c.vocab_size - 1) + "]");
  EXPECT_EQ(types[static_cast<size_t>(c.vocab_size - 1)], 5);
  const auto im_end = tok.token_id("<|im_end|>");
  EXPECT_EQ(tokens[static_cast<size_t>(im_end)], "<|im_end|>");
  EXPECT_EQ(types[static_cast<size_t>(im_end)], 3);  // control
  // Byte-level text, as tokenizer.json's vocabulary has it.
  auto tj = nlohmann::json::parse(std::ifstream{model_dir + "/tokenizer.json"});
  const auto space = tj["model"]["vocab"]["Ġ"].get<size_t>();
  EXPECT_EQ(tokens[space], "Ġ");
  EXPECT_EQ(types[space], 1);
  EXPECT_EQ(value<uint32_t>(*f, "tokenizer.ggml.eos_token_id"), static_cast<uint32_t>(im_end));
  EXPECT_EQ(value<uint32_t>(*f, "tokenizer.ggml.padding_token_id"),
            static_cast<uint32_t>(tok.token_id("<|endoftext|>")));
  EXPECT_EQ(f->find("tokenizer.ggml.bos_token_id"), nullptr);
  EXPECT_FALSE(value<bool>(*f, "tokenizer.ggml.add_bos_token"));
  EXPECT_EQ(value<std::string>(*f, "tokenizer.ggml.model"), "gpt2");
  EXPECT_EQ(value<std::string>(*f, "tokenizer.ggml.pre"), "qwen2");
  EXPECT_FALSE(value<std::vector<std::string>>(*f, "tokenizer.ggml.merges").empty());
  EXPECT_EQ(value<std::string>(*f, "tokenizer.chat_template"), *tok.config().chat_template);

  // Every weight, bit for bit; Llama's q and k rows in ggml's RoPE order.
  auto params = *lm.named_parameters();
  EXPECT_EQ(f->tensors.size(), params.size());
  EXPECT_EQ(done->tensors, params.size());
  std::set<std::string> names;
  for (const auto& t : f->tensors) names.insert(t.name);
  EXPECT_EQ(names.count("output.weight"), tie ? 0u : 1u);
  EXPECT_EQ(names.count("blk.1.attn_q_norm.weight"), arch == Architecture::qwen3 ? 1u : 0u);
  EXPECT_EQ(names.count("blk.0.attn_q.bias"), arch == Architecture::qwen2 ? 1u : 0u);
  auto hf = [&](const std::string& n) { return to_torch(std::find_if(params.begin(), params.end(), [&](auto& p) {
                                                          return p.first == n;
                                                        })->second); };
  EXPECT_TRUE(at::equal(tensor_of(out, *f, "token_embd.weight"), hf("model.embed_tokens.weight")));
  EXPECT_TRUE(at::equal(tensor_of(out, *f, "blk.1.ffn_down.weight"), hf("model.layers.1.mlp.down_proj.weight")));
  EXPECT_TRUE(at::equal(tensor_of(out, *f, "blk.0.attn_v.weight"), hf("model.layers.0.self_attn.v_proj.weight")));
  EXPECT_TRUE(at::equal(tensor_of(out, *f, "output_norm.weight"), hf("model.norm.weight")));
  auto q = hf("model.layers.0.self_attn.q_proj.weight"), k = hf("model.layers.0.self_attn.k_proj.weight");
  auto gq = tensor_of(out, *f, "blk.0.attn_q.weight"), gk = tensor_of(out, *f, "blk.0.attn_k.weight");
  if (arch == Architecture::llama) {
    // Head h's row 2i is HF's row i, row 2i+1 is HF's row half + i.
    const int64_t d = 16, half = 8;
    for (int64_t h : {0, 3})
      for (int64_t i : {0, 5, 7}) {
        EXPECT_TRUE(at::equal(gq[h * d + 2 * i], q[h * d + i]));
        EXPECT_TRUE(at::equal(gq[h * d + 2 * i + 1], q[h * d + half + i]));
      }
    EXPECT_TRUE(at::equal(gk[1 * d + 3], k[1 * d + half + 1]));
    EXPECT_FALSE(at::equal(gq, q));
  } else {
    EXPECT_TRUE(at::equal(gq, q));
    EXPECT_TRUE(at::equal(gk, k));
  }
}

INSTANTIATE_TEST_SUITE_P(Archs, GgufExport,
                         ::testing::Values(ArchCase{Architecture::llama, false}, ArchCase{Architecture::qwen2, true},
                                           ArchCase{Architecture::qwen3, false}, ArchCase{Architecture::qwen3, true}),
                         [](const auto& info) {
                           const auto& p = info.param;
                           return std::string{p.arch == Architecture::llama   ? "Llama"
                                              : p.arch == Architecture::qwen2 ? "Qwen2"
                                                                              : "Qwen3"} +
                                  (p.tie ? "Tied" : "");
                         });

TEST(GgufExportDtypes, MatricesTakeTheAskedTypeAndVectorsStayF32) {
  auto model_dir = glint::testing::tiny_model_dir("gguf-dtype", {.dtype = Dtype::bf16});
  auto lm = *CausalLM::load(model_dir);
  auto embed = to_torch((*lm.named_parameters())[0].second);
  for (Dtype d : {Dtype::f16, Dtype::bf16}) {
    const auto out = model_dir + "/" + std::string{to_string(d)} + ".gguf";
    auto done = export_gguf(model_dir, out, {.dtype = d});
    ASSERT_TRUE(done) << describe(done.error());
    auto f = *read_gguf_header(out);
    EXPECT_EQ(value<uint32_t>(f, "general.file_type"), d == Dtype::f16 ? 1u : 32u);
    for (const auto& t : f.tensors) EXPECT_EQ(t.dtype, t.shape.size() == 1 ? Dtype::f32 : d) << t.name;
    EXPECT_TRUE(at::equal(tensor_of(out, f, "token_embd.weight"), embed.to(to_torch(d)).to(at::kFloat)));
  }
  // No dtype asked: the model's stored one (bf16), which loses nothing.
  auto done = export_gguf(model_dir + "/", model_dir + "/default.gguf");
  ASSERT_TRUE(done);
  EXPECT_EQ(done->dtype, Dtype::bf16);
  // general.name is the directory's, with or without a trailing slash.
  EXPECT_EQ(value<std::string>(*read_gguf_header(model_dir + "/default.gguf"), "general.name"),
            fs::path{model_dir}.filename().string());
  EXPECT_FALSE(export_gguf(model_dir, model_dir + "/x.gguf", {.dtype = Dtype::i64}));
}

TEST(GgufExportLora, TheAdapterIsMergedIntoTheWeights) {
  auto model_dir = glint::testing::tiny_model_dir("gguf-lora");
  auto lm = *CausalLM::load(model_dir);
  LoraConfig cfg;
  cfg.r = 4;
  cfg.alpha = 8;
  cfg.target_modules = {"q_proj", "down_proj"};
  ASSERT_TRUE(lm.add_adapter("a", cfg, 1));
  // A trained adapter has B != 0; make it so.
  auto adapter = *lm.adapter_parameters("a");
  for (auto& [name, t] : adapter) to_torch(t).normal_(0, 0.05);
  const auto adapter_dir = model_dir + "/adapter";
  ASSERT_TRUE(lm.save_adapter("a", adapter_dir));
  auto merged = *lm.merged_parameters("a");

  const auto out = model_dir + "/merged.gguf";
  ASSERT_TRUE(export_gguf(model_dir, out, {.adapter = adapter_dir}));
  auto f = *read_gguf_header(out);
  auto of = [&](const std::string& n) {
    for (auto& [k, v] : merged)
      if (k == n) return to_torch(v);
    return at::Tensor{};
  };
  EXPECT_TRUE(at::equal(tensor_of(out, f, "blk.1.ffn_down.weight"), of("model.layers.1.mlp.down_proj.weight")));
  EXPECT_TRUE(at::equal(tensor_of(out, f, "blk.0.attn_q.weight"), of("model.layers.0.self_attn.q_proj.weight")));
  auto base = *CausalLM::load(model_dir);
  auto base_params = *base.named_parameters();
  for (auto& [k, v] : base_params) {
    if (k == "model.layers.0.self_attn.q_proj.weight") {
      EXPECT_FALSE(at::equal(of(k), to_torch(v)));  // the adapter changed it
    }
  }
}

// What Hugging Face's tokenizer(text) adds, as llama.cpp must add it too:
// Llama 3 puts its TemplateProcessing inside a Sequence post-processor.
TEST(GgufExportTokenizer, BosAndEosAdditionAndControlTokensFollowHuggingFace) {
  auto model_dir = glint::testing::tiny_model_dir("gguf-bos");
  auto j = nlohmann::json::parse(std::ifstream{model_dir + "/tokenizer.json"});
  j["post_processor"] = {
      {"type", "Sequence"},
      {"processors",
       {{{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", false}, {"use_regex", false}},
        {{"type", "TemplateProcessing"},
         {"single", {{{"SpecialToken", {{"id", "<|endoftext|>"}, {"type_id", 0}}}},
                     {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}}},
         {"pair", nlohmann::json::array()},
         {"special_tokens", nlohmann::json::object()}}}}};
  // An added token not marked special that looks like one: control, as the converter types it.
  const int64_t fim = j["added_tokens"].back()["id"].get<int64_t>() + 1;
  j["added_tokens"].push_back({{"id", fim}, {"content", "<|fim_prefix|>"}, {"special", false}});
  j["added_tokens"].push_back({{"id", fim + 1}, {"content", "plain added"}, {"special", false}});
  std::ofstream{model_dir + "/tokenizer.json"} << j.dump();
  auto tc = nlohmann::json::parse(std::ifstream{model_dir + "/tokenizer_config.json"});
  tc["bos_token"] = "<|endoftext|>";
  std::ofstream{model_dir + "/tokenizer_config.json"} << tc.dump();
  const auto out = model_dir + "/bos.gguf";
  auto done = export_gguf(model_dir, out);
  ASSERT_TRUE(done) << describe(done.error());
  auto f = *read_gguf_header(out);
  EXPECT_TRUE(value<bool>(f, "tokenizer.ggml.add_bos_token"));
  EXPECT_FALSE(value<bool>(f, "tokenizer.ggml.add_eos_token"));
  const auto& types = value<std::vector<int32_t>>(f, "tokenizer.ggml.token_type");
  EXPECT_EQ(types[static_cast<size_t>(fim)], 3);
  EXPECT_EQ(types[static_cast<size_t>(fim + 1)], 4);
  // tokenizer_config's add_eos_token wins over the template.
  tc["add_eos_token"] = true;
  tc["add_bos_token"] = false;
  std::ofstream{model_dir + "/tokenizer_config.json"} << tc.dump();
  ASSERT_TRUE(export_gguf(model_dir, out));
  f = *read_gguf_header(out);
  EXPECT_FALSE(value<bool>(f, "tokenizer.ggml.add_bos_token"));
  EXPECT_TRUE(value<bool>(f, "tokenizer.ggml.add_eos_token"));
}

TEST(GgufExportRefusals, WhatLlamaCppWouldComputeOtherwiseIsRefusedAndNothingIsWritten) {
  auto model_dir = glint::testing::tiny_model_dir("gguf-refuse");
  auto edit_config = [&](const std::function<void(nlohmann::json&)>& change) {
    auto dir = glint::testing::fresh_dir("gguf-refuse-edit");
    for (const auto& e : fs::directory_iterator(model_dir)) fs::copy(e.path(), dir + "/" + e.path().filename().string());
    nlohmann::json j = nlohmann::json::parse(std::ifstream{dir + "/config.json"});
    change(j);
    std::ofstream{dir + "/config.json"} << j.dump();
    return dir;
  };
  auto refused = [](const std::string& dir, const std::string& why, const std::string& tokenizer = {}) {
    auto r = export_gguf(dir, dir + "/out.gguf", {.tokenizer = tokenizer});
    ASSERT_FALSE(r) << dir;
    EXPECT_NE(describe(r.error()).find(why), std::string::npos) << describe(r.error());
    EXPECT_FALSE(fs::exists(dir + "/out.gguf"));
  };
  refused(edit_config([](auto& j) { j["hidden_act"] = "gelu"; }), "hidden_act");
  refused(edit_config([](auto& j) {
            j["use_sliding_window"] = true;
            j["sliding_window"] = 8;
            j["max_window_layers"] = 0;
          }),
          "sliding-window");
  {  // Qwen3 with attention biases: llama.cpp's qwen3 has none.
    auto dir = edit_config([](auto&) {});
    auto cfg = *ModelConfig::load(dir + "/config.json");
    cfg.qkv_bias = cfg.o_bias = true;
    ASSERT_TRUE(CausalLM::init_random(cfg, 1)->save(dir));
    refused(dir, "biases");
  }
  // Llama 3.1's RoPE scaling is exported for Llama only.
  refused(edit_config([](auto& j) {
            j["rope_parameters"] = {{"rope_type", "llama3"}, {"factor", 8.0}, {"low_freq_factor", 1.0},
                                    {"high_freq_factor", 4.0}, {"original_max_position_embeddings", 64},
                                    {"rope_theta", 1e6}};
          }),
          "RoPE scaling");
  // The tokenizer: missing, not byte-level, an unknown pre-tokenizer, ids past the vocabulary.
  auto no_tok = edit_config([](auto&) {});
  fs::remove(no_tok + "/tokenizer.json");
  refused(no_tok, "tokenizer.json is missing");
  auto edit_tokenizer = [&](const std::function<void(nlohmann::json&)>& change) {
    auto dir = edit_config([](auto&) {});
    nlohmann::json j = nlohmann::json::parse(std::ifstream{dir + "/tokenizer.json"});
    change(j);
    std::ofstream{dir + "/tokenizer.json"} << j.dump();
    return dir;
  };
  refused(edit_tokenizer([](auto& j) { j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "\\s+|\\S+"; }),
          "pre-tokenizer");
  refused(edit_tokenizer([](auto& j) { j["decoder"] = {{"type", "Metaspace"}}; }), "ByteLevel");
  refused(edit_tokenizer([](auto& j) { j["normalizer"] = {{"type", "Lowercase"}}; }), "normalizer");
  refused(edit_tokenizer([](auto& j) { j["added_tokens"].push_back({{"id", 100000}, {"content", "<x>"}}); }),
          "past the model's vocabulary");
  refused(edit_tokenizer([](auto& j) { j["pre_tokenizer"]["pretokenizers"][1]["add_prefix_space"] = true; }),
          "add_prefix_space");
  refused(edit_tokenizer([](auto& j) { j["model"]["byte_fallback"] = true; }), "byte_fallback");
  refused(edit_tokenizer([](auto& j) { j["model"]["ignore_merges"] = true; }), "ignore_merges");
  // A field of the wrong JSON type is an error that names the file, not a crash.
  refused(edit_tokenizer([](auto& j) { j["added_tokens"][0]["id"] = "seven"; }), "has a field glint cannot read");
}

}  // namespace
}  // namespace glint::components
