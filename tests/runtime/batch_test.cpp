#include "runtime/batch.hpp"
#include "runtime/codec.hpp"

#include <gtest/gtest.h>

namespace glint {
namespace {

Batch sample_batch(int n) {
  Batch b;
  std::vector<int64_t> ids;
  std::vector<std::string> prompts;
  for (int i = 0; i < n; ++i) {
    ids.push_back(i * 10);
    ids.push_back(i * 10 + 1);
    prompts.push_back("prompt " + std::to_string(i));
  }
  b.tensors["input_ids"] = *Tensor::from_values(ids, {n, 2});
  b.fields["prompt"] = prompts;
  return b;
}

TEST(Batch, SizeIsTheSampleCount) {
  auto b = sample_batch(3);
  ASSERT_TRUE(b.size());
  EXPECT_EQ(*b.size(), 3);
}

TEST(Batch, DisagreeingEntriesAreAnErrorNamingThem) {
  auto b = sample_batch(3);
  b.fields["answer"] = {"a", "b"};
  auto n = b.size();
  ASSERT_FALSE(n);
  EXPECT_NE(describe(n.error()).find("'answer' has 2 samples"), std::string::npos) << describe(n.error());
}

TEST(Batch, SliceThenConcatGivesTheBatchBack) {
  auto b = sample_batch(5);
  auto lo = b.slice(0, 2), hi = b.slice(2, 5);
  ASSERT_TRUE(lo && hi);
  EXPECT_TRUE(lo->tensors["input_ids"].shares_storage_with(b.tensors["input_ids"]));
  EXPECT_EQ(hi->fields["prompt"].front(), "prompt 2");
  std::vector<Batch> parts{*lo, *hi};
  auto joined = Batch::concat(parts);
  ASSERT_TRUE(joined);
  EXPECT_EQ(*joined, b);
}

TEST(Batch, RoundTripsThroughTheCodec) {
  auto b = sample_batch(4);
  auto back = decode<Batch>(*encode(b));
  ASSERT_TRUE(back) << describe(back.error());
  EXPECT_EQ(*back, b);
}

TEST(Batch, MissingTensorNamesTheOnesThatExist) {
  auto t = sample_batch(1).tensor("labels");
  ASSERT_FALSE(t);
  EXPECT_EQ(code_of(t.error()), errc::not_found);
  EXPECT_NE(describe(t.error()).find("input_ids"), std::string::npos);
}

}  // namespace
}  // namespace glint
