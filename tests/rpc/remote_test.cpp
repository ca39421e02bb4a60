// Remote mode end to end in one process: a `glint serve` core (rpc::Server)
// on a local runtime, and drivers in remote mode attached to it over
// loopback, each with its own tenant's key. What a driver does through the
// typed clients equals what it does locally; tenants cannot reach each
// other's adapters, and neither can change the shared base; keys, limits and
// bad input are refused with errors that say why.
#include "actors/checkpoint_engine.hpp"
#include "actors/model_group.hpp"
#include "actors/sampler_group.hpp"
#include "components/data/bpe_trainer.hpp"
#include "components/data/dataset.hpp"
#include "components/data/synthetic.hpp"
#include "components/model/model.hpp"
#include "placement/service.hpp"
#include "rpc/client.hpp"
#include "rpc/raw_session.hpp"
#include "rpc/keys.hpp"
#include "rpc/server.hpp"
#include "support/temp_dir.hpp"

#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <future>
#include <random>
#include <thread>

namespace glint::rpc {
namespace {

using actors::ModelGroup;
using actors::SamplerGroup;
using placement::DeviceGroup;
using placement::DeviceMesh;

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

Batch batch(int64_t offset = 0) {
  Batch b;
  std::vector<int64_t> ids;
  for (int64_t i = 0; i < 16; ++i) ids.push_back((i * 7 + offset) % 290 + 3);
  b.tensors["input_ids"] = *Tensor::from_values(ids, {2, 8});
  return b;
}

std::vector<float> values_of(const Tensor& t) {
  auto v = t.values<float>();
  return v ? std::vector<float>(v->begin(), v->end()) : std::vector<float>{};
}

const actors::LoraConfig kLora{.r = 4, .alpha = 8, .target_modules = {"q_proj", "v_proj"}};

class RemoteTest : public ::testing::Test {
protected:
  static void SetUpTestSuite() {
    root_ = new std::string(glint::testing::fresh_dir("remote"));
    auto model_dir = *root_ + "/base";
    auto rows = components::arithmetic_rows(40, {.seed = 2});
    auto json = components::train_bpe(components::texts_of(components::Dataset::from_rows(rows)), {.vocab_size = 300});
    ASSERT_TRUE(json);
    auto tok = components::Tokenizer::parse(*json);
    ASSERT_TRUE(tok);
    auto cfg = components::ModelConfig::make(components::Architecture::qwen3, tok->vocab_size(), 32, 64, 2, 4, 2);
    cfg.max_position_embeddings = 256;
    auto lm = components::CausalLM::init_random(cfg, 7);
    ASSERT_TRUE(lm);
    ASSERT_TRUE(lm->save(model_dir));
    ASSERT_TRUE(components::save_chatml_tokenizer(model_dir, *json));
    auto rt = initialize(Options{});
    ASSERT_TRUE(rt) << describe(rt.error());
    server_rt_ = rt->release();
    ServeConfig config{.model_dir = model_dir, .state_dir = *root_ + "/state", .port = 0};
    config.limits.max_rank = 16;
    config.limits.adapters = 3;
    config.limits.tokens_per_call = 4096;
    config.metrics_port = 0;
    auto s = Server::start(*server_rt_, config);
    ASSERT_TRUE(s) << describe(s.error());
    server_ = s->release();
    for (auto* who : {"alice", "bob"}) {
      auto key = KeyStore::create(config.state_dir, who);
      ASSERT_TRUE(key) << describe(key.error());
      (*keys_)[who] = *key;
    }
  }
  static void TearDownTestSuite() {
    if (server_) server_->shutdown(std::chrono::seconds(5));
    delete server_;
    if (server_rt_) server_rt_->shutdown();
    delete server_rt_;
    std::filesystem::remove_all(*root_);
    delete root_;
  }

  static std::string model_dir() { return *root_ + "/base"; }
  static std::string state_dir() { return *root_ + "/state"; }

  /// A driver's runtime in remote mode, attached with `key`.
  static Result<std::unique_ptr<Runtime>> attach(const std::string& key) {
    Options o;
    o.mode = Mode::remote;
    o.remote_endpoint = "127.0.0.1:" + std::to_string(server_->port());
    o.remote_api_key = key;
    return initialize(o);
  }
  static std::unique_ptr<Runtime> attached(const std::string& tenant) {
    auto rt = attach((*keys_)[tenant]);
    EXPECT_TRUE(rt) << describe(rt.error());
    return rt ? std::move(*rt) : nullptr;
  }
  static ModelGroup model_of(Runtime& rt) {
    auto m = actors::open_model_group(rt, DeviceGroup::of("model", 1), *DeviceMesh::from_sizes({.dp = 1}),
                                      {.model_dir = model_dir()});
    EXPECT_TRUE(m) << describe(m.error());
    return std::move(*m);
  }
  static SamplerGroup sampler_of(Runtime& rt) {
    auto s = actors::open_sampler_group(rt, DeviceGroup::of("sampler", 1), *DeviceMesh::from_sizes({.dp = 1}),
                                        {.model_dir = model_dir()});
    EXPECT_TRUE(s) << describe(s.error());
    return std::move(*s);
  }

