// A model's Jinja chat template (detect_chat_template, and Template::make
// with name "auto"): what glint recognises as a C++ format, and any other
// template the Jinja interpreter parses, renders and encodes conversations,
// each with labels the size of its ids; nothing crashes or runs unbounded.
#include "common.hpp"

#include "components/data/template.hpp"

using namespace glint;
using namespace glint::components;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > fuzz::kMaxInputBytes) return 0;
  const std::string jinja{fuzz::text_of(data, size)};
  auto info = detect_chat_template(jinja);
  GLINT_FUZZ_CHECK(info.name.empty() != info.why.empty(), "a template is recognised or has a reason it is not");
  TokenizerConfig config;
  config.chat_template = jinja;
  config.chat_template_origin = "fuzz/chat_template.jinja";
  auto tok = fuzz::chat_tokenizer(std::move(config));
  GLINT_FUZZ_CHECK(tok != nullptr, "the tokenizer does not load with a chat template");
  for (bool thinking : {true, false}) {
    auto chat = Template::make(tok, {.max_length = 48, .truncation = Truncation::left, .enable_thinking = thinking});
    GLINT_FUZZ_CHECK(!!chat || info.name.empty() || !thinking,
                     "Template::make refused a template detect_chat_template recognises as '" + info.name + "'");
    if (!chat) continue;
    const std::vector<Message> messages = {{"system", "Be brief."},
                                           {"user", "What is 2 + 6?"},
                                           {"assistant", "<think>\nadd</think>\n\nThe answer is 8."},
                                           {"tool", "<tool_response>8</tool_response>"},
                                           {"user", "And 3 + 9?"},
                                           {"assistant", "It is 12."}};
    for (bool prompt : {false, true}) {
      (void)chat->render(messages, prompt);
      auto row = chat->encode(messages, prompt);
      if (row) GLINT_FUZZ_CHECK(row->loss_mask.size() == row->input_ids.size(), "labels and ids differ in length");
    }
  }
  return 0;
}
