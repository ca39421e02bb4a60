// config.json (ModelConfig::parse): a config that parses is written back by
// to_json, which must parse again to the same config (to_json is a fixpoint).
#include "common.hpp"

#include "components/model/config.hpp"

using namespace glint;
using namespace glint::components;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > fuzz::kMaxInputBytes) return 0;
  auto c = ModelConfig::parse(std::string{fuzz::text_of(data, size)}, "fuzz/config.json");
  if (!c) {
    (void)describe(c.error());
    return 0;
  }
  GLINT_FUZZ_CHECK(c->validate(), "a parsed config does not validate");
  (void)c->num_parameters();
  for (int64_t l = -1; l <= c->num_hidden_layers && l < 64; ++l) (void)c->window(l);
  for (int64_t id : {int64_t{-1}, int64_t{0}, c->vocab_size - 1}) (void)c->is_eos(id);
  const auto text = c->to_json();
  auto back = ModelConfig::parse(text, "fuzz/config.json written back");
  GLINT_FUZZ_CHECK(back, "to_json gives a config that does not parse: " + (back ? "" : describe(back.error())) +
                             "\n" + text);
  GLINT_FUZZ_CHECK(back->to_json() == text, "to_json of the config read back differs:\n" + text + "\n" + back->to_json());
  return 0;
}
