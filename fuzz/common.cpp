#include "common.hpp"

#include "components/data/bpe_trainer.hpp"

#include <cstdio>
#include <cstdlib>
#include <vector>

namespace glint::fuzz {

const std::string& chat_tokenizer_json() {
  static const std::string json = [] {
    std::vector<std::string> texts;
    for (int i = 0; i < 20; ++i)
      texts.push_back("system\nYou are helpful.\nuser\nWhat is " + std::to_string(i) + " + " + std::to_string(i * 3) +
                      "?\nassistant\nThe answer is " + std::to_string(4 * i) + ". Let me think: <think> ok </think>");
    components::BpeTrainerOptions o;
    o.vocab_size = 400;
    o.special_tokens = {"<|endoftext|>",     "<|im_start|>",      "<|im_end|>", "<|begin_of_text|>",
                        "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"};
    auto j = components::train_bpe(texts, o);
    if (!j) fail("train_bpe: " + describe(j.error()));
    return *j;
  }();
  return json;
}

std::shared_ptr<const components::Tokenizer> chat_tokenizer(components::TokenizerConfig config) {
  auto t = components::Tokenizer::parse(chat_tokenizer_json(), "chat tokenizer.json", std::move(config));
  if (!t) return nullptr;
  return std::make_shared<const components::Tokenizer>(std::move(*t));
}

void fail(const std::string& what) {
  std::fprintf(stderr, "glint fuzz: %s\n", what.c_str());
  std::abort();
}

}  // namespace glint::fuzz
