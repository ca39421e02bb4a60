#include "components/model/gguf_export.hpp"

#include "components/checkpoint/gguf.hpp"
#include "components/data/detail/regex.hpp"
#include "components/data/tokenizer_config.hpp"
#include "components/model/lora_config.hpp"
#include "components/model/model.hpp"
#include "components/model/transformer.hpp"
#include "components/tensor/torch_bridge.hpp"
#include "runtime/text.hpp"

#include <nlohmann/json.hpp>

#include <ATen/ATen.h>

#include <filesystem>
#include <fstream>
#include <algorithm>
#include <map>
#include <optional>
#include <regex>
#include <sstream>

namespace glint::components {

namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

caf::error refuse(const std::string& what) {
  return make_error(errc::unimplemented, "cannot export to GGUF: " + what);
}

// llama.cpp's architecture names: Hugging Face's model_type, without the
// underscore for the MoE families (qwen3moe, qwen2moe).
std::string arch_name(Architecture a) {
  std::string n{model_type(a)};
  if (is_moe(a)) n.erase(std::remove(n.begin(), n.end(), '_'), n.end());
  return n;
}

// llama_ftype: what most of the file's matrices are.
uint32_t file_type_of(Dtype d) { return d == Dtype::f16 ? 1 : d == Dtype::bf16 ? 32 : 0; }

// What llama.cpp computes for the architecture, checked against the config.
Result<void> check_config(const ModelConfig& c) {
  if (is_hybrid(c.architecture))
    return refuse(std::string{hf_class_name(c.architecture)} +
                  ": GGUF export of the Qwen3.5 family (Gated DeltaNet layers, gated attention) is not built yet; "
                  "glint would have to write llama.cpp's qwen35 tensor layout, and the llama.cpp it is tested "
                  "against does not run that architecture");
  if (is_moe(c.architecture)) {
    // llama.cpp builds every layer of these families as a sparse block,
    // renormalises the k weights for Qwen3-MoE and never for Qwen2-MoE.
    const auto family = std::string{hf_class_name(c.architecture)} + " (llama.cpp's " + arch_name(c.architecture) + ")";
    for (int64_t l = 0; l < c.num_hidden_layers; ++l)
      if (c.feed_forward(l) != FeedForward::sparse)
        return refuse("layer " + std::to_string(l) + " is a dense MLP (decoder_sparse_step " +
                      std::to_string(c.moe.decoder_sparse_step) + ", mlp_only_layers [" + join(c.moe.mlp_only_layers) +
                      "]); " + family + " makes every layer a mixture of experts");
    const bool renormalises = c.architecture == Architecture::qwen3_moe;
    if (c.moe.norm_topk_prob != renormalises)
      return refuse(std::string{"norm_topk_prob is "} + (c.moe.norm_topk_prob ? "true" : "false") + "; " + family +
                    (renormalises ? " always renormalises" : " never renormalises") +
                    " the chosen experts' weights, so the file would compute another model (" +
                    (renormalises ? "Qwen3-30B-A3B and its kin have it true" : "Qwen1.5-MoE has it false") + ")");
  }
  if (c.hidden_act != Activation::silu)
    return refuse("hidden_act is '" + std::string{activation_name(c.hidden_act)} +
                  "'; llama.cpp's " + arch_name(c.architecture) + " uses SiLU");
  for (int64_t l = 0; l < c.num_hidden_layers; ++l)
    if (c.window(l) > 0)
      return refuse("layer " + std::to_string(l) + " uses sliding-window attention (" + std::to_string(c.sliding_window) +
                    " tokens); llama.cpp's " + arch_name(c.architecture) + " attends to every earlier token");
  const bool qkv_ok = c.architecture == Architecture::qwen2 || c.architecture == Architecture::qwen2_moe || !c.qkv_bias;
  if (!qkv_ok || c.o_bias || c.mlp_bias)
    return refuse(std::string{"the model has biases on "} + (!qkv_ok ? "q/k/v" : c.o_bias ? "o_proj" : "the MLP") +
                  " (attention_bias / mlp_bias); glint exports Qwen2's q/k/v biases only");
  if (c.rope_scaling.type == RopeScaling::Type::llama3 && c.architecture != Architecture::llama)
    return refuse("Llama 3.1's RoPE scaling on " + arch_name(c.architecture) + "; llama.cpp reads its rope_freqs for "
                  "Llama only");
  if (c.head_dim % 2 != 0) return refuse("head_dim " + std::to_string(c.head_dim) + " is odd; RoPE needs pairs");
  return {};
}

// Hugging Face's Llama q/k rows are in the rotate-half order (each head's
// first half, then its second); ggml's Llama RoPE rotates interleaved pairs.
// The same reordering as convert_hf_to_gguf.py: per head, rows (i, half + i)
// become neighbours.
at::Tensor interleave_heads(const at::Tensor& w, int64_t heads) {
  auto shape = w.sizes().vec();
  std::vector<int64_t> split{heads, 2, w.size(0) / heads / 2};
  for (size_t i = 1; i < shape.size(); ++i) split.push_back(shape[i]);
  return w.reshape(split).transpose(1, 2).reshape(shape).contiguous();
}

// ggml's name for a Hugging Face parameter; empty when it has none.
std::string gguf_name(const std::string& hf) {
  static const std::map<std::string, std::string> top = {{"model.embed_tokens.weight", "token_embd.weight"},
                                                         {"model.norm.weight", "output_norm.weight"},
                                                         {"lm_head.weight", "output.weight"}};
  if (auto it = top.find(hf); it != top.end()) return it->second;
  static const std::string prefix = "model.layers.";
  if (hf.rfind(prefix, 0) != 0) return {};
  auto dot = hf.find('.', prefix.size());
  if (dot == std::string::npos) return {};
  const auto layer = hf.substr(prefix.size(), dot - prefix.size());
  const auto rest = hf.substr(dot + 1);
  static const std::map<std::string, std::string> in_layer = {
      {"input_layernorm.weight", "attn_norm.weight"},
      {"self_attn.q_proj.weight", "attn_q.weight"},
      {"self_attn.k_proj.weight", "attn_k.weight"},
      {"self_attn.v_proj.weight", "attn_v.weight"},
      {"self_attn.q_proj.bias", "attn_q.bias"},
      {"self_attn.k_proj.bias", "attn_k.bias"},
      {"self_attn.v_proj.bias", "attn_v.bias"},
      {"self_attn.o_proj.weight", "attn_output.weight"},
      {"self_attn.q_norm.weight", "attn_q_norm.weight"},
      {"self_attn.k_norm.weight", "attn_k_norm.weight"},
      {"post_attention_layernorm.weight", "ffn_norm.weight"},
      {"mlp.gate_proj.weight", "ffn_gate.weight"},
      {"mlp.up_proj.weight", "ffn_up.weight"},
      {"mlp.down_proj.weight", "ffn_down.weight"},
      // Mixture of experts: the router, and Qwen2-MoE's shared expert and
      // its gate (the routed experts go stacked: gguf_expert_name).
      {"mlp.gate.weight", "ffn_gate_inp.weight"},
      {"mlp.shared_expert.gate_proj.weight", "ffn_gate_shexp.weight"},
      {"mlp.shared_expert.up_proj.weight", "ffn_up_shexp.weight"},
      {"mlp.shared_expert.down_proj.weight", "ffn_down_shexp.weight"},
      {"mlp.shared_expert_gate.weight", "ffn_gate_inp_shexp.weight"},
  };
  auto it = in_layer.find(rest);
  return it == in_layer.end() ? std::string{} : "blk." + layer + "." + it->second;
}

// A routed expert's parameter (model.layers.L.mlp.experts.N.P.weight): its
// layer, expert and projection; nullopt for any other.
struct ExpertParam {
  int64_t layer = 0, expert = 0;
  std::string proj;  ///< gate_proj, up_proj, down_proj
};
std::optional<ExpertParam> expert_param(const std::string& hf) {
  static const std::regex re{R"(^model\.layers\.(\d+)\.mlp\.experts\.(\d+)\.(gate_proj|up_proj|down_proj)\.weight$)"};
  std::smatch m;
  if (!std::regex_match(hf, m, re)) return std::nullopt;
  return ExpertParam{std::stoll(m[1]), std::stoll(m[2]), m[3]};
}

Result<json> read_json(const fs::path& path) {
  std::ifstream in{path};
  if (!in) return make_error(errc::not_found, "cannot read " + path.string());
  std::stringstream ss;
  ss << in.rdbuf();
  try {
    return json::parse(ss.str());
  } catch (const std::exception& e) {
    return make_error(errc::invalid_argument, path.string() + " is not valid JSON: " + e.what());
  }
}

// llama.cpp's name for a byte-level BPE pre-tokenizer, from its regex.
Result<std::string> pre_tokenizer_name(const json& pre, const std::string& origin) {
  static const std::string llama3 =
      R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
  auto is_byte_level = [](const json& p) { return p.is_object() && p.value("type", "") == "ByteLevel"; };
  const auto& level = is_byte_level(pre) ? pre
                      : pre.is_object() && pre.contains("pretokenizers") && pre["pretokenizers"].is_array() &&
                              !pre["pretokenizers"].empty()
                          ? pre["pretokenizers"].back()
                          : pre;
  if (is_byte_level(level) && level.value("add_prefix_space", false))
    return refuse(origin + ": the ByteLevel pre-tokenizer has add_prefix_space true (a space before every text); "
                           "llama.cpp's byte-level pre-tokenizers add none");
  std::string pattern;
  if (is_byte_level(pre) && pre.value("use_regex", true)) {
    pattern = detail::kGpt2Pattern;
  } else if (pre.is_object() && pre.value("type", "") == "Sequence" && pre.contains("pretokenizers") &&
             pre["pretokenizers"].size() == 2 && is_byte_level(pre["pretokenizers"][1]) &&
             !pre["pretokenizers"][1].value("use_regex", true)) {
    const auto& split = pre["pretokenizers"][0];
    if (split.value("type", "") == "Split" && split.contains("pattern") && split["pattern"].contains("Regex") &&
        split.value("behavior", "") == "Isolated" && !split.value("invert", false))
      pattern = split["pattern"]["Regex"].get<std::string>();
  }
  if (pattern == detail::kQwen2Pattern) return std::string{"qwen2"};
  if (pattern == llama3) return std::string{"llama-bpe"};
  if (pattern == detail::kGpt2Pattern) return std::string{"gpt-2"};
  return refuse(origin + ": the pre-tokenizer " + pre.dump().substr(0, 200) +
                " is not one llama.cpp knows by name; glint exports Qwen2's, Llama 3's and GPT-2's byte-level "
                "splits (tokenizer.ggml.pre qwen2, llama-bpe, gpt-2)");
}

struct Vocabulary {
  std::vector<std::string> tokens;
  std::vector<int32_t> types;
  std::vector<std::string> merges;
  std::string pre;
  int64_t padded = 0;
};

// An added token that is not marked special but looks like a control token
// (<|...|>, <｜...｜>, <pad>, <mask>, <unused...>): convert_hf_to_gguf.py
// types these control too, so llama.cpp neither matches them in plain text
// nor prints them (Qwen2.5's <|fim_prefix|> and <|file_sep|>, say).
bool looks_special(const std::string& t) {
  auto wrapped = [&](std::string_view open, std::string_view close) {
    return t.size() >= open.size() + close.size() && t.compare(0, open.size(), open) == 0 &&
           t.compare(t.size() - close.size(), close.size(), close) == 0;
  };
  return t == "<pad>" || t == "<mask>" || wrapped("<|", "|>") || wrapped("<\xef\xbd\x9c", "\xef\xbd\x9c>") ||
         wrapped("<unused", ">");
}

// tokenizer.ggml.* as convert_hf_to_gguf.py's get_vocab_base writes it.
Result<Vocabulary> read_vocabulary(const json* j, const std::string& origin, int64_t model_vocab) {
  if (!j->is_object()) return refuse(origin + " is not a JSON object");
  const auto& model = (*j)["model"];
  if (!model.is_object() || model.value("type", "") != "BPE" || !model.contains("vocab") || !model["vocab"].is_object())
    return refuse(origin + ": the model is not BPE; glint exports byte-level BPE tokenizers (GPT-2, Qwen, Llama 3)");
  if (!(*j)["decoder"].is_object() || (*j)["decoder"].value("type", "") != "ByteLevel")
    return refuse(origin + ": the decoder is not ByteLevel; glint exports byte-level BPE tokenizers (GPT-2, Qwen, "
                           "Llama 3), not SentencePiece-style ones");
  if (const auto& n = (*j)["normalizer"]; !n.is_null() && !(n.is_object() && n.value("type", "") == "NFC"))
    return refuse(origin + ": the normalizer " + n.dump().substr(0, 200) + " has no llama.cpp counterpart");
  for (const char* f : {"continuing_subword_prefix", "end_of_word_suffix", "dropout"})
    if (model.contains(f) && !model[f].is_null())
      return refuse(origin + ": model." + f + " is " + model[f].dump() + "; llama.cpp's BPE has none");
  if (model.value("byte_fallback", false))
    return refuse(origin + ": model.byte_fallback is true; llama.cpp's byte-level BPE has no byte fallback");
  Vocabulary v;
  auto pre = pre_tokenizer_name((*j)["pre_tokenizer"], origin);
  if (!pre) return pre.error();
  v.pre = *pre;
  // llama.cpp fixes ignore_merges by the pre-tokenizer: on for Llama 3's, off otherwise.
  const bool ignore_merges = model.value("ignore_merges", false);
  if (ignore_merges != (v.pre == "llama-bpe"))
    return refuse(origin + ": model.ignore_merges is " + (ignore_merges ? "true" : "false") +
                  ", but llama.cpp's '" + v.pre + "' pre-tokenizer has it " + (ignore_merges ? "off" : "on"));
  v.tokens.assign(static_cast<size_t>(model_vocab), {});
  v.types.assign(static_cast<size_t>(model_vocab), 0);
  auto place = [&](int64_t id, const std::string& text, int32_t type) -> Result<void> {
    if (id < 0 || id >= model_vocab)
      return refuse(origin + ": token '" + text + "' has id " + std::to_string(id) +
                    ", past the model's vocabulary of " + std::to_string(model_vocab) + " (config.json vocab_size)");
    v.tokens[static_cast<size_t>(id)] = text;
    v.types[static_cast<size_t>(id)] = type;
    return {};
  };
  constexpr int32_t normal = 1, control = 3, user_defined = 4, unused = 5;
  for (const auto& [text, id] : model["vocab"].items())
    if (auto ok = place(id.get<int64_t>(), text, normal); !ok) return ok.error();
  if ((*j).contains("added_tokens"))
    for (const auto& t : (*j)["added_tokens"]) {
      const auto content = t.at("content").get<std::string>();
      if (auto ok = place(t.at("id").get<int64_t>(), content,
                          t.value("special", false) || looks_special(content) ? control : user_defined);
          !ok)
        return ok.error();
    }
  for (int64_t id = 0; id < model_vocab; ++id)
    if (v.types[static_cast<size_t>(id)] == 0) {
      v.tokens[static_cast<size_t>(id)] = "[PAD" + std::to_string(id) + "]";
      v.types[static_cast<size_t>(id)] = unused;
      ++v.padded;
    }
  if (model.contains("merges"))
    for (const auto& m : model["merges"]) {
      if (m.is_string()) v.merges.push_back(m.get<std::string>());
      else if (m.is_array() && m.size() == 2) v.merges.push_back(m[0].get<std::string>() + " " + m[1].get<std::string>());
      else return refuse(origin + ": a merge is " + m.dump() + ", neither \"a b\" nor [\"a\", \"b\"]");
    }
  return v;
}

// Whether Hugging Face's tokenizer(text) adds the bos (first) and eos
// (second) tokens: tokenizer_config's add_bos_token / add_eos_token, else a
// TemplateProcessing post-processor (alone or in a Sequence, as Llama 3's
// is) whose single-sequence template starts with the bos or ends with the
// eos token, as gguf-py's SpecialVocab reads them.
std::pair<bool, bool> adds_bos_eos(const json& tokenizer, const TokenizerConfig& tc) {
  bool bos = false, eos = false;
  const auto& pp = tokenizer.contains("post_processor") ? tokenizer["post_processor"] : json{};
  std::vector<json> processors;
  if (pp.is_object() && pp.value("type", "") == "Sequence" && pp.contains("processors") && pp["processors"].is_array())
    for (const auto& p : pp["processors"]) processors.push_back(p);
  else if (pp.is_object())
    processors.push_back(pp);
  auto role = [&](const char* name) {
    auto it = tc.special_tokens.find(name);
    return it == tc.special_tokens.end() ? std::string{} : it->second;
  };
  auto special = [](const json& piece) {
    return piece.is_object() && piece.contains("SpecialToken") && piece["SpecialToken"].is_object()
               ? piece["SpecialToken"].value("id", "")
               : std::string{};
  };
  for (const auto& p : processors) {
    if (!p.is_object() || p.value("type", "") != "TemplateProcessing" || !p.contains("single") ||
        !p["single"].is_array() || p["single"].size() < 2)
      continue;
    const auto& single = p["single"];
    if (!role("bos_token").empty() && special(single.front()) == role("bos_token")) bos = true;
    if (!role("eos_token").empty() && special(single.back()) == role("eos_token")) eos = true;
  }
  return {tc.add_bos_token.value_or(bos), tc.add_eos_token.value_or(eos)};
}

}  // namespace