  static std::string* root_;
  static Runtime* server_rt_;
  static Server* server_;
  static std::map<std::string, std::string>* keys_;
};

std::string* RemoteTest::root_ = nullptr;
Runtime* RemoteTest::server_rt_ = nullptr;
Server* RemoteTest::server_ = nullptr;
std::map<std::string, std::string>* RemoteTest::keys_ = new std::map<std::string, std::string>();

TEST_F(RemoteTest, TrainingAnAdapterRemotelyEqualsTrainingItLocally) {
  // Local: a model group of the same base in the server's own runtime.
  ASSERT_TRUE(placement::service(*server_rt_, {}));
  auto local = actors::open_model_group(*server_rt_, DeviceGroup::of("local-model", 1),
                                        *DeviceMesh::from_sizes({.dp = 1}), {.model_dir = model_dir()});
  ASSERT_TRUE(local) << describe(local.error());
  auto rt = attached("alice");
  ASSERT_TRUE(rt);
  auto remote = model_of(*rt);
  std::vector<double> losses[2];
  std::vector<float> logps[2];
  int i = 0;
  for (ModelGroup* m : {&*local, &remote}) {
    ASSERT_TRUE(m->add_adapter("same", kLora, 11).get());
    auto a = m->with_adapter("same");
    ASSERT_TRUE(a.set_optimizer({.lr = 1e-2}).get());
    for (int step = 0; step < 3; ++step) {
      auto fb = a.forward_backward(batch(step)).get();
      ASSERT_TRUE(fb) << describe(fb.error());
      losses[i].push_back(fb->at("loss"));
      ASSERT_TRUE(a.clip_grad_and_step().get());
    }
    auto lp = a.forward_only(batch()).get();
    ASSERT_TRUE(lp) << describe(lp.error());
    logps[i] = values_of(*lp);
    ++i;
  }
  ASSERT_EQ(losses[0].size(), 3u);
  for (size_t s = 0; s < 3; ++s) EXPECT_NEAR(losses[0][s], losses[1][s], 1e-6) << "step " << s;
  ASSERT_EQ(logps[0].size(), logps[1].size());
  for (size_t k = 0; k < logps[0].size(); ++k) EXPECT_EQ(logps[0][k], logps[1][k]) << "position " << k;
  ASSERT_TRUE(remote.remove_adapter("same").get());
}

TEST_F(RemoteTest, SaveWritesTheAdapterOnTheDriversSideAndLoadReadsItBack) {
  auto rt = attached("alice");
  ASSERT_TRUE(rt);
  auto m = model_of(*rt);
  ASSERT_TRUE(m.add_adapter("saved", kLora, 3).get());
  auto a = m.with_adapter("saved");
  ASSERT_TRUE(a.set_optimizer({.lr = 1e-2}).get());
  ASSERT_TRUE(a.forward_backward(batch()).get());
  ASSERT_TRUE(a.clip_grad_and_step().get());
  auto dir = glint::testing::fresh_dir("remote-save") + "/adapter";
  auto saved = a.save({.dir = dir, .with_optimizer = true}).get();
  ASSERT_TRUE(saved) << describe(saved.error());
  EXPECT_TRUE(std::filesystem::exists(dir + "/adapter_model.safetensors"));
  EXPECT_TRUE(std::filesystem::exists(dir + "/adapter_config.json"));
  EXPECT_TRUE(std::filesystem::exists(dir + "/optimizer.safetensors"));
  auto before = a.forward_only(batch()).get();
  ASSERT_TRUE(before);
  ASSERT_TRUE(m.load_adapter("copy", dir).get());
  auto copy = m.with_adapter("copy").forward_only(batch()).get();
  ASSERT_TRUE(copy) << describe(copy.error());
  EXPECT_EQ(values_of(*before), values_of(*copy));
  // Loading into the trained adapter (with its optimizer) keeps its outputs.
  ASSERT_TRUE(a.load({.dir = dir, .with_optimizer = true}).get());
  EXPECT_EQ(values_of(*a.forward_only(batch()).get()), values_of(*before));
  ASSERT_TRUE(m.remove_adapter("saved").get());
  ASSERT_TRUE(m.remove_adapter("copy").get());
}

TEST_F(RemoteTest, AnAdapterSyncedToTheSamplerAnswersWithItsWeights) {
  auto rt = attached("alice");
  ASSERT_TRUE(rt);
  auto m = model_of(*rt);
  auto s = sampler_of(*rt);
  ASSERT_TRUE(m.add_adapter("rl", kLora, 5).get());
  ASSERT_TRUE(s.add_adapter("rl", kLora).get());
  auto a = m.with_adapter("rl");
  ASSERT_TRUE(a.set_optimizer({.lr = 5e-2}).get());
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(a.forward_backward(batch(i)).get());
    ASSERT_TRUE(a.clip_grad_and_step().get());
  }
  actors::CheckpointEngine sync{a, s.with_adapter("rl")};
  auto report = sync.sync_weights();
  ASSERT_TRUE(report) << describe(report.error());
  EXPECT_GT(report->version, 0);
  components::SamplingParams greedy{.max_tokens = 6, .temperature = 0, .ignore_eos = true};
  auto base = s.sample({{5, 6, 7, 8}}, greedy).get();
  auto tuned = s.with_adapter("rl").sample({{5, 6, 7, 8}}, greedy).get();
  ASSERT_TRUE(base) << describe(base.error());
  ASSERT_TRUE(tuned) << describe(tuned.error());
  ASSERT_EQ(tuned->size(), 1u);
  EXPECT_EQ((*tuned)[0].weight_version, report->version);
  EXPECT_EQ((*tuned)[0].tokens.size(), 6u);
  EXPECT_EQ((*base)[0].tokens.size(), 6u);
  // Sampling refuses what the server shares: the samplers' own controls.
  EXPECT_EQ(code_of(s.sleep().get().error()), errc::permission_denied);
  ASSERT_TRUE(s.remove_adapter("rl").get());
  ASSERT_TRUE(m.remove_adapter("rl").get());
}

TEST_F(RemoteTest, TenantsCannotReachEachOthersAdaptersAndTheBaseNeverChanges) {
  auto alice_rt = attached("alice");
  auto bob_rt = attached("bob");
  ASSERT_TRUE(alice_rt && bob_rt);
  auto alice = model_of(*alice_rt);
  auto bob = model_of(*bob_rt);
  ASSERT_TRUE(alice.add_adapter("mine", kLora, 1).get());
  auto alice_a = alice.with_adapter("mine");
  ASSERT_TRUE(alice_a.set_optimizer({.lr = 1e-2}).get());
  ASSERT_TRUE(alice_a.forward_backward(batch()).get());
  ASSERT_TRUE(alice_a.clip_grad_and_step().get());
  auto alice_before = values_of(*alice_a.forward_only(batch()).get());
  auto bob_base_before = values_of(*bob.forward_only(batch()).get());

  // Bob, with his valid key, names Alice's adapter every way there is: each
  // is refused exactly as for a name nobody has.
  auto b = bob.with_adapter("mine");
  auto nobody = bob.with_adapter("nobody-has-this");
  auto same_refusal = [&](const caf::error& e, const caf::error& reference, const char* what) {
    EXPECT_EQ(code_of(e), errc::not_found) << what << ": " << describe(e);
    auto scrub = [](std::string s, const char* name) {
      for (auto at = s.find(name); at != std::string::npos; at = s.find(name)) s.replace(at, std::strlen(name), "X");
      return s;
    };
    EXPECT_EQ(scrub(context_of(e), "mine"), scrub(context_of(reference), "nobody-has-this")) << what;
  };
  same_refusal(b.forward_only(batch()).get().error(), nobody.forward_only(batch()).get().error(), "forward_only");
  same_refusal(b.forward_backward(batch()).get().error(), nobody.forward_backward(batch()).get().error(), "train");
  same_refusal(b.clip_grad_and_step().get().error(), nobody.clip_grad_and_step().get().error(), "step");
  same_refusal(b.export_weights().get().error(), nobody.export_weights().get().error(), "export");
  same_refusal(b.set_optimizer({}).get().error(), nobody.set_optimizer({}).get().error(), "set_optimizer");
  same_refusal(b.train_configs().get().error(), nobody.train_configs().get().error(), "train_configs");
  auto dir = glint::testing::fresh_dir("remote-steal");
  same_refusal(b.save({.dir = dir + "/x"}).get().error(), nobody.save({.dir = dir + "/y"}).get().error(), "save");
  same_refusal(bob.remove_adapter("mine").get().error(), bob.remove_adapter("nobody-has-this").get().error(), "remove");
  EXPECT_FALSE(std::filesystem::exists(dir + "/x"));

  // Bob's own adapter of the same name, of another rank: his, not hers.
  ASSERT_TRUE(bob.add_adapter("mine", {.r = 8, .alpha = 16}, 2).get());
  ASSERT_TRUE(b.set_optimizer({.lr = 1e-1}).get());
  for (int i = 0; i < 2; ++i) {
    ASSERT_TRUE(b.forward_backward(batch(i)).get());
    ASSERT_TRUE(b.clip_grad_and_step().get());
  }
  // Overwriting through a load is his adapter too.
  auto bob_dir = dir + "/bob";
  ASSERT_TRUE(b.save({.dir = bob_dir}).get());
  ASSERT_TRUE(b.load({.dir = bob_dir}).get());
  EXPECT_EQ(values_of(*alice_a.forward_only(batch()).get()), alice_before) << "Alice's adapter changed";
  EXPECT_EQ(values_of(*bob.forward_only(batch()).get()), bob_base_before) << "the shared base changed";

  // Nobody trains the base.
  auto base_train = bob.forward_backward(batch()).get();
  ASSERT_FALSE(base_train);
  EXPECT_EQ(code_of(base_train.error()), errc::permission_denied);
  EXPECT_TRUE(contains(describe(base_train.error()), "shared base")) << describe(base_train.error());
  EXPECT_EQ(code_of(bob.save({.dir = dir + "/base"}).get().error()), errc::permission_denied);
  ASSERT_TRUE(bob.remove_adapter("mine").get());
  ASSERT_TRUE(alice.remove_adapter("mine").get());
}

TEST_F(RemoteTest, ErrorsNeverNameAnotherTenantsAdapters) {
  auto alice_rt = attached("alice");
  auto bob_rt = attached("bob");
  ASSERT_TRUE(alice_rt && bob_rt);
  auto bob = model_of(*bob_rt);
  ASSERT_TRUE(bob.add_adapter("bobs-secret-name", kLora).get());
  auto alice = model_of(*alice_rt);
  // An add the gateway accepts and the model refuses (no module matches),
  // with a call right behind it that reaches the model after the refusal:
  // the model's "no adapter" error lists every adapter it holds.
  auto add = alice.add_adapter("x", {.r = 2, .alpha = 4, .target_modules = {"no_such_proj"}});
  auto behind = alice.with_adapter("x").set_loss({});
  EXPECT_FALSE(add.get());
  auto err = behind.get();
  ASSERT_FALSE(err);
  EXPECT_FALSE(contains(describe(err.error()), "bobs-secret-name")) << describe(err.error());
  EXPECT_FALSE(contains(describe(err.error()), "bob:")) << describe(err.error());
  ASSERT_TRUE(bob.remove_adapter("bobs-secret-name").get());
}

TEST_F(RemoteTest, KeysAreCheckedAtConnectAndARevokedKeyStopsAtOnce) {
  auto wrong = attach("tml-" + std::string(64, '0'));
  ASSERT_FALSE(wrong);
  EXPECT_EQ(code_of(wrong.error()), errc::permission_denied);
  auto malformed = attach("not a key");
  ASSERT_FALSE(malformed);
  EXPECT_EQ(code_of(malformed.error()), errc::permission_denied);
  EXPECT_EQ(context_of(wrong.error()), context_of(malformed.error())) << "refusals say nothing about why";

  auto key = KeyStore::create(state_dir(), "carol");
  ASSERT_TRUE(key);
  auto rt = attach(*key);
  ASSERT_TRUE(rt) << describe(rt.error());
  auto m = model_of(**rt);
  ASSERT_TRUE(m.add_adapter("c", kLora).get());
  auto revoked = KeyStore::revoke(state_dir(), KeyStore::id_of(*key));
  ASSERT_TRUE(revoked) << describe(revoked.error());
  auto after = m.with_adapter("c").forward_only(batch()).get();
  ASSERT_FALSE(after);
  EXPECT_EQ(code_of(after.error()), errc::permission_denied);
  EXPECT_FALSE(attach(*key));
  // The store keeps no key, only salted hashes.
  auto listed = KeyStore::list(state_dir());
  ASSERT_TRUE(listed);
  for (const auto& e : std::filesystem::recursive_directory_iterator(state_dir())) {
    if (!e.is_regular_file()) continue;
    std::ifstream in{e.path(), std::ios::binary};
    std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    EXPECT_EQ(bytes.find(key->substr(20)), std::string::npos) << e.path() << " holds the key's secret";
  }
}

TEST_F(RemoteTest, LimitsAndBadInputAreRefusedBeforeAnyActorSeesThem) {
  auto rt = attached("bob");
  ASSERT_TRUE(rt);
  auto m = model_of(*rt);
  auto big = m.add_adapter("big", {.r = 32, .alpha = 64}).get();
  ASSERT_FALSE(big);
  EXPECT_EQ(code_of(big.error()), errc::resource_exhausted);
  EXPECT_TRUE(contains(describe(big.error()), "max_rank")) << describe(big.error());
  auto bad_name = m.add_adapter("../escape", kLora).get();
  EXPECT_EQ(code_of(bad_name.error()), errc::invalid_argument);
  for (auto* n : {"a1", "a2", "a3"}) ASSERT_TRUE(m.add_adapter(n, kLora).get());
  auto fourth = m.add_adapter("a4", kLora).get();
  ASSERT_FALSE(fourth);
  EXPECT_TRUE(contains(describe(fourth.error()), "limit adapters")) << describe(fourth.error());
  auto a = m.with_adapter("a1");
  Batch out_of_vocab;
  out_of_vocab.tensors["input_ids"] = *Tensor::from_values(std::vector<int64_t>{1, 2, 100000, 4}, {1, 4});
  auto oov = a.forward_backward(out_of_vocab).get();
  ASSERT_FALSE(oov);
  EXPECT_EQ(code_of(oov.error()), errc::invalid_argument);
  EXPECT_TRUE(contains(describe(oov.error()), "outside the vocabulary")) << describe(oov.error());
  Batch floats;
  floats.tensors["input_ids"] = *Tensor::from_values(std::vector<float>{1, 2}, {1, 2});
  EXPECT_EQ(code_of(a.forward_backward(floats).get().error()), errc::invalid_argument);
  Batch huge;
  huge.tensors["input_ids"] = *Tensor::zeros(Dtype::i64, {20, 256});
  auto too_many = a.forward_backward(huge).get();
  ASSERT_FALSE(too_many);
  EXPECT_TRUE(contains(describe(too_many.error()), "tokens_per_call")) << describe(too_many.error());
  Batch too_long;
  too_long.tensors["input_ids"] = *Tensor::zeros(Dtype::i64, {1, 1024});
  auto long_rows = a.forward_backward(too_long).get();
  ASSERT_FALSE(long_rows);
  EXPECT_TRUE(contains(describe(long_rows.error()), "longer than the model's context")) << describe(long_rows.error());
  Batch unknown = batch();
  unknown.tensors["advantagez"] = *Tensor::zeros(Dtype::f32, {2});
  auto ignored = a.forward_backward(unknown).get();
  ASSERT_FALSE(ignored) << "a tensor the trainer would ignore is refused, not dropped";
  EXPECT_TRUE(contains(describe(ignored.error()), "unknown tensor 'advantagez'")) << describe(ignored.error());
  Batch misshapen = batch();
  misshapen.tensors["loss_mask"] = *Tensor::zeros(Dtype::f32, {2, 3});
  EXPECT_EQ(code_of(a.forward_backward(misshapen).get().error()), errc::invalid_argument);
  auto s = actors::open_sampler_group(*rt, DeviceGroup::of("s", 1), *DeviceMesh::from_sizes({.dp = 1}), {});
  ASSERT_TRUE(s);
  auto many = s->sample({{5, 6}}, {.num_samples = int64_t{1} << 40, .max_tokens = 0}).get();
  ASSERT_FALSE(many);
  EXPECT_TRUE(contains(describe(many.error()), "num_samples")) << describe(many.error());
  // The next well-formed call is served.
  EXPECT_TRUE(a.forward_backward(batch()).get());
  for (auto* n : {"a1", "a2", "a3"}) ASSERT_TRUE(m.remove_adapter(n).get());
}

TEST_F(RemoteTest, AttachingChecksTheBaseModel) {
  auto rt = attached("alice");
  ASSERT_TRUE(rt);
  auto other = glint::testing::fresh_dir("remote-other");
  auto cfg = components::ModelConfig::make(components::Architecture::qwen3, 300, 32, 64, 2, 4, 2);
  auto lm = components::CausalLM::init_random(cfg, 8);
  ASSERT_TRUE(lm && lm->save(other));
  auto m = actors::open_model_group(*rt, DeviceGroup::of("model", 1), *DeviceMesh::from_sizes({.dp = 1}),
                                    {.model_dir = other});
  ASSERT_FALSE(m);
  EXPECT_EQ(code_of(m.error()), errc::failed_precondition);
  EXPECT_TRUE(contains(describe(m.error()), "not the server's base model")) << describe(m.error());
  auto random = actors::open_model_group(*rt, DeviceGroup::of("model", 1), *DeviceMesh::from_sizes({.dp = 1}),
                                         {.config_json = cfg.to_json()});
  EXPECT_EQ(code_of(random.error()), errc::invalid_argument);
  EXPECT_TRUE(actors::open_model_group(*rt, DeviceGroup::of("model", 1), *DeviceMesh::from_sizes({.dp = 1}), {}));
}

// GET `path` from 127.0.0.1:port; the whole response.
/// A plain TCP connection to 127.0.0.1:port; -1 if refused.
int tcp_connect(int port) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

std::string http_get(int port, const std::string& path) {
  int fd = tcp_connect(port);
  if (fd < 0) return {};
  auto req = "GET " + path + " HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n";
  (void)!::write(fd, req.data(), req.size());
  // Read the headers, then Content-Length bytes (the server keeps the
  // connection open).
  std::string out;
  char buf[4096];
  size_t want = std::string::npos;
  for (ssize_t n; out.size() < want && (n = ::read(fd, buf, sizeof buf)) > 0;) {
    out.append(buf, static_cast<size_t>(n));
    auto end = out.find("\r\n\r\n");
    auto len = out.find("Content-Length: ");
    if (want == std::string::npos && end != std::string::npos && len != std::string::npos && len < end)
      want = end + 4 + std::stoul(out.substr(len + 16));
  }
  ::close(fd);
  return out;
}

TEST_F(RemoteTest, PrometheusCountersCountEachTenantsCalls) {
  auto rt = attached("alice");
  ASSERT_TRUE(rt);
  auto m = model_of(*rt);
  ASSERT_TRUE(m.add_adapter("counted", kLora).get());
  ASSERT_TRUE(m.with_adapter("counted").forward_backward(batch()).get());
  EXPECT_FALSE(m.with_adapter("nope").forward_backward(batch()).get());
  ASSERT_GT(server_->metrics_port(), 0);
  auto text = http_get(server_->metrics_port(), "/metrics");
  EXPECT_TRUE(contains(text, "200 OK")) << text;
  EXPECT_TRUE(contains(text, "# TYPE glint_serve_calls_total counter")) << text;
  EXPECT_TRUE(contains(text, "glint_serve_tokens_total{tenant=\"alice\"}")) << text;
  EXPECT_TRUE(contains(text, "glint_serve_errors_total{tenant=\"alice\"}")) << text;
  EXPECT_TRUE(contains(text, "glint_serve_adapters_resident ")) << text;
  EXPECT_TRUE(contains(text, "glint_serve_resident_memory_bytes ")) << text;
  EXPECT_TRUE(contains(http_get(server_->metrics_port(), "/other"), "404")) << "unknown paths are 404";
  ASSERT_TRUE(m.remove_adapter("counted").get());
}

// A server with TLS: a client that trusts its certificate attaches over
// tls://; one that does not, or that speaks plain TCP to it, is refused.
TEST(RemoteTls, ClientsAttachOverTlsOnlyWhenTheyTrustTheCertificate) {
  auto dir = glint::testing::fresh_dir("remote-tls");
  auto cmd = "openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 2 -subj /CN=localhost "
             "-addext subjectAltName=DNS:localhost -keyout " + dir + "/key.pem -out " + dir + "/cert.pem 2>/dev/null";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << "openssl (scripts/setup.sh installs it) made no certificate";
  auto model_dir = dir + "/base";
  auto cfg = components::ModelConfig::make(components::Architecture::qwen3, 300, 16, 32, 1, 4, 2);
  auto lm = components::CausalLM::init_random(cfg, 3);
  ASSERT_TRUE(lm && lm->save(model_dir));
  auto rt = initialize(Options{});
  ASSERT_TRUE(rt);
  ServeConfig config{.model_dir = model_dir, .state_dir = dir + "/state", .port = 0, .tls_cert = dir + "/cert.pem",
                     .tls_key = dir + "/key.pem"};
  auto server = Server::start(**rt, config);
  ASSERT_TRUE(server) << describe(server.error());
  auto key = KeyStore::create(config.state_dir, "tls-user");
  ASSERT_TRUE(key);
  Options o;
  o.mode = Mode::remote;
  o.remote_api_key = *key;
  o.remote_endpoint = "tls://localhost:" + std::to_string((*server)->port());
  o.remote_ca_file = dir + "/cert.pem";
  o.connect_timeout = std::chrono::seconds(10);
  {
    auto client = initialize(o);
    ASSERT_TRUE(client) << describe(client.error());
    auto m = actors::open_model_group(**client, DeviceGroup::of("model", 1), *DeviceMesh::from_sizes({.dp = 1}), {});
    ASSERT_TRUE(m);
    ASSERT_TRUE(m->add_adapter("a", kLora).get());
    EXPECT_TRUE(m->with_adapter("a").forward_only(batch()).get());
  }
  auto untrusted = o;
  untrusted.remote_ca_file.clear();  // the system's store does not hold a self-signed certificate
  auto refused = initialize(untrusted);
  ASSERT_FALSE(refused);
  EXPECT_EQ(code_of(refused.error()), errc::unavailable) << describe(refused.error());
  auto plain = o;
  plain.remote_endpoint = "127.0.0.1:" + std::to_string((*server)->port());
  EXPECT_FALSE(initialize(plain)) << "plain TCP to a TLS port";
  (*server)->shutdown(std::chrono::seconds(5));
}

// Server-side checkpoints: the tenant's own, and still there after the
// server restarts.
TEST(RemoteCheckpoints, ATenantsCheckpointsAreItsOwnAndOutliveTheServer) {
  auto dir = glint::testing::fresh_dir("remote-ckpt");
  auto cfg = components::ModelConfig::make(components::Architecture::qwen3, 300, 16, 32, 1, 4, 2);
  auto lm = components::CausalLM::init_random(cfg, 4);
  ASSERT_TRUE(lm && lm->save(dir + "/base"));
  ServeConfig config{.model_dir = dir + "/base", .state_dir = dir + "/state", .port = 0};
  auto alice_key = KeyStore::create(config.state_dir, "alice");
  auto bob_key = KeyStore::create(config.state_dir, "bob");
  ASSERT_TRUE(alice_key && bob_key);
  auto attach_to = [](const Server& s, const std::string& key) {
    Options o;
    o.mode = Mode::remote;
    o.remote_endpoint = "127.0.0.1:" + std::to_string(s.port());
    o.remote_api_key = key;
    return initialize(o);
  };
  auto mesh = *DeviceMesh::from_sizes({.dp = 1});
  std::vector<float> trained;
  {
    auto rt = initialize(Options{});
    ASSERT_TRUE(rt);
    auto server = Server::start(**rt, config);
    ASSERT_TRUE(server) << describe(server.error());
    auto alice = attach_to(**server, *alice_key);
    auto bob = attach_to(**server, *bob_key);
    ASSERT_TRUE(alice && bob);
    auto m = actors::open_model_group(**alice, DeviceGroup::of("m", 1), mesh, {});
    ASSERT_TRUE(m);
    ASSERT_TRUE(m->add_adapter("policy", kLora, 2).get());
    auto a = m->with_adapter("policy");
    ASSERT_TRUE(a.set_optimizer({.lr = 1e-2}).get());
    ASSERT_TRUE(a.forward_backward(batch()).get());
    ASSERT_TRUE(a.clip_grad_and_step().get());
    trained = values_of(*a.forward_only(batch()).get());
    auto ckpts = ServerCheckpoints::of(**alice);
    ASSERT_TRUE(ckpts);
    auto saved = ckpts->save(a, "step-1", /*with_optimizer=*/true);
    ASSERT_TRUE(saved) << describe(saved.error());
    EXPECT_EQ(saved->adapter, "policy");
    EXPECT_FALSE(ckpts->save(a, "step-1")) << "a checkpoint is never overwritten";
    // Bob sees nothing of it, and cannot load or delete it.
    auto bobs = ServerCheckpoints::of(**bob);
    ASSERT_TRUE(bobs);
    EXPECT_TRUE(bobs->list()->empty());
    auto bm = actors::open_model_group(**bob, DeviceGroup::of("m", 1), mesh, {});
    ASSERT_TRUE(bm);
    auto steal = bobs->load("step-1", bm->with_adapter("stolen"), /*create=*/true);
    ASSERT_FALSE(steal);
    EXPECT_EQ(code_of(steal.error()), errc::not_found);
    EXPECT_EQ(code_of(bobs->remove("step-1").error()), errc::not_found);
    EXPECT_EQ(code_of(bobs->remove("../alice/step-1").error()), errc::invalid_argument);
    alice->reset();
    bob->reset();
    (*server)->shutdown(std::chrono::seconds(5));
    (*rt)->shutdown();
  }
  // A new server on the same state directory.
  auto rt = initialize(Options{});
  ASSERT_TRUE(rt);
  auto server = Server::start(**rt, config);
  ASSERT_TRUE(server) << describe(server.error());
  auto alice = attach_to(**server, *alice_key);
  ASSERT_TRUE(alice);
  auto ckpts = ServerCheckpoints::of(**alice);
  ASSERT_TRUE(ckpts);
  auto listed = ckpts->list();
  ASSERT_TRUE(listed) << describe(listed.error());
  // Hers, and the adapter the first server held at shutdown, which it saved.
  ASSERT_EQ(listed->size(), 2u);
  EXPECT_EQ((*listed)[0].name, "step-1");
  EXPECT_TRUE((*listed)[0].with_optimizer);
  EXPECT_EQ((*listed)[1].name, "autosave-policy");
  auto m = actors::open_model_group(**alice, DeviceGroup::of("m", 1), mesh, {});
  ASSERT_TRUE(m);
  auto loaded = ckpts->load("step-1", m->with_adapter("back"), /*create=*/true);
  ASSERT_TRUE(loaded) << describe(loaded.error());
  EXPECT_EQ(values_of(*m->with_adapter("back").forward_only(batch()).get()), trained);
  ASSERT_TRUE(ckpts->load("step-1", m->with_adapter("back"), /*create=*/false, /*with_optimizer=*/true));
  // "policy" again, one step further: this server's autosave replaces the first one.
  ASSERT_TRUE(ckpts->load("step-1", m->with_adapter("policy"), /*create=*/true, /*with_optimizer=*/true));
  auto policy = m->with_adapter("policy");
  ASSERT_TRUE(policy.forward_backward(batch()).get());
  ASSERT_TRUE(policy.clip_grad_and_step().get());
  const auto later = values_of(*policy.forward_only(batch()).get());
  ASSERT_NE(later, trained);
  ASSERT_TRUE(ckpts->remove("step-1"));
  EXPECT_FALSE(std::filesystem::exists(config.state_dir + "/checkpoints/alice/step-1"));
  ASSERT_EQ(ckpts->list()->size(), 1u);
  alice->reset();
  (*server)->shutdown(std::chrono::seconds(5));
  server->reset();  // its state directory's lock goes with it
  // A new server in a new runtime, as a restarted process would be.
  (*rt)->shutdown();
  rt = initialize(Options{});
  ASSERT_TRUE(rt);
  server = Server::start(**rt, config);
  ASSERT_TRUE(server) << describe(server.error());
  alice = attach_to(**server, *alice_key);
  ASSERT_TRUE(alice);
  ckpts = ServerCheckpoints::of(**alice);
  ASSERT_TRUE(ckpts);
  listed = ckpts->list();
  ASSERT_TRUE(listed) << describe(listed.error());
  std::vector<std::string> names;
  for (const auto& c : *listed) names.push_back(c.name);
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"autosave-back", "autosave-policy"})) << "replaced, not added beside";
  m = actors::open_model_group(**alice, DeviceGroup::of("m", 1), mesh, {});
  ASSERT_TRUE(m);
  ASSERT_TRUE(ckpts->load("autosave-policy", m->with_adapter("policy"), /*create=*/true));
  EXPECT_EQ(values_of(*m->with_adapter("policy").forward_only(batch()).get()), later) << "the newer autosave";
  for (const auto& n : names) ASSERT_TRUE(ckpts->remove(n));
  EXPECT_TRUE(ckpts->list()->empty());
  alice->reset();
  (*server)->shutdown(std::chrono::seconds(5));
}

