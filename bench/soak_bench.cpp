// glint bench serve-soak: see soak_bench.hpp.
#include "bench/soak_bench.hpp"
#include "bench/measure.hpp"
#include "bench/tinker_client.hpp"

#include "rpc/keys.hpp"
#include "rpc/server.hpp"
#include "runtime/progress.hpp"
#include "runtime/runtime.hpp"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <thread>

namespace glint::bench {

namespace {

constexpr const char* kName = "glint bench serve-soak";
using Clock = std::chrono::steady_clock;

int fail(const std::string& what, const caf::error& e) {
  std::fprintf(stderr, "%s: %s: %s\n", kName, what.c_str(), describe(e).c_str());
  return 1;
}

double rss_mib() {
  std::ifstream in{"/proc/self/statm"};
  int64_t pages = 0, resident = 0;
  in >> pages >> resident;
  return static_cast<double>(resident * ::sysconf(_SC_PAGESIZE)) / (1 << 20);
}

int64_t open_fds() {
  int64_t n = 0;
  std::error_code ec;
  for (auto it = std::filesystem::directory_iterator("/proc/self/fd", ec); !ec && it != std::filesystem::directory_iterator();
       it.increment(ec))
    ++n;
  return n;
}

struct Tally {
  std::mutex mx;
  std::vector<double> latencies_s;
  int64_t calls = 0, errors = 0;
  std::string first_error;
  void add(double s, const caf::error& e) {
    std::lock_guard<std::mutex> guard{mx};
    ++calls;
    latencies_s.push_back(s);
    if (e) {
      ++errors;
      if (first_error.empty()) first_error = describe(e);
    }
  }
};

}  // namespace

int serve_soak(const SoakBenchArgs& a) {
  ScratchDir scratch{"glint-bench-soak"};
  const auto& root = scratch.path;
  auto model_dir = (root / "base").string();
  auto vocab = make_bench_base(model_dir);
  if (!vocab) return fail("making the base model", vocab.error());
  auto rt = initialize(Options{});
  if (!rt) return fail("starting the runtime", rt.error());
  rpc::ServeConfig config{.model_dir = model_dir, .state_dir = (root / "state").string(), .port = 0};
  config.tinker_port = 0;
  config.tinker_base_model = "bench/base";
  config.limits.calls_in_flight = 32;
  auto server = rpc::Server::start(**rt, config);
  if (!server) return fail("starting the server", server.error());
  std::vector<std::string> keys;
  for (int t = 0; t < a.tenants; ++t) {
    auto key = rpc::KeyStore::create(config.state_dir, "soak" + std::to_string(t));
    if (!key) return fail("making a key", key.error());
    keys.push_back(*key);
  }
  const auto total = std::chrono::duration<double>(a.minutes * 60);
  const auto t0 = Clock::now(), warm_until = t0 + std::chrono::duration_cast<Clock::duration>(total / 10),
             end = t0 + std::chrono::duration_cast<Clock::duration>(total);
  Tally tally;
  std::atomic<int> warmed{0};
  // fds and RSS with no client connected: before any, and after all went.
  const int64_t fds_before = open_fds();
  auto tenant = [&](int t) {
    TinkerClient c((*server)->tinker_port(), keys[static_cast<size_t>(t)]);
    auto timed = [&](auto&& f) {
      auto s = Clock::now();
      caf::error e;
      if (auto r = f(); !r) e = r.error();
      tally.add(std::chrono::duration<double>(Clock::now() - s).count(), e);
      return !e;
    };
    if (!timed([&] { return c.open("bench/base"); })) return;
    bool counted = false;
    for (int64_t step = 0; Clock::now() < end; ++step) {
      timed([&] { return c.step(bench_batch(*vocab, step * a.tenants + t)); });
      if (a.sample_every > 0 && step % a.sample_every == a.sample_every - 1) {
        std::string sid;
        if (timed([&]() -> Result<void> {
              auto s = c.sampler();
              if (!s) return s.error();
              sid = *s;
              return {};
            }))
          timed([&]() -> Result<void> {
            auto n = c.sample(sid, {3, 5, 7, 9, static_cast<int64_t>(4 + step % 20)}, 4, 16);
            if (!n) return n.error();
            return {};
          });
      }
      if (!counted && Clock::now() >= warm_until && step >= 4) {
        counted = true;
        ++warmed;
      }
    }
    if (!counted) ++warmed;
  };
  std::vector<std::thread> threads;
  for (int t = 0; t < a.tenants; ++t) threads.emplace_back(tenant, t);
  // The warm-up's end: every tenant past it (its allocations made).
  while (warmed.load() < a.tenants && Clock::now() < end) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  const double rss_start = rss_mib();
  const auto counted_from = Clock::now();
  {
    const int seconds = std::max(1, static_cast<int>(std::chrono::duration<double>(end - counted_from).count()));
    Progress bar{"soak", seconds};
    while (Clock::now() < end) {
      std::this_thread::sleep_for(std::chrono::seconds(1));
      const int done = std::min(seconds, static_cast<int>(std::chrono::duration<double>(Clock::now() - counted_from).count()));
      int64_t calls = 0, errors = 0;
      {
        std::lock_guard<std::mutex> guard{tally.mx};
        calls = tally.calls;
        errors = tally.errors;
      }
      bar.update(done, std::to_string(calls) + " calls, " + std::to_string(errors) + " errors, RSS " +
                           std::to_string(static_cast<int>(rss_mib())) + " MiB");
    }
    bar.finish();
  }
  for (auto& th : threads) th.join();
  // The server closes idle connections on its own schedule: give it a moment.
  std::this_thread::sleep_for(std::chrono::seconds(6));
  const double rss_end = rss_mib();
  const int64_t fds_after = open_fds();
  std::sort(tally.latencies_s.begin(), tally.latencies_s.end());
  auto pct = [&](double q) {
    if (tally.latencies_s.empty()) return 0.0;
    return tally.latencies_s[std::min(tally.latencies_s.size() - 1, static_cast<size_t>(q * tally.latencies_s.size()))];
  };
  const double growth = rss_start > 0 ? rss_end / rss_start - 1 : 0;
  std::printf("# %d tenants for %.1f minutes against one server (Tinker API, SDK-shaped calls); "
              "RSS counted from the warm-up's end\n",
              a.tenants, a.minutes);
  print_metric("soak_calls", static_cast<double>(tally.calls), 0);
  print_metric("soak_errors", static_cast<double>(tally.errors), 0);
  print_metric("soak_p50_ms", pct(0.5) * 1e3, 1);
  print_metric("soak_p99_ms", pct(0.99) * 1e3, 1);
  print_metric("soak_rss_start_mib", rss_start, 1);
  print_metric("soak_rss_end_mib", rss_end, 1);
  print_metric("soak_rss_growth", growth, 4);
  print_metric("soak_fds_start", static_cast<double>(fds_before), 0);
  print_metric("soak_fds_end", static_cast<double>(fds_after), 0);
  print_metric("soak_fds_leaked", static_cast<double>(std::max<int64_t>(0, fds_after - fds_before)), 0);
  if (!tally.first_error.empty()) std::printf("# the first error: %s\n", tally.first_error.c_str());
  (*server)->shutdown();
  const bool ok = tally.errors == 0 && growth < 0.05 && fds_after <= fds_before;
  if (!ok) std::fprintf(stderr, "%s: a goal was missed (0 errors, RSS growth < 5%%, 0 leaked descriptors)\n", kName);
  return ok ? 0 : 1;
}

}  // namespace glint::bench
