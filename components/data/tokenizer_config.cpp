#include "components/data/tokenizer_config.hpp"

#include "runtime/file.hpp"
#include "runtime/log.hpp"

#include <nlohmann/json.hpp>

#include <filesystem>
#include <set>

namespace glint::components {

namespace {

using nlohmann::json;

std::string show(const json& v) {
  auto s = v.dump();
  return s.size() > 80 ? s.substr(0, 77) + "..." : s;
}

// The fields glint reads, and those that change nothing it computes:
// padding and truncation sides (glint pads and truncates itself), the class
// names, slow-tokenizer options, the processor's names.
const std::set<std::string, std::less<>> kKnown = {
    "tokenizer_class", "model_max_length", "padding_side", "truncation_side", "model_input_names",
    "additional_special_tokens", "extra_special_tokens", "legacy", "use_default_system_prompt", "sp_model_kwargs",
    "spaces_between_special_tokens", "auto_map", "name_or_path", "processor_class", "clean_up_tokenization_spaces",
    "mask_token", "sep_token", "cls_token", "use_fast", "vocab_file", "merges_file", "tokenizer_file",
    "add_bos_token", "add_eos_token", "chat_template", "bos_token", "eos_token", "pad_token", "unk_token",
    "added_tokens_decoder", "split_special_tokens", "errors", "add_prefix_space", "do_lower_case"};

// "bos_token": "<s>" or {"content": "<s>", "__type": "AddedToken", ...} or null.
Result<std::optional<std::string>> token_text(const json& v, const std::string& field, const std::string& origin) {
  if (v.is_null()) return std::optional<std::string>{};
  if (v.is_string()) return std::optional<std::string>{v.get<std::string>()};
  if (v.is_object())
    if (auto c = v.find("content"); c != v.end() && c->is_string()) return std::optional<std::string>{c->get<std::string>()};
  return make_error(errc::invalid_argument, origin + ": " + field + " " + show(v) + " is not a token (a string or {\"content\": ...})");
}

Result<std::optional<bool>> optional_flag(const json& j, const char* key, const std::string& origin) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return std::optional<bool>{};
  if (!it->is_boolean())
    return make_error(errc::invalid_argument, origin + ": " + key + " " + show(*it) + " is not true or false");
  return std::optional<bool>{it->get<bool>()};
}

// chat_template is a string, or a list of {"name", "template"} of which
// "default" is the one apply_chat_template uses.
Result<std::optional<std::string>> chat_template_of(const json& v, const std::string& origin) {
  if (v.is_null()) return std::optional<std::string>{};
  if (v.is_string()) return std::optional<std::string>{v.get<std::string>()};
  if (v.is_array()) {
    for (const auto& t : v)
      if (t.is_object() && t.value("name", std::string{}) == "default" && t.contains("template") && t["template"].is_string())
        return std::optional<std::string>{t["template"].get<std::string>()};
    return make_error(errc::invalid_argument,
                      origin + ": chat_template is a list without a template named \"default\"; glint renders the "
                               "default template only");
  }
  return make_error(errc::invalid_argument, origin + ": chat_template " + show(v) + " is not a string or a list");
}

}  // namespace

