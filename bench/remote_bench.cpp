// glint bench remote: see remote_bench.hpp.
#include "bench/remote_bench.hpp"
#include "bench/measure.hpp"
#include "bench/tinker_client.hpp"

#include "actors/model_group.hpp"
#include "actors/sampler_group.hpp"
#include "components/data/bpe_trainer.hpp"
#include "components/data/dataset.hpp"
#include "components/data/synthetic.hpp"
#include "components/model/model.hpp"
#include "placement/service.hpp"
#include "rpc/keys.hpp"
#include "rpc/server.hpp"
#include "runtime/runtime.hpp"

#include "tinker_public.pb.h"

#include <httplib.h>
#include <nlohmann/json.hpp>

#include <atomic>
#include <optional>
#include <cstdio>
#include <filesystem>
#include <thread>
#include <unistd.h>

namespace glint::bench {

namespace {

constexpr const char* kName = "glint bench remote";
using actors::ModelGroup;
using actors::SamplerGroup;
using placement::DeviceGroup;
using placement::DeviceMesh;

int fail(const std::string& what, const caf::error& e) {
  std::fprintf(stderr, "%s: %s: %s\n", kName, what.c_str(), describe(e).c_str());
  return 1;
}

const actors::LoraConfig kLora{.r = 8, .alpha = 16, .target_modules = {"all-linear"}};

// A sample call of 4 prompts, 32 tokens each; answers the tokens it made.
Result<int64_t> sample4(const SamplerGroup& sampler, int step) {
  std::vector<std::vector<int64_t>> prompts;
  for (int p = 0; p < 4; ++p) prompts.push_back({3 + p, 5 + step % 7, 9, 11, 13, 17, 19, 23});
  auto seqs = sampler.sample(prompts, {.max_tokens = 32, .temperature = 1.0, .seed = step, .ignore_eos = true}).take();
  if (!seqs) return seqs.error();
  int64_t tokens = 0;
  for (const auto& q : *seqs) tokens += static_cast<int64_t>(q.tokens.size());
  return tokens;
}

struct Unit {
  int64_t tokens = 0;
  double train_s = 0, sample_s = 0;  ///< the two halves' wall-clock seconds
};

// One tenant's work unit: a training step and a sample call.
Result<Unit> work(const ModelGroup& model, const SamplerGroup& sampler, int64_t vocab, int step) {
  auto batch = bench_batch(vocab, step);
  Unit u;
  caf::error err;
  u.train_s = seconds_of([&] {
    if (auto fb = model.forward_backward(batch).take(); !fb) err = fb.error();
    else if (auto s = model.clip_grad_and_step().take(); !s) err = s.error();
  });
  if (err) return err;
  Result<int64_t> sampled = int64_t{0};
  u.sample_s = seconds_of([&] { sampled = sample4(sampler, step); });
  if (!sampled) return sampled.error();
  u.tokens = batch.tensors["input_ids"].numel() + *sampled;
  return u;
}

}  // namespace

int remote(const RemoteBenchArgs& a) {
  ScratchDir scratch{"glint-bench-remote"};
  const auto& root = scratch.path;
  // The base: a small Qwen3 (4 layers, hidden 256) with a trained tokenizer.
  auto model_dir = (root / "base").string();
  auto vocab_size = make_bench_base(model_dir);
  if (!vocab_size) return fail("making the base model", vocab_size.error());
  const int64_t vocab = *vocab_size;

  auto rt = initialize(Options{});
  if (!rt) return fail("starting the runtime", rt.error());
  rpc::ServeConfig config{.model_dir = model_dir, .state_dir = (root / "state").string(), .port = 0};
  config.sampler_cache_bytes = int64_t{64} << 20;
  config.tinker_port = 0;  // and the Tinker API, for tinker_step_ms
  config.tinker_base_model = "bench/base";
  auto server = rpc::Server::start(**rt, config);
  if (!server) return fail("starting the server", server.error());
  std::vector<std::string> keys;
  for (int t = 0; t < 4; ++t) {
    auto key = rpc::KeyStore::create(config.state_dir, "tenant" + std::to_string(t));
    if (!key) return fail("making a key", key.error());
    keys.push_back(*key);
  }
  auto attach = [&](const std::string& key) {
    Options o;
    o.mode = Mode::remote;
    o.remote_endpoint = "127.0.0.1:" + std::to_string((*server)->port());
    o.remote_api_key = key;
    return initialize(o);
  };
  auto mesh = DeviceMesh::from_sizes({.dp = 1});
  if (!mesh) return fail("the device mesh", mesh.error());
  const auto& one = *mesh;

  // 1. noop round trips and training steps: straight to the server's model
  // group (the same actors, the same cores), and through the gateway.
  std::optional<ModelGroup> local = (*server)->model_group();
  auto driver = attach(keys[0]);
  if (!driver) return fail("attaching", driver.error());
  auto remote = actors::open_model_group(**driver, DeviceGroup::of("model", 1), one, {});
  if (!remote) return fail("opening the remote model group", remote.error());
  // Local and remote calls alternate, so that both see the same machine
  // (these VMs are noisy); medians of each.
  std::vector<ModelGroup> adapters;
  for (ModelGroup* g : {&*local, &*remote}) {
    const std::string name = g == &*local ? "bench-local" : "bench";
    if (auto ok = g->add_adapter(name, kLora, 1).get(); !ok) return fail("adding an adapter", ok.error());
    adapters.push_back(g->with_adapter(name));
    if (auto ok = adapters.back().set_optimizer({.lr = 1e-3}).get(); !ok) return fail("setting the optimizer", ok.error());
  }
  // The same step through the Tinker API (HTTP, protobuf bodies), with a
  // tenant of its own.
  auto tinker_key = rpc::KeyStore::create(config.state_dir, "tinker");
  if (!tinker_key) return fail("making a key", tinker_key.error());
  TinkerClient tinker((*server)->tinker_port(), *tinker_key);
  if (auto ok = tinker.open("bench/base"); !ok) return fail("opening a Tinker model", ok.error());
  std::vector<double> noops[2], steps[2], tinker_steps;
  for (int i = 0; i < a.repeats; ++i)
    for (int m = 0; m < 2; ++m) {
      caf::error err;
      noops[m].push_back(seconds_of([&] {
        if (auto r = adapters[static_cast<size_t>(m)].calculate_metric().get(); !r) err = r.error();
      }));
      if (err) return fail("calculate_metric", err);
    }
  auto batch = bench_batch(vocab, 0);
  for (int i = 0; i < a.steps + 2; ++i)
    for (int m = 0; m < 2; ++m) {
      const auto& ad = adapters[static_cast<size_t>(m)];
      caf::error err;
      double s = seconds_of([&] {
        if (auto r = ad.forward_backward(batch).get(); !r) err = r.error();
        else if (auto st = ad.clip_grad_and_step().get(); !st) err = st.error();
      });
      if (err) return fail("a training step", err);
      if (i >= 2) steps[m].push_back(s);  // the first two warm up
      if (m == 1) {
        double t = seconds_of([&] {
          if (auto ok = tinker.step(batch); !ok) err = ok.error();
        });
        if (err) return fail("a Tinker training step", err);
        if (i >= 2) tinker_steps.push_back(t);
      }
    }
  // What one model step over 4 tenants' rows could save at most: a step of
  // 32 rows against 4 steps of 8 (the same adapter, local).
  std::vector<double> rows8, rows32;
  {
    Batch big;
    std::vector<int64_t> ids;
    for (int64_t i = 0; i < 32 * 64; ++i) ids.push_back((i * 31) % (vocab - 3) + 3);
    if (auto t = Tensor::from_values(ids, {32, 64})) big.tensors["input_ids"] = std::move(*t);
    for (int i = 0; i < std::max(3, a.steps / 2); ++i)
      for (const Batch* b : {&batch, &big}) {
        caf::error err;
        double s = seconds_of([&] {
          if (auto r = adapters[0].forward_backward(*b).get(); !r) err = r.error();
          else if (auto st = adapters[0].clip_grad_and_step().get(); !st) err = st.error();
        });
        if (err) return fail("a training step", err);
        (b == &batch ? rows8 : rows32).push_back(s);
      }
  }
  const double noop_us[2] = {median(noops[0]) * 1e6, median(noops[1]) * 1e6};
  const double step_s[2] = {median(steps[0]), median(steps[1])};
  print_metric("local_noop_rtt_us", noop_us[0], 1);
  print_metric("remote_noop_rtt_us", noop_us[1], 1);
  print_metric("local_forward_backward_s", step_s[0], 4);
  print_metric("remote_forward_backward_s", step_s[1], 4);
  print_metric("remote_forward_backward_vs_local", step_s[1] / step_s[0], 3);
  // The same step (forward_backward + the optimizer step, 8 rows of 64
  // tokens) through the Tinker API against glint's own Cap'n Proto API.
  print_metric("native_step_ms", step_s[1] * 1e3, 2);
  print_metric("tinker_step_ms", median(tinker_steps) * 1e3, 2);
  print_metric("tinker_vs_native_step", median(tinker_steps) / step_s[1], 3);
  print_metric("train_rows32_vs_4x_rows8", median(rows32) / (4 * median(rows8)), 3);
  (void)local->remove_adapter("bench-local").get();
  (void)remote->remove_adapter("bench").get();

  // 2. One tenant alone, then four at once, each alternating training and sampling.
  struct Round {
    double tokens_per_s = 0;
    double train_s = 0, sample_s = 0;  ///< medians per unit (one tenant)
    double sample4_s = 0;              ///< median: 4 tenants' sample calls at once
  };
  auto throughput = [&](int tenants) -> Result<Round> {
    std::vector<std::unique_ptr<Runtime>> drivers;
    std::vector<ModelGroup> models;
    std::vector<SamplerGroup> samplers;
    for (int t = 0; t < tenants; ++t) {
      auto d = attach(keys[static_cast<size_t>(t)]);
      if (!d) return d.error();
      auto mg = actors::open_model_group(**d, DeviceGroup::of("model", 1), one, {});
      if (!mg) return mg.error();
      auto sg = actors::open_sampler_group(**d, DeviceGroup::of("sampler", 1), one, {});
      if (!sg) return sg.error();
      const std::string name = "t" + std::to_string(tenants) + "-" + std::to_string(t);
      if (auto ok = mg->add_adapter(name, kLora, static_cast<uint64_t>(t)).get(); !ok) return ok.error();
      if (auto ok = sg->add_adapter(name, kLora).get(); !ok) return ok.error();
      if (auto ok = mg->with_adapter(name).set_optimizer({.lr = 1e-3}).get(); !ok) return ok.error();
      models.push_back(mg->with_adapter(name));
      samplers.push_back(sg->with_adapter(name));
      drivers.push_back(std::move(*d));
    }
    // A warm-up unit each, then the timed ones.
    for (int t = 0; t < tenants; ++t)
      if (auto w = work(models[static_cast<size_t>(t)], samplers[static_cast<size_t>(t)], vocab, 0); !w) return w.error();
    std::atomic<int64_t> tokens{0};
    std::vector<double> train_s, sample_s;  // one tenant's units
    std::vector<caf::error> errors(static_cast<size_t>(tenants));
    auto secs = seconds_of([&] {
      std::vector<std::thread> threads;
      for (int t = 0; t < tenants; ++t)
        threads.emplace_back([&, t] {
          for (int s = 1; s <= a.steps; ++s) {
            auto w = work(models[static_cast<size_t>(t)], samplers[static_cast<size_t>(t)], vocab, s);
            if (!w) {
              errors[static_cast<size_t>(t)] = w.error();
              return;
            }
            tokens += w->tokens;
            if (tenants == 1) {
              train_s.push_back(w->train_s);
              sample_s.push_back(w->sample_s);
            }
          }
        });
      for (auto& th : threads) th.join();
    });
    for (auto& e : errors)
      if (e) return e;
    Round round{.tokens_per_s = static_cast<double>(tokens.load()) / secs};
    if (tenants == 1) {
      round.train_s = median(train_s);
      round.sample_s = median(sample_s);
    } else {
      // The tenants' sample calls alone, all at once (the sampler batches them).
      std::vector<double> together;
      for (int s = 0; s < a.steps; ++s) {
        together.push_back(seconds_of([&] {
          std::vector<std::thread> threads;
          for (int t = 0; t < tenants; ++t)
            threads.emplace_back([&, t] {
              if (auto r = sample4(samplers[static_cast<size_t>(t)], s); !r) errors[static_cast<size_t>(t)] = r.error();
            });
          for (auto& th : threads) th.join();
        }));
      }
      for (auto& e : errors)
        if (e) return e;
      round.sample4_s = median(together);
    }
    for (size_t t = 0; t < models.size(); ++t) {
      (void)samplers[t].remove_adapter(samplers[t].adapter()).get();
      (void)models[t].base().remove_adapter(models[t].adapter()).get();
    }
    return round;
  };
  // Five rounds of one tenant then four, medians of each.
  std::vector<double> alone, four, bound;
  for (int round = 0; round < 5; ++round) {
    auto one_tenant = throughput(1);
    if (!one_tenant) return fail("one tenant", one_tenant.error());
    auto four_tenants = throughput(4);
    if (!four_tenants) return fail("four tenants", four_tenants.error());
    alone.push_back(one_tenant->tokens_per_s);
    four.push_back(four_tenants->tokens_per_s);
    // What 4 tenants gain from shared engine steps alone: 4 units of one
    // tenant over 4 training steps back to back plus one round of the 4
    // tenants' sample calls at once. Overlapping the model's work with the
    // sampler's can add to it; a shared model step cannot here while
    // train_rows32_vs_4x_rows8 >= 1 (one step over 4 tenants' rows costs
    // what their 4 steps cost, or more).
    const double t = one_tenant->train_s, s1 = one_tenant->sample_s, s4 = four_tenants->sample4_s;
    bound.push_back(4 * (t + s1) / (4 * t + s4));
  }
  print_metric("tenants1_tokens_per_s", median(alone), 0);
  print_metric("tenants4_tokens_per_s", median(four), 0);
  print_metric("tenants4_vs_1_tokens_per_s", median(four) / median(alone), 3);
  print_metric("tenants4_vs_1_no_overlap", median(bound), 3);
  driver->reset();
  (*server)->shutdown();
  return 0;
}

}  // namespace glint::bench
