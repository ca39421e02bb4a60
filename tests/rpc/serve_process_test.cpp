// `glint serve` as its own process: a tenant's server-side checkpoints
// survive the server being killed with SIGKILL (saved ones list and load
// exactly, a deleted one stays deleted), and SIGTERM ends it cleanly,
// saving the adapters it holds as their tenants' checkpoints.
#include "actors/model_group.hpp"
#include "components/model/model.hpp"
#include "rpc/client.hpp"
#include "rpc/keys.hpp"
#include "runtime/process.hpp"
#include "support/temp_dir.hpp"

#include <gtest/gtest.h>

#include <csignal>
#include <fstream>
#include <thread>

namespace glint::rpc {
namespace {

using placement::DeviceGroup;
using placement::DeviceMesh;

Batch batch() {
  Batch b;
  b.tensors["input_ids"] = *Tensor::from_values(std::vector<int64_t>{5, 6, 7, 8, 9, 10, 11, 12}, {2, 4});
  return b;
}

// Attaches to the server on `port`, retrying while it starts (up to 60 s).
std::unique_ptr<Runtime> attach(uint16_t port, const std::string& key) {
  Options o;
  o.mode = Mode::remote;
  o.remote_endpoint = "127.0.0.1:" + std::to_string(port);
  o.remote_api_key = key;
  for (int i = 0; i < 600; ++i) {
    auto rt = initialize(o);
    if (rt) return std::move(*rt);
    if (code_of(rt.error()) != errc::unavailable) {
      ADD_FAILURE() << describe(rt.error());
      return nullptr;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ADD_FAILURE() << "the server did not come up within 60 s";
  return nullptr;
}

TEST(ServeProcess, CheckpointsSurviveSigkillAndSigtermStopsCleanly) {
  auto dir = glint::testing::fresh_dir("serve-process");
  auto cfg = components::ModelConfig::make(components::Architecture::qwen3, 300, 16, 32, 1, 4, 2);
  auto lm = components::CausalLM::init_random(cfg, 5);
  ASSERT_TRUE(lm && lm->save(dir + "/base"));
  std::ofstream{dir + "/serve.toml"} << "model = \"base\"\nstate_dir = \"state\"\n";
  auto key = KeyStore::create(dir + "/state", "alice");
  ASSERT_TRUE(key);
  auto port = pick_free_port();
  ASSERT_TRUE(port);
  const std::vector<std::string> serve = {GLINT_BINARY, "serve", "--config", dir + "/serve.toml", "--port",
                                          std::to_string(*port)};
  auto mesh = *DeviceMesh::from_sizes({.dp = 1});
  std::vector<float> trained;
  {
    auto server = ChildProcess::start(serve);
    ASSERT_TRUE(server) << describe(server.error());
    auto rt = attach(*port, *key);
    ASSERT_TRUE(rt);
    auto m = actors::open_model_group(*rt, DeviceGroup::of("m", 1), mesh, {});
    ASSERT_TRUE(m);
    ASSERT_TRUE(m->add_adapter("policy", {.r = 4, .alpha = 8}, 2).get());
    auto a = m->with_adapter("policy");
    ASSERT_TRUE(a.set_optimizer({.lr = 1e-2}).get());
    ASSERT_TRUE(a.forward_backward(batch()).get());
    ASSERT_TRUE(a.clip_grad_and_step().get());
    auto lp = a.forward_only(batch()).get();
    ASSERT_TRUE(lp);
    auto v = lp->values<float>();
    ASSERT_TRUE(v);
    trained.assign(v->begin(), v->end());
    auto ckpts = ServerCheckpoints::of(*rt);
    ASSERT_TRUE(ckpts);
    ASSERT_TRUE(ckpts->save(a, "kept", true));
    ASSERT_TRUE(ckpts->save(a, "dropped"));
    ASSERT_TRUE(ckpts->remove("dropped"));
    server->signal(SIGKILL);
    EXPECT_EQ(server->wait(), 128 + SIGKILL);
    // The driver's calls now fail, and do not hang.
    auto after = a.forward_only(batch()).get();
    ASSERT_FALSE(after);
    EXPECT_EQ(code_of(after.error()), errc::unavailable) << describe(after.error());
  }
  auto server = ChildProcess::start(serve);
  ASSERT_TRUE(server) << describe(server.error());
  auto stop = [&] {
    server->signal(SIGTERM);
    auto code = server->wait_for(std::chrono::seconds(60));
    ASSERT_TRUE(code) << "glint serve did not stop within 60 s of SIGTERM";
    EXPECT_EQ(*code, 0);
  };
  auto values_of = [](const Result<Tensor>& t) {
    if (!t) return std::vector<float>{};
    auto v = t->values<float>();
    return v ? std::vector<float>(v->begin(), v->end()) : std::vector<float>{};
  };
  std::vector<float> last;
  {
    auto rt = attach(*port, *key);
    ASSERT_TRUE(rt);
    auto ckpts = ServerCheckpoints::of(*rt);
    ASSERT_TRUE(ckpts);
    auto listed = ckpts->list();
    ASSERT_TRUE(listed) << describe(listed.error());
    ASSERT_EQ(listed->size(), 1u);
    EXPECT_EQ((*listed)[0].name, "kept");
    auto m = actors::open_model_group(*rt, DeviceGroup::of("m", 1), mesh, {});
    ASSERT_TRUE(m);
    ASSERT_TRUE(ckpts->load("kept", m->with_adapter("back"), /*create=*/true, /*with_optimizer=*/true));
    auto b = m->with_adapter("back");
    EXPECT_EQ(values_of(b.forward_only(batch()).get()), trained);
    // One more step: the adapter now differs from every checkpoint.
    ASSERT_TRUE(b.forward_backward(batch()).get());
    ASSERT_TRUE(b.clip_grad_and_step().get());
    last = values_of(b.forward_only(batch()).get());
    ASSERT_FALSE(last.empty());
    ASSERT_NE(last, trained);
  }
  stop();
  // SIGTERM saved the adapter as it was, with its optimizer state.
  server = ChildProcess::start(serve);
  ASSERT_TRUE(server) << describe(server.error());
  {
    auto rt = attach(*port, *key);
    ASSERT_TRUE(rt);
    auto ckpts = ServerCheckpoints::of(*rt);
    ASSERT_TRUE(ckpts);
    auto listed = ckpts->list();
    ASSERT_TRUE(listed) << describe(listed.error());
    ASSERT_EQ(listed->size(), 2u);
    EXPECT_EQ((*listed)[1].name, "autosave-back");
    EXPECT_TRUE((*listed)[1].with_optimizer);
    auto m = actors::open_model_group(*rt, DeviceGroup::of("m", 1), mesh, {});
    ASSERT_TRUE(m);
    ASSERT_TRUE(ckpts->load("autosave-back", m->with_adapter("again"), /*create=*/true, /*with_optimizer=*/true));
    EXPECT_EQ(values_of(m->with_adapter("again").forward_only(batch()).get()), last);
  }
  stop();
}

}  // namespace
}  // namespace glint::rpc
