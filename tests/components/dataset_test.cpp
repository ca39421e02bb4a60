// Datasets: JSONL and JSON, bad rows counted by reason, slices,
// preprocessors, filters, a seeded shuffle, and encoding on a thread pool.
#include "components/data/dataset.hpp"
#include "components/data/synthetic.hpp"
#include "support/temp_dir.hpp"
#include "support/tokenizers.hpp"

#include <gtest/gtest.h>

#include <sys/stat.h>

#include <fstream>
#include <set>
#include <sstream>

namespace glint::components {
namespace {

std::string write(const std::string& name, const std::string& text) {
  auto path = glint::testing::fresh_dir("dataset") + "/" + name;
  std::ofstream{path} << text;
  return path;
}

std::vector<std::string> logged;
DatasetMeta meta(std::string path) {
  logged.clear();
  return {.path = std::move(path), .log = [](const std::string& line) { logged.push_back(line); }};
}

Template chatml(TemplateOptions o = {}) {
  o.name = "chatml";
  auto t = Template::make(glint::testing::chat_tokenizer(), o);
  EXPECT_TRUE(t) << describe(t.error());
  return std::move(*t);
}

const char* kRows =
    R"({"messages": [{"role": "user", "content": "Who are you?"}, {"role": "assistant", "content": "I am {{NAME}}, by {{AUTHOR}}."}]})"
    "\n"
    "{not json\n"
    "\n"
    R"({"messages": "oops"})"
    "\n"
    R"({"query": "Your name?", "response": "{{NAME}}.", "tag": 3})"
    "\n"
    R"([1, 2])"
    "\n";

TEST(Dataset, JsonlSkipsBadRowsCountedByReasonAndLogsWhere) {
  auto path = write("rows.jsonl", kRows);
  auto ds = Dataset::load(meta(path));
  ASSERT_TRUE(ds) << describe(ds.error());
  EXPECT_EQ(ds->size(), 2u);
  EXPECT_EQ(ds->skipped().counts.at("invalid JSON"), 1);
  EXPECT_EQ(ds->skipped().counts.at("malformed row"), 2);
  EXPECT_EQ(ds->skipped().summary(), "3 rows skipped: 1 invalid JSON, 2 malformed row");
  ASSERT_EQ(logged.size(), 3u);
  EXPECT_NE(logged[0].find(path + ":2"), std::string::npos) << logged[0];
  EXPECT_EQ(ds->row(1).fields.at("tag"), "3");
  EXPECT_EQ(ds->row(0).origin, path + ":1");
}

// What is not a file of rows is refused at once, saying what it is: a
// directory, a FIFO with no writer (which would block forever), a device
// such as /dev/zero (which would be read until memory ran out), and a
// .jsonl file whose "line" has no end.
TEST(Dataset, WhatIsNotAFileOfRowsIsRefusedAtOnce) {
  const auto dir = glint::testing::fresh_dir("dataset-kinds");
  auto refused = [](const std::string& path, const std::string& needle) {
    auto d = Dataset::load({.path = path});
    ASSERT_FALSE(d) << path;
    EXPECT_EQ(code_of(d.error()), errc::invalid_argument) << describe(d.error());
    EXPECT_NE(describe(d.error()).find(needle), std::string::npos) << describe(d.error());
  };
  refused(dir, "is a directory");
  const auto fifo = dir + "/rows.jsonl";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  refused(fifo, "not a regular file");
  refused("/dev/zero", "not a regular file");
  const auto endless = dir + "/endless.jsonl";
  {
    std::ofstream out{endless, std::ios::binary};
    const std::string chunk(1 << 20, 'x');
    for (int i = 0; i < 65; ++i) out << chunk;
  }
  refused(endless, "longer than 64 MiB");
  // A last line without its newline is still a row.
  const auto tail = dir + "/tail.jsonl";
  std::ofstream{tail} << "{\"text\": \"a\"}\n\n{\"text\": \"b\"}";
  auto d = Dataset::load({.path = tail});
  ASSERT_TRUE(d) << describe(d.error());
  EXPECT_EQ(d->size(), 2u);
}

TEST(Dataset, JsonArraysLoadAndOtherJsonIsAnError) {
  auto ok = Dataset::load(meta(write("rows.json", R"([{"question": "1+1?", "answer": "#### 2"}, 7])")));
  ASSERT_TRUE(ok) << describe(ok.error());
  EXPECT_EQ(ok->size(), 1u);
  EXPECT_EQ(ok->skipped().total(), 1);
  auto bad = Dataset::load(meta(write("bad.json", R"({"rows": []})")));
  ASSERT_FALSE(bad);
  EXPECT_NE(describe(bad.error()).find("not a JSON array"), std::string::npos);
  auto missing = Dataset::load(meta("/nonexistent/data.jsonl"));
  ASSERT_FALSE(missing);
  EXPECT_EQ(code_of(missing.error()), errc::not_found);
  EXPECT_NE(describe(missing.error()).find("/nonexistent/data.jsonl"), std::string::npos);
}

// Found while writing fuzz/targets/dataset.cpp: an integer field past
// int64 (a JSON id, 12345678901234567890) was kept as the negative number
// its bits make. Dataset::parse reads from a stream, as the fuzz target does.
TEST(Dataset, IntegerFieldsKeepTheirDigitsAndParseReadsAStream) {
  std::istringstream in{R"({"id": 12345678901234567890, "n": -3, "x": 1.5, "ok": true})" "\n"};
  auto ds = Dataset::parse(in, meta("rows.jsonl"));
  ASSERT_TRUE(ds) << describe(ds.error());
  ASSERT_EQ(ds->size(), 1u);
  EXPECT_EQ(ds->row(0).fields.at("id"), "12345678901234567890");
  EXPECT_EQ(ds->row(0).fields.at("n"), "-3");
  EXPECT_EQ(ds->row(0).fields.at("x"), "1.5");
  EXPECT_EQ(ds->row(0).fields.at("ok"), "true");
  EXPECT_EQ(ds->row(0).origin, "rows.jsonl:1");
}

TEST(Dataset, SliceSelfCognitionAndEncode) {
  auto path = write("rows.jsonl", kRows);
  auto m = meta(path);
  m.slice_begin = 1;
  auto ds = Dataset::load(m);
  ASSERT_TRUE(ds);
  ASSERT_EQ(ds->size(), 1u);  // only the query/response row
  ds->map(preprocess::self_cognition("glint", "the team"));
  ASSERT_EQ(ds->size(), 1u);
  EXPECT_EQ(ds->row(0).messages, (std::vector<Message>{{"user", "Your name?"}, {"assistant", "glint."}}));
  EXPECT_FALSE(ds->encode()) << "no template yet";
  ds->set_template(chatml());
  ASSERT_TRUE(ds->encode());
  EXPECT_EQ(chatml().tokenizer().decode(ds->encoded(0).input_ids, false),
            "<|im_start|>user\nYour name?<|im_end|>\n<|im_start|>assistant\nglint.<|im_end|>\n");
}

TEST(Dataset, Gsm8kRowsBecomePromptsWithTheirSolution) {
  auto path = write("gsm.jsonl",
                    R"({"question": "Tom has 3 apples and buys 1,200 more. How many?", "answer": "3 + 1200 = 1203\n#### 1,203"})"
                    "\n"
                    R"({"question": "No answer here", "answer": "42"})"
                    "\n"
                    R"({"messages": []})"
                    "\n");
  auto ds = Dataset::load(meta(path));
  ASSERT_TRUE(ds);
  ds->map(preprocess::gsm8k());
  ASSERT_EQ(ds->size(), 1u);
  EXPECT_EQ(ds->skipped().counts.at("gsm8k: the answer has no '#### n' final answer"), 1);
  EXPECT_EQ(ds->skipped().counts.at("gsm8k: no question/answer fields"), 1);
  EXPECT_EQ(ds->row(0).fields.at("solution"), "1203");
  ASSERT_EQ(ds->row(0).messages.size(), 3u);
  EXPECT_EQ(ds->row(0).messages[0].role, "system");
  ds->set_template(chatml());
  ASSERT_TRUE(ds->encode({.add_generation_prompt = true}));
  auto text = chatml().tokenizer().decode(ds->encoded(0).input_ids, false);
  EXPECT_EQ(text.substr(text.size() - 22), "<|im_start|>assistant\n");
  EXPECT_EQ(text.find("1203"), std::string::npos) << "the reference solution is not in the prompt";
}

TEST(Dataset, TooLongRowsAndRowsWithoutMessagesAreSkipped) {
  std::vector<Row> rows;
  for (int i = 0; i < 6; ++i)
    rows.push_back({{{"user", "Q" + std::string(static_cast<size_t>(i * 20), 'x')}, {"assistant", "A"}}, {}, "row" + std::to_string(i)});
  rows.push_back({{}, {{"question", "q"}}, "bare"});
  auto ds = Dataset::from_rows(rows, "mem");
  logged.clear();
  ds.set_template(chatml({.max_length = 30}));
  ASSERT_TRUE(ds.encode());
  EXPECT_GT(ds.skipped().counts.at("too long"), 0);
  EXPECT_EQ(ds.skipped().counts.at("no messages (map a preprocessor first)"), 1);
  EXPECT_EQ(ds.size() + static_cast<size_t>(ds.skipped().total()), rows.size());
  for (size_t i = 0; i < ds.size(); ++i) EXPECT_LE(ds.encoded(i).input_ids.size(), 30u);
  auto left = Dataset::from_rows(rows, "mem");
  left.set_template(chatml({.max_length = 30, .truncation = Truncation::left}));
  ASSERT_TRUE(left.encode());
  EXPECT_EQ(left.size(), 6u) << left.skipped().summary();
}

TEST(Dataset, EncodingDoesNotDependOnTheThreadCount) {
  std::vector<Row> rows;
  for (int i = 0; i < 300; ++i)
    rows.push_back({{{"user", "What is " + std::to_string(i) + "?"}, {"assistant", std::to_string(i)}}, {}, ""});
  auto one = Dataset::from_rows(rows), four = Dataset::from_rows(rows);
  one.set_template(chatml());
  four.set_template(chatml());
  ASSERT_TRUE(one.encode({.threads = 1}));
  ASSERT_TRUE(four.encode({.threads = 4}));
  ASSERT_EQ(one.size(), 300u);
  for (size_t i = 0; i < 300; ++i) {
    EXPECT_EQ(one.encoded(i).input_ids, four.encoded(i).input_ids);
    EXPECT_EQ(one.encoded(i).loss_mask, four.encoded(i).loss_mask);
  }
}

TEST(Dataset, ShuffleIsASeededPermutationThatKeepsEncodingsWithTheirRows) {
  std::vector<Row> rows;
  for (int i = 0; i < 100; ++i) rows.push_back({{{"user", std::to_string(i)}, {"assistant", "ok"}}, {}, std::to_string(i)});
  auto a = Dataset::from_rows(rows), b = Dataset::from_rows(rows), c = Dataset::from_rows(rows);
  a.set_template(chatml());
  ASSERT_TRUE(a.encode());
  a.shuffle(7);
  b.shuffle(7);
  c.shuffle(8);
  std::set<std::string> seen;
  bool moved = false;
  for (size_t i = 0; i < 100; ++i) {
    EXPECT_EQ(a.row(i), b.row(i));
    seen.insert(a.row(i).origin);
    moved |= a.row(i).origin != std::to_string(i);
    // The encoding still belongs to its row.
    auto text = chatml().tokenizer().decode(a.encoded(i).input_ids, false);
    EXPECT_NE(text.find("user\n" + a.row(i).origin + "<|im_end|>"), std::string::npos);
  }
  EXPECT_EQ(seen.size(), 100u);
  EXPECT_TRUE(moved);
  bool differs = false;
  for (size_t i = 0; i < 100; ++i) differs |= !(b.row(i) == c.row(i));
  EXPECT_TRUE(differs);
}

TEST(Dataset, FiltersCountWhatTheyDrop) {
  std::vector<Row> rows;
  for (int i = 0; i < 10; ++i) rows.push_back({{{"user", std::to_string(i)}}, {}, std::to_string(i)});
  auto ds = Dataset::from_rows(rows);
  ds.filter("even", [](const Row& r) { return std::stoi(r.origin) % 2 == 0; });
  EXPECT_EQ(ds.size(), 5u);
  EXPECT_EQ(ds.skipped().counts.at("filtered: even"), 5);
}

TEST(Arithmetic, RowsAreDeterministicCorrectAndRoundTripThroughJsonl) {
  auto rows = arithmetic_rows(200, {.seed = 5, .max_operand = 30, .max_terms = 3});
  EXPECT_EQ(rows, arithmetic_rows(200, {.seed = 5, .max_operand = 30, .max_terms = 3}));
  EXPECT_NE(rows, arithmetic_rows(200, {.seed = 6, .max_operand = 30, .max_terms = 3}));
  for (const auto& r : rows) {
    // "What is a + b - c?" -> evaluate left to right.
    std::string expr = r.fields.at("question").substr(8);
    expr.pop_back();
    std::istringstream in{expr};
    int64_t value = 0, x = 0;
    std::string op;
    in >> value;
    while (in >> op >> x) value = op == "+" ? value + x : value - x;
    EXPECT_GE(value, 0);
    EXPECT_EQ(gsm8k_final_answer(r.fields.at("answer")), std::to_string(value)) << r.fields.at("answer");
  }
  auto path = glint::testing::fresh_dir("arith") + "/arith.jsonl";
  ASSERT_TRUE(save_jsonl(rows, path));
  auto back = Dataset::load(meta(path));
  ASSERT_TRUE(back);
  ASSERT_EQ(back->size(), rows.size());
  for (size_t i = 0; i < rows.size(); ++i) EXPECT_EQ(back->row(i).fields, rows[i].fields);
  back->map(preprocess::gsm8k());
  EXPECT_EQ(back->size(), rows.size()) << back->skipped().summary();
  EXPECT_FALSE(save_jsonl(rows, "/nonexistent/dir/x.jsonl"));
}

TEST(Gsm8k, FinalAnswerIsTheTextAfterTheLastMarks) {
  EXPECT_EQ(gsm8k_final_answer("a\n#### 1,234"), "1234");
  EXPECT_EQ(gsm8k_final_answer("#### 1\n#### $5 "), "5");
  EXPECT_EQ(gsm8k_final_answer("no marks"), std::nullopt);
  EXPECT_EQ(gsm8k_final_answer("####   "), std::nullopt);
}

TEST(DatasetLayouts, EachLayoutBecomesMessagesAndRowsThatFitNoneAreSkippedWithTheReason) {
  auto path = write("layouts.jsonl",
                    "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}, {\"role\": \"assistant\", \"content\": \"yo\"}]}\n"
                    "{\"query\": \"q\", \"response\": \"r\", \"system\": \"be brief\"}\n"
                    "{\"instruction\": \"add\", \"input\": \"1 and 2\", \"output\": \"3\"}\n"
                    "{\"instruction\": \"greet\", \"input\": \"\", \"output\": \"hello\"}\n"
                    "{\"query\": \"q\", \"response\": \"r\", \"history\": [[\"a\", \"b\"]]}\n"
                    "{\"foo\": \"bar\"}\n");
  auto ds = Dataset::load(meta(path));
  ASSERT_TRUE(ds);
  auto layout = preprocess::layout("auto", "default system");
  ASSERT_TRUE(layout);
  ds->map(*layout);
  ASSERT_EQ(ds->size(), 4u);
  using M = std::vector<Message>;
  EXPECT_EQ(ds->row(0).messages, (M{{"system", "default system"}, {"user", "hi"}, {"assistant", "yo"}}));
  EXPECT_EQ(ds->row(1).messages, (M{{"system", "be brief"}, {"user", "q"}, {"assistant", "r"}}))
      << "a row's own system field wins over the default";
  EXPECT_EQ(ds->row(2).messages, (M{{"system", "default system"}, {"user", "add\n1 and 2"}, {"assistant", "3"}}));
  EXPECT_EQ(ds->row(3).messages, (M{{"system", "default system"}, {"user", "greet"}, {"assistant", "hello"}}));
  EXPECT_EQ(ds->skipped().total(), 2) << ds->skipped().summary();
  EXPECT_NE(ds->skipped().summary().find("history"), std::string::npos) << "history is refused, not dropped";
  EXPECT_NE(ds->skipped().summary().find("no known layout"), std::string::npos);

  auto only = Dataset::load(meta(path));
  ASSERT_TRUE(only);
  only->map(*preprocess::layout("alpaca"));
  EXPECT_EQ(only->size(), 2u) << "a named layout takes only its own rows";
  EXPECT_FALSE(preprocess::layout("sharegpt")) << "an unknown layout name is an error";

  auto qa = write("qa.jsonl", "{\"question\": \"1+1?\", \"answer\": \"1+1=2\\n#### 2\"}\n");
  auto g = Dataset::load(meta(qa));
  ASSERT_TRUE(g);
  g->map(*preprocess::layout("auto"));
  ASSERT_EQ(g->size(), 1u) << g->skipped().summary();
  EXPECT_EQ(g->row(0).messages, (M{{"user", "1+1?"}, {"assistant", "1+1=2\n#### 2"}}))
      << "question/answer rows train on the whole worked answer";
}

TEST(PromptLayouts, EachLayoutEndsWithAUserTurnAndKeepsItsSolution) {
  auto path = write("prompts.jsonl",
                    "{\"question\": \"What is 2+3?\", \"answer\": \"2+3=5\\n#### 5\", \"level\": \"1\"}\n"
                    "{\"prompt\": \"Name a prime.\", \"solution\": \"7\"}\n"
                    "{\"prompt\": \"Half of 8?\", \"answer\": \"It is 4.\\n#### 4\"}\n"
                    "{\"prompt\": \"Say hi.\"}\n"
                    "{\"messages\": [{\"role\": \"user\", \"content\": \"3*3?\"}, {\"role\": \"assistant\", \"content\": \"#### 9\"}]}\n"
                    "{\"query\": \"10-4?\", \"response\": \"6\"}\n"
                    "{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}, {\"role\": \"assistant\", \"content\": \"b\"}, "
                    "{\"role\": \"assistant\", \"content\": \"c\"}]}\n"
                    "{\"prompt\": [{\"role\": \"user\", \"content\": \"x\"}]}\n"
                    "{\"question\": \"no final answer\", \"answer\": \"none\"}\n"
                    "{\"foo\": \"bar\"}\n");
  auto ds = Dataset::load(meta(path));
  ASSERT_TRUE(ds);
  auto layout = preprocess::prompt_layout("auto", "sys");
  ASSERT_TRUE(layout);
  ds->map(*layout);
  ASSERT_EQ(ds->size(), 6u) << ds->skipped().summary();
  using M = std::vector<Message>;
  EXPECT_EQ(ds->row(0).messages, (M{{"system", "sys"}, {"user", "What is 2+3?"}}));
  EXPECT_EQ(ds->row(0).fields.at("solution"), "5");
  EXPECT_EQ(ds->row(0).fields.at("level"), "1") << "other fields stay for a reward command";
  EXPECT_EQ(ds->row(1).fields.at("solution"), "7");
  EXPECT_EQ(ds->row(2).fields.at("solution"), "4") << "an answer's '#### n' is cut to n";
  EXPECT_EQ(ds->row(3).messages, (M{{"system", "sys"}, {"user", "Say hi."}}));
  EXPECT_EQ(ds->row(3).fields.count("solution"), 0u) << "a prompt without an answer has no solution";
  EXPECT_EQ(ds->row(4).messages, (M{{"system", "sys"}, {"user", "3*3?"}})) << "the last assistant turn is dropped";
  EXPECT_EQ(ds->row(4).fields.at("solution"), "9");
  EXPECT_EQ(ds->row(5).fields.at("solution"), "6");
  const auto why = ds->skipped().summary();
  EXPECT_EQ(ds->skipped().total(), 4) << why;
  EXPECT_NE(why.find("do not end with a user turn"), std::string::npos) << why;
  EXPECT_NE(why.find("not a string"), std::string::npos) << why;
  EXPECT_NE(why.find("no '#### n'"), std::string::npos) << why;
  EXPECT_NE(why.find("no known prompt layout"), std::string::npos) << why;

  auto only = Dataset::load(meta(path));
  ASSERT_TRUE(only);
  only->map(*preprocess::prompt_layout("gsm8k"));
  EXPECT_EQ(only->size(), 1u) << "a named layout takes only its own rows";
  EXPECT_FALSE(preprocess::prompt_layout("alpaca")) << "an unknown prompt layout is an error";
}

}  // namespace
}  // namespace glint::components
