// Dataset rows (Dataset::parse): JSONL or a JSON array, per the first byte.
// The rows are preprocessed (gsm8k, self_cognition), shuffled and encoded
// with a ChatML template; save_jsonl then Dataset::load gives the same rows.
#include "common.hpp"

#include "components/data/dataset.hpp"

#include <unistd.h>

#include <sstream>

using namespace glint;
using namespace glint::components;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1 || size > fuzz::kMaxInputBytes) return 0;
  const bool jsonl = data[0] & 1;
  const auto truncation = static_cast<Truncation>((data[0] >> 1) % 3);
  std::istringstream in{std::string{fuzz::text_of(data + 1, size - 1)}};
  auto quiet = [](const std::string&) {};
  DatasetMeta meta{.path = jsonl ? "fuzz.jsonl" : "fuzz.json", .slice_begin = 0, .slice_end = -1, .log = quiet};
  auto ds = Dataset::parse(in, meta);
  if (!ds) {
    (void)describe(ds.error());
    return 0;
  }
  (void)ds->skipped().summary();
  (void)texts_of(*ds);
  std::vector<Row> rows;
  for (size_t i = 0; i < ds->size(); ++i) rows.push_back(ds->row(i));

  // What save_jsonl writes, load reads back (origins aside).
  static const std::string path = "/tmp/glint-fuzz-dataset-" + std::to_string(::getpid()) + ".jsonl";
  auto saved = save_jsonl(rows, path);
  GLINT_FUZZ_CHECK(saved, saved ? "" : describe(saved.error()));
  auto back = Dataset::load({.path = path, .log = quiet});
  GLINT_FUZZ_CHECK(back, back ? "" : describe(back.error()));
  ::unlink(path.c_str());
  GLINT_FUZZ_CHECK(back->size() == rows.size(), "save_jsonl then load has " + std::to_string(back->size()) +
                                                    " rows, not " + std::to_string(rows.size()));
  for (size_t i = 0; i < rows.size(); ++i) {
    GLINT_FUZZ_CHECK(back->row(i).messages == rows[i].messages, "row " + std::to_string(i) + ": messages differ");
    GLINT_FUZZ_CHECK(back->row(i).fields == rows[i].fields, "row " + std::to_string(i) + ": fields differ");
  }

  static const auto tok = fuzz::chat_tokenizer();
  static const auto chat = Template::make(tok, {.name = "chatml", .max_length = 64, .truncation = Truncation::left});
  GLINT_FUZZ_CHECK(chat, "the ChatML template");
  for (auto p : {preprocess::gsm8k(), preprocess::self_cognition("glint", "the glint team")}) {
    auto copy = Dataset::from_rows(rows, "fuzz");
    copy.map(p).shuffle(size);
    auto o = chat->options();
    o.truncation = truncation;
    if (auto made = Template::make(tok, o)) copy.set_template(std::move(*made));
    auto ok = copy.encode({.add_generation_prompt = (data[0] & 8) != 0, .threads = 1});
    GLINT_FUZZ_CHECK(ok, ok ? "" : describe(ok.error()));
    for (size_t i = 0; i < copy.size(); ++i)
      GLINT_FUZZ_CHECK(copy.encoded(i).input_ids.size() == copy.encoded(i).loss_mask.size(), "labels and ids differ");
    (void)copy.skipped().summary();
  }
  for (const auto& r : rows)
    for (const auto& [k, v] : r.fields) (void)gsm8k_final_answer(v);
  return 0;
}
