// glint's Jinja interpreter against Jinja2 itself: the snippets of
// tests/data/chat/jinja_cases.json (whitespace control, Python's values,
// filters, tests, scoping, errors) and every chat template of
// tests/data/chat_templates over the conversations of
// tests/data/chat/conversations.json, rendered by both; then what is
// refused, and how.
#include "components/data/jinja.hpp"
#include "runtime/file.hpp"
#include "support/temp_dir.hpp"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <cstdlib>
#include <algorithm>
#include <filesystem>
#include <fstream>

namespace glint::components {
namespace {

using json = nlohmann::ordered_json;

std::string read(const std::string& path) {
  auto text = read_text_file(path);
  EXPECT_TRUE(text) << describe(text.error());
  return text ? std::move(*text) : std::string{};
}

std::string data(const std::string& rel) { return std::string{GLINT_TEST_SOURCE_DIR} + "/data/" + rel; }

// What Jinja2 renders (tests/support/jinja_reference.py) for each job
// ({"template", "cases"}), one result per case: {"text", "generation"} or
// {"error"}. Fails the test where python3 with jinja2 is missing:
// scripts/setup.sh installs them.
json reference(const json& jobs) {
  const auto dir = glint::testing::fresh_dir("jinja-reference");
  const std::string in = dir + "/job.json", out = dir + "/out.json";
  std::ofstream{in} << json{{"jobs", jobs}}.dump();
  const std::string cmd = "python3 " + std::string{GLINT_TEST_SOURCE_DIR} + "/support/jinja_reference.py < " + in + " > " + out;
  if (std::system(cmd.c_str()) != 0) {
    ADD_FAILURE() << "python3 with jinja2 did not run (scripts/setup.sh installs python3-jinja2): " << cmd;
    return json::array();
  }
  return json::parse(read(out));
}

// Each case rendered by glint and as Jinja2 rendered it (`expected`): the
// same text and generation ranges, or both fail. Returns how many cases
// agreed.
size_t compare(const std::string& name, const std::string& source, const json& cases, const json& expected) {
  if (expected.size() != cases.size()) return 0;
  auto t = JinjaTemplate::parse(source, name);
  size_t agreed = 0;
  for (size_t i = 0; i < cases.size(); ++i) {
    const json& want = expected[i];
    const std::string label = name + " case " + std::to_string(i) + " " + cases[i].dump().substr(0, 160);
    if (!t) {
      ADD_FAILURE() << label << ": glint refused to parse it (" << describe(t.error()) << "); Jinja2: " << want.dump().substr(0, 200);
      continue;
    }
    auto got = t->render(cases[i]);
    if (want.contains("error")) {
      EXPECT_FALSE(got) << label << ": Jinja2 failed (" << want["error"] << ") but glint rendered:\n" << got->text;
      agreed += !got;
      continue;
    }
    if (!got) {
      ADD_FAILURE() << label << ": glint failed (" << describe(got.error()) << "); Jinja2 rendered:\n" << want["text"];
      continue;
    }
    std::vector<std::pair<size_t, size_t>> ranges;
    for (const auto& r : want["generation"]) ranges.emplace_back(r[0].get<size_t>(), r[1].get<size_t>());
    EXPECT_EQ(got->text, want["text"].get<std::string>()) << label;
    EXPECT_EQ(got->generation, ranges) << label;
    agreed += got->text == want["text"].get<std::string>() && got->generation == ranges;
  }
  return agreed;
}

class EpochEnv : public ::testing::Test {
protected:
  void SetUp() override { setenv("SOURCE_DATE_EPOCH", "1700000000", 1); }
  void TearDown() override { unsetenv("SOURCE_DATE_EPOCH"); }
};
using JinjaAgainstJinja2 = EpochEnv;

TEST_F(JinjaAgainstJinja2, EachSnippetRendersAsJinja2RendersIt) {
  const json cases = json::parse(read(data("chat/jinja_cases.json")));
  json jobs = json::array();
  for (const auto& c : cases) jobs.push_back({{"template", c["template"]}, {"cases", json::array({c["variables"]})}});
  const json expected = reference(jobs);
  ASSERT_EQ(expected.size(), cases.size());
  size_t agreed = 0;
  for (size_t i = 0; i < cases.size(); ++i)
    agreed += compare("snippet " + std::to_string(i), cases[i]["template"].get<std::string>(), jobs[i]["cases"], expected[i]);
  EXPECT_EQ(agreed, cases.size());
}

TEST_F(JinjaAgainstJinja2, EachModelsChatTemplateRendersEachConversationAsJinja2Does) {
  const json conversations = json::parse(read(data("chat/conversations.json")));
  json cases = json::array();
  for (const auto& c : conversations) {
    json v = c;
    v.erase("name");
    if (!v.contains("add_generation_prompt")) v["add_generation_prompt"] = false;
    v["bos_token"] = "<s>";
    v["eos_token"] = "</s>";
    cases.push_back(v);
  }
  std::vector<std::filesystem::path> files;
  for (const auto& entry : std::filesystem::directory_iterator(data("chat_templates")))
    if (entry.path().extension() == ".jinja") files.push_back(entry.path());
  std::sort(files.begin(), files.end());
  json jobs = json::array();
  for (const auto& f : files) jobs.push_back({{"template", read(f.string())}, {"cases", cases}});
  const json expected = reference(jobs);
  ASSERT_EQ(expected.size(), files.size());
  size_t rendered = 0, raised = 0;
  for (size_t k = 0; k < files.size(); ++k) {
    EXPECT_EQ(compare(files[k].filename().string(), jobs[k]["template"].get<std::string>(), cases, expected[k]), cases.size())
        << files[k];
    for (const auto& r : expected[k]) (r.contains("error") ? raised : rendered)++;
  }
  // The real templates' spread: Qwen2.5/3/3.5, QwQ, Llama 3.1/3.2, Mistral,
  // Gemma, DeepSeek-R1/V3, Phi, GLM-4, Kimi-K2, gpt-oss, Granite, Command-R,
  // Hermes (each file's first line says where it comes from).
  EXPECT_GE(files.size(), 20u);
  EXPECT_GT(rendered, 4 * raised) << "most conversations should render, not raise";
}

// Random templates from a seeded grammar (tests/support/jinja_random.py:
// expressions, filters, tests, methods, slices, loops, conditions, macros,
// namespaces, whitespace control, over messages with tool calls and
// unicode), each rendered by Jinja2 and by glint: the same text, or both
// fail (a template Jinja2 cannot parse, glint must refuse too).
TEST_F(JinjaAgainstJinja2, RandomTemplatesRenderAsJinja2RendersThem) {
  const auto dir = glint::testing::fresh_dir("jinja-random");
  const std::string out = dir + "/cases.json";
  const std::string cmd = "python3 " + std::string{GLINT_TEST_SOURCE_DIR} + "/support/jinja_random.py 20261204 1000 > " + out;
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  const json cases = json::parse(read(out));
  ASSERT_EQ(cases.size(), 1000u);
  size_t agreed = 0, errors = 0;
  for (size_t i = 0; i < cases.size(); ++i) {
    const auto& c = cases[i];
    const std::string source = c["template"].get<std::string>();
    const json& want = c["result"];
    auto t = JinjaTemplate::parse(source, "random " + std::to_string(i));
    if (want.contains("error")) {
      ++errors;
      const bool jinja_parse_error = want["error"].get<std::string>().starts_with("parse: ");
      if (!t) {
        EXPECT_TRUE(jinja_parse_error) << source << "\nglint refused to parse: " << describe(t.error());
        agreed += jinja_parse_error;
        continue;
      }
      auto got = t->render(c["variables"]);
      EXPECT_FALSE(got) << source << "\nJinja2 failed (" << want["error"] << "); glint rendered: " << got->text;
      agreed += !got;
      continue;
    }
    if (!t) {
      ADD_FAILURE() << source << "\nglint refused to parse: " << describe(t.error());
      continue;
    }
    auto got = t->render(c["variables"]);
    if (!got) {
      ADD_FAILURE() << source << "\nglint failed: " << describe(got.error()) << "\nJinja2: " << want["text"];
      continue;
    }
    // A generator printed: Jinja2 writes its address.
    if (want["text"].get<std::string>().find(" at 0x") != std::string::npos) {
      EXPECT_NE(got->text.find("<generator object"), std::string::npos) << source;
      ++agreed;
      continue;
    }
    EXPECT_EQ(got->text, want["text"].get<std::string>()) << source;
    agreed += got->text == want["text"].get<std::string>();
  }
  EXPECT_EQ(agreed, cases.size());
  EXPECT_LT(errors, cases.size() * 2 / 3) << "a third of the random templates should render";
}

std::string render(const std::string& source, const json& vars = json::object()) {
  auto t = JinjaTemplate::parse(source, "test.jinja");
  if (!t) return "parse error: " + describe(t.error());
  auto r = t->render(vars);
  if (!r) return "render error: " + describe(r.error());
  return r->text;
}

TEST(Jinja, RaiseExceptionFailsWithTheTemplatesMessageAndLine) {
  const std::string out = render("line one\n{% if messages | length == 0 %}\n{{ raise_exception('Conversation roles must alternate') }}\n{% endif %}",
                                 {{"messages", json::array()}});
  EXPECT_NE(out.find("render error"), std::string::npos) << out;
  EXPECT_NE(out.find("test.jinja, line 3"), std::string::npos) << out;
  EXPECT_NE(out.find("raised an exception: Conversation roles must alternate"), std::string::npos) << out;
}

TEST(Jinja, WhatItDoesNotRunIsRefusedAtParseNamingTheConstructAndLine) {
  for (const auto& [source, what] : std::vector<std::pair<std::string, std::string>>{
           {"a\n{% include 'x.jinja' %}", "line 2: cannot be parsed: {% include %} is not supported"},
           {"{% call foo() %}x{% endcall %}", "{% call %} is not supported"},
           {"{% do x.append(1) %}", "{% do %} is not supported"},
           {"\n\n{{ x | no_such_filter }}", "line 3: cannot be parsed: no filter named 'no_such_filter'"},
           {"{{ x is frobnicated }}", "no test named 'frobnicated'"},
           {"{% for x in y recursive %}{% endfor %}", "recursive for loops are not supported"},
           {"{% if x %}never closed", "the template ends inside a block"},
           {"{{ f(*args) }}", "*args and **kwargs"},
           {"{% break %}", "outside a for loop"},
           {"{{ 'unterminated }}", "never closed"},
           {"{% frobnicate %}", "unknown tag 'frobnicate'"},
       }) {
    const std::string out = render(source);
    EXPECT_NE(out.find("parse error"), std::string::npos) << source << " -> " << out;
    EXPECT_NE(out.find(what), std::string::npos) << source << " -> " << out;
  }
}

TEST(Jinja, UndefinedIsEmptyTextButFailsWhenUsedAsMoreNamingWhatWasMissing) {
  EXPECT_EQ(render("[{{ missing }}][{{ m.nope }}]", {{"m", json::object()}}), "[][]");
  const std::string out = render("{{ m.tool_calls.function }}", {{"m", {{"role", "user"}}}});
  EXPECT_NE(out.find("'dict object' has no attribute 'tool_calls'"), std::string::npos) << out;
  EXPECT_NE(render("{{ 1 + x }}").find("'x' is undefined"), std::string::npos);
}

TEST(Jinja, StrftimeNowReadsSourceDateEpoch) {
  setenv("SOURCE_DATE_EPOCH", "86400", 1);
  EXPECT_EQ(render("{{ strftime_now('%d %b %Y') }}"), "02 Jan 1970");
  setenv("SOURCE_DATE_EPOCH", "yesterday", 1);
  EXPECT_NE(render("{{ strftime_now('%Y') }}").find("SOURCE_DATE_EPOCH='yesterday'"), std::string::npos);
  unsetenv("SOURCE_DATE_EPOCH");
  EXPECT_EQ(render("{{ strftime_now('%Y') | length }}"), "4");
}

TEST(Jinja, AListMethodThatWouldChangeItFailsAsInTheImmutableSandbox) {
  const std::string out = render("{% set l = [1] %}{{ l.append(2) }}");
  EXPECT_NE(out.find("access to attribute 'append' of 'list' object is unsafe"), std::string::npos) << out;
}

TEST(Jinja, RunawayRecursionAndOutputAreBounded) {
  EXPECT_NE(render("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}").find("macros nest deeper than"), std::string::npos);
  EXPECT_NE(render("{% for i in range(2000000) %}{% endfor %}").find("more than a million"), std::string::npos);
}

// Hostile templates: each is refused or fails with an error, fast, and none
// crashes or runs unbounded (found in review).
TEST(Jinja, HostileTemplatesFailCleanly) {
  EXPECT_EQ(render("{{ 1e400 }} {{ -1e400 }} {{ 1e-400 }}"), "inf -inf 0.0");
  EXPECT_NE(render("{{ x.99999999999999999999 }}").find("too large"), std::string::npos);
  EXPECT_NE(render("{{ 123456789012345678901234567890 }}").find("too large"), std::string::npos);
  EXPECT_NE(render("{{ (-9223372036854775807 - 1) // -1 }}").find("too large"), std::string::npos);
  EXPECT_EQ(render("{{ (-9223372036854775807 - 1) % -1 }} {{ 7 // -1 }}"), "0 -7");
  EXPECT_EQ(render("{{ 1 ** 9223372036854775807 }} {{ 2 ** 62 }}"), "1 4611686018427387904");
  EXPECT_NE(render("{{ 2 ** 100 }}").find("too large"), std::string::npos);
  EXPECT_NE(render("{{ 9223372036854775807 + 1 }}").find("too large"), std::string::npos);
  EXPECT_EQ(render("{{ 'abc'[1::9223372036854775807] }}{{ [1, 2, 3][-1::-9223372036854775807] }}"), "b[3]");
  std::string chain = "{{ 1";
  for (int i = 0; i < 100000; ++i) chain += "+1";
  EXPECT_NE(render(chain + " }}").find("deeper than 150"), std::string::npos);
  EXPECT_NE(render("{{ \"\\x\xF4\x8F\xBF\xBF\" }}").find("parse error"), std::string::npos);
  EXPECT_NE(render("{{ '\\U00110000' }}").find("names no character"), std::string::npos);
  EXPECT_EQ(render("{% set ns = namespace() %}{% set ns.a = ns %}{{ ns | string | length > 0 }}"), "True");
  EXPECT_NE(render("{% set ns = namespace(s='ab') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}")
                .find("more than 256 MiB"),
            std::string::npos);
  EXPECT_NE(render("{% for i in range(1000000) %}{{ range(1000000) | length }}{% endfor %}").find("units of work"),
            std::string::npos);
  EXPECT_NE(render("{{ 'x' | center(100000000000) }}").find("width"), std::string::npos);
  EXPECT_NE(render("{{ [1] | tojson(indent=1000000000) }}").find("indent"), std::string::npos);
  EXPECT_EQ(render("{{ '%s' | format(x) | length }} {{ ('%s!' % x) | length }}", {{"x", std::string(5000, 'a')}}), "5000 5001");
  EXPECT_NE(render("{{ 1e300 | int }}").find("too large"), std::string::npos);
  EXPECT_EQ(render("{{ 1234 | round(-2) }} {{ 1250 | round(-2) }} {{ 1350 | round(-2) }}"), "1200 1200 1400");
  json deep = json::array();
  for (int i = 0; i < 1000; ++i) deep = json::array({deep});
  EXPECT_NE(render("{{ x }}", {{"x", deep}}).find("deeper than 256"), std::string::npos);
}

TEST(Jinja, GenerationBlocksReportTheirByteRanges) {
  auto t = JinjaTemplate::parse("ab{% generation %}é{{ x }}{% endgeneration %}c{% generation %}{% endgeneration %}", "g");
  ASSERT_TRUE(t) << describe(t.error());
  auto r = t->render({{"x", 1}});
  ASSERT_TRUE(r) << describe(r.error());
  EXPECT_EQ(r->text, "abé1c");
  EXPECT_EQ(r->generation, (std::vector<std::pair<size_t, size_t>>{{2, 5}, {6, 6}}));
}

TEST(Jinja, TheVariablesMustBeAnObject) {
  auto t = JinjaTemplate::parse("x", "t");
  ASSERT_TRUE(t);
  EXPECT_FALSE(t->render(json::array()));
}

}  // namespace
}  // namespace glint::components
