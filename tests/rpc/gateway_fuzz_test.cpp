// The gateway under untrusted input: random bytes on raw connections, then
// 10,000 RPC calls whose every field is random or a valid call's field
// mutated, from an authenticated tenant. The server must never crash, its
// memory must stay bounded, and a well-behaved tenant must keep getting the
// same answers throughout. Bounded in count and time (about 30 s here).
#include "actors/model_group.hpp"
#include "components/model/model.hpp"
#include "rpc/glint.capnp.h"
#include "rpc/keys.hpp"
#include "rpc/server.hpp"
#include "rpc/raw_session.hpp"
#include "support/temp_dir.hpp"

#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmath>
#include <fstream>
#include <limits>
#include <random>

namespace glint::rpc {
namespace {

using placement::DeviceGroup;
using placement::DeviceMesh;

int64_t resident_bytes() {
  std::ifstream in{"/proc/self/statm"};
  int64_t pages = 0, resident = 0;
  in >> pages >> resident;
  return resident * ::sysconf(_SC_PAGESIZE);
}

Batch good_batch() {
  Batch b;
  b.tensors["input_ids"] = *Tensor::from_values(std::vector<int64_t>{5, 6, 7, 8, 9, 10, 11, 12}, {2, 4});
  return b;
}

// Random values with a bias towards the edges fuzzers find bugs at.
struct Chaos {
  std::mt19937_64 rng;
  explicit Chaos(uint64_t seed) : rng(seed) {}
  uint64_t u(uint64_t n) { return n == 0 ? 0 : rng() % n; }
  bool coin() { return rng() & 1; }
  int64_t i64() {
    static const int64_t edges[] = {0, 1, -1, 2, 7, 255, 256, 299, 300, 4096, -100, INT32_MAX, INT64_MAX, INT64_MIN,
                                    int64_t{1} << 40};
    return coin() ? edges[u(std::size(edges))] : static_cast<int64_t>(rng()) >> u(64);
  }
  double f64() {
    static const double edges[] = {0.0, 1.0, -1.0, 0.5, 1e-9, 1e300, -1e300, std::numeric_limits<double>::quiet_NaN(),
                                   std::numeric_limits<double>::infinity(), -0.0};
    return coin() ? edges[u(std::size(edges))] : std::ldexp(static_cast<double>(rng() % 1000) - 500, static_cast<int>(u(40)) - 20);
  }
  std::string text(size_t max = 80) {
    static const char* known[] = {"f", "default", "../f", "f/../../etc", "", ".", "..", "a:b", "alice:f",
                                  "adapter_config.json", "adapter_model.safetensors", "input_ids", "loss_mask"};
    if (coin()) return known[u(std::size(known))];
    std::string s(u(max), '\0');
    for (auto& c : s) c = static_cast<char>(rng());
    return s;
  }
  void data(capnp::Data::Builder d) {
    for (auto& b : d) b = static_cast<capnp::byte>(rng());
  }
};

void fill_tensor(wire::Tensor::Builder t, Chaos& c) {
  t.setDtype(c.coin() ? static_cast<uint8_t>(c.u(8)) : static_cast<uint8_t>(c.rng()));
  auto dims = c.u(11);
  auto shape = t.initShape(static_cast<unsigned>(dims));
  int64_t numel = 1;
  for (unsigned i = 0; i < dims; ++i) {
    int64_t d = c.coin() ? static_cast<int64_t>(c.u(6)) : c.i64();
    shape.set(i, d);
    numel *= (d > 0 && d < 64) ? d : 1;
  }
  size_t bytes = c.coin() ? static_cast<size_t>(numel) * (c.coin() ? 8 : 4) : c.u(4096);
  c.data(t.initData(static_cast<unsigned>(std::min<size_t>(bytes, 1 << 16))));
}

void fill_batch(wire::Batch::Builder b, Chaos& c) {
  if (c.u(4) == 0) {  // a valid batch with one field mutated
    auto ts = b.initTensors(1);
    ts[0].setName("input_ids");
    auto t = ts[0].initTensor();
    t.setDtype(3);
    auto shape = t.initShape(2);
    shape.set(0, 2);
    shape.set(1, 4);
    auto d = t.initData(64);
    for (unsigned i = 0; i < 64; i += 8) d[i] = static_cast<capnp::byte>(5 + i / 8);
    switch (c.u(4)) {
      case 0: shape.set(1, c.i64()); break;
      case 1: t.setDtype(static_cast<uint8_t>(c.rng())); break;
      case 2: d[c.u(64)] = static_cast<capnp::byte>(c.rng()); break;
      default: ts[0].setName(c.text()); break;
    }
    return;
  }
  auto n = c.u(6);
  auto ts = b.initTensors(static_cast<unsigned>(n));
  static const char* names[] = {"input_ids", "attention_mask", "position_ids", "segment_ids", "target_ids",
                                "loss_mask", "old_logps", "ref_logps", "advantages"};
  for (unsigned i = 0; i < n; ++i) {
    ts[i].setName(c.coin() ? names[c.u(std::size(names))] : c.text(16));
    fill_tensor(ts[i].initTensor(), c);
  }
  auto fields = b.initFields(static_cast<unsigned>(c.u(3)));
  for (auto f : fields) {
    f.setName(c.text(8));
    auto v = f.initValues(static_cast<unsigned>(c.u(4)));
    for (unsigned i = 0; i < v.size(); ++i) v.set(i, c.text(8));
  }
}

void fill_lora(wire::LoraConfig::Builder l, Chaos& c) {
  l.setR(c.coin() ? static_cast<int64_t>(c.u(20)) : c.i64());
  l.setAlpha(c.f64());
  l.setDropout(c.coin() ? 0.0 : c.f64());
  auto tm = l.initTargetModules(static_cast<unsigned>(c.u(3)));
  for (unsigned i = 0; i < tm.size(); ++i) tm.set(i, c.coin() ? "q_proj" : c.text(20));
  l.setRslora(c.coin());
  if (c.u(4) == 0) l.setTargetRegex(c.text(40));
  if (c.u(4) == 0) {
    auto rp = l.initRankPattern(1);
    rp[0].setPattern(c.text(20));
    rp[0].setR(c.i64());
  }
  if (c.u(4) == 0) {
    auto lt = l.initLayersToTransform(1);
    lt.set(0, c.i64());
  }
}

void fill_sampling(wire::SamplingParams::Builder p, Chaos& c) {
  p.setNumSamples(c.coin() ? 1 + static_cast<int64_t>(c.u(3)) : c.i64());
  p.setMaxTokens(c.coin() ? static_cast<int64_t>(c.u(8)) : c.i64());
  p.setTemperature(c.coin() ? 0.0 : c.f64());
  p.setTopK(c.coin() ? 0 : c.i64());
  p.setTopP(c.coin() ? 1.0 : c.f64());
  p.setMinP(c.coin() ? 0.0 : c.f64());
  p.setRepetitionPenalty(c.coin() ? 1.0 : c.f64());
  p.setSeed(c.i64());
  auto st = p.initStopTokenIds(static_cast<unsigned>(c.u(3)));
  for (unsigned i = 0; i < st.size(); ++i) st.set(i, c.i64());
  auto s = p.initStop(static_cast<unsigned>(c.u(2)));
  for (unsigned i = 0; i < s.size(); ++i) s.set(i, c.text(10));
  p.setLogprobs(c.coin() ? -1 : c.i64());
  p.setPromptLogprobs(c.coin() ? -1 : c.i64());
  p.setIgnoreEos(c.coin());
}

void fill_files(capnp::List<wire::File>::Builder files, Chaos& c) {
  for (auto f : files) {
    f.setName(c.text(40));
    auto d = f.initData(static_cast<unsigned>(c.u(2048)));
    if (c.coin()) {
      std::string json = R"({"r": )" + std::to_string(c.i64()) + R"(, "lora_alpha": 8, "target_modules": ["q_proj"]})";
      d = f.initData(static_cast<unsigned>(json.size()));
      std::memcpy(d.begin(), json.data(), json.size());
    } else {
      c.data(d);
    }
  }
}

template <class Request>
int status_of(Request& r, kj::WaitScope& ws) {
  return r.send().wait(ws).getStatus().getCode();
}

// One random call; answers the status code the server answered, or -1 when
// it failed the call instead.
int random_call(wire::Session::Client& s, Chaos& c, kj::WaitScope& ws) {
  auto adapter = [&] { return c.u(3) == 0 ? c.text() : std::string{c.coin() ? "f" : ""}; };
  try {
    switch (c.u(14)) {
      case 0: {
        auto r = s.addAdapterRequest();
        r.setName(adapter());
        fill_lora(r.initLora(), c);
        r.setSeed(c.rng());
        return status_of(r, ws);
      }
      case 1: {
        auto r = s.forwardBackwardRequest();
        r.setAdapter(adapter());
        fill_batch(r.initBatch(), c);
        return status_of(r, ws);
      }
      case 2: {
        auto r = s.forwardOnlyRequest();
        r.setAdapter(adapter());
        fill_batch(r.initBatch(), c);
        return status_of(r, ws);
      }
      case 3: {
        auto r = s.setLossRequest();
        r.setAdapter(adapter());
        auto l = r.initLoss();
        l.setKind(static_cast<uint8_t>(c.rng()));
        l.setEpsilon(c.f64());
        l.setEpsilonHigh(c.f64());
        l.setBeta(c.f64());
        l.setMaxTokens(c.i64());
        return status_of(r, ws);
      }
      case 4: {
        auto r = s.setOptimizerRequest();
        r.setAdapter(adapter());
        auto o = r.initOptimizer();
        o.setKind(static_cast<uint8_t>(c.u(3)));
        o.setLr(c.f64());
        o.setBeta1(c.f64());
        o.setEps(c.f64());
        o.setMaxGradNorm(c.f64());
        return status_of(r, ws);
      }
      case 5: {
        auto r = s.setLrSchedulerRequest();
        r.setAdapter(adapter());
        auto o = r.initScheduler();
        o.setKind(static_cast<uint8_t>(c.u(4)));
        o.setWarmupSteps(c.i64());
        o.setTotalSteps(c.i64());
        o.setMinLrRatio(c.f64());
        return status_of(r, ws);
      }
      case 6: {
        auto r = s.clipGradAndStepRequest();
        r.setAdapter(adapter());
        return status_of(r, ws);
      }
      case 7: {
        auto r = s.sampleRequest();
        r.setAdapter(c.u(3) == 0 ? c.text() : std::string{});
        auto reqs = r.initRequests(static_cast<unsigned>(c.u(4)));
        for (auto q : reqs) {
          q.setIndex(c.i64());
          auto p = q.initPrompt(static_cast<unsigned>(c.u(6)));
          for (unsigned i = 0; i < p.size(); ++i) p.set(i, c.coin() ? 5 + static_cast<int64_t>(c.u(200)) : c.i64());
        }
        fill_sampling(r.initParams(), c);
        return status_of(r, ws);
      }
      case 8: {
        auto r = s.loadAdapterRequest();
        r.setAdapter(adapter());
        fill_files(r.initFiles(static_cast<unsigned>(c.u(4))), c);
        r.setCreate(c.coin());
        r.setWithOptimizer(c.coin());
        return status_of(r, ws);
      }
      case 9: {
        auto r = s.saveAdapterRequest();
        r.setAdapter(adapter());
        r.setWithOptimizer(c.coin());
        return status_of(r, ws);
      }
      case 10: {
        auto r = s.samplerAddAdapterRequest();
        r.setName(adapter());
        fill_lora(r.initLora(), c);
        return status_of(r, ws);
      }
      case 11: {
        auto r = s.syncWeightsRequest();
        r.setAdapter(adapter());
        return status_of(r, ws);
      }
      case 12: {
        auto r = s.removeAdapterRequest();
        r.setName(c.u(8) == 0 ? std::string{"f"} : c.text());
        return status_of(r, ws);
      }
      default: {
        auto r = s.samplerLoadAdapterRequest();
        r.setName(adapter());
        fill_files(r.initFiles(static_cast<unsigned>(c.u(3))), c);
        return status_of(r, ws);
      }
    }
  } catch (const kj::Exception& e) {
    ADD_FAILURE() << "the server failed a call instead of answering it: " << e.getDescription().cStr();
  }
  return -1;
}

TEST(GatewayFuzz, RandomAndMutatedMessagesNeverCrashTheServerOrDisturbAWellBehavedTenant) {
  auto dir = glint::testing::fresh_dir("gateway-fuzz");
  auto cfg = components::ModelConfig::make(components::Architecture::qwen3, 300, 16, 32, 1, 4, 2);
  cfg.max_position_embeddings = 64;
  auto lm = components::CausalLM::init_random(cfg, 3);
  ASSERT_TRUE(lm && lm->save(dir + "/base"));
  auto rt = initialize(Options{});
  ASSERT_TRUE(rt);
  ServeConfig config{.model_dir = dir + "/base", .state_dir = dir + "/state", .port = 0};
  config.limits.max_rank = 8;
  config.limits.tokens_per_call = 2048;
  config.max_message_bytes = 1 << 20;
  config.sampler_cache_bytes = 4 << 20;
  auto server = Server::start(**rt, config);
  ASSERT_TRUE(server) << describe(server.error());
  auto good_key = KeyStore::create(config.state_dir, "good");
  auto fuzz_key = KeyStore::create(config.state_dir, "fuzzer");
  ASSERT_TRUE(good_key && fuzz_key);
  const int port = (*server)->port();

  // The well-behaved tenant: its adapter's log-probs, before and throughout.
  Options o;
  o.mode = Mode::remote;
  o.remote_endpoint = "127.0.0.1:" + std::to_string(port);
  o.remote_api_key = *good_key;
  auto good_rt = initialize(o);
  ASSERT_TRUE(good_rt) << describe(good_rt.error());
  auto good = actors::open_model_group(**good_rt, DeviceGroup::of("m", 1), *DeviceMesh::from_sizes({.dp = 1}), {});
  ASSERT_TRUE(good);
  ASSERT_TRUE(good->add_adapter("mine", {.r = 4, .alpha = 8}, 1).get());
  auto reference = good->with_adapter("mine").forward_only(good_batch()).get();
  ASSERT_TRUE(reference);
  auto still_served = [&] {
    auto now = good->with_adapter("mine").forward_only(good_batch()).get();
    ASSERT_TRUE(now) << describe(now.error());
    EXPECT_EQ(*now, *reference);
  };

  // 1. Raw bytes: 300 connections that speak no Cap'n Proto, or a broken
  // frame (segment counts and sizes from the fuzzer).
  Chaos chaos{20261124};
  for (int i = 0; i < 300; ++i) {
    int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(port));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ASSERT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
    std::string junk(chaos.u(8192), '\0');
    for (auto& ch : junk) ch = static_cast<char>(chaos.rng());
    if (chaos.coin() && junk.size() >= 8) {  // a frame header claiming huge segments
      uint32_t header[2] = {static_cast<uint32_t>(chaos.u(600)), static_cast<uint32_t>(chaos.rng())};
      std::memcpy(junk.data(), header, sizeof header);
    }
    (void)!::write(fd, junk.data(), junk.size());
    ::close(fd);
  }
  still_served();

