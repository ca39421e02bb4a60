// `glint init-model`: writes a Hugging Face model directory with random
// weights, so tests, examples and benchmarks need no download.
#include "components/data/bpe_trainer.hpp"
#include "components/data/dataset.hpp"
#include "components/data/synthetic.hpp"
#include "components/data/tokenizer.hpp"
#include "components/model/model.hpp"
#include "components/rl/environment.hpp"
#include "launcher/commands.hpp"
#include "runtime/memory.hpp"
#include "runtime/progress.hpp"

#include <algorithm>
#include <cstdio>
#include <filesystem>

namespace glint::launcher {

int init_model(const InitModelArgs& a) {
  auto arch = components::parse_architecture(a.arch);
  if (!arch) {
    std::fprintf(stderr, "glint init-model: %s\n", describe(arch.error()).c_str());
    return 2;
  }
  auto cfg = components::ModelConfig::make(*arch, a.vocab, a.hidden, a.intermediate, a.layers, a.heads,
                                           a.kv_heads > 0 ? a.kv_heads : a.heads, a.head_dim);
  if (components::is_moe(*arch)) {
    auto& m = cfg.moe;
    m.num_experts = a.experts;
    m.num_experts_per_tok = a.experts_per_tok;
    m.moe_intermediate_size = a.moe_intermediate > 0 ? a.moe_intermediate : std::max<int64_t>(1, a.intermediate / 4);
    m.shared_expert_intermediate_size =
        *arch != components::Architecture::qwen3_moe ? (a.shared_intermediate > 0 ? a.shared_intermediate : a.intermediate)
                                                     : 0;
    m.decoder_sparse_step = a.sparse_step;
    m.norm_topk_prob = a.norm_topk;
    if (*arch == components::Architecture::qwen3_5_moe) {  // every layer sparse, always renormalised
      if (a.sparse_step != 1) {
        std::fprintf(stderr, "glint init-model: --sparse-step: Qwen3.5-MoE makes every layer sparse\n");
        return 2;
      }
      m.norm_topk_prob = true;
    }
  }
  if (components::is_hybrid(*arch)) {
    auto& la = cfg.linear_attention;
    la.num_key_heads = a.linear_key_heads > 0 ? a.linear_key_heads : a.heads;
    la.num_value_heads = a.linear_value_heads > 0 ? a.linear_value_heads : 2 * la.num_key_heads;
    la.key_head_dim = la.value_head_dim = a.linear_head_dim > 0 ? a.linear_head_dim : cfg.head_dim;
    la.conv_kernel_dim = a.conv_kernel;
    cfg.partial_rotary_factor = a.partial_rotary;
    const int64_t interval = std::min(a.full_attention_interval, a.layers);
    cfg.token_mixers.clear();
    for (int64_t l = 0; l < a.layers; ++l)
      cfg.token_mixers.push_back((l + 1) % interval == 0 ? components::TokenMixer::attention
                                                         : components::TokenMixer::gated_deltanet);
  }
  if (a.tokenizer_from.empty() && a.chat_template != "chatml") {
    std::fprintf(stderr, "glint init-model: --chat-template comes with the tokenizer: give --tokenizer-from too\n");
    return 2;
  }
  cfg.tie_word_embeddings = a.tie;
  cfg.max_position_embeddings = a.max_positions;
  auto dtype = parse_dtype(a.dtype);
  if (!dtype || (*dtype != Dtype::f32 && *dtype != Dtype::bf16 && *dtype != Dtype::f16)) {
    std::fprintf(stderr, "glint init-model: --dtype must be f32, bf16 or f16, not '%s'\n", a.dtype.c_str());
    return 2;
  }
  cfg.dtype = *dtype;
  std::string tokenizer_json;
  if (!a.tokenizer_from.empty()) {
    // The vocabulary first: the model's embedding size follows it.
    auto ds = components::Dataset::load({.path = a.tokenizer_from});
    if (!ds) {
      std::fprintf(stderr, "glint init-model: %s\n", describe(ds.error()).c_str());
      return 1;
    }
    auto texts = components::texts_of(*ds);
    Progress bar{"tokenizer", static_cast<int>(std::max<int64_t>(1, a.vocab - 256 - 3))};
    auto json = components::train_bpe(texts, {.vocab_size = a.vocab, .progress = [&](int64_t done, int64_t) {
                                                bar.update(static_cast<int>(done), "merges");
                                              }});
    if (!json) {
      std::fprintf(stderr, "glint init-model: training the tokenizer: %s\n", describe(json.error()).c_str());
      return 2;
    }
    auto tok = components::Tokenizer::parse(*json);
    bar.finish(std::to_string(tok->vocab_size()) + " tokens from " + std::to_string(texts.size()) + " texts");
    cfg.vocab_size = tok->vocab_size();
    cfg.eos_token_ids = {tok->token_id("<|im_end|>")};
    cfg.bos_token_id = -1;
    tokenizer_json = std::move(*json);
  }
  if (auto ok = cfg.validate(); !ok) {
    std::fprintf(stderr, "glint init-model: %s\n", describe(ok.error()).c_str());
    return 2;
  }
  auto lm = components::CausalLM::init_random(cfg, a.seed);
  if (!lm) {
    std::fprintf(stderr, "glint init-model: %s\n", describe(lm.error()).c_str());
    return 1;
  }
  if (auto ok = lm->save(a.out); !ok) {
    std::fprintf(stderr, "glint init-model: %s\n", describe(ok.error()).c_str());
    return 1;
  }
  if (!tokenizer_json.empty())
    if (auto ok = components::save_chatml_tokenizer(a.out, tokenizer_json, a.chat_template == "tools"); !ok) {
      std::fprintf(stderr, "glint init-model: %s\n", describe(ok.error()).c_str());
      return 1;
    }
  std::printf("wrote %s: %s, %.2fM parameters (%s), seed %llu\n", a.out.c_str(),
              std::string{components::hf_class_name(cfg.architecture)}.c_str(),
              static_cast<double>(cfg.num_parameters()) / 1e6, a.dtype.c_str(),
              static_cast<unsigned long long>(a.seed));
  return 0;
}

int init_data(const InitDataArgs& a) {
  if (a.kind != "arithmetic" && a.kind != "calculator") {
    std::fprintf(stderr, "glint init-data: unknown kind '%s'; the generated datasets are: arithmetic, calculator\n",
                 a.kind.c_str());
    return 2;
  }
  if (a.kind != "calculator" && a.tool_share != 0.5) {
    std::fprintf(stderr, "glint init-data: --tool-share applies to calculator rows, not %s\n", a.kind.c_str());
    return 2;
  }
  // The rows are made in memory, then written: estimate both from a sample
  // before making them all.
  const components::ArithmeticOptions opts{.seed = a.seed, .max_operand = a.max_operand, .max_terms = a.max_terms};
  double line = 0;
  const auto sample = components::arithmetic_rows(std::min<int64_t>(a.rows, 256), opts);
  for (const auto& r : sample) {
    line += 64;  // keys, quotes, braces
    for (const auto& [k, v] : r.fields) line += static_cast<double>(k.size() + v.size());
    for (const auto& m : r.messages) line += static_cast<double>(m.role.size() + m.content.size() + 32);
  }
  line /= static_cast<double>(std::max<size_t>(sample.size(), 1));
  const double file_bytes = line * static_cast<double>(a.rows);
  // In memory: the strings, each row's map and vector nodes, ~4x the line.
  if (auto ok = check_memory(4 * file_bytes, std::to_string(a.rows) + " rows made in memory"); !ok) {
    std::fprintf(stderr, "glint init-data: %s; ask for fewer --rows\n", describe(ok.error()).c_str());
    return 2;
  }
  std::error_code ec;
  auto parent = std::filesystem::absolute(a.out, ec).parent_path();
  if (auto space = std::filesystem::space(parent, ec); !ec && static_cast<double>(space.available) < file_bytes) {
    std::fprintf(stderr, "glint init-data: %lld rows need about %s on disk; %s has %s free. Ask for fewer --rows\n",
                 static_cast<long long>(a.rows), format_bytes(file_bytes).c_str(), parent.string().c_str(),
                 format_bytes(static_cast<double>(space.available)).c_str());
    return 2;
  }
  auto rows = components::arithmetic_rows(a.rows, opts);
  if (a.kind == "calculator") {
    line *= 4;  // the episode's messages and tools beside the question
    rows = components::rl::calculator_rows(rows, a.tool_share, a.seed);
  }
  if (auto ok = components::save_jsonl(rows, a.out); !ok) {
    std::fprintf(stderr, "glint init-data: %s\n", describe(ok.error()).c_str());
    return 1;
  }
  if (a.kind == "calculator")
    std::printf("wrote %s: %lld calculator episodes (question and answer, and messages with a calculator tool call in "
                "%.0f%% of them), seed %llu\n",
                a.out.c_str(), static_cast<long long>(rows.size()), 100 * a.tool_share,
                static_cast<unsigned long long>(a.seed));
  else
    std::printf("wrote %s: %lld arithmetic rows (GSM8K format: question, answer ending in '#### n'), seed %llu\n",
                a.out.c_str(), static_cast<long long>(a.rows), static_cast<unsigned long long>(a.seed));
  return 0;
}

}  // namespace glint::launcher
