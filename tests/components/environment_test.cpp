// Environments for multi-turn rollouts: the built-in calculator's episodes
// and arithmetic, and a program speaking JSON lines, with what goes wrong
// when it crashes, hangs or answers garbage.
#include "components/rl/environment.hpp"
#include "support/temp_dir.hpp"

#include <gtest/gtest.h>

#include <fstream>

namespace glint::components::rl {
namespace {

using json = nlohmann::ordered_json;
using namespace std::chrono_literals;

TEST(Calculator, EvaluatesArithmeticAndSaysWhatIsWrong) {
  EXPECT_EQ(*CalculatorEnvironment::evaluate("12*7"), 84);
  EXPECT_EQ(*CalculatorEnvironment::evaluate(" (1 + 2) * -3 / 2 "), -4.5);
  EXPECT_EQ(*CalculatorEnvironment::evaluate("2.5+0.5"), 3);
  for (const auto& [bad, why] : std::vector<std::pair<std::string, std::string>>{
           {"1/0", "division by zero"}, {"(1+2", "not closed"}, {"2^3", "unexpected '^"}, {"", "ends early"},
           {std::string(300, '1'), "longer than 200"}, {std::string(60, '(') + "1" + std::string(60, ')'), "nest too deep"}}) {
    auto v = CalculatorEnvironment::evaluate(bad);
    ASSERT_FALSE(v) << bad;
    EXPECT_NE(describe(v.error()).find(why), std::string::npos) << bad << ": " << describe(v.error());
  }
}

TEST(Calculator, AnEpisodeOffersTheToolAnswersCallsAndRewardsTheFinalAnswer) {
  auto env = make_environment("builtin:calculator", {});
  ASSERT_TRUE(env) << describe(env.error());
  const std::map<std::string, std::string> row = {{"question", "What is 12 * 7?"}, {"answer", "12 * 7 = 84\n#### 84"}};
  auto start = (*env)->reset(row);
  ASSERT_TRUE(start) << describe(start.error());
  EXPECT_EQ(start->messages.back()["content"], "What is 12 * 7?");
  EXPECT_EQ(start->tools[0]["function"]["name"], "calculator");
  auto call = (*env)->step({"", {{"", "calculator", {{"expression", "12*7"}}}}, {}});
  ASSERT_TRUE(call) << describe(call.error());
  EXPECT_FALSE(call->done);
  EXPECT_EQ(call->messages[0]["content"], "84");
  EXPECT_EQ(call->metrics.at("tool_calls_valid"), 1);
  auto wrong_tool = (*env)->step({"", {{"", "search", json::object()}}, {"tool call 2: invalid JSON: {"}});
  ASSERT_TRUE(wrong_tool);
  ASSERT_EQ(wrong_tool->messages.size(), 2u);
  EXPECT_EQ(wrong_tool->messages[0]["content"], "error: tool call 2: invalid JSON: {");
  EXPECT_NE(wrong_tool->messages[1]["content"].get<std::string>().find("no tool named 'search'"), std::string::npos);
  EXPECT_EQ(wrong_tool->metrics.at("tool_calls_valid"), 0);
  auto right = (*env)->step({"So it is 84.", {}, {}});
  ASSERT_TRUE(right);
  EXPECT_TRUE(right->done);
  EXPECT_EQ(right->reward, 1);
  ASSERT_TRUE((*env)->reset(row));
  EXPECT_EQ((*env)->step({"It is 85.", {}, {}})->reward, 0);
  EXPECT_FALSE((*env)->reset({{"question", "no answer"}}));
  EXPECT_FALSE(make_environment("builtin:chess", {}));
}

// A program: `mode` in the row picks how it misbehaves.
std::string script() {
  const auto path = glint::testing::fresh_dir("env") + "/env.py";
  std::ofstream{path} << R"(import json, sys, time
mode = "ok"
for line in sys.stdin:
    req = json.loads(line)
    if req["type"] == "reset":
        mode = req["row"].get("mode", "ok")
        print(json.dumps({"messages": [{"role": "user", "content": "Q: " + req["row"].get("question", "")}], "tools": []}), flush=True)
        continue
    if mode == "crash":
        sys.exit(3)
    if mode == "hang":
        time.sleep(30)
    if mode == "garbage":
        print("not json", flush=True)
        continue
    msg = req["message"]
    calls = msg.get("tool_calls", [])
    done = not calls
    print(json.dumps({"messages": [] if done else [{"role": "tool", "content": "seen " + calls[0]["function"]["name"]}],
                      "reward": 1.0 if done and "42" in msg["content"] else 0.0, "done": done, "metrics": {"calls": len(calls)}}), flush=True)
)";
  return "python3 " + path;
}

TEST(CommandEnvironment, SpeaksJsonLinesAcrossEpisodes) {
  auto env = make_environment(script(), {.timeout = 10s});
  ASSERT_TRUE(env);
  for (int episode = 0; episode < 3; ++episode) {
    auto start = (*env)->reset({{"question", "6*7"}});
    ASSERT_TRUE(start) << describe(start.error());
    EXPECT_EQ(start->messages[0]["content"], "Q: 6*7");
    auto mid = (*env)->step({"", {{"", "calculator", {{"expression", "6*7"}}}}, {}});
    ASSERT_TRUE(mid) << describe(mid.error());
    EXPECT_FALSE(mid->done);
    EXPECT_EQ(mid->messages[0]["content"], "seen calculator");
    EXPECT_EQ(mid->metrics.at("calls"), 1);
    auto end = (*env)->step({"42", {}, {}});
    ASSERT_TRUE(end) << describe(end.error());
    EXPECT_TRUE(end->done);
    EXPECT_EQ(end->reward, 1);
  }
}

TEST(CommandEnvironment, ACrashAHangAndGarbageAreNamedAndTheNextEpisodeStartsAfresh) {
  auto env = make_environment(script(), {.timeout = 500ms});
  ASSERT_TRUE(env);
  ASSERT_TRUE((*env)->reset({{"mode", "crash"}}));
  auto crashed = (*env)->step({"x", {}, {}});
  ASSERT_FALSE(crashed);
  EXPECT_NE(describe(crashed.error()).find("exited with status 3"), std::string::npos) << describe(crashed.error());
  ASSERT_TRUE((*env)->reset({{"mode", "hang"}})) << "started again after the crash";
  const auto t0 = std::chrono::steady_clock::now();
  auto hung = (*env)->step({"x", {}, {}});
  ASSERT_FALSE(hung);
  EXPECT_EQ(code_of(hung.error()), errc::deadline_exceeded);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 5s);
  ASSERT_TRUE((*env)->reset({{"mode", "garbage"}}));
  auto garbage = (*env)->step({"x", {}, {}});
  ASSERT_FALSE(garbage);
  EXPECT_NE(describe(garbage.error()).find("not a JSON object: not json"), std::string::npos) << describe(garbage.error());
  // Stopped: the next request does not read an answer meant for an earlier one.
  auto next = (*env)->reset({{"question", "again"}});
  ASSERT_TRUE(next) << describe(next.error());
  EXPECT_EQ(next->messages[0]["content"], "Q: again");
  auto missing = make_environment("exit 0", {.timeout = 1s});
  ASSERT_TRUE(missing);
  auto r = (*missing)->reset({});
  ASSERT_FALSE(r);
  EXPECT_NE(describe(r.error()).find("environment 'exit 0'"), std::string::npos) << describe(r.error());
}

}  // namespace
}  // namespace glint::components::rl
