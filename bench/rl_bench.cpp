#include "bench/rl_bench.hpp"

#include "bench/measure.hpp"
#include "bench/python_child.hpp"
#include "runtime/process.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <optional>
#include <regex>
#include <sstream>
#include <vector>

namespace glint::bench {

namespace {

namespace fs = std::filesystem;

// What one run of the example printed.
struct Run {
  double seconds = 0;   ///< the GRPO phase's wall time
  double sample = 0;    ///< its sampling time (admission to last sequence, summed over steps)
  double train = 0;     ///< its training time (forward_backward, step and sync)
  double accuracy = 0;  ///< greedy, on 256 held-out prompts, after GRPO
  int steps = 0;
};

Result<Run> run_once(const std::string& grpo, const std::string& dir, int eta, int seed, int steps) {
  const auto log = dir + "/log";
  std::ostringstream cmd;
  cmd << "'" << grpo << "' --out '" << dir << "/run' --steps " << steps << " --seed " << seed << " --max-staleness "
      << eta << " --save-every 0 > '" << log << "' 2>&1";
  const int rc = std::system(cmd.str().c_str());
  std::ifstream in{log};
  std::stringstream text;
  text << in.rdbuf();
  const auto out = text.str();
  if (rc != 0)
    return make_error(errc::internal, "the GRPO example failed (" + cmd.str() + "):\n" + out.substr(out.size() > 2000 ? out.size() - 2000 : 0));
  std::smatch m;
  Run r;
  static const std::regex phase{
      R"(grpo phase: (\d+) steps in ([0-9.]+) s .*sampling ([0-9.]+) s, training ([0-9.]+) s)"};
  static const std::regex acc{R"(greedy accuracy on 256 held-out prompts: [0-9.]+ after the warm-up, ([0-9.]+) after GRPO)"};
  if (!std::regex_search(out, m, phase))
    return make_error(errc::internal, "the GRPO example printed no 'grpo phase' line:\n" + out);
  r.steps = std::stoi(m[1]);
  r.seconds = std::stod(m[2]);
  r.sample = std::stod(m[3]);
  r.train = std::stod(m[4]);
  if (!std::regex_search(out, m, acc))
    return make_error(errc::internal, "the GRPO example printed no accuracy after GRPO:\n" + out);
  r.accuracy = std::stod(m[1]);
  return r;
}

double mean(const std::vector<double>& v) { return std::accumulate(v.begin(), v.end(), 0.0) / static_cast<double>(v.size()); }

double stddev(const std::vector<double>& v) {
  if (v.size() < 2) return 0;
  const double mu = mean(v);
  double s = 0;
  for (double x : v) s += (x - mu) * (x - mu);
  return std::sqrt(s / static_cast<double>(v.size() - 1));
}

}  // namespace

int rl(const RlBenchArgs& a) {
  auto grpo = a.grpo.empty() ? (fs::path{self_executable()}.parent_path().parent_path() / "examples" / "grpo").string()
                             : a.grpo;
  if (!fs::exists(grpo)) {
    std::fprintf(stderr,
                 "bench rl: the GRPO example is not at %s; build it (cmake --build build --target grpo) or pass "
                 "--grpo PATH\n",
                 grpo.c_str());
    return 2;
  }
  auto tmp = TempDir::create();
  if (!tmp) {
    std::fprintf(stderr, "bench rl: %s\n", describe(tmp.error()).c_str());
    return 1;
  }
  print_metric("rl_steps", a.steps, 0);
  print_metric("rl_seeds", a.seeds, 0);
  std::vector<double> speed1, speed2, ideal, of_ideal, acc0, acc1, acc2, sph0, sph1, sph2, gen, train;
  for (int seed = 1; seed <= a.seeds; ++seed) {
    Run runs[3];
    for (int eta = 0; eta <= 2; ++eta) {
      const auto dir = tmp->path() + "/s" + std::to_string(seed) + "e" + std::to_string(eta);
      fs::create_directories(dir);
      std::fprintf(stderr, "bench rl: seed %d, --max-staleness %d ...\n", seed, eta);
      auto r = run_once(grpo, dir, eta, seed, a.steps);
      if (!r) {
        std::fprintf(stderr, "bench rl: %s\n", describe(r.error()).c_str());
        return 1;
      }
      runs[eta] = *r;
      fs::remove_all(dir);
    }
    const auto per_hour = [](const Run& r) { return r.steps * 3600.0 / r.seconds; };
    sph0.push_back(per_hour(runs[0]));
    sph1.push_back(per_hour(runs[1]));
    sph2.push_back(per_hour(runs[2]));
    speed1.push_back(runs[0].seconds / runs[1].seconds);
    speed2.push_back(runs[0].seconds / runs[2].seconds);
    const double i = (runs[0].sample + runs[0].train) / std::max(runs[0].sample, runs[0].train);
    ideal.push_back(i);
    of_ideal.push_back(speed2.back() / i);
    gen.push_back(runs[0].sample);
    train.push_back(runs[0].train);
    acc0.push_back(runs[0].accuracy);
    acc1.push_back(runs[1].accuracy);
    acc2.push_back(runs[2].accuracy);
    std::fprintf(stderr,
                 "bench rl: seed %d: %.1f / %.1f / %.1f s for eta 0 / 1 / 2 (ideal %.3f); accuracy %.3f / %.3f / "
                 "%.3f\n",
                 seed, runs[0].seconds, runs[1].seconds, runs[2].seconds, i, runs[0].accuracy, runs[1].accuracy,
                 runs[2].accuracy);
  }
  print_metric("sync_steps_per_hour", median(sph0), 0);
  print_metric("async_eta1_steps_per_hour", median(sph1), 0);
  print_metric("async_eta2_steps_per_hour", median(sph2), 0);
  print_metric("sync_gen_seconds", median(gen), 2);
  print_metric("sync_train_seconds", median(train), 2);
  print_metric("async_eta1_speedup", median(speed1), 3);
  print_metric("async_eta2_speedup", median(speed2), 3);
  print_metric("async_ideal_speedup", median(ideal), 3);
  print_metric("async_eta2_of_ideal", median(of_ideal), 3);
  print_metric("sync_accuracy", mean(acc0), 3);
  print_metric("async_eta1_accuracy", mean(acc1), 3);
  print_metric("async_eta2_accuracy", mean(acc2), 3);
  print_metric("accuracy_seed_std", stddev(acc0), 3);
  return 0;
}

}  // namespace glint::bench
