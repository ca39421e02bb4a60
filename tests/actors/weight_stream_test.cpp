// The stream transport's socket layer on loopback: tensors arrive whole and
// in order at every receiver; a mismatched receiver, one that declines, one
// that never comes and one frozen mid-send fail the sender with what
// happened, in bounded time.
#include "actors/weight_sync/stream.hpp"

#include <gtest/gtest.h>

#include <signal.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

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
  // Two of like(w), not one copied: a Tensor's copy shares its bytes, and the
  // receivers would write into the same buffers (TSan's report).
  std::vector<std::vector<Tensor>> got;
  for (int r = 0; r < 2; ++r) got.push_back(like(w));
  std::vector<std::future<Result<void>>> receivers;
  for (auto& g : got)
    receivers.push_back(std::async(std::launch::async, [&] { return recv_weights("127.0.0.1", l->port(), static_cast<int32_t>(&g - got.data()), g, in(30s)); }));
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
  auto receiver = std::async(std::launch::async, [&] { return recv_weights("127.0.0.1", l->port(), 0, other, in(30s)); });
  auto sent = send_weights(*l, 1, w, in(30s));
  auto got = receiver.get();
  ASSERT_FALSE(got);
  EXPECT_NE(describe(got.error()).find("the manifest lists 3"), std::string::npos) << describe(got.error());
  EXPECT_FALSE(sent) << "the sender learns it too";
}

TEST(WeightStream, ADecliningReceiverFailsTheSenderAtOnce) {
  auto l = Listener::open();
  ASSERT_TRUE(l);
  auto declined = std::async(std::launch::async, [&] { return decline("127.0.0.1", l->port(), 0, in(30s)); });
  const auto start = std::chrono::steady_clock::now();
  auto sent = send_weights(*l, 1, weights(), in(60s));
  ASSERT_FALSE(sent);
  EXPECT_LT(std::chrono::steady_clock::now() - start, 30s) << "the sender waited for its deadline";
  EXPECT_TRUE(declined.get());
}

// One receiver declines before another has connected: the sender hears
// them all before it fails, so the late one is not left retrying to connect
// to a closed listener until its deadline.
TEST(WeightStream, ADeclineBeforeTheOthersConnectFailsEveryoneAtOnce) {
  auto l = Listener::open();
  ASSERT_TRUE(l);
  const auto w = weights();
  auto got = like(w);
  auto declined = std::async(std::launch::async, [&] { return decline("127.0.0.1", l->port(), 1, in(30s)); });
  auto late = std::async(std::launch::async, [&] {
    std::this_thread::sleep_for(300ms);
    return recv_weights("127.0.0.1", l->port(), 0, got, in(30s));
  });
  const auto start = std::chrono::steady_clock::now();
  auto sent = send_weights(*l, 2, w, in(30s));
  ASSERT_FALSE(sent);
  EXPECT_NE(describe(sent.error()).find("receiver 2 of 2 declined"), std::string::npos) << describe(sent.error());
  l = Listener::open();  // the model closes its listener after a send (stream_send)
  auto r = late.get();
  EXPECT_FALSE(r) << "the late receiver got weights from a failed send";
  EXPECT_LT(std::chrono::steady_clock::now() - start, 10s) << "a receiver waited for its deadline";
  EXPECT_TRUE(declined.get());
}

// A receiver whose process froze (or whose link was cut) after connecting:
// no reset comes, its acknowledgement never does. The driver, told its node
// was lost, declines it, and the send fails then rather than at its deadline.
TEST(WeightStream, AReceiverDeclinedMidSendFailsTheSenderAtOnce) {
  auto l = Listener::open();
  ASSERT_TRUE(l);
  const auto w = weights();
  auto frozen_into = like(w);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {  // receiver 1, in a process of its own, to be frozen
    auto ok = recv_weights("127.0.0.1", l->port(), 1, frozen_into, in(60s));
    ::_exit(ok ? 0 : 1);
  }
  auto got = like(w);
  auto good = std::async(std::launch::async, [&] { return recv_weights("127.0.0.1", l->port(), 0, got, in(60s)); });
  // Frozen once connected: its hello is in the listener's queue, nothing more comes.
  std::this_thread::sleep_for(300ms);
  ::kill(child, SIGSTOP);
  auto driver = std::async(std::launch::async, [&] {
    std::this_thread::sleep_for(500ms);
    return decline("127.0.0.1", l->port(), 1, in(5s));
  });
  const auto start = std::chrono::steady_clock::now();
  auto sent = send_weights(*l, 2, w, in(60s));
  const auto took = std::chrono::steady_clock::now() - start;
  ::kill(child, SIGKILL);
  ::waitpid(child, nullptr, 0);
  ASSERT_FALSE(sent) << "the frozen receiver never acknowledged";
  EXPECT_LT(took, 10s) << "the sender waited for its deadline";
  EXPECT_EQ(code_of(sent.error()), errc::unavailable);
  EXPECT_NE(describe(sent.error()).find("receiver 2 of 2 declined"), std::string::npos) << describe(sent.error());
  EXPECT_TRUE(driver.get());
  auto ok = good.get();
  ASSERT_TRUE(ok) << "the live receiver got everything: " << describe(ok.error());
  for (size_t i = 0; i < w.size(); ++i) EXPECT_EQ(got[i], w[i]) << "tensor " << i;
}

// Connections that are not a receiver's (a port scan, a stale client) are
// dropped; the receivers that do come are served.
TEST(WeightStream, AStrangerOnThePortIsIgnored) {
  auto l = Listener::open();
  ASSERT_TRUE(l);
  const auto w = weights();
  auto stranger = std::async(std::launch::async, [&] {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(l->port()));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0) (void)!::write(fd, "GET / HTTP/1.0\r\n\r\n", 18);
    std::this_thread::sleep_for(200ms);
    ::close(fd);
  });
  auto got = like(w);
  auto receiver = std::async(std::launch::async, [&] {
    std::this_thread::sleep_for(50ms);
    return recv_weights("127.0.0.1", l->port(), 0, got, in(30s));
  });
  auto sent = send_weights(*l, 1, w, in(30s));
  stranger.get();
  ASSERT_TRUE(sent) << describe(sent.error());
  ASSERT_TRUE(receiver.get());
  EXPECT_EQ(got.back(), w.back());
}

TEST(WeightStream, NobodyComingIsADeadlineNotAHang) {
  auto l = Listener::open();
  ASSERT_TRUE(l);
  auto sent = send_weights(*l, 1, weights(), in(200ms));
  ASSERT_FALSE(sent);
  EXPECT_EQ(code_of(sent.error()), errc::deadline_exceeded);
  EXPECT_NE(describe(sent.error()).find("receiver 1 of 1"), std::string::npos) << describe(sent.error());
  std::vector<Tensor> t = like(weights());
  auto nobody_listens = recv_weights("127.0.0.1", 1, 0, t, in(200ms));
  EXPECT_FALSE(nobody_listens);
}

}  // namespace
}  // namespace glint::actors::weight_sync
