// tokenizer_config.json (TokenizerConfig::parse): a config that parses is
// checked against a small ChatML tokenizer, and its chat template, where
// glint recognises it, renders and encodes a conversation.
#include "common.hpp"

#include "components/data/template.hpp"
#include "components/data/tokenizer_config.hpp"

using namespace glint;
using namespace glint::components;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > fuzz::kMaxInputBytes) return 0;
  const std::string text{fuzz::text_of(data, size)};
  auto c = TokenizerConfig::parse(text, "fuzz/tokenizer_config.json");
  if (!c) {
    (void)describe(c.error());
    return 0;
  }
  (void)clean_up_tokenization(text.substr(0, 256));
  if (c->chat_template) (void)detect_chat_template(*c->chat_template);
  auto tok = fuzz::chat_tokenizer(std::move(*c));
  if (!tok) return 0;
  (void)tok->decode(std::vector<int64_t>{1, 2, 3, 300, 399}, true);
  auto chat = Template::make(tok, {});
  if (!chat) return 0;
  const std::vector<Message> messages = {{"user", "What is 2 + 6?"}, {"assistant", "The answer is 8."}};
  (void)chat->encode(messages, false);
  (void)chat->encode(std::span{messages}.first(1), true);
  return 0;
}
