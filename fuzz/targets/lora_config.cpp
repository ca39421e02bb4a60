// adapter_config.json (LoraConfig::parse): a config that parses is written
// back by to_json, which must parse again to the same text, and says which
// modules of a small model it adapts, with what rank and scaling.
#include "common.hpp"

#include "components/model/lora_config.hpp"

#include <cmath>

using namespace glint;
using namespace glint::components;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > fuzz::kMaxInputBytes) return 0;
  auto c = LoraConfig::parse(std::string{fuzz::text_of(data, size)}, "fuzz/adapter_config.json");
  if (!c) {
    (void)describe(c.error());
    return 0;
  }
  GLINT_FUZZ_CHECK(c->validate(), "a parsed config does not validate");
  const auto text = c->to_json();
  auto back = LoraConfig::parse(text, "fuzz/adapter_config.json written back");
  GLINT_FUZZ_CHECK(back, "to_json gives a config that does not parse: " + (back ? "" : describe(back.error())) +
                             "\n" + text);
  GLINT_FUZZ_CHECK(back->to_json() == text, "to_json of the config read back differs:\n" + text + "\n" + back->to_json());
  (void)c->scaling();
  for (const char* m : {"model.layers.0.self_attn.q_proj", "model.layers.1.mlp.down_proj", "lm_head",
                        "model.embed_tokens"}) {
    (void)c->targets(m);
    GLINT_FUZZ_CHECK(c->rank_of(m) > 0, m);
    (void)c->scaling_of(m);
  }
  return 0;
}
