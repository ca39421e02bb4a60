// glint bench actors: call latency and throughput of glint groups, local and
// across processes, against raw CAF requests to the same actor in the same
// run (what glint builds on) and, for the cluster transport, a bare TCP
// ping-pong over loopback between two threads (the floor any socket
// transport on this machine has). Prints `name: value` lines; every value is
// the median of --repeats runs.
#include "actors/probe.hpp"
#include "actors/probe_group.hpp"
#include "bench/measure.hpp"
#include "bench/two_process_job.hpp"
#include "runtime/group.hpp"
#include "runtime/process.hpp"

#include <caf/scoped_actor.hpp>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <functional>
#include <thread>

namespace glint::bench {

namespace {

using namespace std::chrono_literals;
using actors::probe_actor;

struct Lines;
double lookup(const Lines& lines, const std::string& name);

struct Lines {
  std::vector<std::pair<std::string, double>> out;
  void add(std::string name, double v) {
    std::printf("%s: %.3f\n", name.c_str(), v);
    std::fflush(stdout);
    out.emplace_back(std::move(name), v);
  }
};

double lookup(const Lines& lines, const std::string& name) {
  for (const auto& [n, v] : lines.out)
    if (n == name) return v;
  return 0;
}

// A 64-byte TCP ping-pong over loopback between this thread and an echo
// thread: the round trip of the bare socket path, in microseconds (or -1).
double tcp_loopback_rtt_us(int n) {
  sockaddr_in addr{};
  int server = listen_on_loopback(addr);
  if (server < 0) return -1;
  auto exchange = [](int fd, bool echo, int rounds) {
    int one = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    char buf[64] = {0};
    for (int i = 0; i < rounds; ++i) {
      if (!echo && ::send(fd, buf, sizeof(buf), 0) != sizeof(buf)) return false;
      for (size_t got = 0; got < sizeof(buf);) {
        auto r = ::recv(fd, buf + got, sizeof(buf) - got, 0);
        if (r <= 0) return false;
        got += static_cast<size_t>(r);
      }
      if (echo && ::send(fd, buf, sizeof(buf), 0) != sizeof(buf)) return false;
    }
    return true;
  };
  std::thread echo([&] {
    int fd = ::accept(server, nullptr, nullptr);
    if (fd >= 0) {
      exchange(fd, true, n);
      ::close(fd);
    }
  });
  int client = ::socket(AF_INET, SOCK_STREAM, 0);
  bool ok = client >= 0 && ::connect(client, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  double s = ok ? seconds_of([&] { ok = exchange(client, false, n); }) : 0;
  if (client >= 0) ::close(client);
  if (!ok) ::shutdown(server, SHUT_RDWR);
  echo.join();
  ::close(server);
  return ok ? s / n * 1e6 : -1;
}

// Measures one group (one rank) in the runtime; `suffix` is local or cluster.
bool measure(Runtime& rt, const Group<probe_actor>& g, const std::string& suffix, int repeats, Lines& lines,
             bool with_tensor) {
  bool local = suffix.rfind("local", 0) == 0;
  const int rtt_calls = local ? 20000 : 5000;
  const int batch_calls = local ? 100000 : 20000;
  std::vector<double> rtt, caf_rtt, rate, gbps;
  caf::scoped_actor self{rt.system()};
  auto handle = g.handle(0);
  bool ok = true;
  for (int rep = 0; rep < repeats && ok; ++rep) {
    rtt.push_back(seconds_of([&] {
                    for (int64_t i = 0; i < rtt_calls; ++i) ok = ok && g.call_rank(0, actors::echo_atom::value, i).get();
                  }) / rtt_calls * 1e6);
    caf_rtt.push_back(seconds_of([&] {
                        for (int64_t i = 0; i < rtt_calls; ++i)
                          self->request(handle, 10s, actors::echo_atom::value, i)
                              .receive([](int64_t) {}, [&](caf::error&) { ok = false; });
                      }) / rtt_calls * 1e6);
    rate.push_back(batch_calls / seconds_of([&] {
                     std::vector<Future<int64_t>> fs;
                     fs.reserve(static_cast<size_t>(batch_calls));
                     for (int64_t i = 0; i < batch_calls; ++i) fs.push_back(g.call_rank(0, actors::echo_atom::value, i));
                     for (auto& f : fs) ok = ok && f.get();
                   }));
    if (with_tensor) {
      auto zeros = Tensor::zeros(Dtype::f32, {256 * 1024});  // 1 MiB
      if (!zeros) throw std::runtime_error(describe(zeros.error()));
      auto t = std::move(*zeros);
      const int n = 200;
      double s = seconds_of([&] {
        for (int i = 0; i < n; ++i) ok = ok && g.call_rank(0, actors::echo_atom::value, t).get();
      });
      gbps.push_back(2.0 * static_cast<double>(t.nbytes()) * n / s / 1e9);
    }
  }
  if (!ok) {
    std::fprintf(stderr, "glint bench actors: a call failed during the %s run\n", suffix.c_str());
    return false;
  }
  lines.add("actor_rtt_" + suffix + "_us", median(rtt));
  lines.add("caf_rtt_" + suffix + "_us", median(caf_rtt));
  lines.add("actor_rtt_" + suffix + "_vs_caf", median(rtt) / median(caf_rtt));
  lines.add("actor_calls_per_s_" + suffix, median(rate));
  if (with_tensor) lines.add("tensor_1mib_" + suffix + "_gbps", median(gbps));
  return true;
}

// What a typed client call costs over the raw Group call to the same actor:
// echo round trips through ProbeGroup (handle -> backend -> Group::call_rank)
// and through Group::call_rank, interleaved, `repeats` times each; the
// difference of the medians, in microseconds.
bool typed_overhead(const Group<probe_actor>& g, int repeats, Lines& lines) {
  const auto client = actors::probe_group_of(g);
  const int calls = 20000;
  std::vector<double> raw, typed;
  bool ok = true;
  for (int rep = 0; rep < repeats && ok; ++rep) {
    raw.push_back(seconds_of([&] {
                    for (int64_t i = 0; i < calls; ++i) ok = ok && g.call_rank(0, actors::echo_atom::value, i).get();
                  }) / calls * 1e6);
    typed.push_back(seconds_of([&] {
                      for (int64_t i = 0; i < calls; ++i) ok = ok && client.echo(i).get();
                    }) / calls * 1e6);
  }
  if (!ok) {
    std::fprintf(stderr, "glint bench actors: a call failed while timing the typed client\n");
    return false;
  }
  lines.add("raw_group_call_local_us", median(raw));
  lines.add("typed_client_call_local_us", median(typed));
  lines.add("typed_call_overhead_us", median(typed) - median(raw));
  return true;
}

}  // namespace

int actors(int repeats, const std::string& modes) {
  Lines lines;
  std::printf("# glint bench actors: medians of %d runs; baseline caf_rtt_*: a raw CAF request to the same actor\n",
              repeats);
  if (modes != "cluster") {
    Options opts;
    auto rt = initialize(opts);
    if (!rt) {
      std::fprintf(stderr, "glint bench actors: %s\n", describe(rt.error()).c_str());
      return 1;
    }
    auto g = Group<probe_actor>::spawn(**rt, "bench", actors::probe_scheduled_type, {RankSlot{}});
    if (!g || !measure(**rt, *g, "local", repeats, lines, false)) return 1;
    if (!typed_overhead(*g, std::max(repeats, 5), lines)) return 1;
    auto d = Group<probe_actor>::spawn(**rt, "bench", actors::probe_type, {RankSlot{}});
    if (!d || !measure(**rt, *d, "local_detached", repeats, lines, false)) return 1;
  }
  if (modes != "local") {
    auto job = TwoProcessJob::start();
    if (!job) {
      std::fprintf(stderr, "glint bench actors: %s\n", describe(job.error()).c_str());
      return 1;
    }
    auto& rt = job->rt;
    RankSlot remote;
    remote.node = 1;
    auto g = Group<probe_actor>::spawn(*rt, "bench", actors::probe_type, {remote});
    if (!g || !measure(*rt, *g, "cluster", repeats, lines, true)) return 1;
    std::vector<double> tcp;
    for (int rep = 0; rep < repeats; ++rep) tcp.push_back(tcp_loopback_rtt_us(5000));
    lines.add("tcp_rtt_loopback_us", median(tcp));
    if (median(tcp) > 0) lines.add("actor_rtt_cluster_vs_tcp", lookup(lines, "actor_rtt_cluster_us") / median(tcp));
    job->stop();
  }
  return 0;
}

}  // namespace glint::bench
