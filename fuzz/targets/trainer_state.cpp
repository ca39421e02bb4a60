// A checkpoint's trainer_state.json (parse_trainer_state,
// parse_checkpoint_summary): a state that parses is written again and must
// read back the same.
#include "common.hpp"

#include "actors/trainer_state.hpp"

#include <cmath>

using namespace glint;
using namespace glint::actors;

namespace {

bool same(const std::map<std::string, double>& a, const std::map<std::string, double>& b) {
  if (a.size() != b.size()) return false;
  for (auto ia = a.begin(), ib = b.begin(); ia != a.end(); ++ia, ++ib)
    if (ia->first != ib->first || !(ia->second == ib->second || (!std::isfinite(ia->second) && std::isnan(ib->second))))
      return false;
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > fuzz::kMaxInputBytes) return 0;
  const auto text = fuzz::text_of(data, size);
  auto summary = parse_checkpoint_summary(text, "fuzz/trainer_state.json");
  auto s = parse_trainer_state(text, "fuzz/trainer_state.json");
  if (!s) {
    (void)describe(s.error());
    return 0;
  }
  // The summary fields are read only by parse_checkpoint_summary.
  if (summary) GLINT_FUZZ_CHECK(summary->step == s->step, "the summary's step differs");
  const CheckpointSummary extra = summary ? *summary : CheckpointSummary{};
  const auto written = trainer_state_json(*s, extra.summary, extra.saved_ms);
  auto back = parse_trainer_state(written, "fuzz/trainer_state.json written back");
  GLINT_FUZZ_CHECK(back, "trainer_state_json gives a state that does not parse: " + (back ? "" : describe(back.error())));
  GLINT_FUZZ_CHECK(back->step == s->step && back->consumed_samples == s->consumed_samples &&
                       back->gradient_accumulation == s->gradient_accumulation && back->seed == s->seed &&
                       back->phase == s->phase && back->loader == s->loader && back->train_configs == s->train_configs &&
                       same(s->metrics, back->metrics),
                   "the state read back differs:\n" + written);
  auto back_summary = parse_checkpoint_summary(written, "written back");
  GLINT_FUZZ_CHECK(back_summary && back_summary->step == s->step && back_summary->summary == extra.summary &&
                       back_summary->saved_ms == extra.saved_ms,
                   "the summary read back differs");
  return 0;
}
