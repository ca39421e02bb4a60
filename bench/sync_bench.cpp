// glint bench sync: see sync_bench.hpp.
#include "bench/sync_bench.hpp"
#include "bench/measure.hpp"
#include "bench/two_process_job.hpp"

#include "actors/checkpoint_engine.hpp"
#include "components/model/config.hpp"
#include "runtime/process.hpp"
#include "runtime/runtime.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <memory>
#include <optional>

namespace glint::bench {

namespace {

using namespace std::chrono_literals;
constexpr const char* kName = "glint bench sync";

int fail(const std::string& what) {
  std::fprintf(stderr, "%s: %s\n", kName, what.c_str());
  return 1;
}

struct Size {
  std::string label;
  components::ModelConfig config;
};

std::vector<Size> sizes(bool small) {
  using components::Architecture;
  auto make = [](int64_t vocab, int64_t hidden, int64_t inter, int64_t layers, int64_t heads) {
    auto c = components::ModelConfig::make(Architecture::qwen3, vocab, hidden, inter, layers, heads, heads / 2);
    c.max_position_embeddings = 512;
    return c;
  };
  if (small) return {{"1m", make(1024, 128, 384, 4, 4)}, {"5m", make(4096, 256, 768, 4, 4)}};
  return {{"30m", make(8192, 512, 1408, 6, 8)}, {"300m", make(32768, 1024, 2816, 20, 16)}};
}

// GB/s of one memcpy of `bytes` between two buffers whose pages are touched.
double memcpy_gbps(size_t bytes, int repeats) {
  std::unique_ptr<char[]> src{new char[bytes]}, dst{new char[bytes]};
  std::memset(src.get(), 1, bytes);
  std::memset(dst.get(), 0, bytes);
  std::vector<double> secs;
  for (int r = 0; r < repeats; ++r) secs.push_back(seconds_of([&] { std::memcpy(dst.get(), src.get(), bytes); }));
  return static_cast<double>(bytes) / median(secs) / 1e9;
}

// GB/s of a bare TCP socket over loopback moving `bytes` from this process
// to a forked child, which reads them into a buffer of its own and answers
// one byte when it has them all: the floor of any socket transport between
// two processes on this machine. The median of `repeats` transfers; -1 if a
// socket call failed.
double tcp_loopback_gbps(size_t bytes, int repeats) {
  sockaddr_in addr{};
  int server = listen_on_loopback(addr);
  if (server < 0) return -1;
  // Both buffers exist before the fork: the child only makes system calls
  // (allocating after a fork of a threaded process can deadlock).
  std::unique_ptr<char[]> buf{new char[bytes]}, src{new char[bytes]};
  std::memset(src.get(), 1, bytes);
  std::fflush(nullptr);
  const pid_t child = ::fork();
  if (child == 0) {  // the receiver
    ::close(server);
    int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0 || ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) ::_exit(1);
    std::memset(buf.get(), 0, bytes);
    for (int r = 0; r < repeats; ++r) {
      for (size_t got = 0; got < bytes;) {
        auto n = ::recv(fd, buf.get() + got, bytes - got, 0);
        if (n <= 0) ::_exit(1);
        got += static_cast<size_t>(n);
      }
      char ack = 1;
      if (::send(fd, &ack, 1, 0) != 1) ::_exit(1);
    }
    ::_exit(0);
  }
  pollfd wait_for{server, POLLIN, 0};
  int fd = child > 0 && ::poll(&wait_for, 1, 30000) == 1 ? ::accept(server, nullptr, nullptr) : -1;
  ::close(server);
  std::vector<double> secs;
  bool ok = fd >= 0;
  for (int r = 0; r < repeats && ok; ++r)
    secs.push_back(seconds_of([&] {
      for (size_t sent = 0; ok && sent < bytes;) {
        auto n = ::send(fd, src.get() + sent, bytes - sent, 0);
        if (n <= 0) ok = false;
        else sent += static_cast<size_t>(n);
      }
      char ack = 0;
      ok = ok && ::recv(fd, &ack, 1, MSG_WAITALL) == 1;
    }));
  if (fd >= 0) ::close(fd);
  int status = 0;
  if (child > 0) ::waitpid(child, &status, 0);
  if (!ok || secs.empty()) return -1;
  return static_cast<double>(bytes) / median(secs) / 1e9;
}

// Median GB/s of `repeats` syncs (after one warm-up sync) from a model rank
// in this process to a sampler rank on node `sampler_node`.
Result<double> sync_gbps(Runtime& rt, const Size& s, int sampler_node, int repeats, const std::string& tag,
                         actors::SyncTransport transport = actors::SyncTransport::automatic) {
  auto config = s.config.to_json();
  auto model = Group<actors::model_actor>::spawn(rt, "model-" + tag, actors::model_type, {RankSlot{}},
                                                 actors::ModelSpec{.config_json = config, .seed = 1});
  if (!model) return model.error();
  RankSlot remote;
  remote.node = sampler_node;
  auto sampler = Group<actors::sampler_actor>::spawn(
      rt, "sampler-" + tag, actors::sampler_type, {remote},
      actors::SamplerSpec{.config_json = config, .seed = 2, .cache_bytes = 4 << 20});
  if (!sampler) return sampler.error();
  actors::CheckpointEngine ckpt{actors::model_group_of(model->with_timeout(10min)),
                                actors::sampler_group_of(rt, sampler->with_timeout(10min))};
  std::vector<double> gbps;
  for (int r = 0; r <= repeats; ++r) {
    auto report = ckpt.sync_weights({.transport = transport});
    if (!report) return report.error();
    if (r > 0) gbps.push_back(report->gbps());
  }
  return median(gbps);
}

}  // namespace

