// BatchSampler: every row once per epoch, short tails, exact resume.
#include "components/data/batch_sampler.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>

namespace glint::components {
namespace {

std::vector<std::vector<int64_t>> drain(BatchSampler& s) {
  std::vector<std::vector<int64_t>> out;
  for (auto b = s.next(); !b.empty(); b = s.next()) out.push_back(b);
  return out;
}

TEST(BatchSampler, EachEpochIsAPermutationOfTheRows) {
  auto s = BatchSampler::make(10, {.batch_size = 4, .min_batch_size = 1, .seed = 3, .epochs = 2});
  ASSERT_TRUE(s);
  EXPECT_EQ(s->batches_per_epoch(), 3);
  auto batches = drain(*s);
  ASSERT_EQ(batches.size(), 6u);
  EXPECT_EQ(batches[2].size(), 2u) << "the tail of 2 is kept: min_batch_size 1";
  std::vector<int64_t> e0, e1;
  for (int i = 0; i < 3; ++i) e0.insert(e0.end(), batches[static_cast<size_t>(i)].begin(), batches[static_cast<size_t>(i)].end());
  for (int i = 3; i < 6; ++i) e1.insert(e1.end(), batches[static_cast<size_t>(i)].begin(), batches[static_cast<size_t>(i)].end());
  EXPECT_NE(e0, e1) << "each epoch has its own order";
  std::vector<int64_t> all(10);
  std::iota(all.begin(), all.end(), 0);
  std::sort(e0.begin(), e0.end());
  std::sort(e1.begin(), e1.end());
  EXPECT_EQ(e0, all);
  EXPECT_EQ(e1, all);
  EXPECT_TRUE(s->next().empty()) << "stays done";
}

TEST(BatchSampler, ShortTailsAreDroppedAndNoShuffleKeepsOrder) {
  auto s = BatchSampler::make(10, {.batch_size = 4, .shuffle = false, .epochs = 1});
  auto batches = drain(*s);
  EXPECT_EQ(batches, (std::vector<std::vector<int64_t>>{{0, 1, 2, 3}, {4, 5, 6, 7}}));
  EXPECT_EQ(s->batches_per_epoch(), 2);
  auto tiny = BatchSampler::make(3, {.batch_size = 4, .epochs = 0});
  EXPECT_TRUE(tiny->next().empty()) << "an endless loader over too few rows ends instead of spinning";
}

TEST(BatchSampler, RestoringAStateGivesTheSameBatchesAgain) {
  const BatchSamplerOptions o{.batch_size = 3, .min_batch_size = 2, .seed = 9, .epochs = 4};
  auto a = BatchSampler::make(11, o);
  std::vector<LoaderState> states;
  std::vector<std::vector<int64_t>> batches;
  for (auto b = a->next(); !b.empty(); b = a->next()) {
    batches.push_back(b);
    states.push_back(a->state());
  }
  ASSERT_GT(batches.size(), 8u);
  for (size_t k : {size_t{0}, size_t{3}, size_t{4}, batches.size() - 2}) {
    auto b = BatchSampler::make(11, o);
    ASSERT_TRUE(b->restore(states[k]));
    auto rest = drain(*b);
    EXPECT_EQ(rest, std::vector<std::vector<int64_t>>(batches.begin() + static_cast<std::ptrdiff_t>(k) + 1, batches.end()))
        << "resumed after batch " << k;
  }
}

TEST(BatchSampler, BadOptionsAndForeignStatesAreRefused) {
  EXPECT_FALSE(BatchSampler::make(10, {.batch_size = 0}));
  EXPECT_FALSE(BatchSampler::make(10, {.batch_size = 4, .min_batch_size = 5}));
  EXPECT_FALSE(BatchSampler::make(10, {.epochs = -1}));
  auto s = BatchSampler::make(10, {.seed = 1});
  auto seed = s->restore({.seed = 2});
  ASSERT_FALSE(seed);
  EXPECT_NE(describe(seed.error()).find("seed 2"), std::string::npos);
  EXPECT_FALSE(s->restore({.seed = 1, .epoch = 0, .position = 11}));
}

}  // namespace
}  // namespace glint::components
