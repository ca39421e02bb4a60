// Collectives over Gloo between threads, and data-parallel training: two
// ranks on halves of a batch take the same steps as one rank on all of it.
// A frozen rank fails the others' collectives within the peer timeout.
#include "components/comm/peer_watch.hpp"
#include "components/comm/process_group_impl.hpp"
#include "components/parallel/flat_param.hpp"
#include "components/model/trainer.hpp"
#include "components/model/transformer.hpp"

#include "runtime/process.hpp"
#include "support/tensors.hpp"
#include "support/thread_ranks.hpp"

#include <gtest/gtest.h>

#include <csignal>
#include <sstream>
#include <thread>

#include <sys/wait.h>
#include <unistd.h>

namespace glint::components {
namespace {

using glint::testing::ids_of;

using glint::testing::on_ranks;

TEST(Comm, AllReduceBroadcastAndBarrier) {
  on_ranks(2, [](int r, ProcessGroup& pg) {
    EXPECT_EQ(pg.size(), 2);
    std::vector<Tensor> ts{glint::testing::vector_of(std::vector<float>{1.f * (r + 1), 10.f}),
                           glint::testing::vector_of(std::vector<int64_t>{r, 5})};
    ASSERT_TRUE(pg.all_reduce_sum(ts));
    EXPECT_EQ(ts[0], glint::testing::vector_of(std::vector<float>{3.f, 20.f}));
    EXPECT_EQ(ts[1], glint::testing::vector_of(std::vector<int64_t>{1, 10}));
    std::vector<Tensor> b{glint::testing::vector_of(std::vector<float>{static_cast<float>(r), 7.f * r})};
    ASSERT_TRUE(pg.broadcast(b, 1));
    EXPECT_EQ(b[0], glint::testing::vector_of(std::vector<float>{1.f, 7.f}));
    EXPECT_TRUE(pg.barrier());
    EXPECT_FALSE(pg.broadcast(b, 2));
  });
  auto bad = ProcessGroup::create({.store_port = 1, .rank = 2, .world_size = 2});
  ASSERT_FALSE(bad);
  EXPECT_NE(describe(bad.error()).find("rank 2 is outside a world of 2"), std::string::npos);
  EXPECT_FALSE(ProcessGroup::create({.backend = "mpi"}));
}

template <class T>
std::vector<T> elements(const Tensor& t) {
  auto v = *t.values<T>();
  return {v.begin(), v.end()};
}

// The collectives sharded training needs (Gloo has no reduce-scatter: it is
// an all-reduce, then the slice) and point to point for pipeline stages.
TEST(Comm, AllGatherReduceScatterAndPointToPointOnThreeRanks) {
  on_ranks(3, [](int r, ProcessGroup& pg) {
    using glint::testing::vector_of;
    auto in = Tensor::from_values(std::vector<float>{10.f * r, 10.f * r + 1, 10.f * r + 2, 10.f * r + 3}, {2, 2});
    auto out = Tensor::zeros(Dtype::f32, {6, 2});
    ASSERT_TRUE(in && out);
    ASSERT_TRUE(pg.all_gather(*in, *out));
    EXPECT_EQ(elements<float>(*out), (std::vector<float>{0, 1, 2, 3, 10, 11, 12, 13, 20, 21, 22, 23}));
    auto wrong = Tensor::zeros(Dtype::f32, {5, 2});
    EXPECT_EQ(code_of(pg.all_gather(*in, *wrong).error()), errc::invalid_argument);

    // Rank r contributes (r + 1) * [0 1 2 3 4 5]; the sum is 6 * [0..5].
    std::vector<int64_t> vals;
    for (int64_t i = 0; i < 6; ++i) vals.push_back((r + 1) * i);
    auto full = Tensor::from_values(vals, {6});
    auto mine = Tensor::zeros(Dtype::i64, {2});
    ASSERT_TRUE(full && mine);
    ASSERT_TRUE(pg.reduce_scatter_sum(*full, *mine));
    EXPECT_EQ(elements<int64_t>(*mine), (std::vector<int64_t>{6 * (2 * r), 6 * (2 * r + 1)})) << "rank " << r;
    EXPECT_EQ(elements<int64_t>(*full), vals) << "the input is left as it was";
    auto odd = Tensor::zeros(Dtype::i64, {4});
    EXPECT_EQ(code_of(pg.reduce_scatter_sum(*full, *odd).error()), errc::invalid_argument);

    // A ring: each rank sends to the next and receives from the one before.
    // A send returns once its receiver has taken it: odd ranks receive first.
    auto msg = Tensor::from_values(std::vector<float>{1.f * r, 2.f * r}, {2});
    auto got = Tensor::zeros(Dtype::f32, {2});
    ASSERT_TRUE(msg && got);
    if (r % 2 == 1) ASSERT_TRUE(pg.recv(*got, (r + 2) % 3, 7));
    auto sent = pg.send(*msg, (r + 1) % 3, 7);
    ASSERT_TRUE(sent) << describe(sent.error());
    if (r % 2 == 0) ASSERT_TRUE(pg.recv(*got, (r + 2) % 3, 7));
    const float from = static_cast<float>((r + 2) % 3);
    EXPECT_EQ(elements<float>(*got), (std::vector<float>{from, 2 * from}));
    EXPECT_EQ(code_of(pg.send(*msg, r, 7).error()), errc::invalid_argument) << "not to itself";
    EXPECT_EQ(code_of(pg.recv(*got, 3, 7).error()), errc::invalid_argument);
  });
}

// FSDP's unit, as a layer uses it: three parameters of uneven shapes (31
// elements, padded to 32 on 2 shards, 33 on 3) cut into shards; gathered for
// the forward and freed right after it; gathered again by a hook on the
// layer's output gradient before its backward reads them (what autograd
// saved sees the refilled storage); gradients reduce-scattered as a mean;
// clipped to the global norm; a shard's SGD step. Five steps on 2 (and 3) ranks, each on its part of
// the batch, equal five steps of one process on all of it, within 1e-6 (the
// sums run in another order).
TEST(Comm, FlatParamShardsTrainAsOneProcessOnTheWholeBatch) {
  // Drawn once: the ranks are threads, and the global generator is shared.
  at::manual_seed(5);
  const std::vector<at::Tensor> start{at::randn({4, 3}), at::randn({5}), at::randn({2, 7})};
  auto init = [&] {
    std::vector<at::Tensor> p;
    for (const auto& t : start) p.push_back(t.clone().set_requires_grad(true));
    return p;
  };
  at::manual_seed(6);
  const auto x = at::randn({12, 3}), y = at::randn({12, 2});
  auto layer = [](const std::vector<at::Tensor>& p, const at::Tensor& xs) {
    auto h = at::matmul(xs, p[0].t());                                                 // [n, 4]
    auto hb = at::cat({h, h.narrow(1, 0, 1) + p[1].narrow(0, 0, 3).view({1, 3})}, 1);  // [n, 7]
    return at::matmul(hb, p[2].t());                                                   // [n, 2]
  };
  auto loss_of = [](const at::Tensor& out, const at::Tensor& ys) { return (out - ys).pow(2).mean(); };
  const double lr = 0.05;
  const int steps = 5;
  auto whole = init();
  // Clipped to a global norm below every step's gradient norm (checked), so the
  // clip acts at every step.
  const double max_norm = 0.5;
  std::vector<double> norms;
  for (int s = 0; s < steps; ++s) {
    for (auto& p : whole) p.mutable_grad() = at::Tensor{};
    loss_of(layer(whole, x), y).backward();
    c10::NoGradGuard no_grad;
    double sq = 0;
    for (auto& p : whole) sq += p.grad().to(at::kDouble).pow(2).sum().item<double>();
    norms.push_back(std::sqrt(sq));
    for (auto& p : whole) p.sub_(p.grad() * (max_norm / (norms.back() + 1e-6)) * lr);
  }
  for (double n : norms) ASSERT_GT(n, max_norm);
  for (int world : {2, 3}) {
    std::vector<std::vector<at::Tensor>> finals(static_cast<size_t>(world));
    on_ranks(world, [&](int r, ProcessGroup& pg) {
      auto params = init();
      auto f = FlatParam::shard(params, world, r);
      ASSERT_TRUE(f) << describe(f.error());
      EXPECT_EQ(f->numel(), 31);
      EXPECT_EQ(f->padded_numel() % world, 0);
      EXPECT_EQ(f->shard_numel(), (31 + world - 1) / world);
      f->free_full();
      EXPECT_EQ(params[0].storage().nbytes(), 0u) << "only the shard is held between uses";
      EXPECT_EQ(params[0].sizes(), (std::vector<int64_t>{4, 3}));
      const auto n = 12 / world;
      for (int s = 0; s < steps; ++s) {
        ASSERT_TRUE(f->gather(pg));
        auto out = layer(params, x.narrow(0, r * n, n));
        f->free_full();  // between the forward and the backward, as FSDP frees
        bool regathered = false;
        out.register_hook([&](const at::Tensor& g) {
          regathered = static_cast<bool>(f->gather(pg));
          return g;
        });
        loss_of(out, y.narrow(0, r * n, n)).backward();
        ASSERT_TRUE(regathered);
        auto reduced = f->reduce_grads(pg);
        ASSERT_TRUE(reduced) << describe(reduced.error());
        f->free_full();
        auto norm = clip_grad_norm({&*f}, pg, max_norm);
        ASSERT_TRUE(norm) << describe(norm.error());
        EXPECT_NEAR(*norm, norms[static_cast<size_t>(s)], 1e-5 * norms[static_cast<size_t>(s)]) << "the global norm";
        c10::NoGradGuard no_grad;
        f->local().sub_(f->local().grad() * lr);
        f->local().mutable_grad() = at::Tensor{};  // reduce_grads adds to it
      }
      ASSERT_TRUE(f->gather(pg));
      for (auto& p : params) finals[static_cast<size_t>(r)].push_back(p.detach().clone());
    });
    for (int r = 0; r < world; ++r)
      for (size_t i = 0; i < whole.size(); ++i)
        EXPECT_TRUE(at::allclose(finals[static_cast<size_t>(r)][i], whole[i].detach(), 1e-6, 1e-6))
            << "world " << world << " rank " << r << " parameter " << i << ":\n"
            << finals[static_cast<size_t>(r)][i] << "\nagainst\n" << whole[i];
  }
  EXPECT_FALSE(FlatParam::shard({}, 2, 0));
  EXPECT_FALSE(FlatParam::shard({at::zeros({2})}, 2, 2));
  EXPECT_FALSE(FlatParam::shard({at::zeros({2}), at::zeros({2}, at::kDouble)}, 2, 0));
}

TEST(Comm, DataParallelStepsEqualOneRankOnTheWholeBatch) {
  auto cfg = ModelConfig::make(Architecture::qwen3, 31, 16, 32, 2, 4, 2);
  auto batch = ids_of({{1, 2, 3, 4, 5, 6}, {7, 8, 9, 0, 0, 0}, {4, 4, 4, 4, 0, 0}, {9, 8, 7, 6, 5, 4}});
  auto mask = ids_of({{1, 1, 1, 1, 1, 1}, {1, 1, 1, 0, 0, 0}, {1, 1, 1, 1, 0, 0}, {1, 1, 1, 1, 1, 1}});
  const int steps = 5;
  TrainConfig tc{.optimizer = {.lr = 1e-2}};

  auto single = Trainer::create(*CausalLM::init_random(cfg, 3), tc);
  ASSERT_TRUE(single);
  for (int s = 0; s < steps; ++s) {
    ASSERT_TRUE(single->forward_backward({.tokens = {.input_ids = batch, .attention_mask = mask}}, {}));
    ASSERT_TRUE(single->clip_grad_and_step());
  }

  std::vector<std::map<std::string, at::Tensor>> ranks(2);
  on_ranks(2, [&](int r, ProcessGroup& pg) {
    auto shared = std::shared_ptr<ProcessGroup>(&pg, [](ProcessGroup*) {});
    auto mine = tc;
    mine.dp_group = shared;
    auto tr = Trainer::create(*CausalLM::init_random(cfg, 3), mine);
    ASSERT_TRUE(tr);
    for (int s = 0; s < steps; ++s) {
      auto m = tr->forward_backward(
          {.tokens = {.input_ids = *batch.slice(2 * r, 2 * r + 2), .attention_mask = *mask.slice(2 * r, 2 * r + 2)}}, {});
      ASSERT_TRUE(m) << describe(m.error());
      auto st = tr->clip_grad_and_step();
      ASSERT_TRUE(st) << describe(st.error());
    }
    for (auto& [n, p] : tr->model().impl().params) ranks[static_cast<size_t>(r)][n] = p.detach().clone();
  });
  for (auto& [n, p] : single->model().impl().params) {
    EXPECT_TRUE(at::allclose(ranks[0].at(n), p, 1e-5, 1e-5)) << n;
    EXPECT_TRUE(at::equal(ranks[0].at(n), ranks[1].at(n))) << n << " differs between the dp ranks";
  }
}

TEST(Comm, ARankWhoseBatchFailedStillJoinsTheStep) {
  auto cfg = ModelConfig::make(Architecture::qwen3, 31, 16, 32, 1, 4, 2);
  std::vector<std::map<std::string, at::Tensor>> ranks(2);
  on_ranks(2, [&](int r, ProcessGroup& pg) {
    auto tr = Trainer::create(*CausalLM::init_random(cfg, 3),
                              {.optimizer = {.lr = 1e-2}, .dp_group = std::shared_ptr<ProcessGroup>(&pg, [](ProcessGroup*) {})});
    ASSERT_TRUE(tr);
    // Rank 1's batch is bad; its step adds zeros instead of leaving rank 0 waiting.
    auto ids = r == 0 ? ids_of({{1, 2, 3, 4}}) : ids_of({{1, 2, 99, 4}});
    EXPECT_EQ(static_cast<bool>(tr->forward_backward({.tokens = {.input_ids = ids}}, {})), r == 0);
    auto start = std::chrono::steady_clock::now();
    auto st = tr->clip_grad_and_step();
    ASSERT_TRUE(st) << describe(st.error());
    EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
    for (auto& [n, p] : tr->model().impl().params) ranks[static_cast<size_t>(r)][n] = p.detach().clone();
  });
  for (auto& [n, p] : ranks[0]) EXPECT_TRUE(at::equal(p, ranks[1].at(n))) << n;
}

using namespace std::chrono_literals;

TEST(PeerWatch, RanksHearEachOtherAndOneThatStopsIsNamed) {
  std::vector<std::unique_ptr<PeerWatch>> w;
  std::vector<std::string> addresses;
  for (int r = 0; r < 3; ++r) {
    auto o = PeerWatch::open(r, "127.0.0.1", 400ms);
    ASSERT_TRUE(o) << describe(o.error());
    addresses.push_back((*o)->address());
    w.push_back(std::move(*o));
  }
  for (auto& x : w) ASSERT_TRUE(x->start(addresses));
  // Each has heard the others once (a group waits for this before use):
  // a rank that stops right after its first beat is silent, not unheard.
  for (auto& x : w) EXPECT_EQ(x->await_peers(2s), std::vector<int>{});
  for (auto& x : w) EXPECT_FALSE(x->silent()) << *x->silent();
  w[2].reset();  // rank 2 stops sending, as a frozen process would
  std::this_thread::sleep_for(200ms);
  EXPECT_FALSE(w[0]->silent()) << "not before the timeout";
  std::this_thread::sleep_for(400ms);
  auto why = w[0]->silent();
  ASSERT_TRUE(why);
  EXPECT_NE(why->find("rank 2 has sent no heartbeat"), std::string::npos) << *why;
  EXPECT_TRUE(w[1]->silent());
}

// A rank never heard at all (UDP blocked between the machines) is not called
// silent: that would end healthy runs; Gloo's timeout still bounds it. Nor
// do a stranger's datagrams on the port count as the rank's.
TEST(PeerWatch, ARankNeverHeardIsNotCalledSilentAndStrangersDoNotCount) {
  auto a = PeerWatch::open(0, "127.0.0.1", 200ms);
  auto b = PeerWatch::open(1, "127.0.0.1", 200ms);
  ASSERT_TRUE(a && b);
  ASSERT_TRUE((*a)->start({(*a)->address(), (*b)->address()}));  // b never starts: never heard
  EXPECT_EQ((*a)->await_peers(300ms), std::vector<int>{1}) << "the wait for a first beat is bounded";
  std::this_thread::sleep_for(200ms);
  EXPECT_FALSE((*a)->silent());
  auto c = PeerWatch::open(1, "127.0.0.1", 200ms);  // claims rank 1, with another id
  ASSERT_TRUE(c);
  std::istringstream in((*a)->address());
  std::string host, port;
  in >> host >> port;
  ASSERT_TRUE((*c)->start({host + " " + port + " 12345 200", (*c)->address()}));
  std::this_thread::sleep_for(300ms);
  EXPECT_FALSE((*a)->silent()) << "a stranger's beats do not make rank 1 heard";
  EXPECT_EQ((*c)->timeout(), 200ms);
  auto slow = PeerWatch::open(0, "127.0.0.1", 900ms);
  auto fast = PeerWatch::open(1, "127.0.0.1", 300ms);
  ASSERT_TRUE(slow && fast);
  ASSERT_TRUE((*fast)->start({(*slow)->address(), (*fast)->address()}));
  EXPECT_EQ((*fast)->timeout(), 900ms) << "the ranks agree on the longest timeout";
  auto alone = PeerWatch::open(1, "127.0.0.1", 300ms);
  ASSERT_TRUE(alone);
  EXPECT_TRUE((*alone)->start({PeerWatch::kNoWatch, (*alone)->address()})) << "a rank without a watch is left out";
  EXPECT_FALSE(PeerWatch::open(0, "127.0.0.1", 10ms));
  EXPECT_FALSE((*b)->start({"nonsense", "x"}));
}

// Rank 0 (which also hosts the group's store) is frozen with SIGSTOP while
// rank 1 waits in an all-reduce: rank 1 fails within the peer timeout, not
// Gloo's minute, naming rank 0; the group is broken from then on, and
// leaving it does not wait for Gloo's stuck worker.
TEST(Comm, AFrozenRankFailsTheOthersCollectiveWithinThePeerTimeout) {
  auto port = pick_free_port();
  ASSERT_TRUE(port);
  int ready[2];
  ASSERT_EQ(::pipe(ready), 0);
  const CommConfig cfg{.store_port = *port, .world_size = 2, .timeout = 60s, .peer_timeout = 1s};
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {  // rank 0, to be frozen after one good collective
    auto mine = cfg;
    auto pg = ProcessGroup::create(mine);
    if (!pg) ::_exit(2);
    std::vector<Tensor> ts{glint::testing::vector_of(std::vector<float>{1.f})};
    if (!(*pg)->all_reduce_sum(ts)) ::_exit(3);
    (void)!::write(ready[1], "r", 1);
    while (true) ::pause();
  }
  auto mine = cfg;
  mine.rank = 1;
  auto pg = ProcessGroup::create(mine);
  ASSERT_TRUE(pg) << describe(pg.error());
  std::vector<Tensor> ts{glint::testing::vector_of(std::vector<float>{2.f})};
  ASSERT_TRUE((*pg)->all_reduce_sum(ts));
  EXPECT_EQ(ts[0], glint::testing::vector_of(std::vector<float>{3.f}));
  char c = 0;
  ASSERT_EQ(::read(ready[0], &c, 1), 1);
  ::kill(child, SIGSTOP);
  const auto start = std::chrono::steady_clock::now();
  auto r = (*pg)->all_reduce_sum(ts);
  const auto took = std::chrono::steady_clock::now() - start;
  ASSERT_FALSE(r) << "rank 0 is frozen";
  EXPECT_GE(took, 900ms);
  EXPECT_LT(took, 5s) << "waited for Gloo's timeout, not the peer timeout";
  EXPECT_EQ(code_of(r.error()), errc::unavailable);
  EXPECT_NE(describe(r.error()).find("rank 0 has sent no heartbeat"), std::string::npos) << describe(r.error());
  EXPECT_TRUE((*pg)->broken());
  auto again = (*pg)->barrier();
  ASSERT_FALSE(again);
  EXPECT_NE(describe(again.error()).find("broken"), std::string::npos) << describe(again.error());
  const auto leave = std::chrono::steady_clock::now();
  pg->reset();
  EXPECT_LT(std::chrono::steady_clock::now() - leave, 2s);
  ::kill(child, SIGKILL);
  ::waitpid(child, nullptr, 0);
  ::close(ready[0]);
  ::close(ready[1]);
}

// In a group of three, Gloo's error for a killed rank names only an
// address: the rank is found by its heartbeats, which stopped. Rank 2 is
// killed while ranks 0 and 1 (this process) wait in an all-reduce: rank 1's
// call fails within the peer timeout, naming rank 2.
TEST(Comm, AKilledRankOfThreeIsNamedByTheOthersFailedCollective) {
  auto port = pick_free_port();
  ASSERT_TRUE(port);
  int ready[2];
  ASSERT_EQ(::pipe(ready), 0);
  const CommConfig cfg{.store_port = *port, .world_size = 3, .timeout = 60s, .peer_timeout = 1s};
  auto rank_in_child = [&](int rank, bool stay) {
    const pid_t pid = ::fork();
    if (pid != 0) return pid;
    auto mine = cfg;
    mine.rank = rank;
    auto pg = ProcessGroup::create(mine);
    if (!pg) ::_exit(2);
    std::vector<Tensor> ts{glint::testing::vector_of(std::vector<float>{1.f})};
    if (!(*pg)->all_reduce_sum(ts)) ::_exit(3);
    (void)!::write(ready[1], "r", 1);
    if (stay)
      while (true) ::pause();
    (void)(*pg)->all_reduce_sum(ts);  // fails once rank 2 is gone
    ::_exit(0);
  };
  const pid_t host = rank_in_child(0, false);
  ASSERT_GE(host, 0);
  const pid_t victim = rank_in_child(2, true);
  ASSERT_GE(victim, 0);
  auto mine = cfg;
  mine.rank = 1;
  auto pg = ProcessGroup::create(mine);
  ASSERT_TRUE(pg) << describe(pg.error());
  std::vector<Tensor> ts{glint::testing::vector_of(std::vector<float>{1.f})};
  ASSERT_TRUE((*pg)->all_reduce_sum(ts));
  EXPECT_EQ(ts[0], glint::testing::vector_of(std::vector<float>{3.f}));
  char c = 0;
  ASSERT_EQ(::read(ready[0], &c, 1), 1);
  ASSERT_EQ(::read(ready[0], &c, 1), 1);
  ::kill(victim, SIGKILL);
  ::waitpid(victim, nullptr, 0);
  const auto start = std::chrono::steady_clock::now();
  auto r = (*pg)->all_reduce_sum(ts);
  const auto took = std::chrono::steady_clock::now() - start;
  ASSERT_FALSE(r) << "rank 2 is gone";
  EXPECT_LT(took, 5s) << "waited for Gloo's timeout, not the peer timeout";
  EXPECT_EQ(code_of(r.error()), errc::unavailable);
  EXPECT_NE(describe(r.error()).find("rank 2 "), std::string::npos) << describe(r.error());
  pg->reset();
  ::kill(host, SIGKILL);
  ::waitpid(host, nullptr, 0);
  ::close(ready[0]);
  ::close(ready[1]);
}

}  // namespace
}  // namespace glint::components
