// Rewards and advantages: answer parsing edge cases, accuracy with
// tolerance, the format reward, GRPO scales and RLOO against hand-worked
// numbers, and the metric's aggregates.
#include "components/rl/metrics.hpp"
#include "components/rl/reward_command.hpp"
#include "components/rl/rewards.hpp"

#include <gtest/gtest.h>

#include <chrono>
#include <cmath>

namespace glint::components::rl {
namespace {

TEST(Rewards, FinalAnswerIsTheLastBoxedOrHashesWhicheverComesLater) {
  EXPECT_EQ(extract_final_answer("so \\boxed{12} but wait\n#### 13"), "13");
  EXPECT_EQ(extract_final_answer("#### 13\nactually \\boxed{\\frac{1}{2}}"), "\\frac{1}{2}");
  EXPECT_EQ(extract_final_answer("\\boxed{1} and \\boxed{2}"), "2");
  EXPECT_EQ(extract_final_answer("#### 4\nmore text"), "4");
  EXPECT_EQ(extract_final_answer("\\boxed{unclosed"), std::nullopt);
  EXPECT_EQ(extract_final_answer("nothing"), std::nullopt);
  EXPECT_EQ(extract_final_answer(""), std::nullopt);
}

TEST(Rewards, NumbersParseAsPeopleWriteThem) {
  EXPECT_EQ(parse_number("1,234"), 1234.0);
  EXPECT_EQ(parse_number("$5"), 5.0);
  EXPECT_EQ(parse_number(" -3.50 "), -3.5);
  EXPECT_EQ(parse_number("7/2"), 3.5);
  EXPECT_EQ(parse_number("12."), 12.0);
  EXPECT_EQ(parse_number("40%"), 40.0);
  EXPECT_EQ(parse_number("1/0"), std::nullopt);
  EXPECT_EQ(parse_number("inf"), std::nullopt);
  EXPECT_EQ(parse_number("nan"), std::nullopt);
  EXPECT_EQ(parse_number("0x10"), std::nullopt);
  EXPECT_EQ(parse_number("twelve"), std::nullopt);
  EXPECT_EQ(parse_number(""), std::nullopt);
}

TEST(Rewards, AccuracyComparesNumbersWithinTolerance) {
  std::vector<std::string> c = {"#### 1,203", "\\boxed{1203.0000001}", "#### 1204", "no answer", "#### abc", "#### abc"};
  std::vector<std::string> s = {"1203", "1203", "1203", "1203", "abc", "abd"};
  auto r = gsm8k_accuracy(c, s);
  ASSERT_TRUE(r);
  EXPECT_EQ(*r, (std::vector<double>{1, 1, 0, 0, 1, 0}));
  auto strict = gsm8k_accuracy(std::span{c}.first(2), std::span{s}.first(2), 0.0);
  EXPECT_EQ(*strict, (std::vector<double>{1, 0}));
  std::vector<std::string> one = {"x"};
  EXPECT_FALSE(gsm8k_accuracy(one, s));
}

TEST(Rewards, FormatRewardsAFinalAnswerLineOrABoxAtTheEnd) {
  std::vector<std::string> c = {"2 + 2 = 4\n#### 4",        "2 + 2 = 4\n#### 4\n<|im_end|>", "#### 4 is it",
                                "The answer is \\boxed{4}.", "\\boxed{4} and then more words", "4",
                                "#### 4\nextra line",        ""};
  EXPECT_EQ(gsm8k_format(c), (std::vector<double>{1, 1, 0, 1, 0, 0, 0, 0}));
}

TEST(Advantages, GroupScaleIsMeanCenteredOverSampleStd) {
  std::vector<double> r = {1, 0, 0, 1, /* group 2 */ 2, 2, 2, 2};
  auto a = advantages(r, {.group_size = 4, .scale = Scale::group, .eps = 0});
  ASSERT_TRUE(a);
  const double sd = std::sqrt(1.0 / 3.0);  // sample std of {1,0,0,1}
  EXPECT_NEAR((*a)[0], 0.5 / sd, 1e-12);
  EXPECT_NEAR((*a)[1], -0.5 / sd, 1e-12);
  for (int i = 4; i < 8; ++i) EXPECT_EQ((*a)[static_cast<size_t>(i)], 0.0) << "equal rewards teach nothing";
}

TEST(Advantages, BatchAndNoneScales) {
  std::vector<double> r = {3, 1, 0, 0};
  auto none = advantages(r, {.group_size = 2, .scale = Scale::none});
  EXPECT_EQ(*none, (std::vector<double>{1, -1, 0, 0}));
  auto batch = advantages(r, {.group_size = 2, .scale = Scale::batch, .eps = 0});
  // Batch mean 1, sample variance (4 + 0 + 1 + 1) / 3 = 2.
  const double sd = std::sqrt(2.0);
  EXPECT_NEAR((*batch)[0], 1 / sd, 1e-12);
  EXPECT_NEAR((*batch)[1], -1 / sd, 1e-12);
  EXPECT_EQ((*batch)[2], 0.0);
}

TEST(Advantages, RlooSubtractsTheMeanOfTheOthers) {
  std::vector<double> r = {1, 2, 6};
  auto a = advantages(r, {.group_size = 3, .leave_one_out = true});
  ASSERT_TRUE(a);
  EXPECT_NEAR((*a)[0], 1 - 4.0, 1e-12);
  EXPECT_NEAR((*a)[1], 2 - 3.5, 1e-12);
  EXPECT_NEAR((*a)[2], 6 - 1.5, 1e-12);
}

TEST(Advantages, BadInputIsAClearError) {
  std::vector<double> r = {1, 2, 3};
  EXPECT_NE(describe(advantages(r, {.group_size = 2}).error()).find("groups of 2"), std::string::npos);
  EXPECT_FALSE(advantages(r, {.group_size = 0}));
  std::vector<double> one = {1};
  EXPECT_NE(describe(advantages(one, {.group_size = 1, .leave_one_out = true}).error()).find("RLOO"), std::string::npos);
  std::vector<double> nan = {1, std::nan("")};
  EXPECT_NE(describe(advantages(nan, {.group_size = 2}).error()).find("reward 1"), std::string::npos);
  EXPECT_TRUE(parse_scale("group"));
  EXPECT_FALSE(parse_scale("global"));
}

TEST(CompletionRewardMetric, AggregatesRewardsAndLengthsUntilReset) {
  CompletionRewardMetric m;
  std::vector<int64_t> len = {4, 8};
  ASSERT_TRUE(m.accumulate(len, {{"total", {1, 0}}, {"format", {1, 1}}}));
  std::vector<int64_t> len2 = {6};
  ASSERT_TRUE(m.accumulate(len2, {{"total", {1}}, {"format", {0}}}));
  EXPECT_FALSE(m.accumulate(len2, {{"total", {1, 2}}}));
  auto out = m.calculate();
  EXPECT_NEAR(out.at("reward/total/mean"), 2.0 / 3, 1e-12);
  EXPECT_NEAR(out.at("reward/total/std"), std::sqrt(2.0 / 9), 1e-12);
  EXPECT_EQ(out.at("completion_length/mean"), 6.0);
  EXPECT_EQ(out.at("completion_length/min"), 4.0);
  EXPECT_EQ(out.at("completion_length/max"), 8.0);
  EXPECT_EQ(out.at("completions"), 3.0);
  m.reset();
  EXPECT_TRUE(m.calculate().empty());
}

TEST(CompletionRewardMetric, TokensPerSecondCountsFromTheLastReset) {
  ManualClock clock;
  CompletionRewardMetric m{clock};
  clock.advance(std::chrono::seconds(5));  // before the reset: not counted
  m.reset();
  std::vector<int64_t> len = {30, 10};
  ASSERT_TRUE(m.accumulate(len, {{"total", {1, 0}}}));
  clock.advance(std::chrono::seconds(2));
  EXPECT_DOUBLE_EQ(m.calculate().at("tokens_per_second"), 20.0);
  clock.set_unix_ms(0);  // the wall clock stepping back changes nothing
  EXPECT_DOUBLE_EQ(m.calculate().at("tokens_per_second"), 20.0);
}

TEST(RewardCommand, ReadsJsonLinesInOrderAndAnswersOneScorePerLine) {
  // Scores: the completion's length plus the row's "bonus" field, read back
  // from the JSON the command gets (with the prompt and index).
  const RewardCommand cmd{.command = "python3 -c 'import json,sys\n"
                                     "for l in sys.stdin:\n"
                                     " r=json.loads(l); print(len(r[\"completion\"]) + float(r[\"bonus\"]) + 100*r[\"index\"]"
                                     " + (1000 if r[\"prompt\"]==\"p\" else 0))'"};
  std::vector<RewardInput> in = {{.prompt = "p", .completion = "abc", .fields = {{"bonus", "0.5"}}},
                                 {.prompt = "q", .completion = "\"quoted\"\n", .fields = {{"bonus", "-1"}}}};
  auto scores = run_reward_command(cmd, in);
  ASSERT_TRUE(scores) << describe(scores.error());
  EXPECT_EQ(*scores, (std::vector<double>{1003.5, 108.0}));
  auto none = run_reward_command(cmd, {});
  ASSERT_TRUE(none) << describe(none.error());
  EXPECT_TRUE(none->empty());
}

TEST(RewardCommand, EveryWayItCanGoWrongIsAnErrorThatSaysWhich) {
  std::vector<RewardInput> two = {{.completion = "a"}, {.completion = "b"}};
  auto message = [&](const std::string& command, double timeout = 30) {
    auto r = run_reward_command({.command = command, .timeout_seconds = timeout}, two);
    EXPECT_FALSE(r) << command;
    return r ? std::string{} : describe(r.error());
  };
  EXPECT_NE(message("cat > /dev/null; exit 3").find("exited with status 3"), std::string::npos);
  EXPECT_NE(message("cat > /dev/null; echo 1").find("wrote 1 scores for 2"), std::string::npos);
  EXPECT_NE(message("cat > /dev/null; printf '1\\n2\\n3\\n'").find("wrote 3 scores for 2"), std::string::npos);
  EXPECT_NE(message("cat > /dev/null; printf '1\\nabc\\n'").find("'abc' on output line 2"), std::string::npos);
  EXPECT_NE(message("cat > /dev/null; printf '1\\nnan\\n'").find("finite"), std::string::npos);
  EXPECT_NE(message("").find("empty"), std::string::npos);
  const auto start = std::chrono::steady_clock::now();
  EXPECT_NE(message("sleep 30 & wait", 0.3).find("timeout"), std::string::npos);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5)) << "a timeout kills the command's group";
  auto ok = run_reward_command({.command = "cat > /dev/null; printf '1\\n2.5\\n'"}, two);
  ASSERT_TRUE(ok) << describe(ok.error());
  EXPECT_EQ(*ok, (std::vector<double>{1, 2.5}));
}

}  // namespace
}  // namespace glint::components::rl
