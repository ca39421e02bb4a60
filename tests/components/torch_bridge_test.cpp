#include "components/tensor/torch_bridge.hpp"

#include <gtest/gtest.h>

namespace glint::components {
namespace {

TEST(TorchBridge, ToTorchSharesTheBytes) {
  auto t = *Tensor::from_values<float>(std::vector<float>{1, 2, 3, 4, 5, 6}, {2, 3});
  auto a = to_torch(t);
  EXPECT_EQ(a.sizes(), (at::IntArrayRef{2, 3}));
  EXPECT_EQ(a.data_ptr(), static_cast<const void*>(t.data()));
  a.mul_(2);
  EXPECT_EQ((*t.values<float>())[5], 12.f);
}

TEST(TorchBridge, FromTorchSharesTheBytesAndKeepsThemAlive) {
  Tensor g;
  void* ptr = nullptr;
  {
    auto a = at::arange(12, at::kLong).reshape({3, 4});
    ptr = a.data_ptr();
    g = *from_torch(a);
  }
  EXPECT_EQ(static_cast<const void*>(g.data()), ptr);
  EXPECT_EQ(g.shape(), (std::vector<int64_t>{3, 4}));
  EXPECT_EQ((*g.values<int64_t>())[11], 11);
}

TEST(TorchBridge, EveryDtypeMapsBothWays) {
  for (auto d : {Dtype::f32, Dtype::bf16, Dtype::f16, Dtype::i64, Dtype::i32, Dtype::u8, Dtype::boolean, Dtype::f64}) {
    auto t = *Tensor::zeros(d, {2});
    auto back = from_torch(to_torch(t));
    ASSERT_TRUE(back) << to_string(d);
    EXPECT_EQ(back->dtype(), d);
  }
}

TEST(TorchBridge, RefusesWhatItCannotShare) {
  auto nc = at::arange(6, at::kFloat).reshape({2, 3}).t();
  auto r = from_torch(nc);
  ASSERT_FALSE(r);
  EXPECT_NE(describe(r.error()).find("contiguous"), std::string::npos);
  EXPECT_FALSE(from_torch(at::zeros({2}, at::kShort))) << "no i16 in glint";
}

}  // namespace
}  // namespace glint::components