Result<TokenizerConfig> TokenizerConfig::parse(const std::string& text, const std::string& origin) try {
  auto j = json::parse(text);
  if (!j.is_object()) return make_error(errc::invalid_argument, origin + " is not a JSON object");
  TokenizerConfig c;
  c.origin = origin;
  auto refuse = [&](const std::string& field, const json& v, const std::string& why) {
    return make_error(errc::unimplemented, origin + ": " + field + " " + show(v) + " is not supported: " + why);
  };
  if (auto v = j.find("split_special_tokens"); v != j.end() && v->is_boolean() && v->get<bool>())
    return refuse("split_special_tokens", *v, "glint always matches special tokens as one token each");
  if (auto v = j.find("errors"); v != j.end() && !v->is_null() && *v != "replace")
    return refuse("errors", *v, "glint decodes invalid UTF-8 as U+FFFD (errors \"replace\")");
  if (auto v = j.find("add_prefix_space"); v != j.end() && v->is_boolean() && v->get<bool>())
    return refuse("add_prefix_space", *v,
                  "Hugging Face rebuilds the pre-tokenizer for it; set it in tokenizer.json's pre_tokenizer instead");
  if (auto v = j.find("do_lower_case"); v != j.end() && v->is_boolean() && v->get<bool>())
    return refuse("do_lower_case", *v, "lower-case through tokenizer.json's normalizer (Lowercase) instead");
  if (auto v = j.find("chat_template"); v != j.end()) {
    auto t = chat_template_of(*v, origin);
    if (!t) return t.error();
    c.chat_template = std::move(*t);
    if (c.chat_template) c.chat_template_origin = origin + ": chat_template";
  }
  if (auto v = optional_flag(j, "clean_up_tokenization_spaces", origin); !v) return v.error();
  else c.clean_up_tokenization_spaces = v->value_or(false);
  if (auto v = j.find("model_max_length"); v != j.end() && !v->is_null()) {
    // Hugging Face writes int(1e30) for "no limit": beyond int64 it reads
    // as a float here, and so does any limit past 2^40 tokens.
    constexpr int64_t kNoLimit = int64_t{1} << 40;
    if (!v->is_number())
      return make_error(errc::invalid_argument, origin + ": model_max_length " + show(*v) + " is not a number");
    if (v->is_number_integer() && v->get<int64_t>() > 0 && v->get<int64_t>() < kNoLimit)
      c.model_max_length = v->get<int64_t>();
    else if (!(v->get<double>() >= static_cast<double>(kNoLimit)))
      return make_error(errc::invalid_argument,
                        origin + ": model_max_length " + show(*v) + " is not a positive number of tokens");
  }
  if (auto v = optional_flag(j, "add_bos_token", origin); !v) return v.error();
  else c.add_bos_token = *v;
  if (auto v = optional_flag(j, "add_eos_token", origin); !v) return v.error();
  else c.add_eos_token = *v;
  for (const char* role : {"bos_token", "eos_token", "pad_token", "unk_token"}) {
    auto v = j.find(role);
    if (v == j.end()) continue;
    auto t = token_text(*v, role, origin);
    if (!t) return t.error();
    if (*t) c.special_tokens[role] = **t;
  }
  if (auto v = j.find("added_tokens_decoder"); v != j.end() && !v->is_null()) {
    if (!v->is_object()) return make_error(errc::invalid_argument, origin + ": added_tokens_decoder is not an object");
    for (const auto& [key, entry] : v->items()) {
      int64_t id = -1;
      try {
        size_t used = 0;
        id = std::stoll(key, &used);
        if (used != key.size() || id < 0) id = -1;
      } catch (const std::exception&) {
      }
      if (id < 0) return make_error(errc::invalid_argument, origin + ": added_tokens_decoder key '" + key + "' is not an id");
      auto t = token_text(entry, "added_tokens_decoder[" + key + "]", origin);
      if (!t) return t.error();
      if (*t) c.added_tokens[id] = **t;
    }
  }
  std::string unused;
  for (const auto& [key, value] : j.items())
    if (!kKnown.contains(key)) unused += (unused.empty() ? "" : ", ") + key;
  if (!unused.empty()) log::debug(origin + ": fields glint does not use: " + unused);
  return c;
} catch (const json::exception& e) {
  return make_error(errc::invalid_argument, origin + " is not a tokenizer_config.json: " + e.what());
}

Result<TokenizerConfig> TokenizerConfig::load_dir(const std::string& dir) {
  namespace fs = std::filesystem;
  TokenizerConfig c;
  if (auto path = (fs::path{dir} / "tokenizer_config.json").string(); fs::exists(path)) {
    auto text = read_text_file(path);
    if (!text) return text.error();
    auto parsed = parse(*text, path);
    if (!parsed) return parsed.error();
    c = std::move(*parsed);
  }
  // Current transformers saves the template as its own file, which then
  // wins over tokenizer_config.json's field.
  if (auto path = (fs::path{dir} / "chat_template.jinja").string(); fs::exists(path)) {
    auto text = read_text_file(path);
    if (!text) return text.error();
    c.chat_template = std::move(*text);
    c.chat_template_origin = path;
  }
  return c;
}

std::string clean_up_tokenization(std::string text) {
  // In Hugging Face's order; each replaces every occurrence before the next.
  static const std::pair<std::string_view, std::string_view> kRules[] = {
      {" .", "."},     {" ?", "?"},     {" !", "!"},     {" ,", ","},     {" ' ", "'"},
      {" n't", "n't"}, {" 'm", "'m"},   {" 's", "'s"},   {" 've", "'ve"}, {" 're", "'re"}};
  for (auto [from, to] : kRules) {
    std::string out;
    out.reserve(text.size());
    for (size_t i = 0; i < text.size();) {
      if (text.compare(i, from.size(), from) == 0) {
        out += to;
        i += from.size();
      } else {
        out += text[i++];
      }
    }
    text = std::move(out);
  }
  return text;
}

}  // namespace glint::components
