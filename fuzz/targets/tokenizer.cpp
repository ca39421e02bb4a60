// tokenizer.json (Tokenizer::parse): a tokenizer that loads encodes a few
// texts (and the start of its own file) and decodes the ids back; ids are
// in the vocabulary, and without a normalizer or a lossy step decode gives
// the text back.
#include "common.hpp"

#include <string>
#include <vector>

using namespace glint;
using namespace glint::components;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > fuzz::kMaxInputBytes) return 0;
  const std::string text{fuzz::text_of(data, size)};
  // A small max_word_bytes keeps BPE on long words cheap.
  auto t = Tokenizer::parse(text, "fuzz/tokenizer.json", {}, {.max_word_bytes = 256});
  if (!t) {
    (void)describe(t.error());
    return 0;
  }
  const std::vector<std::string> samples = {"Hello world", " 12 + 30 = 42\n\n", "<|im_start|>user\nhi<|im_end|>",
                                            "\xff\xfe invalid \xc3", "\xc4\xb0\xce\xa3 \xe2\x96\x81x",
                                            text.substr(0, 200)};
  for (const auto& s : samples) {
    auto ids = t->encode(s);
    if (!ids) {
      (void)describe(ids.error());
      continue;
    }
    for (auto id : *ids) GLINT_FUZZ_CHECK(id >= 0 && id < t->vocab_size(), "encode gave id " + std::to_string(id));
    (void)t->decode(*ids, true);
    (void)t->decode(*ids, false);
  }
  std::vector<int64_t> ids = {-1, 0, 1, t->vocab_size() - 1, t->vocab_size(), INT64_MAX, INT64_MIN};
  (void)t->decode(ids, false);
  for (auto id : ids) (void)t->token_bytes(id), (void)t->is_special(id);
  (void)t->token_id("<|im_end|>");
  (void)t->token_id(text.substr(0, 16));
  return 0;
}
