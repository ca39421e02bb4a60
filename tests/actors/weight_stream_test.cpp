// The stream transport's socket layer on loopback: tensors arrive whole and
// in order at every receiver; a mismatched receiver, one that declines and
// one that never comes fail the sender with what happened, in bounded time.
#include "actors/weight_sync/stream.hpp"

#include <gtest/gtest.h>

#include <future>
#include <thread>

namespace glint::actors::weight_sync {
namespace {

using namespace std::chrono_literals;

Deadline in(std::chrono::milliseconds d) { return std::chrono::steady_clock::now() + d; }

std::vector<Tensor> weights() {
  std::vector<Tensor> w;
  w.push_back(*Tensor::from_values(std::vector<float>{1.5f, -2.f, 3.f, 4.f}, {2, 2}));
  w.push_back(*Tensor::from_values(std::vector<int64_t>{7, 8, 9}, {3}));
  w.push_back(*Tensor::zeros(Dtype::f32, {0}));
  std::vector<float> big(1 << 20);
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<float>(i % 977);
  w.push_back(*Tensor::from_values(big, {static_cast<int64_t>(big.size())}));
  return w;
}

std::vector<Tensor> like(const std::vector<Tensor>& w) {
  std::vector<Tensor> out;
  for (const auto& t : w) out.push_back(*Tensor::zeros(t.dtype(), t.shape()));
  return out;
}

TEST(WeightStream, EveryReceiverGetsEveryTensorInOrder) {
  auto l = Listener::open("127.0.0.1");
  ASSERT_TRUE(l) << describe(l.error());
  const auto w = weights();
  std::vector<std::vector<Tensor>> got(2, like(w));
  std::vector<std::future<Result<void>>> receivers;
  for (auto& g : got)
    receivers.push_back(std::async(std::launch::async, [&] { return recv_weights("127.0.0.1", l->port(), g, in(30s)); }));
  auto sent = send_weights(*l, 2, w, in(30s));
  ASSERT_TRUE(sent) << describe(sent.error());
  EXPECT_EQ(*sent, static_cast<int64_t>(16 + 24 + 0 + (4 << 20)));
  for (size_t r = 0; r < 2; ++r) {
    auto ok = receivers[r].get();
    ASSERT_TRUE(ok) << describe(ok.error());
    for (size_t i = 0; i < w.size(); ++i) EXPECT_EQ(got[r][i], w[i]) << "receiver " << r << ", tensor " << i;
  }
}

TEST(WeightStream, AReceiverWithAnotherManifestFailsBothSides) {
  auto l = Listener::open();
  ASSERT_TRUE(l);
  const auto w = weights();
  auto other = like(w);
  other.pop_back();
  auto receiver = std::async(std::launch::async, [&] { return recv_weights("127.0.0.1", l->port(), other, in(30s)); });
  auto sent = send_weights(*l, 1, w, in(30s));
  auto got = receiver.get();
  ASSERT_FALSE(got);
  EXPECT_NE(describe(got.error()).find("the manifest lists 3"), std::string::npos) << describe(got.error());
  EXPECT_FALSE(sent) << "the sender learns it too";
}

TEST(WeightStream, ADecliningReceiverFailsTheSenderAtOnce) {
  auto l = Listener::open();
  ASSERT_TRUE(l);
  auto declined = std::async(std::launch::async, [&] { return decline("127.0.0.1", l->port(), in(30s)); });
  const auto start = std::chrono::steady_clock::now();
  auto sent = send_weights(*l, 1, weights(), in(60s));
  ASSERT_FALSE(sent);
  EXPECT_LT(std::chrono::steady_clock::now() - start, 30s) << "the sender waited for its deadline";
  EXPECT_TRUE(declined.get());
}

TEST(WeightStream, NobodyComingIsADeadlineNotAHang) {
  auto l = Listener::open();
  ASSERT_TRUE(l);
  auto sent = send_weights(*l, 1, weights(), in(200ms));
  ASSERT_FALSE(sent);
  EXPECT_EQ(code_of(sent.error()), errc::deadline_exceeded);
  EXPECT_NE(describe(sent.error()).find("receiver 1 of 1"), std::string::npos) << describe(sent.error());
  std::vector<Tensor> t = like(weights());
  auto nobody_listens = recv_weights("127.0.0.1", 1, t, in(200ms));
  EXPECT_FALSE(nobody_listens);
}

}  // namespace
}  // namespace glint::actors::weight_sync