// A client that goes silent (no calls, no heartbeats) has its adapters
// freed after the idle time; a driver's own heartbeats keep its adapters.
TEST(RemoteIdle, ASilentTenantsAdaptersAreFreedAndAHeartbeatingOnesStay) {
  auto dir = glint::testing::fresh_dir("remote-idle");
  auto cfg = components::ModelConfig::make(components::Architecture::qwen3, 300, 16, 32, 1, 4, 2);
  auto lm = components::CausalLM::init_random(cfg, 6);
  ASSERT_TRUE(lm && lm->save(dir + "/base"));
  auto rt = initialize(Options{});
  ASSERT_TRUE(rt);
  ServeConfig config{.model_dir = dir + "/base", .state_dir = dir + "/state", .port = 0};
  config.limits.idle_seconds = 1;
  auto server = Server::start(**rt, config);
  ASSERT_TRUE(server) << describe(server.error());
  auto silent_key = KeyStore::create(config.state_dir, "silent");
  auto busy_key = KeyStore::create(config.state_dir, "busy");
  ASSERT_TRUE(silent_key && busy_key);
  // The busy tenant: a driver, whose client sends heartbeats.
  Options o;
  o.mode = Mode::remote;
  o.remote_endpoint = "127.0.0.1:" + std::to_string((*server)->port());
  o.remote_api_key = *busy_key;
  auto busy_rt = initialize(o);
  ASSERT_TRUE(busy_rt);
  auto busy = actors::open_model_group(**busy_rt, DeviceGroup::of("m", 1), *DeviceMesh::from_sizes({.dp = 1}), {});
  ASSERT_TRUE(busy);
  ASSERT_TRUE(busy->add_adapter("kept", kLora).get());
  // The silent one: a bare Cap'n Proto client that never sends a heartbeat.
  testing::RawSession silent{(*server)->port(), *silent_key};
  ASSERT_EQ(silent.status(), 0) << silent.message();
  EXPECT_EQ(silent.idle_seconds(), 1);
  ASSERT_EQ(silent.add_small_adapter("gone"), 0);
  silent.sleep_ms(2500);
  auto list = silent.session().listAdaptersRequest().send().wait(silent.wait_scope());
  ASSERT_EQ(list.getStatus().getCode(), 0);
  EXPECT_EQ(list.getNames().size(), 0u) << "the silent tenant's adapter was freed";
  auto still = busy->with_adapter("kept").forward_only(batch()).get();
  EXPECT_TRUE(still) << "the heartbeating tenant's adapter stays: " << describe(still.error());
  busy_rt->reset();
  (*server)->shutdown(std::chrono::seconds(5));
}

