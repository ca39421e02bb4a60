#include "runtime/codec.hpp"
#include "runtime/tensor.hpp"

#include <gtest/gtest.h>

#include <random>

namespace glint {
namespace {

Tensor random_tensor(Dtype d, std::vector<int64_t> shape, uint32_t seed) {
  auto t = *Tensor::zeros(d, std::move(shape));
  std::mt19937 gen{seed};
  for (size_t i = 0; i < t.nbytes(); ++i) t.mutable_data()[i] = static_cast<std::byte>(gen() & 0xff);
  if (d == Dtype::boolean)
    for (size_t i = 0; i < t.nbytes(); ++i) t.mutable_data()[i] = static_cast<std::byte>(gen() & 1);
  return t;
}

TEST(Tensor, RoundTripsEveryDtypeThroughTheCodec) {
  uint32_t seed = std::random_device{}();
  for (auto d : {Dtype::f32, Dtype::bf16, Dtype::f16, Dtype::i64, Dtype::i32, Dtype::u8, Dtype::boolean, Dtype::f64}) {
    auto t = random_tensor(d, {3, 5, 2}, seed++);
    auto bytes = encode(t);
    ASSERT_TRUE(bytes) << describe(bytes.error());
    auto back = decode<Tensor>(*bytes);
    ASSERT_TRUE(back) << describe(back.error());
    EXPECT_EQ(*back, t) << to_string(d);
    EXPECT_FALSE(back->shares_storage_with(t));
  }
}

TEST(Tensor, RoundTripsEmptyAndUndefinedTensors) {
  auto empty = *Tensor::zeros(Dtype::f32, {0, 4});
  auto back = decode<Tensor>(*encode(empty));
  ASSERT_TRUE(back);
  EXPECT_EQ(back->shape(), (std::vector<int64_t>{0, 4}));
  auto undef = decode<Tensor>(*encode(Tensor{}));
  ASSERT_TRUE(undef);
  EXPECT_FALSE(undef->defined());
}

TEST(Tensor, SliceSharesStorageAndSelectsRows) {
  auto t = *Tensor::from_values<int64_t>(std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6, 7}, {4, 2});
  auto s = t.slice(1, 3);
  ASSERT_TRUE(s);
  EXPECT_TRUE(s->shares_storage_with(t));
  EXPECT_EQ(s->shape(), (std::vector<int64_t>{2, 2}));
  auto v = *s->values<int64_t>();
  EXPECT_EQ(std::vector<int64_t>(v.begin(), v.end()), (std::vector<int64_t>{2, 3, 4, 5}));
  (*s->mutable_values<int64_t>())[0] = 42;
  EXPECT_EQ((*t.values<int64_t>())[2], 42);
}

TEST(Tensor, SliceOutsideRangeIsAnError) {
  auto t = *Tensor::zeros(Dtype::f32, {4});
  auto s = t.slice(2, 5);
  ASSERT_FALSE(s);
  EXPECT_EQ(code_of(s.error()), errc::invalid_argument);
  EXPECT_NE(describe(s.error()).find("outside dim 0"), std::string::npos);
}

TEST(Tensor, ConcatJoinsAlongDimZero) {
  auto a = *Tensor::from_values<float>(std::vector<float>{1, 2}, {1, 2});
  auto b = *Tensor::from_values<float>(std::vector<float>{3, 4, 5, 6}, {2, 2});
  std::vector<Tensor> parts{a, b};
  auto c = Tensor::concat(parts);
  ASSERT_TRUE(c);
  EXPECT_EQ(*c, *Tensor::from_values<float>(std::vector<float>{1, 2, 3, 4, 5, 6}, {3, 2}));
  std::vector<Tensor> bad{a, *Tensor::zeros(Dtype::f32, {1, 3})};
  EXPECT_FALSE(Tensor::concat(bad));
}

TEST(Tensor, ReadingWithTheWrongTypeIsAnError) {
  auto t = *Tensor::zeros(Dtype::f32, {2});
  auto v = t.values<int64_t>();
  ASSERT_FALSE(v);
  EXPECT_NE(describe(v.error()).find("f32[2]"), std::string::npos);
}

TEST(Tensor, RejectsNegativeDimsAndOverflowingShapes) {
  EXPECT_FALSE(Tensor::zeros(Dtype::f32, {2, -1}));
  EXPECT_FALSE(Tensor::zeros(Dtype::f32, {int64_t{1} << 40, int64_t{1} << 40}));
  EXPECT_FALSE(Tensor::zeros(Dtype::f32, std::vector<int64_t>(9, 1)));
}

// The codec's layout for a defined tensor: u8 defined, u8 dtype, varint
// ndims, i64 dims..., u64 nbytes (integers big-endian), bytes. Tests below edit those fields.
std::vector<char> encoded_f32_2x2() {
  auto t = *Tensor::from_values<float>(std::vector<float>{1, 2, 3, 4}, {2, 2});
  return *encode(t);
}

TEST(TensorCodec, RejectsAHeaderWhoseSizeDisagreesWithItsBytes) {
  auto bytes = encoded_f32_2x2();
  // Claim one more byte than the shape holds.
  size_t nbytes_at = 1 + 1 + 1 + 2 * 8;
  uint64_t n = __builtin_bswap64(uint64_t{17});  // CAF writes integers in network order
  std::memcpy(bytes.data() + nbytes_at, &n, 8);
  auto t = decode<Tensor>(bytes);
  ASSERT_FALSE(t);
  EXPECT_EQ(code_of(t.error()), errc::invalid_argument);
  EXPECT_NE(describe(t.error()).find("16 bytes) but carries 17 bytes"), std::string::npos) << describe(t.error());
}

TEST(TensorCodec, RejectsATruncatedPayload) {
  auto bytes = encoded_f32_2x2();
  bytes.resize(bytes.size() - 3);
  auto t = decode<Tensor>(bytes);
  ASSERT_FALSE(t);
  EXPECT_NE(describe(t.error()).find("truncated"), std::string::npos) << describe(t.error());
}

TEST(TensorCodec, RejectsTrailingBytes) {
  auto bytes = encoded_f32_2x2();
  bytes.push_back(0);
  EXPECT_FALSE(decode<Tensor>(bytes));
}

TEST(TensorCodec, RejectsAnUnknownDtype) {
  auto bytes = encoded_f32_2x2();
  bytes[1] = 99;
  auto t = decode<Tensor>(bytes);
  ASSERT_FALSE(t);
  EXPECT_NE(describe(t.error()).find("unknown dtype code 99"), std::string::npos);
}

TEST(TensorCodec, RejectsAnOversizedTensorBeforeAllocating) {
  auto old = max_message_bytes();
  set_max_message_bytes(8);
  auto t = decode<Tensor>(encoded_f32_2x2());
  set_max_message_bytes(old);
  ASSERT_FALSE(t);
  EXPECT_EQ(code_of(t.error()), errc::resource_exhausted);
  EXPECT_NE(describe(t.error()).find("exceeds the limit of 8 bytes"), std::string::npos);
}

TEST(TensorCodec, RejectsAHugeDeclaredShapeWithoutAllocating) {
  auto bytes = encoded_f32_2x2();
  int64_t huge = static_cast<int64_t>(__builtin_bswap64(uint64_t{1} << 40));
  std::memcpy(bytes.data() + 3, &huge, 8);
  std::memcpy(bytes.data() + 11, &huge, 8);
  auto t = decode<Tensor>(bytes);
  ASSERT_FALSE(t);
}

TEST(TensorCodec, SurvivesRandomGarbage) {
  std::mt19937 gen{std::random_device{}()};
  for (int i = 0; i < 2000; ++i) {
    std::vector<char> junk(gen() % 64);
    for (auto& c : junk) c = static_cast<char>(gen());
    (void)decode<Tensor>(junk);  // must not crash or throw
  }
  SUCCEED();
}

}  // namespace
}  // namespace glint
