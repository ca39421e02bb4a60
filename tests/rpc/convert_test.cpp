// The wire codec (rpc/convert.hpp), the key store (rpc/keys.hpp) and the
// server's config (rpc/serve_config.hpp): values survive the wire exactly,
// malformed ones are refused naming the field, and keys are only ever
// stored as salted hashes.
#include "rpc/convert.hpp"
#include "rpc/keys.hpp"
#include "rpc/detail/scrub.hpp"
#include "rpc/serve_config.hpp"
#include "support/temp_dir.hpp"

#include <capnp/message.h>
#include <capnp/serialize.h>
#include <gtest/gtest.h>

#include <filesystem>

namespace glint::rpc {
namespace {

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

TEST(WireCodec, TensorsRoundTripAndAlignedOnesAreNotCopied) {
  capnp::MallocMessageBuilder msg;
  auto b = msg.initRoot<wire::Batch>();
  Batch batch;
  batch.tensors["input_ids"] = *Tensor::from_values(std::vector<int64_t>{1, 2, 3, 4, 5, 6}, {2, 3});
  batch.tensors["advantages"] = *Tensor::from_values(std::vector<float>{0.5f, -1.5f}, {2});
  batch.tensors["odd"] = *Tensor::from_values(std::vector<uint8_t>{1, 2, 3, 4, 5, 6}, {2, 3});  // 6 bytes: copied
  batch.fields["prompt"] = {"a", "b"};
  KeepAlive keep;
  write_batch(b, batch, &keep);
  EXPECT_EQ(keep.size(), 2u) << "the two word-sized tensors are referenced, the 6-byte one copied";
  // The referenced bytes are the tensor's own: the message aliases them.
  auto ids = b.asReader().getTensors()[1].getTensor().getData();  // std::map order: advantages, input_ids, odd
  EXPECT_EQ(static_cast<const void*>(ids.begin()), static_cast<const void*>(batch.tensors["input_ids"].data()));
  // Through real bytes, as the network carries them.
  auto words = capnp::messageToFlatArray(msg);
  capnp::FlatArrayMessageReader reader(words.asPtr());
  auto back = read_batch(reader.getRoot<wire::Batch>());
  ASSERT_TRUE(back) << describe(back.error());
  EXPECT_EQ(*back, batch);
}

TEST(WireCodec, MalformedTensorsAndBatchesAreRefusedNamingTheField) {
  capnp::MallocMessageBuilder msg;
  auto b = msg.initRoot<wire::Batch>();
  auto ts = b.initTensors(2);
  ts[0].setName("input_ids");
  ts[0].initTensor().setDtype(3);
  ts[0].getTensor().initShape(2).set(0, 2);
  ts[0].getTensor().getShape().set(1, 2);
  ts[0].getTensor().initData(24);  // 4 elements need 32 bytes
  ts[1].setName("input_ids");
  auto bad = read_batch(b.asReader());
  ASSERT_FALSE(bad);
  EXPECT_EQ(code_of(bad.error()), errc::invalid_argument);
  EXPECT_TRUE(contains(describe(bad.error()), "input_ids")) << describe(bad.error());
  ts[0].getTensor().setDtype(200);
  EXPECT_FALSE(read_tensor(ts[0].getTensor().asReader(), "t"));
  ts[0].getTensor().setDtype(3);
  ts[0].getTensor().initData(32);
  ts[1].setTensor(ts[0].getTensor().asReader());
  auto twice = read_batch(b.asReader());
  ASSERT_FALSE(twice);
  EXPECT_TRUE(contains(describe(twice.error()), "given twice")) << describe(twice.error());
}

TEST(WireCodec, SettingsRoundTripAndInvalidOnesAreRefused) {
  capnp::MallocMessageBuilder msg;
  auto root = msg.initRoot<wire::SamplingParams>();
  components::SamplingParams p{.num_samples = 3, .max_tokens = 9, .temperature = 0.7, .top_k = 5, .top_p = 0.9,
                               .min_p = 0.1, .repetition_penalty = 1.2, .seed = 42, .stop_token_ids = {7},
                               .stop = {"\n\n"}, .include_stop_str_in_output = true, .ignore_eos = true,
                               .logprobs = 2, .prompt_logprobs = 0, .return_routes = true};
  write_sampling(root, p);
  auto back = read_sampling(root.asReader());
  ASSERT_TRUE(back) << describe(back.error());
  EXPECT_EQ(*back, p);
  root.setTopP(0);
  EXPECT_EQ(code_of(read_sampling(root.asReader()).error()), errc::invalid_argument);

  // A sequence's expert routes cross whole; ones that do not fit its tokens are refused.
  capnp::MallocMessageBuilder ms;
  auto seqs = ms.initRoot<wire::Session::SampleResults>();
  actors::SampledSequence seq{.index = 1, .tokens = {4, 5}, .weight_version = 2, .first_weight_version = 2,
                              .routes = {.layers = 2, .k = 2, .experts = {0, 1, 2, 3, 4, 5, 6, 7}}};
  write_sequences(seqs.initSequences(1), {seq});
  auto got = read_sequences(seqs.asReader().getSequences());
  ASSERT_TRUE(got) << describe(got.error());
  EXPECT_EQ(got->at(0), seq);
  seqs.getSequences()[0].getRoutes().setK(3);
  EXPECT_FALSE(read_sequences(seqs.asReader().getSequences()));

  capnp::MallocMessageBuilder m2;
  auto lora = m2.initRoot<wire::LoraConfig>();
  actors::LoraConfig l{.r = 6, .alpha = 12, .dropout = 0.1, .target_modules = {"q_proj"}, .rslora = true,
                       .rank_pattern = {{"v_proj", 2}}, .alpha_pattern = {{"v_proj", 4.0}},
                       .layers_to_transform = {0}, .exclude_modules = {"o_proj"}};
  write_lora(lora, l);
  auto lb = read_lora(lora.asReader());
  ASSERT_TRUE(lb) << describe(lb.error());
  EXPECT_EQ(lb->r, 6);
  EXPECT_EQ(lb->rank_pattern, l.rank_pattern);
  EXPECT_EQ(lb->alpha_pattern, l.alpha_pattern);
  EXPECT_EQ(lb->exclude_modules, l.exclude_modules);
  EXPECT_TRUE(lb->rslora);
  lora.setR(0);
  EXPECT_FALSE(read_lora(lora.asReader()));

  capnp::MallocMessageBuilder m3;
  auto opt = m3.initRoot<wire::OptimizerConfig>();
  write_optimizer(opt, {.kind = actors::OptimizerConfig::Kind::sgd, .lr = 0.5, .momentum = 0.9});
  EXPECT_EQ(read_optimizer(opt.asReader())->momentum, 0.9);
  opt.setKind(9);
  EXPECT_FALSE(read_optimizer(opt.asReader()));
}

// Strings cross the wire byte for byte, a NUL inside them too: KJ's
// conversion from std::string stops at the first NUL, so a stop string
// "a\0b" reached the other end as "a" (found by fuzz_capnp_request).
TEST(WireCodec, StringsWithANulCrossWhole) {
  const std::string nul{"a\0b", 3};
  capnp::MallocMessageBuilder msg;
  auto root = msg.initRoot<wire::SamplingParams>();
  components::SamplingParams p{.stop = {nul}};
  write_sampling(root, p);
  auto back = read_sampling(root.asReader());
  ASSERT_TRUE(back) << describe(back.error());
  EXPECT_EQ(back->stop, std::vector<std::string>{nul});

  capnp::MallocMessageBuilder m2;
  Batch b;
  b.tensors.emplace("input_ids", *Tensor::from_values(std::vector<int64_t>{1, 2}, {1, 2}));
  b.fields["prompt"] = {nul};
  write_batch(m2.initRoot<wire::Batch>(), b, nullptr);
  auto bb = read_batch(m2.getRoot<wire::Batch>().asReader());
  ASSERT_TRUE(bb) << describe(bb.error());
  EXPECT_EQ(bb->fields.at("prompt"), std::vector<std::string>{nul});

  capnp::MallocMessageBuilder m3;
  write_status(m3.initRoot<wire::Status>(), make_error(errc::invalid_argument, "stop " + nul));
  EXPECT_NE(describe(read_status(m3.getRoot<wire::Status>().asReader())).find(nul), std::string::npos);
}

TEST(WireCodec, FileNamesCannotLeaveTheirDirectory) {
  capnp::MallocMessageBuilder msg;
  auto files = msg.initRoot<wire::Session::LoadAdapterParams>().initFiles(1);
  for (const char* name : {"../x", "/etc/passwd", "a/b", "..", ""}) {
    files[0].setName(name);
    auto r = read_files(files.asReader());
    EXPECT_FALSE(r) << name;
  }
  files[0].setName("adapter_config.json");
  EXPECT_TRUE(read_files(files.asReader()));
  capnp::MallocMessageBuilder m2;
  auto name = m2.initRoot<wire::Session::AddAdapterParams>();
  for (const char* bad : {"", "../a", "a/b", "a b", "é"}) {
    name.setName(bad);
    EXPECT_FALSE(read_name(name.asReader().getName(), "adapter name")) << bad;
  }
  name.setName("policy-v2.1_a");
  EXPECT_TRUE(read_name(name.asReader().getName(), "adapter name"));
}

TEST(KeyStore, KeysAuthenticateTheirTenantUntilRevoked) {
  auto dir = glint::testing::fresh_dir("keys");
  auto a = KeyStore::create(dir, "alice");
  auto b = KeyStore::create(dir, "bob");
  ASSERT_TRUE(a && b);
  EXPECT_EQ(a->size(), key_length);
  EXPECT_TRUE(a->starts_with("tml-"));
  EXPECT_FALSE(KeyStore::create(dir, "not/a/name"));
  auto reader = KeyStore::open_reader(dir);
  ASSERT_TRUE(reader) << describe(reader.error());
  EXPECT_EQ(*(*reader)->authenticate(*a), "alice");
  EXPECT_EQ(*(*reader)->authenticate(*b), "bob");
  auto forged = *a;
  forged.back() = forged.back() == '0' ? '1' : '0';
  EXPECT_EQ(code_of((*reader)->authenticate(forged).error()), errc::permission_denied);
  ASSERT_TRUE(KeyStore::revoke(dir, *a));
  EXPECT_EQ(code_of((*reader)->authenticate(*a).error()), errc::permission_denied) << "revocation is seen at once";
  EXPECT_TRUE((*reader)->authenticate(*b));
  auto listed = KeyStore::list(dir);
  ASSERT_TRUE(listed);
  ASSERT_EQ(listed->size(), 2u);
  EXPECT_EQ((*listed)[0].tenant, "alice");
  EXPECT_TRUE((*listed)[0].revoked);
  EXPECT_FALSE((*listed)[1].revoked);
  EXPECT_EQ(code_of(KeyStore::revoke(dir, "0123456789abcdef").error()), errc::not_found);
}

TEST(ServeConfig, EveryKeyIsCheckedAndOnlyLoopbackMayGoWithoutTls) {
  auto c = ServeConfig::parse("model = \"m\"\n[listen]\nhost = \"0.0.0.0\"\nport = 9000\n[limits]\nmax_rank = 32\n", "s.toml");
  ASSERT_TRUE(c) << describe(c.error());
  EXPECT_EQ(c->port, 9000);
  EXPECT_EQ(c->limits.max_rank, 32);
  auto typo = ServeConfig::parse("model = \"m\"\n[limits]\nmax_rnak = 32\n", "s.toml");
  ASSERT_FALSE(typo);
  EXPECT_TRUE(contains(describe(typo.error()), "limits.max_rnak")) << describe(typo.error());
  EXPECT_FALSE(c->exclusive_full_training) << "full-parameter training is refused unless asked for";
  EXPECT_EQ(c->limits.memory_bytes, int64_t{8} << 30);
  auto exclusive = ServeConfig::parse("model = \"m\"\nfull_training = \"exclusive\"\n[limits]\nmemory_mib = 512\n", "s.toml");
  ASSERT_TRUE(exclusive) << describe(exclusive.error());
  EXPECT_TRUE(exclusive->exclusive_full_training);
  EXPECT_EQ(exclusive->limits.memory_bytes, int64_t{512} << 20);
  auto shared = ServeConfig::parse("full_training = \"shared\"\n", "s.toml");
  ASSERT_FALSE(shared);
  EXPECT_TRUE(contains(describe(shared.error()), "full_training must be")) << describe(shared.error());
  auto wrong_type = ServeConfig::parse("[listen]\nport = \"80\"\n", "s.toml");
  ASSERT_FALSE(wrong_type);
  EXPECT_TRUE(contains(describe(wrong_type.error()), "listen.port")) << describe(wrong_type.error());
  auto dir = glint::testing::fresh_dir("serve-config");
  std::ofstream{dir + "/config.json"} << "{}";
  c->model_dir = dir;
  auto open = c->validate();
  ASSERT_FALSE(open);
  EXPECT_EQ(code_of(open.error()), errc::permission_denied);
  EXPECT_TRUE(contains(describe(open.error()), "--insecure")) << describe(open.error());
  c->insecure = true;
  EXPECT_TRUE(c->validate());
  c->insecure = false;
  c->tls_cert = "cert.pem";
  EXPECT_FALSE(c->validate()) << "a certificate without its key";
  c->tls_key = "key.pem";
  EXPECT_TRUE(c->validate());
}

TEST(ServeConfig, TheTinkerSectionIsReadAndCheckedLikeTheRest) {
  auto off = ServeConfig::parse("model = \"m\"\n", "s.toml");
  ASSERT_TRUE(off);
  EXPECT_EQ(off->tinker_port, -1) << "the Tinker API is off unless asked for";
  auto c = ServeConfig::parse("model = \"m\"\n[tinker]\nport = 7734\nbase_model = \"Qwen/Qwen3-0.6B\"\n"
                              "poll_seconds = 5\nseq_gap_seconds = 30\nmax_samples_in_flight = 3\n",
                              "s.toml");
  ASSERT_TRUE(c) << describe(c.error());
  EXPECT_EQ(c->tinker_port, 7734);
  EXPECT_EQ(c->tinker_base_model, "Qwen/Qwen3-0.6B");
  EXPECT_EQ(c->tinker_poll_seconds, 5);
  EXPECT_EQ(c->tinker_seq_gap_seconds, 30);
  EXPECT_EQ(c->tinker_samples_in_flight, 3);
  for (const char* bad : {"[tinker]\nprot = 1\n", "[tinker]\npoll_seconds = 45\n", "[tinker]\nport = \"x\"\n"}) {
    auto r = ServeConfig::parse(std::string{"model = \"m\"\n"} + bad, "s.toml");
    ASSERT_FALSE(r) << bad;
    EXPECT_TRUE(contains(describe(r.error()), "tinker.")) << describe(r.error());
  }
  // Keys cross the network in the Tinker API's headers: loopback, TLS or --insecure.
  auto dir = glint::testing::fresh_dir("serve-config-tinker");
  std::ofstream{dir + "/config.json"} << "{}";
  auto open = ServeConfig::parse("model = \"" + dir + "\"\n[tinker]\nhost = \"0.0.0.0\"\n", "s.toml");
  ASSERT_TRUE(open);
  auto v = open->validate();
  ASSERT_FALSE(v);
  EXPECT_TRUE(contains(describe(v.error()), "[tinker]")) << describe(v.error());
}

// A trainer's failure named the host, pid and layout of the server's job.
TEST(TenantErrors, ProcessLabelsAndTheHostNameAreTakenOut) {
  const auto text = detail::without_process_labels(
      "unavailable: node 1 (gpu-box-7, pid 4242) was lost (its process exited); rank 0 on gpu-box-7 waits", "gpu-box-7");
  EXPECT_EQ(text, "unavailable: a server process was lost (its process exited); rank 0 on <host> waits");
  EXPECT_EQ(detail::without_process_labels("a sample of vmware text", "vm"), "a sample of vmware text")
      << "a host name too short to be told from words is left";
}

TEST(ServeConfig, ConnectionAndRequestLimitsAreReadAndMetricsOffLoopbackNeedAToken) {
  auto c = ServeConfig::parse("model = \"m\"\n[tinker]\nport = 0\nconnections = 32\nbody_seconds = 5\n"
                              "[limits]\nrequest_mib = 300\n[metrics]\nport = 0\ntoken_file = \"t\"\n",
                              "s.toml");
  ASSERT_TRUE(c) << describe(c.error());
  EXPECT_EQ(c->tinker_connections, 32);
  EXPECT_EQ(c->tinker_body_seconds, 5);
  EXPECT_EQ(c->limits.request_bytes, int64_t{300} << 20);
  EXPECT_EQ(c->metrics_token_file, "t");
  auto defaults = ServeConfig::parse("model = \"m\"\n", "s.toml");
  ASSERT_TRUE(defaults);
  EXPECT_EQ(defaults->tinker_connections, 256);
  EXPECT_EQ(defaults->tinker_body_seconds, 60);
  EXPECT_EQ(defaults->limits.request_bytes, int64_t{512} << 20);
  for (const char* bad : {"[tinker]\nconnections = 0\n", "[tinker]\nbody_seconds = \"x\"\n", "[limits]\nrequest_mib = 0\n",
                          "[metrics]\ntoken = \"x\"\n"}) {
    auto r = ServeConfig::parse(std::string{"model = \"m\"\n"} + bad, "s.toml");
    EXPECT_FALSE(r) << bad;
  }
  auto dir = glint::testing::fresh_dir("serve-config-limits");
  std::ofstream{dir + "/config.json"} << "{}";
  // Per-tenant request memory below one message could never carry one.
  auto small = ServeConfig::parse("model = \"" + dir + "\"\n[limits]\nmessage_mib = 64\nrequest_mib = 32\n", "s.toml");
  ASSERT_TRUE(small);
  auto v = small->validate();
  ASSERT_FALSE(v);
  EXPECT_TRUE(contains(describe(v.error()), "request_mib")) << describe(v.error());
  // Metrics name every tenant: off loopback only with a token.
  auto open = ServeConfig::parse("model = \"" + dir + "\"\n[metrics]\nhost = \"0.0.0.0\"\nport = 0\n", "s.toml");
  ASSERT_TRUE(open);
  v = open->validate();
  ASSERT_FALSE(v);
  EXPECT_EQ(code_of(v.error()), errc::permission_denied);
  EXPECT_TRUE(contains(describe(v.error()), "token_file")) << describe(v.error());
  open->metrics_token_file = "t";
  EXPECT_TRUE(open->validate());
}

}  // namespace
}  // namespace glint::rpc