TEST(RemoteConnect, NoServerIsUnavailableAndABadAddressIsInvalid) {
  Options o;
  o.mode = Mode::remote;
  o.remote_api_key = "tml-" + std::string(64, '0');
  o.remote_endpoint = "127.0.0.1:1";
  auto none = initialize(o);
  ASSERT_FALSE(none);
  EXPECT_EQ(code_of(none.error()), errc::unavailable);
  o.remote_endpoint = "no-port";
  auto bad = initialize(o);
  ASSERT_FALSE(bad);
  EXPECT_EQ(code_of(bad.error()), errc::invalid_argument);
}

// -- standalone servers -----------------------------------------------------------

/// A server of its own (a fresh base of the given shape, a tweaked
/// config) in this process, with keys for `tenants`.
struct OwnServer {
  std::string dir;
  std::unique_ptr<Runtime> rt;
  std::unique_ptr<Server> server;
  std::map<std::string, std::string> keys;

  OwnServer(const std::string& name, const components::ModelConfig& cfg, const std::function<void(ServeConfig&)>& tweak,
            std::vector<std::string> tenants = {"alice", "bob"}) {
    dir = glint::testing::fresh_dir(name);
    auto lm = components::CausalLM::init_random(cfg, 3);
    EXPECT_TRUE(lm && lm->save(dir + "/base"));
    auto r = initialize(Options{});
    EXPECT_TRUE(r);
    rt = std::move(*r);
    ServeConfig config{.model_dir = dir + "/base", .state_dir = dir + "/state", .port = 0};
    tweak(config);
    for (const auto& t : tenants) keys[t] = *KeyStore::create(config.state_dir, t);
    auto s = Server::start(*rt, config);
    EXPECT_TRUE(s) << describe(s.error());
    if (s) server = std::move(*s);
  }
  ~OwnServer() {
    if (server) server->shutdown(std::chrono::seconds(5));
    server.reset();
    if (rt) rt->shutdown();
    std::filesystem::remove_all(dir);
  }
  std::unique_ptr<Runtime> attach(const std::string& tenant) const {
    Options o;
    o.mode = Mode::remote;
    o.remote_endpoint = "127.0.0.1:" + std::to_string(server->port());
    o.remote_api_key = keys.at(tenant);
    auto r = initialize(o);
    EXPECT_TRUE(r) << describe(r.error());
    return r ? std::move(*r) : nullptr;
  }
  static ModelGroup model(Runtime& rt) {
    return *actors::open_model_group(rt, DeviceGroup::of("m", 1), *DeviceMesh::from_sizes({.dp = 1}), {});
  }
  static SamplerGroup sampler(Runtime& rt) {
    return *actors::open_sampler_group(rt, DeviceGroup::of("s", 1), *DeviceMesh::from_sizes({.dp = 1}), {});
  }
};