Result<GgufExportSummary> export_gguf(const std::string& model_dir, const std::string& out,
                                      const GgufExportOptions& options) {
  auto lm = CausalLM::load(model_dir);
  if (!lm) return lm.error();
  const auto& cfg = lm->config();
  if (auto ok = check_config(cfg); !ok) return ok.error();
  const Dtype dtype = options.dtype.value_or(cfg.dtype);
  if (dtype != Dtype::f32 && dtype != Dtype::f16 && dtype != Dtype::bf16)
    return make_error(errc::invalid_argument, "cannot export to GGUF in " + std::string{to_string(dtype)} +
                                                  "; choose f32, f16 or bf16");
  if (!options.adapter.empty()) {
    if (auto ok = lm->load_adapter("export", options.adapter); !ok) return ok.error();
    if (auto ok = lm->merge_adapter("export"); !ok) return ok.error();
  }

  // The tokenizer.
  const fs::path tok_dir{options.tokenizer.empty() ? model_dir : options.tokenizer};
  const auto tok_file = tok_dir / "tokenizer.json";
  if (!fs::exists(tok_file))
    return refuse(tok_file.string() + " is missing; llama.cpp needs the model's vocabulary (give the directory that "
                                      "has it with --tokenizer)");
  auto tokenizer = read_json(tok_file);
  if (!tokenizer) return tokenizer.error();
  auto tc = TokenizerConfig::load_dir(tok_dir.string());
  if (!tc) return tc.error();
  Result<Vocabulary> vocab = make_error(errc::internal, "unread");
  std::pair<bool, bool> adds{false, false};
  try {  // a field of the wrong JSON type is an error, not a crash
    vocab = read_vocabulary(&*tokenizer, tok_file.string(), cfg.vocab_size);
    adds = adds_bos_eos(*tokenizer, *tc);
  } catch (const std::exception& e) {
    return make_error(errc::invalid_argument, tok_file.string() + " has a field glint cannot read: " + e.what());
  }
  if (!vocab) return vocab.error();
  auto id_of = [&](const std::string& text) -> int64_t {
    for (size_t i = 0; i < vocab->tokens.size(); ++i)
      if (vocab->tokens[i] == text) return static_cast<int64_t>(i);
    return -1;
  };
  auto special_id = [&](const char* role) -> int64_t {
    auto it = tc->special_tokens.find(role);
    return it == tc->special_tokens.end() ? -1 : id_of(it->second);
  };
  int64_t bos = special_id("bos_token"), eos = special_id("eos_token"), pad = special_id("pad_token");
  if (bos < 0) bos = cfg.bos_token_id;
  if (eos < 0 && !cfg.eos_token_ids.empty()) eos = cfg.eos_token_ids.front();

  const auto arch = arch_name(cfg.architecture);
  auto u32 = [](int64_t v) { return static_cast<uint32_t>(v); };
  GgufFile f;
  auto& m = f.metadata;
  m.emplace_back("general.architecture", arch);
  m.emplace_back("general.type", std::string{"model"});
  auto dir_name = fs::absolute(model_dir).lexically_normal();
  if (dir_name.filename().empty()) dir_name = dir_name.parent_path();  // "models/arith/"
  m.emplace_back("general.name", options.name.empty() ? dir_name.filename().string() : options.name);
  m.emplace_back("general.file_type", file_type_of(dtype));
  m.emplace_back("general.quantization_version", uint32_t{2});
  m.emplace_back(arch + ".vocab_size", u32(cfg.vocab_size));
  m.emplace_back(arch + ".context_length", u32(cfg.max_position_embeddings));
  m.emplace_back(arch + ".embedding_length", u32(cfg.hidden_size));
  m.emplace_back(arch + ".block_count", u32(cfg.num_hidden_layers));
  m.emplace_back(arch + ".feed_forward_length", u32(cfg.intermediate_size));
  m.emplace_back(arch + ".attention.head_count", u32(cfg.num_attention_heads));
  m.emplace_back(arch + ".attention.head_count_kv", u32(cfg.num_key_value_heads));
  m.emplace_back(arch + ".attention.key_length", u32(cfg.head_dim));
  m.emplace_back(arch + ".attention.value_length", u32(cfg.head_dim));
  m.emplace_back(arch + ".rope.dimension_count", u32(cfg.head_dim));
  m.emplace_back(arch + ".rope.freq_base", static_cast<float>(cfg.rope_theta));
  m.emplace_back(arch + ".attention.layer_norm_rms_epsilon", static_cast<float>(cfg.rms_norm_eps));
  if (cfg.rope_scaling.type == RopeScaling::Type::linear) {
    m.emplace_back(arch + ".rope.scaling.type", std::string{"linear"});
    m.emplace_back(arch + ".rope.scaling.factor", static_cast<float>(cfg.rope_scaling.factor));
  }
  m.emplace_back("tokenizer.ggml.model", std::string{"gpt2"});
  m.emplace_back("tokenizer.ggml.pre", vocab->pre);
  m.emplace_back("tokenizer.ggml.tokens", vocab->tokens);
  m.emplace_back("tokenizer.ggml.token_type", vocab->types);
  m.emplace_back("tokenizer.ggml.merges", vocab->merges);
  if (bos >= 0) m.emplace_back("tokenizer.ggml.bos_token_id", u32(bos));
  if (eos >= 0) m.emplace_back("tokenizer.ggml.eos_token_id", u32(eos));
  if (pad >= 0) m.emplace_back("tokenizer.ggml.padding_token_id", u32(pad));
  m.emplace_back("tokenizer.ggml.add_bos_token", adds.first);
  m.emplace_back("tokenizer.ggml.add_eos_token", adds.second);
  if (tc->chat_template) m.emplace_back("tokenizer.chat_template", *tc->chat_template);

  if (is_moe(cfg.architecture)) {
    m.emplace_back(arch + ".expert_count", u32(cfg.moe.num_experts));
    m.emplace_back(arch + ".expert_used_count", u32(cfg.moe.num_experts_per_tok));
    m.emplace_back(arch + ".expert_feed_forward_length", u32(cfg.moe.moe_intermediate_size));
    if (cfg.moe.shared_expert_intermediate_size > 0)
      m.emplace_back(arch + ".expert_shared_feed_forward_length", u32(cfg.moe.shared_expert_intermediate_size));
  }

  // The tensors, converted one by one as they are written.
  const auto& impl = lm->impl();
  for (const auto& hf : impl.names) {
    if (auto e = expert_param(hf)) {
      // Each projection's experts stacked into one [E, out, in] tensor
      // (ffn_gate_exps, ffn_up_exps, ffn_down_exps), at its first expert.
      if (e->expert != 0) continue;
      const auto base = "model.layers." + std::to_string(e->layer) + ".mlp.experts.";
      std::vector<at::Tensor> parts;
      for (int64_t x = 0; x < cfg.moe.num_experts; ++x)
        parts.push_back(impl.param(base + std::to_string(x) + "." + e->proj + ".weight"));
      const auto kind = e->proj.substr(0, e->proj.find('_'));  // gate, up, down
      auto shape = parts.front().sizes().vec();
      shape.insert(shape.begin(), cfg.moe.num_experts);
      f.tensors.push_back({.name = "blk." + std::to_string(e->layer) + ".ffn_" + kind + "_exps.weight",
                           .shape = shape, .dtype = dtype, .data = [parts, dtype] {
                             return from_torch(at::stack(parts).to(to_torch(dtype)).contiguous());
                           }});
      continue;
    }
    auto name = gguf_name(hf);
    if (name.empty()) return make_error(errc::internal, "no GGUF name for parameter " + hf);
    const auto& p = impl.param(hf);
    // The router and the shared expert's gate stay f32, as
    // convert_hf_to_gguf.py keeps them (the gate as a vector [hidden]).
    const bool gating = name.find("ffn_gate_inp") != std::string::npos;
    const bool matrix = p.dim() >= 2 && !gating;
    const Dtype type = matrix ? dtype : Dtype::f32;
    int64_t interleave = 0;
    if (cfg.architecture == Architecture::llama) {
      if (hf.find("self_attn.q_proj.") != std::string::npos) interleave = cfg.num_attention_heads;
      if (hf.find("self_attn.k_proj.") != std::string::npos) interleave = cfg.num_key_value_heads;
    }
    auto shape = p.sizes().vec();
    if (name.find("ffn_gate_inp_shexp") != std::string::npos) shape = {p.numel()};
    f.tensors.push_back({.name = name, .shape = shape, .dtype = type, .data = [p, type, interleave, shape] {
                           auto t = interleave ? interleave_heads(p, interleave) : p;
                           return from_torch(t.to(to_torch(type)).reshape(shape).contiguous());
                         }});
  }
  if (cfg.tie_word_embeddings && cfg.architecture == Architecture::qwen2_moe) {
    // llama.cpp's qwen2moe has no tied head: it reads output.weight, which
    // is then the embeddings again.
    const auto& e = impl.param("model.embed_tokens.weight");
    f.tensors.push_back({.name = "output.weight", .shape = e.sizes().vec(), .dtype = dtype, .data = [e, dtype] {
                           return from_torch(e.to(to_torch(dtype)).contiguous());
                         }});
  }
  if (cfg.rope_scaling.type == RopeScaling::Type::llama3) {
    // ggml divides each frequency by its factor: unscaled / scaled.
    auto half = at::arange(0, cfg.head_dim / 2, at::kDouble) * 2.0 / static_cast<double>(cfg.head_dim);
    auto factors = (at::pow(cfg.rope_theta, half).reciprocal() / impl.inverse_frequencies()).to(at::kFloat);
    f.tensors.push_back({.name = "rope_freqs.weight", .shape = {cfg.head_dim / 2}, .dtype = Dtype::f32,
                         .data = [factors] { return from_torch(factors.contiguous()); }});
  }
  const size_t total = f.tensors.size();
  if (auto ok = write_gguf(out, f, [&](size_t done) {
        if (options.progress) options.progress(done, total);
      });
      !ok)
    return ok.error();
  std::error_code ec;
  return GgufExportSummary{.architecture = arch, .dtype = dtype, .tensors = total,
                           .bytes = static_cast<uint64_t>(fs::file_size(out, ec)),
                           .vocab = cfg.vocab_size, .padded_tokens = vocab->padded, .pre_tokenizer = vocab->pre};
}

}  // namespace glint::components
