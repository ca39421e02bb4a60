// trainer_state.json: what save writes, resume reads back; what fuzzing
// and its round trip found.
#include "actors/trainer_state.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

namespace glint::actors {
namespace {

TEST(TrainerState, RoundTripsEveryField) {
  TrainerState s{.step = 40, .consumed_samples = 320, .gradient_accumulation = 2, .seed = 7, .phase = "grpo",
                 .loader = {3, 1, 16}, .metrics = {{"loss", 0.25}}, .train_configs = R"({"lr": 1e-4})"};
  const auto text = trainer_state_json(s, "loss 0.25", 1700000000000);
  auto back = parse_trainer_state(text, "trainer_state.json");
  ASSERT_TRUE(back) << describe(back.error());
  EXPECT_EQ(back->step, 40);
  EXPECT_EQ(back->consumed_samples, 320);
  EXPECT_EQ(back->gradient_accumulation, 2);
  EXPECT_EQ(back->seed, 7u);
  EXPECT_EQ(back->phase, "grpo");
  EXPECT_EQ(back->loader, s.loader);
  EXPECT_EQ(back->metrics, s.metrics);
  EXPECT_EQ(back->train_configs, s.train_configs);
  auto summary = parse_checkpoint_summary(text, "trainer_state.json");
  ASSERT_TRUE(summary) << describe(summary.error());
  EXPECT_EQ(summary->step, 40);
  EXPECT_EQ(summary->saved_ms, 1700000000000);
  EXPECT_EQ(summary->summary, "loss 0.25");
}

// Found by the fuzz target's round trip: JSON has no NaN, so nlohmann
// writes a NaN metric (a diverged loss) as null, which the reader refused:
// such a checkpoint could not be resumed.
TEST(TrainerState, ANanMetricIsWrittenAsNullAndReadBackAsNan) {
  TrainerState s{.step = 3, .metrics = {{"loss", std::numeric_limits<double>::quiet_NaN()}, {"reward", 1.0}}};
  auto back = parse_trainer_state(trainer_state_json(s, "", 0), "trainer_state.json");
  ASSERT_TRUE(back) << describe(back.error());
  EXPECT_TRUE(std::isnan(back->metrics.at("loss")));
  EXPECT_EQ(back->metrics.at("reward"), 1.0);
}

// Found by fuzz/targets/trainer_state.cpp: a float where an integer goes
// (1e300 has no int64) was converted with undefined behaviour, and a
// "saved_ms" that was not a number threw out of Checkpointer::open.
TEST(TrainerState, FieldsOfTheWrongTypeAreErrorsNamingTheField) {
  const std::string loader = R"("loader": {"seed": 1, "epoch": 0, "position": 0})";
  for (auto [text, field] : std::vector<std::pair<std::string, std::string>>{
           {R"({"step": 1e300, )" + loader + "}", "'step'"},
           {R"({"step": 1, "seed": -1, )" + loader + "}", "'seed'"},
           {R"({"step": 1, "metrics": {"loss": "low"}, )" + loader + "}", "'loss'"},
           {R"({"step": 1, "loader": {"seed": 1, "epoch": 0.5, "position": 0}})", "'epoch'"},
           {R"({"step": 1})", "'loader'"},
           {R"({"step": 18446744073709551615, )" + loader + "}", "'step'"}}) {
    auto s = parse_trainer_state(text, "t.json");
    ASSERT_FALSE(s) << text;
    EXPECT_EQ(code_of(s.error()), errc::invalid_argument);
    EXPECT_NE(describe(s.error()).find(field), std::string::npos) << describe(s.error());
  }
  auto c = parse_checkpoint_summary(R"({"step": 2, "saved_ms": "yesterday"})", "t.json");
  ASSERT_FALSE(c);
  EXPECT_NE(describe(c.error()).find("'saved_ms'"), std::string::npos) << describe(c.error());
  EXPECT_TRUE(parse_checkpoint_summary(R"({"step": 2})", "t.json"));
}

}  // namespace
}  // namespace glint::actors