Batch rows_of(int64_t rows, int64_t len, int64_t offset = 0) {
  std::vector<int64_t> ids;
  for (int64_t i = 0; i < rows * len; ++i) ids.push_back((i * 13 + offset) % 290 + 3);
  Batch b;
  b.tensors["input_ids"] = *Tensor::from_values(ids, {rows, len});
  return b;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? NAN : v[v.size() / 2];
}

// Issue 13's fairness goal: with tenant A sending batches 8x larger than
// tenant B's (and keeping several calls in flight), B's median call latency
// stays within 2x its latency alone plus one of A's steps. Without the
// model group's turns, B's call would wait behind all of A's queued ones
// (four here).
TEST(RemoteFair, ABigTenantDelaysASmallOnesCallsByAtMostOneOfItsOwn) {
  auto cfg = components::ModelConfig::make(components::Architecture::qwen3, 300, 64, 128, 2, 4, 2);
  cfg.max_position_embeddings = 256;
  OwnServer s{"remote-fair", cfg, [](ServeConfig&) {}};
  ASSERT_TRUE(s.server);
  auto a_rt = s.attach("alice"), b_rt = s.attach("bob");
  ASSERT_TRUE(a_rt && b_rt);
  auto a = OwnServer::model(*a_rt), b = OwnServer::model(*b_rt);
  ASSERT_TRUE(a.add_adapter("big", kLora, 1).get());
  ASSERT_TRUE(b.add_adapter("small", kLora, 2).get());
  auto big = a.with_adapter("big"), small = b.with_adapter("small");
  const auto small_batch = rows_of(2, 64), big_batch = rows_of(16, 64, 5);  // 8x the tokens
  using ms = std::chrono::duration<double, std::milli>;
  auto timed = [](const ModelGroup& m, const Batch& batch) {
    auto t0 = std::chrono::steady_clock::now();
    auto r = m.forward_backward(batch).get();
    EXPECT_TRUE(r) << describe(r.error());
    return ms(std::chrono::steady_clock::now() - t0).count();
  };
  for (int i = 0; i < 3; ++i) (void)timed(small, small_batch), (void)timed(big, big_batch);  // warm-up
  std::vector<double> alone, a_steps, with_a;
  for (int i = 0; i < 15; ++i) alone.push_back(timed(small, small_batch));
  for (int i = 0; i < 7; ++i) a_steps.push_back(timed(big, big_batch));
  // A: four big calls in flight at a time, then a step, until B is done.
  std::atomic<bool> stop{false};
  std::atomic<int> a_calls{0};
  std::thread busy([&] {
    while (!stop) {
      std::vector<Future<Metrics>> calls;
      for (int k = 0; k < 4; ++k) calls.push_back(big.forward_backward(big_batch));
      for (auto& c : calls) EXPECT_TRUE(c.get());
      a_calls += 4;
      EXPECT_TRUE(big.clip_grad_and_step().get());
    }
  });
  while (a_calls < 4) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  // B prepares its next batch between calls (a think time spread over one
  // of A's steps), so its calls arrive at any point of A's: calls sent
  // back to back would all land just as A's next starts.
  std::mt19937 rng{7};
  std::uniform_real_distribution<double> think(0, median(a_steps));
  for (int i = 0; i < 21; ++i) {
    std::this_thread::sleep_for(std::chrono::microseconds(static_cast<int64_t>(think(rng) * 1000)));
    with_a.push_back(timed(small, small_batch));
  }
  stop = true;
  busy.join();
  const double b_alone = median(alone), a_step = median(a_steps), b_with = median(with_a);
  std::printf("B alone %.2f ms, A's step %.2f ms, B beside A %.2f ms (bound %.2f ms)\n", b_alone, a_step, b_with,
              2 * b_alone + a_step);
  EXPECT_GT(a_step, 2 * b_alone) << "A's batches must cost more than B's for the test to mean something";
  EXPECT_LE(b_with, 2 * b_alone + a_step);
}