  // 2. 10,000 calls of an authenticated tenant, every field random or mutated.
  const auto rss_before = resident_bytes();
  testing::RawSession raw{port, *fuzz_key, 64 << 20};
  ASSERT_EQ(raw.status(), 0) << raw.message();
  auto& session = raw.session();
  // An adapter of the fuzzer's own, so that calls reach the actors (made
  // again whenever a random call removed it).
  auto ensure_adapter = [&] {
    auto code = raw.add_small_adapter("f");
    EXPECT_TRUE(code == 0 || code == static_cast<uint16_t>(errc::invalid_argument)) << "exists already, or made";
  };
  ensure_adapter();
  int answered = 0, accepted = 0;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::minutes(3);
  for (int i = 0; i < 10000 && std::chrono::steady_clock::now() < deadline; ++i) {
    int code = random_call(session, chaos, raw.wait_scope());
    answered += code >= 0;
    accepted += code == 0;
    if (i % 50 == 49) ensure_adapter();
    if (i % 1000 == 999) still_served();
    if (::testing::Test::HasFailure()) break;
  }
  EXPECT_EQ(answered, 10000) << "every call answered, within 3 minutes";
  EXPECT_GT(accepted, 100) << "so few calls passed the checks that the actors were hardly reached";
  std::printf("%d of 10000 random calls were valid and served\n", accepted);
  still_served();
  const auto grown = resident_bytes() - rss_before;
#if defined(__SANITIZE_ADDRESS__)
  // ASan keeps freed blocks in quarantine (256 MiB) and its shadow memory:
  // the resident size says nothing of the server's own bound there.
  std::printf("the server's memory grew by %lld bytes (not checked under ASan)\n", static_cast<long long>(grown));
#else
  EXPECT_LT(grown, int64_t{256} << 20) << "the server's memory grew by " << grown << " bytes";
#endif
  (*server)->shutdown(std::chrono::seconds(5));
}

}  // namespace
}  // namespace glint::rpc