int sync(const SyncBenchArgs& a) {
  if (a.mode != "local" && a.mode != "cluster" && a.mode != "all")
    return fail("--mode must be local, cluster or all, not '" + a.mode + "'");
  auto list = sizes(a.small);
  std::printf("# %s: full-weight sync model -> sampler, 256 MiB buckets, f32; medians of %d syncs after a warm-up\n",
              kName, a.repeats);
  for (const auto& s : list)
    std::printf("# model %s: %.1fM parameters, %.0f MB\n", s.label.c_str(), static_cast<double>(s.config.num_parameters()) / 1e6,
                static_cast<double>(s.config.num_parameters()) * 4 / 1e6);
  const auto biggest = static_cast<size_t>(list.back().config.num_parameters() * 4);
  const double ceiling = memcpy_gbps(biggest, a.repeats);
  print_metric("memcpy_gbps", ceiling, 2);
  // Before any actor system starts its threads: the child of a fork is simpler then.
  const double tcp = a.mode != "local" ? tcp_loopback_gbps(biggest, a.repeats) : 0;
  if (a.mode != "local") print_metric("tcp_loopback_gbps", tcp, 2);
  if (a.mode != "cluster") {
    auto rt = initialize(Options{});
    if (!rt) return fail(describe(rt.error()));
    for (const auto& s : list) {
      auto g = sync_gbps(**rt, s, 0, a.repeats, s.label);
      if (!g) return fail(describe(g.error()));
      print_metric(("weight_sync_gbps_" + s.label).c_str(), *g, 2);
      print_metric(("weight_sync_vs_memcpy_" + s.label).c_str(), *g / ceiling, 3);
    }
    (*rt)->shutdown();
  }
  if (a.mode != "local") {
    auto job = TwoProcessJob::start();
    if (!job) return fail(describe(job.error()));
    auto& rt = job->rt;
    double faster = 0;
    for (const auto& s : list) {
      auto g = sync_gbps(*rt, s, 1, a.repeats, s.label, actors::SyncTransport::messages);
      if (!g) return fail(describe(g.error()));
      print_metric(("weight_sync_cluster_messages_gbps_" + s.label).c_str(), *g, 2);
      auto c = sync_gbps(*rt, s, 1, a.repeats, s.label + "-c10d", actors::SyncTransport::collective);
      if (!c) return fail(describe(c.error()));
      print_metric(("weight_sync_cluster_c10d_gbps_" + s.label).c_str(), *c, 2);
      auto st = sync_gbps(*rt, s, 1, a.repeats, s.label + "-stream", actors::SyncTransport::stream);
      if (!st) return fail(describe(st.error()));
      print_metric(("weight_sync_cluster_stream_gbps_" + s.label).c_str(), *st, 2);
      faster = std::max({*g, *c, *st});
      print_metric(("weight_sync_cluster_gbps_" + s.label).c_str(), faster, 2);
    }
    job->stop();
    if (tcp > 0) print_metric(("weight_sync_cluster_vs_tcp_" + list.back().label).c_str(), faster / tcp, 3);
  }
  return 0;
}

}  // namespace glint::bench