// Issue 13: a server-wide memory budget for adapters and their optimizer
// state; an adapter that would go over it is refused naming the limit, and
// removing one makes room.
TEST(RemoteMemory, AnAdapterOverTheServersBudgetIsRefusedNamingTheLimit) {
  auto cfg = components::ModelConfig::make(components::Architecture::qwen3, 300, 32, 64, 2, 4, 2);
  // kLora on this base: 2 layers x (4 x (32 + 32) + 4 x (32 + 16)) = 896
  // parameters, 16 bytes each in the model group (weights, gradients, two
  // AdamW moments): 14336 bytes; its sampler copy 3584.
  OwnServer s{"remote-memory", cfg, [](ServeConfig& c) { c.limits.memory_bytes = 40000; }};
  ASSERT_TRUE(s.server);
  auto a_rt = s.attach("alice"), b_rt = s.attach("bob");
  auto a = OwnServer::model(*a_rt), b = OwnServer::model(*b_rt);
  auto bs = OwnServer::sampler(*b_rt);
  ASSERT_TRUE(a.add_adapter("one", kLora).get());
  ASSERT_TRUE(b.add_adapter("two", kLora).get());
  ASSERT_TRUE(bs.add_adapter("two", kLora).get());  // 14336 * 2 + 3584 = 32256 of 40000
  // A load into "one" of a rank-1 adapter that fails (no weights) leaves
  // "one" as it was, and charged as it was: had the charge shrunk to the
  // rank-1 size, "three" below would fit.
  auto tiny = s.dir + "/tiny";
  std::filesystem::create_directories(tiny);
  std::ofstream{tiny + "/adapter_config.json"} << R"({"r": 1, "lora_alpha": 1, "target_modules": ["q_proj"]})";
  EXPECT_FALSE(a.with_adapter("one").load({.dir = tiny}).get());
  auto over = a.add_adapter("three", kLora).get();
  ASSERT_FALSE(over);
  EXPECT_EQ(code_of(over.error()), errc::resource_exhausted);
  EXPECT_TRUE(contains(describe(over.error()), "limit memory_mib")) << describe(over.error());
  auto big = a.add_adapter("big", {.r = 16, .alpha = 16, .target_modules = {"all-linear"}}).get();
  ASSERT_FALSE(big);
  EXPECT_EQ(code_of(big.error()), errc::resource_exhausted);
  ASSERT_TRUE(b.remove_adapter("two").get());
  EXPECT_TRUE(a.add_adapter("three", kLora).get()) << "removing an adapter makes room";
  // A load sent right after a removal of the same adapter cannot bring it
  // back behind the server's books: the name is gone when the removal is.
  auto saved = s.dir + "/three";
  ASSERT_TRUE(a.with_adapter("three").save({.dir = saved}).get());
  auto removed = a.remove_adapter("three");
  auto revived = a.with_adapter("three").load({.dir = saved});
  EXPECT_TRUE(removed.get());
  auto r = revived.get();
  ASSERT_FALSE(r);
  EXPECT_EQ(code_of(r.error()), errc::not_found);
}

// A weight sync sent right behind a step that still waits for its turn at
// the model group syncs the weights after that step, as it would locally:
// a tenant's calls keep their order.
TEST(RemoteOrder, ASyncSentBehindAStepSyncsTheSteppedWeights) {
  auto cfg = components::ModelConfig::make(components::Architecture::qwen3, 300, 32, 64, 2, 4, 2);
  OwnServer s{"remote-order", cfg, [](ServeConfig&) {}};
  ASSERT_TRUE(s.server);
  auto rt = s.attach("alice");
  auto m = OwnServer::model(*rt);
  auto sm = OwnServer::sampler(*rt);
  ASSERT_TRUE(m.add_adapter("rl", kLora, 3).get());
  auto added = sm.add_adapter("rl", kLora).get();
  ASSERT_TRUE(added) << describe(added.error());
  auto a = m.with_adapter("rl");
  auto as = sm.with_adapter("rl");
  ASSERT_TRUE(a.set_optimizer({.lr = 0.5}).get());
  const components::SamplingParams greedy{.max_tokens = 6, .temperature = 0, .ignore_eos = true, .logprobs = 1};
  auto chosen = [&] {
    auto seqs = as.sample({{5, 6, 7, 8}}, greedy).get();
    EXPECT_TRUE(seqs) << describe(seqs.error());
    return seqs ? (*seqs)[0].logprobs.chosen : std::vector<float>{};
  };
  // Not waiting: the step queues behind the forward_backward, the sync
  // behind the step.
  auto fb = a.forward_backward(rows_of(8, 32));
  auto step = a.clip_grad_and_step();
  auto synced = actors::CheckpointEngine{a, as}.sync_weights();
  ASSERT_TRUE(synced) << describe(synced.error());
  ASSERT_TRUE(fb.get());
  ASSERT_TRUE(step.get());
  auto first = chosen();
  ASSERT_TRUE((actors::CheckpointEngine{a, as}.sync_weights()));  // nothing queued now
  EXPECT_EQ(first, chosen()) << "the first sync sent the weights from before the step";
}

// Each weight sync runs on a thread of the server's; one finished is joined
// when the next starts. A thread never joined keeps its stack's mappings
// and thread-local blocks: the soak's RSS grew 0.12 MiB per sync until the
// server stopped (and its mappings would reach vm.max_map_count). 40 syncs
// here add a bounded number of mappings, not two per sync.
size_t mappings() {
  std::ifstream maps{"/proc/self/maps"};
  size_t n = 0;
  for (std::string line; std::getline(maps, line);) ++n;
  return n;
}

