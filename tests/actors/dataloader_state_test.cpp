// The dataloader rank's state called directly: batches with their rows'
// solutions, the position after delivered batches only, exact resume, and
// a dataset that does not load answering why.
#include "actors/dataloader_state.hpp"
#include "components/data/bpe_trainer.hpp"
#include "components/data/synthetic.hpp"
#include "support/temp_dir.hpp"

#include <gtest/gtest.h>

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

}  // namespace
}  // namespace glint::actors
