// The dataloader rank's state called directly: batches with their rows'
// solutions, the position after delivered batches only, exact resume, and
// a dataset that does not load answering why.
#include "actors/dataloader_state.hpp"
#include "components/data/bpe_trainer.hpp"
#include "components/data/synthetic.hpp"
#include "support/temp_dir.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>

namespace glint::actors {
namespace {

DataLoaderSpec spec() {
  static const auto dir = [] {
    auto d = glint::testing::fresh_dir("loader-state");
    auto rows = components::arithmetic_rows(20, {.seed = 4});
    EXPECT_TRUE(components::save_jsonl(rows, d + "/arith.jsonl"));
    auto json = components::train_bpe(components::texts_of(components::Dataset::from_rows(rows)), {.vocab_size = 300});
    EXPECT_TRUE(components::save_chatml_tokenizer(d, *json));
    return d;
  }();
  return {.dataset = dir + "/arith.jsonl", .preprocess = "gsm8k", .tokenizer = dir, .add_generation_prompt = true,
          .batch_size = 4, .seed = 2, .epochs = 1, .prefetch = 3};
}

TEST(DataLoaderState, BatchesCarryPromptsAndSolutionsAndEndAfterTheEpoch) {
  DataLoaderState st{RankContext{.group = "data"}, spec()};
  auto info = st.info();
  ASSERT_TRUE(info) << describe(info.error());
  EXPECT_EQ(info->rows, 20);
  EXPECT_EQ(info->batches_per_epoch, 5);
  for (int i = 0; i < 5; ++i) {
    auto b = st.next();
    ASSERT_TRUE(b) << describe(b.error());
    ASSERT_EQ(b->rows.size(), 4u);
    for (const auto& r : b->rows) {
      EXPECT_FALSE(r.input_ids.empty());
      EXPECT_EQ(r.loss_mask, std::vector<float>(r.input_ids.size(), 0.f)) << "prompts train on nothing";
      EXPECT_TRUE(r.fields.count("solution"));
    }
  }
  auto end = st.next();
  ASSERT_TRUE(end);
  EXPECT_TRUE(end->end);
  EXPECT_TRUE(end->rows.empty());
  EXPECT_TRUE(st.next()->end) << "and stays at the end";
}

TEST(DataLoaderState, TheStateIsAfterTheDeliveredBatchAndResumesExactly) {
  DataLoaderState a{RankContext{}, spec()};
  ASSERT_TRUE(a.next());
  a.fill();  // batches made ahead do not move the state
  auto at = a.state();
  ASSERT_TRUE(at);
  auto want = a.next();
  DataLoaderState b{RankContext{}, spec()};
  ASSERT_TRUE(b.restore(*at));
  auto got = b.next();
  ASSERT_TRUE(want && got);
  EXPECT_EQ(got->rows, want->rows);
  EXPECT_FALSE(b.restore({.seed = 99, .epoch = 0, .position = 0})) << "another seed's order is not this loader's";
}

TEST(DataLoaderState, ABatchOverTheMessageLimitIsRefusedAndNotConsumed) {
  DataLoaderState st{RankContext{}, spec()};
  const auto limit = max_message_bytes();
  set_max_message_bytes(64);
  auto big = st.next();
  set_max_message_bytes(limit);
  ASSERT_FALSE(big);
  EXPECT_EQ(code_of(big.error()), errc::resource_exhausted);
  EXPECT_NE(describe(big.error()).find("lower batch_size"), std::string::npos) << describe(big.error());
  EXPECT_EQ(st.state()->position, 0) << "the refused batch was not delivered";
  DataLoaderState fresh{RankContext{}, spec()};
  EXPECT_EQ(st.next()->rows, fresh.next()->rows) << "and comes next";
}

TEST(DataLoaderState, ADatasetThatDoesNotLoadAnswersWhy) {
  auto s = spec();
  s.preprocess = "nope";
  DataLoaderState st{RankContext{.group = "data"}, s};
  auto b = st.next();
  ASSERT_FALSE(b);
  EXPECT_NE(describe(b.error()).find("unknown preprocessor 'nope'"), std::string::npos) << describe(b.error());
  EXPECT_NE(describe(st.fail(b.error())).find("group 'data'"), std::string::npos);
  EXPECT_FALSE(st.state());
}

// max_length 0 is the model's context: max_position_embeddings of the
// config.json beside the tokenizer, else the tokenizer_config.json's
// model_max_length. Rows beyond it are refused (skipped, counted) or
// truncated as the spec says, never passed on to a model that cannot take them.
TEST(DataLoaderState, NoMaxLengthMeansTheModelsContext) {
  auto s = spec();
  s.shuffle = false;
  s.batch_size = 1;
  const auto dir = glint::testing::fresh_dir("loader-context");
  for (const char* f : {"tokenizer.json", "tokenizer_config.json"})
    std::filesystem::copy_file(s.tokenizer + "/" + f, dir + "/" + f);
  s.tokenizer = dir;
  // No config.json, no model_max_length: no limit. The rows' lengths:
  std::vector<size_t> lengths;
  {
    DataLoaderState st{RankContext{}, s};
    ASSERT_TRUE(st.info()) << describe(st.info().error());
    for (auto b = st.next(); b && !b->end; b = st.next()) lengths.push_back(b->rows.at(0).input_ids.size());
  }
  ASSERT_EQ(lengths.size(), 20u);
  auto sorted = lengths;
  std::sort(sorted.begin(), sorted.end());
  const auto context = sorted[10];
  const auto fit = std::count_if(lengths.begin(), lengths.end(), [&](size_t n) { return n <= context; });
  ASSERT_LT(fit, 20) << "the rows must differ in length for this test";
  std::ofstream{dir + "/config.json"} << R"({"max_position_embeddings": )" << context << "}";
  {
    DataLoaderState st{RankContext{}, s};
    auto info = st.info();
    ASSERT_TRUE(info) << describe(info.error());
    EXPECT_EQ(info->rows, fit);
    EXPECT_NE(info->skipped.find(std::to_string(20 - fit) + " too long"), std::string::npos) << info->skipped;
  }
  s.truncation = "left";
  {
    DataLoaderState st{RankContext{}, s};
    ASSERT_TRUE(st.info());
    EXPECT_EQ(st.info()->rows, 20);
    for (auto b = st.next(); b && !b->end; b = st.next()) EXPECT_LE(b->rows.at(0).input_ids.size(), context);
  }
  s.max_length = -1;
  DataLoaderState negative{RankContext{}, s};
  ASSERT_FALSE(negative.info());
  EXPECT_NE(describe(negative.info().error()).find("max_length is -1"), std::string::npos);
  std::ofstream{dir + "/config.json"} << R"({"max_position_embeddings": "long"})";
  s.max_length = 0;
  DataLoaderState broken{RankContext{}, s};
  ASSERT_FALSE(broken.info());
  EXPECT_NE(describe(broken.info().error()).find("max_position_embeddings \"long\""), std::string::npos)
      << describe(broken.info().error());
}

}  // namespace
}  // namespace glint::actors