TEST(RemoteOrder, FinishedSyncThreadsAreJoined) {
  auto cfg = components::ModelConfig::make(components::Architecture::qwen3, 300, 32, 64, 2, 4, 2);
  OwnServer s{"remote-sync-threads", cfg, [](ServeConfig&) {}};
  ASSERT_TRUE(s.server);
  auto rt = s.attach("alice");
  auto m = OwnServer::model(*rt);
  auto sm = OwnServer::sampler(*rt);
  ASSERT_TRUE(m.add_adapter("rl", kLora, 3).get());
  ASSERT_TRUE(sm.add_adapter("rl", kLora).get());
  actors::CheckpointEngine engine{m.with_adapter("rl"), sm.with_adapter("rl")};
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(engine.sync_weights());
  const auto before = mappings();
  for (int i = 0; i < 40; ++i) ASSERT_TRUE(engine.sync_weights());
  const auto after = mappings();
  EXPECT_LT(after, before + 20) << before << " mappings before 40 syncs, " << after << " after";
}

// A name crosses the wire whole: "a\0b" went out as "a" (KJ's conversion
// from std::string stops at a NUL), so the server made an adapter of
// another name than the caller's. Now the server sees it and refuses it,
// and the refusal comes back with the NUL in it.
TEST(RemoteOrder, ANameWithANulIsRefusedNotCutShort) {
  auto cfg = components::ModelConfig::make(components::Architecture::qwen3, 300, 32, 64, 2, 4, 2);
  OwnServer s{"remote-nul-name", cfg, [](ServeConfig&) {}};
  ASSERT_TRUE(s.server);
  auto rt = s.attach("alice");
  auto m = OwnServer::model(*rt);
  const std::string nul{"a\0b", 3};
  auto added = m.add_adapter(nul, kLora, 3).get();
  ASSERT_FALSE(added) << "an adapter was made of a name the caller did not give";
  EXPECT_EQ(code_of(added.error()), errc::invalid_argument);
  EXPECT_NE(describe(added.error()).find(nul), std::string::npos) << describe(added.error());
  auto a = m.add_adapter("a", kLora, 3).get();
  EXPECT_TRUE(a) << "'a' is free: " << (a ? "" : describe(a.error()));
}

// Runs `fn` on a thread of its own and says whether it returned within
// `limit`; a call that hangs is left behind (the test fails instead of
// hanging until ctest's timeout).
bool returns_within(std::chrono::seconds limit, std::function<void()> fn) {
  struct Done {
    std::mutex mx;
    std::condition_variable cv;
    bool done = false;
  };
  auto d = std::make_shared<Done>();
  std::thread([d, fn = std::move(fn)] {
    fn();
    std::lock_guard<std::mutex> guard{d->mx};
    d->done = true;
    d->cv.notify_all();
  }).detach();
  std::unique_lock<std::mutex> lock{d->mx};
  return d->cv.wait_for(lock, limit, [&] { return d->done; });
}

// When the server goes, every call fails with `unavailable` and returns:
// the calls in flight as the connection ends, and those made long after
// (KJ 0.9's executeSync never returned once the client's I/O loop had
// exited; a driver calling after its server died hung for good).
TEST(RemoteLost, CallsDuringAndAfterTheServersEndFailAndReturn) {
  auto cfg = components::ModelConfig::make(components::Architecture::qwen3, 300, 16, 32, 1, 4, 2);
  OwnServer s{"remote-lost", cfg, [](ServeConfig&) {}};
  ASSERT_TRUE(s.server);
  auto rt = s.attach("alice");
  ASSERT_TRUE(rt);
  auto m = OwnServer::model(*rt);
  ASSERT_TRUE(m.add_adapter("a", kLora, 1).get());
  auto a = m.with_adapter("a");
  ASSERT_TRUE(a.forward_only(rows_of(1, 4)).get());
  // Three threads call without pause while the server shuts down.
  auto unavailable = std::make_shared<std::atomic<int>>(0);
  auto hammer = [a, unavailable]() mutable {
    for (;;) {
      auto r = a.forward_only(rows_of(1, 4)).get();
      if (!r) {
        if (code_of(r.error()) == errc::unavailable) ++*unavailable;
        return;
      }
    }
  };
  std::vector<std::future<bool>> callers;
  for (int t = 0; t < 3; ++t)
    callers.push_back(std::async(std::launch::async, [hammer] { return returns_within(std::chrono::seconds(30), hammer); }));
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  s.server.reset();  // its connections close with it
  for (auto& c : callers) ASSERT_TRUE(c.get()) << "a call in flight when the server stopped never returned";
  EXPECT_EQ(unavailable->load(), 3) << "every caller ends on `unavailable`";
  // Long after the connection ended: the I/O thread is gone.
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  auto later = std::make_shared<Result<Tensor>>(make_error(errc::internal, "not called"));
  ASSERT_TRUE(returns_within(std::chrono::seconds(30), [a, later]() mutable { *later = a.forward_only(rows_of(1, 4)).get(); }))
      << "a call made after the connection ended never returned";
  ASSERT_FALSE(*later);
  EXPECT_EQ(code_of(later->error()), errc::unavailable) << describe(later->error());
}

// The last handle on a connection may go on the connection's own I/O
// thread: a future's continuation that holds a group, run there by the
// answer, after the driver dropped everything else. The connection must
// outlive that thread's loop (it used to be freed under it: a use after
// free, for ASan to see in scripts/sanitize.sh). Ten rounds, each with a
// call slow enough that the runtime lets go of the connection first.
TEST(RemoteLost, TheLastHandleGoingOnTheConnectionsOwnThreadIsSafe) {
  auto cfg = components::ModelConfig::make(components::Architecture::qwen3, 300, 32, 64, 2, 4, 2);
  OwnServer s{"remote-last-handle", cfg, [](ServeConfig&) {}};
  ASSERT_TRUE(s.server);
  for (int round = 0; round < 10; ++round) {
    auto rt = s.attach("alice");
    ASSERT_TRUE(rt);
    Future<int> done;
    {
      auto m = OwnServer::model(*rt);
      // The tenant's adapter outlives each connection (until idle_seconds).
      auto added = m.add_adapter("a", kLora, 1).get();
      ASSERT_TRUE(added || round > 0) << describe(added.error());
      auto a = m.with_adapter("a");
      done = a.forward_only(rows_of(32, 256)).then([a](const Result<Tensor>& r) -> Result<int> {
        return r ? 1 : 0;  // `a` goes with this continuation, on the thread that ran it
      });
    }
    rt->shutdown();
    rt.reset();
    ASSERT_TRUE(returns_within(std::chrono::seconds(30), [done] { done.wait(); })) << "round " << round;
    auto got = done.get();
    ASSERT_TRUE(got) << "round " << round;
    EXPECT_EQ(*got, 1) << "round " << round << ": the call itself was answered";
  }
  // The server is fine, and so is a new connection.
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  auto rt = s.attach("alice");
  ASSERT_TRUE(rt);
  EXPECT_TRUE(OwnServer::model(*rt).forward_only(rows_of(1, 4)).get());
}

// A message larger than the server reads would end the whole connection
// (Cap'n Proto's traversal limit): the client refuses it before sending,
// naming the limit, and the session goes on.
TEST(RemoteMessages, ACallOverTheServersMessageLimitIsRefusedAndTheSessionLives) {
  auto cfg = components::ModelConfig::make(components::Architecture::qwen3, 300, 16, 32, 1, 4, 2);
  cfg.max_position_embeddings = 4096;
  OwnServer s{"remote-messages", cfg, [](ServeConfig& c) { c.max_message_bytes = 1 << 20; }};
  ASSERT_TRUE(s.server);
  auto rt = s.attach("alice");
  auto m = OwnServer::model(*rt);
  ASSERT_TRUE(m.add_adapter("a", kLora).get());
  auto big = m.with_adapter("a").forward_backward(rows_of(64, 4096)).get();  // 2 MiB of token ids
  ASSERT_FALSE(big);
  EXPECT_EQ(code_of(big.error()), errc::invalid_argument);
  EXPECT_TRUE(contains(describe(big.error()), "message_mib")) << describe(big.error());
  auto next = m.with_adapter("a").forward_only(batch()).get();
  EXPECT_TRUE(next) << "the connection lives on: " << describe(next.error());
}

