// glint bench faults: see faults_bench.hpp.
#include "bench/faults_bench.hpp"
#include "bench/measure.hpp"
#include "bench/two_process_job.hpp"

#include "actors/probe.hpp"
#include "actors/sampler_group.hpp"
#include "components/model/config.hpp"
#include "components/model/model.hpp"
#include "placement/service.hpp"
#include "runtime/group.hpp"
#include "runtime/process.hpp"

#include <signal.h>
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <string>
#include <thread>

namespace glint::bench {

namespace {

using namespace std::chrono_literals;
constexpr const char* kName = "glint bench faults";

int fail(const std::string& what) {
  std::fprintf(stderr, "%s: %s\n", kName, what.c_str());
  return 1;
}

double since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Seconds from `sig` to node 1 until a call in flight there fails with
// `unavailable`.
Result<double> detect(int sig) {
  auto job = TwoProcessJob::start();
  if (!job) return job.error();
  auto& rt = *job->rt;
  if (auto svc = placement::service(rt, {.strategy = placement::Strategy::spread}); !svc) return svc.error();
  auto g = placement::spawn_group<actors::probe_actor>(rt, placement::DeviceGroup::of("probe", 2), actors::probe_type);
  if (!g) return g.error();
  if (auto warm = g->call_rank(1, actors::echo_atom::value, int64_t{1}).get(); !warm) return warm.error();
  auto pending = g->call_rank(1, actors::sleep_atom::value, int64_t{60'000});
  const auto t0 = std::chrono::steady_clock::now();
  job->node.signal(sig);
  if (!pending.wait_for(60s)) return make_error(errc::deadline_exceeded, "node 1 was not found lost within 60 s");
  const double s = since(t0);
  auto r = pending.get();
  if (r || code_of(r.error()) != errc::unavailable)
    return make_error(errc::internal, "the call to the lost node ended with " + (r ? std::string{"an answer"} : describe(r.error())));
  job->node.signal(SIGKILL);
  job->stop();
  return s;
}

struct SamplerTimes {
  double spawn_s = 0, respawn_s = 0;
};

// A supervised 2-rank sampler group (rank 0 here, rank 1 on node 1) at
// weight version 1; node 1 killed; the sample calls that follow respawn
// rank 1 here and replay the update. Also times a plain one-rank spawn.
Result<SamplerTimes> respawn() {
  auto job = TwoProcessJob::start();
  if (!job) return job.error();
  auto& rt = *job->rt;
  if (auto svc = placement::service(rt, {.strategy = placement::Strategy::spread}); !svc) return svc.error();
  auto cfg = components::ModelConfig::make(components::Architecture::qwen3, 4096, 256, 768, 4, 4, 2);
  cfg.max_position_embeddings = 512;
  const actors::SamplerSpec spec{.config_json = cfg.to_json(), .seed = 2, .cache_bytes = 8 << 20};
  auto mesh1 = placement::DeviceMesh::from_sizes({.dp = 1});
  auto mesh2 = placement::DeviceMesh::from_sizes({.dp = 2});
  if (!mesh1 || !mesh2) return make_error(errc::internal, "a device mesh");
  SamplerTimes out;
  {
    const auto t0 = std::chrono::steady_clock::now();
    auto one = actors::open_sampler_group(rt, placement::DeviceGroup::of("baseline", 1), *mesh1, spec);
    if (!one) return one.error();
    // The rank loads its model before it answers its first call.
    if (auto pinged = one->stats().get(); !pinged) return pinged.error();
    out.spawn_s = since(t0);
    one->backend().actor_group()->stop();
  }
  auto sg = actors::open_sampler_group(rt, placement::DeviceGroup::of("sampler", 2), *mesh2, spec,
                                       RestartPolicy{.max_restarts = 1, .backoff = 0ms});
  if (!sg) return sg.error();
  if (sg->info().ranks[1].node != 1) return make_error(errc::internal, "rank 1 was not placed on node 1");
  // Version 1: other weights than the spec's, which a respawned rank must replay.
  auto lm = components::CausalLM::init_random(cfg, 3);
  if (!lm) return lm.error();
  auto params = lm->named_parameters();
  if (!params) return params.error();
  NamedTensors weights;
  for (auto& [name, t] : *params) weights.emplace_back(name, t.clone());
  std::vector<std::vector<int64_t>> prompts;
  for (int64_t i = 0; i < 8; ++i) prompts.push_back({1 + i, 2 + i, 3 + i});
  const components::SamplingParams p{.num_samples = 1, .max_tokens = 4, .seed = 1, .ignore_eos = true};
  if (auto ok = sg->update_weights(weights, 1).get(); !ok) return ok.error();
  if (auto warm = sg->sample(prompts, p).get(); !warm) return warm.error();
  const auto t0 = std::chrono::steady_clock::now();
  job->node.signal(SIGKILL);
  for (;;) {
    if (since(t0) > 120) return make_error(errc::deadline_exceeded, "rank 1 did not serve again within 120 s");
    auto got = sg->sample(prompts, p).get();
    auto now = sg->backend().actor_group();
    if (got && now && now->alive(1)) {
      for (const auto& q : *got)
        if (q.weight_version != 1)
          return make_error(errc::internal, "a sequence sampled at version " + std::to_string(q.weight_version));
      break;
    }
    std::this_thread::sleep_for(1ms);
  }
  out.respawn_s = since(t0);
  job->stop();
  return out;
}

// Runs scripts/chaos.sh `runs` and prints its result lines.
int chaos(int runs) {
  const std::string script = std::string{GLINT_SOURCE_DIR} + "/scripts/chaos.sh";
  const std::string cmd = "GLINT='" + self_executable() + "' bash '" + script + "' " + std::to_string(runs) + " 2>&1";
  std::FILE* p = ::popen(cmd.c_str(), "r");
  if (!p) return fail("cannot run " + script);
  std::array<char, 4096> line{};
  while (std::fgets(line.data(), static_cast<int>(line.size()), p)) {
    std::fputs(line.data(), stdout);
    std::fflush(stdout);
  }
  int status = ::pclose(p);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 1;
}

}  // namespace

int faults(const FaultsBenchArgs& args) {
  if (args.repeats < 1) return fail("--repeats must be at least 1");
  std::vector<double> kills, freezes, spawns, respawns;
  for (int r = 0; r < args.repeats; ++r) {
    auto k = detect(SIGKILL);
    if (!k) return fail("kill_detect: " + describe(k.error()));
    kills.push_back(*k);
    auto f = detect(SIGSTOP);
    if (!f) return fail("freeze_detect: " + describe(f.error()));
    freezes.push_back(*f);
    auto s = respawn();
    if (!s) return fail("sampler_respawn: " + describe(s.error()));
    spawns.push_back(s->spawn_s);
    respawns.push_back(s->respawn_s);
  }
  print_metric("kill_detect_s", median(kills), 3);
  print_metric("freeze_detect_s", median(freezes), 3);
  print_metric("peer_timeout_s", std::chrono::duration<double>(Options{}.peer_timeout).count(), 3);
  print_metric("sampler_spawn_s", median(spawns), 3);
  print_metric("sampler_respawn_s", median(respawns), 3);
  if (args.chaos > 0) return chaos(args.chaos);
  return 0;
}

}  // namespace glint::bench
