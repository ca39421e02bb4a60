// `glint template`: a conversation as the model's own chat template renders
// it, so a user can see what a model is trained on (and, with --ids, which
// tokens the loss counts).
#include "components/data/chat_render.hpp"
#include "components/data/tokenizer_config.hpp"
#include "launcher/commands.hpp"
#include "runtime/file.hpp"

#include <nlohmann/json.hpp>

#include <cstdio>
#include <optional>

namespace glint::launcher {
namespace {

using json = nlohmann::ordered_json;
using components::ChatInput;

int fail(const std::string& what) {
  std::fprintf(stderr, "glint template: %s\n", what.c_str());
  return 1;
}

std::optional<std::string> read_file(const std::string& path, std::string& error) {
  auto text = read_text_file(path);
  if (!text) {
    error = describe(text.error());
    return std::nullopt;
  }
  return std::move(*text);
}

std::optional<json> read_json(const std::string& path, std::string& error) {
  auto text = read_file(path, error);
  if (!text) return std::nullopt;
  try {
    return json::parse(*text);
  } catch (const json::parse_error& e) {
    error = path + " is not JSON: " + e.what();
    return std::nullopt;
  }
}

// A token as printable text: its bytes, with controls escaped.
std::string shown(const std::string& bytes) {
  std::string out;
  for (unsigned char c : bytes) {
    if (c == '\n') out += "\\n";
    else if (c == '\t') out += "\\t";
    else if (c < 0x20) {
      char b[8];
      std::snprintf(b, sizeof b, "\\x%02x", c);
      out += b;
    } else out += static_cast<char>(c);
  }
  return out;
}

}  // namespace

int chat_template(const TemplateArgs& args) {
  std::string error;
  if (args.model.empty() == args.chat_template.empty()) return fail("give one of --model DIR or --chat-template FILE");
  if (args.ids && args.model.empty()) return fail("--ids needs --model (the tokenizer that makes the ids)");
  std::string source, origin;
  std::optional<components::Tokenizer> tokenizer;
  std::map<std::string, std::string> special;
  if (!args.model.empty()) {
    auto config = components::TokenizerConfig::load_dir(args.model);
    if (!config) return fail(describe(config.error()));
    if (!config->chat_template) return fail(args.model + " has no chat template (tokenizer_config.json's chat_template, or chat_template.jinja)");
    source = *config->chat_template;
    origin = config->chat_template_origin;
    special = config->special_tokens;
    if (args.ids) {
      auto tok = components::Tokenizer::load(args.model);
      if (!tok) return fail(describe(tok.error()));
      tokenizer = std::move(*tok);
    }
  } else {
    auto text = read_file(args.chat_template, error);
    if (!text) return fail(error);
    source = std::move(*text);
    origin = args.chat_template;
  }
  if (!args.bos_token.empty()) special["bos_token"] = args.bos_token;
  if (!args.eos_token.empty()) special["eos_token"] = args.eos_token;

  auto messages = read_json(args.messages, error);
  if (!messages) return fail(error);
  ChatInput in;
  if (messages->is_object()) {
    if (!messages->contains("messages")) return fail(args.messages + ": an object must hold \"messages\" (an array)");
    in.messages = (*messages)["messages"];
    if (messages->contains("tools")) in.tools = (*messages)["tools"];
    if (messages->contains("documents")) in.documents = (*messages)["documents"];
  } else {
    in.messages = *messages;
  }
  if (!in.messages.is_array()) return fail(args.messages + ": \"messages\" must be an array of {\"role\", \"content\"} objects");
  for (auto [file, slot] : {std::pair{&args.tools, &in.tools}, {&args.documents, &in.documents}}) {
    if (file->empty()) continue;
    auto v = read_json(*file, error);
    if (!v) return fail(error);
    if (!v->is_array()) return fail(*file + " must hold a JSON array");
    *slot = std::move(*v);
  }
  in.add_generation_prompt = args.add_generation_prompt;
  if (args.no_thinking) in.kwargs["enable_thinking"] = false;

  auto t = components::JinjaTemplate::parse(source, origin);
  if (!t) return fail(describe(t.error()));
  if (!args.ids) {
    auto r = t->render(components::chat_variables(in, special));
    if (!r) return fail(describe(r.error()));
    std::fwrite(r->text.data(), 1, r->text.size(), stdout);
    return 0;
  }
  auto chat = components::render_chat(*t, in, special);
  if (!chat) return fail(describe(chat.error()));
  auto tokens = components::tokenize_chat(*tokenizer, *chat);
  if (!tokens) return fail(describe(tokens.error()));
  std::fwrite(chat->text.data(), 1, chat->text.size(), stdout);
  size_t learned = 0;
  for (float m : tokens->loss_mask) learned += m > 0;
  std::printf("\n--- %zu tokens, %zu learned (the loss counts the token after each position marked 1; assistant text from %s)\n",
              tokens->input_ids.size(), learned,
              chat->from_generation_blocks ? "{% generation %} blocks" : "rendering prefixes");
  std::printf("position\tid\tmask\ttoken\n");
  for (size_t k = 0; k < tokens->input_ids.size(); ++k)
    std::printf("%zu\t%lld\t%d\t%s\n", k, static_cast<long long>(tokens->input_ids[k]), tokens->loss_mask[k] > 0 ? 1 : 0,
                shown(tokenizer->token_bytes(tokens->input_ids[k])).c_str());
  return 0;
}

}  // namespace glint::launcher