/// Whether the peer closes `fd` within `ms` (it sends nothing first).
bool closed_within(int fd, int ms) {
  pollfd p{.fd = fd, .events = POLLIN, .revents = 0};
  if (::poll(&p, 1, ms) <= 0) return false;
  char byte;
  return ::recv(fd, &byte, 1, 0) <= 0;
}

// Unauthenticated peers cannot hold the server: past [limits] connections
// a new connection is closed at once, and one that presents no valid key
// within auth_seconds is closed then; an authenticated one stays.
TEST(RemoteConnections, ThereAreAtMostLimitConnectionsAndSilentOnesAreClosed) {
  auto cfg = components::ModelConfig::make(components::Architecture::qwen3, 300, 16, 32, 1, 4, 2);
  OwnServer s{"remote-connections", cfg, [](ServeConfig& c) {
                c.limits.connections = 2;
                c.limits.auth_seconds = 1;
              }};
  ASSERT_TRUE(s.server);
  const int port = s.server->port();
  int silent = tcp_connect(port);
  ASSERT_GE(silent, 0);
  EXPECT_FALSE(closed_within(silent, 300)) << "a new connection has auth_seconds to authenticate";
  testing::RawSession alice{port, s.keys.at("alice")};
  ASSERT_EQ(alice.status(), 0) << alice.message();
  int third = tcp_connect(port);
  ASSERT_GE(third, 0);
  EXPECT_TRUE(closed_within(third, 500)) << "a third connection is closed at once";
  ::close(third);
  EXPECT_TRUE(closed_within(silent, 3000)) << "a connection without a key is closed after auth_seconds";
  ::close(silent);
  std::this_thread::sleep_for(std::chrono::milliseconds(1200));  // past auth_seconds for Alice too
  auto beat = alice.session().heartbeatRequest().send().wait(alice.wait_scope());
  EXPECT_EQ(beat.getStatus().getCode(), 0) << "the authenticated session stays";
  EXPECT_TRUE(s.attach("bob")) << "the closed ones made room";
}

// One tenant cannot take every connection: past connections_per_tenant its
// next is refused naming the limit, and other tenants still connect.
TEST(RemoteConnections, ATenantHasAtMostItsShareOfConnections) {
  auto cfg = components::ModelConfig::make(components::Architecture::qwen3, 300, 16, 32, 1, 4, 2);
  OwnServer s{"remote-tenant-connections", cfg, [](ServeConfig& c) { c.limits.connections_per_tenant = 1; }};
  ASSERT_TRUE(s.server);
  auto first = s.attach("alice");
  ASSERT_TRUE(first);
  Options o;
  o.mode = Mode::remote;
  o.remote_endpoint = "127.0.0.1:" + std::to_string(s.server->port());
  o.remote_api_key = s.keys.at("alice");
  auto second = initialize(o);
  ASSERT_FALSE(second);
  EXPECT_EQ(code_of(second.error()), errc::resource_exhausted);
  EXPECT_TRUE(contains(describe(second.error()), "connections_per_tenant")) << describe(second.error());
  EXPECT_TRUE(s.attach("bob"));
}

// Issue 13: full-parameter training as an exclusive mode. A tenant trains
// the base itself only while no other tenant uses the server; meanwhile the
// others are refused (unavailable) and never see its weights; when it
// disconnects the base is restored, bit for bit, in the model and sampler
// groups.
TEST(RemoteExclusive, OneTenantTrainsTheFullModelAloneAndTheBaseIsRestoredAfter) {
  auto cfg = components::ModelConfig::make(components::Architecture::qwen3, 300, 32, 64, 2, 4, 2);
  OwnServer s{"remote-exclusive", cfg, [](ServeConfig& c) { c.exclusive_full_training = true; }};
  ASSERT_TRUE(s.server);
  auto b_rt = s.attach("bob");
  auto b = OwnServer::model(*b_rt);
  auto bs = OwnServer::sampler(*b_rt);
  const components::SamplingParams greedy{.max_tokens = 6, .temperature = 0, .ignore_eos = true};
  auto base_logps = values_of(*b.forward_only(batch()).get());
  auto base_tokens = (*bs.sample({{5, 6, 7, 8}}, greedy).get())[0].tokens;
  ASSERT_FALSE(base_logps.empty());

  auto a_rt = s.attach("alice");
  auto a = OwnServer::model(*a_rt);
  auto as = OwnServer::sampler(*a_rt);
  // Not while Bob has an adapter.
  ASSERT_TRUE(b.add_adapter("mine", kLora).get());
  auto busy = a.set_optimizer({.lr = 1e-2}).get();
  ASSERT_FALSE(busy);
  EXPECT_EQ(code_of(busy.error()), errc::unavailable) << describe(busy.error());
  ASSERT_TRUE(b.remove_adapter("mine").get());

  // Alice trains the whole model, syncs it to the sampler, saves and loads it.
  ASSERT_TRUE(a.set_optimizer({.lr = 1e-2}).get());
  for (int i = 0; i < 3; ++i) {
    auto fb = a.forward_backward(batch(i)).get();
    ASSERT_TRUE(fb) << describe(fb.error());
    ASSERT_TRUE(a.clip_grad_and_step().get());
  }
  auto trained = values_of(*a.forward_only(batch()).get());
  EXPECT_NE(trained, base_logps);
  auto report = actors::CheckpointEngine{a, as}.sync_weights();
  ASSERT_TRUE(report) << describe(report.error());
  auto saved_dir = s.dir + "/alice-full";
  auto saved = a.save({.dir = saved_dir, .with_optimizer = true}).get();
  ASSERT_TRUE(saved) << describe(saved.error());
  EXPECT_TRUE(std::filesystem::exists(saved_dir + "/config.json"));
  EXPECT_TRUE(std::filesystem::exists(saved_dir + "/optimizer.safetensors"));
  ASSERT_TRUE(a.load({.dir = saved_dir, .with_optimizer = true}).get());
  EXPECT_EQ(values_of(*a.forward_only(batch()).get()), trained);
  EXPECT_FALSE(a.add_adapter("lora", kLora).get()) << "adapters wait until the full training ends";

  // Bob is refused meanwhile, and says so.
  auto refused = b.forward_only(batch()).get();
  ASSERT_FALSE(refused);
  EXPECT_EQ(code_of(refused.error()), errc::unavailable);
  EXPECT_TRUE(contains(describe(refused.error()), "another tenant is training the full model")) << describe(refused.error());
  EXPECT_EQ(code_of(bs.sample({{5, 6, 7, 8}}, greedy).get().error()), errc::unavailable);

  // Alice leaves (her groups hold her connection): the base comes back,
  // bit for bit, in both groups.
  a = ModelGroup{nullptr};
  as = SamplerGroup{nullptr};
  a_rt.reset();
  Result<Tensor> after = make_error(errc::unavailable, "not yet");
  for (int i = 0; i < 200 && !after; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    after = b.forward_only(batch()).get();
  }
  ASSERT_TRUE(after) << describe(after.error());
  EXPECT_EQ(values_of(*after), base_logps);
  auto sampled = bs.sample({{5, 6, 7, 8}}, greedy).get();
  ASSERT_TRUE(sampled) << describe(sampled.error());
  EXPECT_EQ((*sampled)[0].tokens, base_tokens);
  // And Bob may now train the full model himself.
  EXPECT_TRUE(b.set_optimizer({.lr = 1e-3}).get());
}

// Without exclusive mode the base is never trained, and the refusal says
// how an operator can allow it.
TEST_F(RemoteTest, FullParameterTrainingOnASharedServerIsRefusedSayingWhy) {
  auto rt = attached("alice");
  ASSERT_TRUE(rt);
  auto m = model_of(*rt);
  for (auto r : {m.set_optimizer({.lr = 1e-2}).get(), m.load({.dir = model_dir()}).get()}) {
    ASSERT_FALSE(r);
    EXPECT_EQ(code_of(r.error()), errc::permission_denied);
    EXPECT_TRUE(contains(describe(r.error()), "full_training = \"exclusive\"")) << describe(r.error());
  }
}

}  // namespace
}  // namespace glint::rpc
