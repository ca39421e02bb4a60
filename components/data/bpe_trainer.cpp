#include "components/data/bpe_trainer.hpp"

#include "components/data/detail/byte_level.hpp"
#include "components/data/detail/regex.hpp"

#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <queue>
#include <unordered_map>
#include <unordered_set>

namespace glint::components {

namespace {

using Pair = uint64_t;  // (left id << 32) | right id
Pair pair_of(int32_t a, int32_t b) { return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b); }
int32_t left_of(Pair p) { return static_cast<int32_t>(p >> 32); }
int32_t right_of(Pair p) { return static_cast<int32_t>(p & 0xffffffffu); }

struct Word {
  std::vector<int32_t> symbols;
  int64_t count = 0;
};

// A heap entry; stale entries (count no longer current) are skipped on pop.
struct Candidate {
  int64_t count;
  Pair pair;
  bool operator<(const Candidate& o) const {
    // Higher count first; on a tie the smaller pair (Hugging Face's rule).
    return count != o.count ? count < o.count : pair > o.pair;
  }
};

}  // namespace

Result<std::string> train_bpe(std::span<const std::string> texts, const BpeTrainerOptions& options) {
  const auto specials = static_cast<int64_t>(options.special_tokens.size());
  if (options.vocab_size < 256 + specials)
    return make_error(errc::invalid_argument, "vocab_size " + std::to_string(options.vocab_size) +
                                                  " is too small: the 256 bytes and " + std::to_string(specials) +
                                                  " special tokens need " + std::to_string(256 + specials));
  if (options.min_frequency < 1)
    return make_error(errc::invalid_argument, "min_frequency must be at least 1, not " + std::to_string(options.min_frequency));
  for (const auto& s : options.special_tokens)
    if (s.empty()) return make_error(errc::invalid_argument, "a special token is empty");
  const std::string pattern = options.pattern.empty() ? detail::kQwen2Pattern : options.pattern;
  auto regex = detail::Regex::compile(pattern);
  if (!regex) return regex.error();

  // Distinct pieces with their counts. Special tokens never take part in
  // merges: the text around them is split at them first, as encode does.
  std::unordered_map<std::string, int64_t> piece_counts;
  auto count_pieces = [&](std::string_view text) {
    return regex->split(text, [&](std::string_view piece) -> Result<void> {
      ++piece_counts[std::string{piece}];
      return {};
    });
  };
  for (const auto& text : texts) {
    std::string_view rest = text;
    while (!rest.empty()) {
      size_t cut = rest.size(), len = 0;
      for (const auto& s : options.special_tokens)
        if (auto at = rest.find(s); at != std::string_view::npos && at < cut) {
          cut = at;
          len = s.size();
        }
      if (auto ok = count_pieces(rest.substr(0, cut)); !ok) return ok.error();
      rest.remove_prefix(std::min(rest.size(), cut + len));
    }
  }
  std::vector<Word> words;
  words.reserve(piece_counts.size());
  for (const auto& [piece, count] : piece_counts) {
    Word w;
    w.count = count;
    for (unsigned char c : piece) w.symbols.push_back(c);
    words.push_back(std::move(w));
  }

  std::vector<std::string> tokens;  // id -> bytes
  std::unordered_map<std::string, int32_t> token_ids;
  for (int b = 0; b < 256; ++b) {
    tokens.emplace_back(1, static_cast<char>(b));
    token_ids.emplace(tokens.back(), b);
  }
  std::unordered_map<Pair, int64_t> counts;
  std::unordered_map<Pair, std::unordered_set<uint32_t>> where;  // may hold words that lost the pair
  for (uint32_t w = 0; w < words.size(); ++w) {
    const auto& s = words[w].symbols;
    for (size_t i = 0; i + 1 < s.size(); ++i) {
      auto p = pair_of(s[i], s[i + 1]);
      counts[p] += words[w].count;
      where[p].insert(w);
    }
  }
  std::priority_queue<Candidate> heap;
  for (const auto& [p, c] : counts) heap.push({c, p});

  const int64_t wanted = options.vocab_size - 256 - specials;
  std::vector<std::pair<int32_t, int32_t>> merges;
  std::unordered_set<Pair> touched;
  const auto vocab_wanted = static_cast<size_t>(256 + wanted);
  while (tokens.size() < vocab_wanted && !heap.empty()) {
    auto top = heap.top();
    heap.pop();
    auto it = counts.find(top.pair);
    const int64_t current = it == counts.end() ? 0 : it->second;
    if (current != top.count) {  // stale
      if (current > 0) heap.push({current, top.pair});
      continue;
    }
    if (current < options.min_frequency) break;
    const int32_t a = left_of(top.pair), b = right_of(top.pair);
    // Two merges may spell the same bytes ("a"+"bc", "ab"+"c"): one token.
    auto bytes = tokens[static_cast<size_t>(a)] + tokens[static_cast<size_t>(b)];
    auto [known, fresh] = token_ids.emplace(bytes, static_cast<int32_t>(tokens.size()));
    if (fresh) tokens.push_back(std::move(bytes));
    const int32_t id = known->second;
    merges.emplace_back(a, b);
    touched.clear();
    auto holders = std::move(where[top.pair]);
    where.erase(top.pair);
    for (auto w : holders) {
      auto& word = words[w];
      auto& s = word.symbols;
      bool has = false;
      for (size_t i = 0; i + 1 < s.size() && !has; ++i) has = s[i] == a && s[i + 1] == b;
      if (!has) continue;
      // Take the word's pairs out, merge left to right, put them back.
      for (size_t i = 0; i + 1 < s.size(); ++i) {
        auto p = pair_of(s[i], s[i + 1]);
        counts[p] -= word.count;
        touched.insert(p);
      }
      std::vector<int32_t> merged;
      merged.reserve(s.size());
      for (size_t i = 0; i < s.size(); ++i) {
        if (i + 1 < s.size() && s[i] == a && s[i + 1] == b) {
          merged.push_back(id);
          ++i;
        } else {
          merged.push_back(s[i]);
        }
      }
      s = std::move(merged);
      for (size_t i = 0; i + 1 < s.size(); ++i) {
        auto p = pair_of(s[i], s[i + 1]);
        counts[p] += word.count;
        where[p].insert(w);
        touched.insert(p);
      }
    }
    counts.erase(top.pair);
    for (auto p : touched) {
      auto c = counts.find(p);
      if (c == counts.end()) continue;
      if (c->second <= 0) counts.erase(c);
      else heap.push({c->second, p});
    }
    if (options.progress && fresh && tokens.size() % 64 == 0) options.progress(static_cast<int64_t>(tokens.size()) - 256, wanted);
  }
  if (options.progress) options.progress(static_cast<int64_t>(tokens.size()) - 256, static_cast<int64_t>(tokens.size()) - 256);

  // tokenizer.json, in the layout Hugging Face's tokenizers writes.
  nlohmann::ordered_json vocab = nlohmann::ordered_json::object();
  for (size_t i = 0; i < tokens.size(); ++i) vocab[detail::to_byte_level(tokens[i])] = static_cast<int64_t>(i);
  nlohmann::ordered_json merge_list = nlohmann::ordered_json::array();
  for (auto [a, b] : merges)
    merge_list.push_back(nlohmann::ordered_json::array(
        {detail::to_byte_level(tokens[static_cast<size_t>(a)]), detail::to_byte_level(tokens[static_cast<size_t>(b)])}));
  nlohmann::ordered_json added = nlohmann::ordered_json::array();
  int64_t next = static_cast<int64_t>(tokens.size());
  for (const auto& s : options.special_tokens)
    added.push_back({{"id", next++}, {"content", s}, {"single_word", false}, {"lstrip", false}, {"rstrip", false},
                     {"normalized", false}, {"special", true}});
  nlohmann::ordered_json j;
  j["version"] = "1.0";
  j["truncation"] = nullptr;
  j["padding"] = nullptr;
  j["added_tokens"] = added;
  j["normalizer"] = nullptr;
  j["pre_tokenizer"] = {
      {"type", "Sequence"},
      {"pretokenizers",
       nlohmann::ordered_json::array(
           {{{"type", "Split"}, {"pattern", {{"Regex", pattern}}}, {"behavior", "Isolated"}, {"invert", false}},
            {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", false}, {"use_regex", false}}})}};
  j["post_processor"] = nullptr;
  j["decoder"] = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", false}, {"use_regex", false}};
  j["model"] = {{"type", "BPE"},         {"dropout", nullptr},  {"unk_token", nullptr},
                {"continuing_subword_prefix", nullptr}, {"end_of_word_suffix", nullptr}, {"fuse_unk", false},
                {"byte_fallback", false}, {"ignore_merges", false}, {"vocab", vocab}, {"merges", merge_list}};
  return j.dump(1);
}

// Written for glint, in the layout of Qwen 2.5's tool calls; compact, so
// that a tiny model's prompts stay short.
const char* const kChatmlToolsTemplate = R"TPL({%- if messages[0].role == 'system' or tools %}
{{- '<|im_start|>system\n' }}
{%- if messages[0].role == 'system' %}{{- messages[0].content }}{%- endif %}
{%- if tools %}
{{- '\n<tools>\n' }}
{%- for tool in tools %}{{- tool | tojson }}{{- '\n' }}{%- endfor %}
{{- '</tools>' }}
{%- endif %}
{{- '<|im_end|>\n' }}
{%- endif %}
{%- for message in messages %}
{%- if message.role == 'system' %}
{%- if not loop.first %}{{- raise_exception('A system message must come first.') }}{%- endif %}
{%- elif message.role == 'assistant' %}
{{- '<|im_start|>assistant\n' }}
{%- if message.content %}{{- message.content }}{%- endif %}
{%- for call in message.tool_calls or [] %}
{%- if call.function is defined %}{%- set call = call.function %}{%- endif %}
{%- if not loop.first or message.content %}{{- '\n' }}{%- endif %}
{{- '<tool_call>\n{"name": "' + call.name + '", "arguments": ' }}
{%- if call.arguments is string %}{{- call.arguments }}{%- else %}{{- call.arguments | tojson }}{%- endif %}
{{- '}\n</tool_call>' }}
{%- endfor %}
{{- '<|im_end|>\n' }}
{%- elif message.role == 'tool' %}
{{- '<|im_start|>user\n<tool_response>\n' + message.content + '\n</tool_response><|im_end|>\n' }}
{%- else %}
{{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>\n' }}
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\n' }}{%- endif %})TPL";

Result<void> save_chatml_tokenizer(const std::string& dir, const std::string& tokenizer_json, bool tools) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return make_error(errc::not_found, "cannot create " + dir + ": " + ec.message());
  nlohmann::ordered_json config;
  config["tokenizer_class"] = "PreTrainedTokenizerFast";
  config["bos_token"] = nullptr;
  config["eos_token"] = "<|im_end|>";
  config["pad_token"] = "<|endoftext|>";
  config["model_max_length"] = 32768;
  config["chat_template"] = tools ? kChatmlToolsTemplate :
      "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + "
      "'<|im_end|>' + '\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";
  for (auto [name, text] : {std::pair<std::string, std::string>{"tokenizer.json", tokenizer_json},
                            std::pair<std::string, std::string>{"tokenizer_config.json", config.dump(2)}}) {
    auto path = dir + "/" + name;
    std::ofstream out{path, std::ios::binary | std::ios::trunc};
    out << text;
    out.flush();
    if (!out) return make_error(errc::unavailable, "cannot write " + path);
  }
  return {};
}

}  // namespace glint::components
