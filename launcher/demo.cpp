#include "actors/probe.hpp"
#include "runtime/text.hpp"
#include "launcher/commands.hpp"
#include "runtime/progress.hpp"
#include "placement/service.hpp"
#include "runtime/group.hpp"

#include <cstdio>
#include <random>

namespace glint::launcher {

int demo(const DemoArgs& args) {
  return run_main([&](Runtime& rt) -> int {
    auto fail = [](const caf::error& e) {
      std::fprintf(stderr, "glint demo: %s\n", describe(e).c_str());
      return 1;
    };
    std::printf("glint demo: %s mode, %d process%s, a group of %d ranks\n", std::string{to_string(rt.mode())}.c_str(),
                rt.num_nodes(), rt.num_nodes() == 1 ? "" : "es", args.ranks);
    auto svc = placement::service(rt, {.strategy = placement::Strategy::spread});
    if (!svc) return fail(svc.error());
    auto mesh = placement::DeviceMesh::from_sizes({.dp = args.ranks});
    if (!mesh) return fail(mesh.error());
    auto g = placement::spawn_group<actors::probe_actor>(rt, placement::DeviceGroup::of("workers", args.ranks), *mesh,
                                                         actors::probe_type);
    if (!g) return fail(g.error());
    auto where = g->call<Collect::flatten>(Dispatch::all, actors::where_atom::value).get();
    if (!where) return fail(where.error());
    for (const auto& w : *where) {
      auto cpus = join(w.bound_cpus, ",");
      std::printf("  rank %d: node %d (%s, pid %d), cpus %s, dp %d/%d\n", w.ctx.rank, w.ctx.node, w.host.c_str(), w.pid,
                  cpus.c_str(), w.ctx.dp_rank, w.ctx.dp_size);
    }
    // Each step slices a batch over the data-parallel ranks; each rank adds
    // its slice into a running sum. The driver checks the totals.
    constexpr int rows = 64, cols = 256;
    std::mt19937 gen{1234};
    std::normal_distribution<float> normal;
    std::vector<double> expected(static_cast<size_t>(cols), 0.0);
    Progress bar{"steps", args.steps};
    Tensor totals;
    auto start = std::chrono::steady_clock::now();
    for (int step = 0; step < args.steps; ++step) {
      std::vector<float> v(static_cast<size_t>(rows * cols));
      for (auto& x : v) x = normal(gen);
      auto batch = Tensor::from_values(v, {rows, cols});
      if (!batch) return fail(batch.error());
      // Every rank's slice sum is a [rows/ranks, cols] tensor; add them all up.
      auto sums = g->call<Collect::flatten>(Dispatch::slice_dp, actors::accumulate_atom::value, *batch).get();
      if (!sums) return fail(sums.error());
      totals = *sums;
      for (int r = 0; r < rows; ++r)
        for (int c = 0; c < cols; ++c) expected[static_cast<size_t>(c)] += v[static_cast<size_t>(r * cols + c)];
      bar.update(step + 1);
    }
    double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    bar.finish();
    // totals holds every rank's running sum of its rows, concatenated; fold the rows.
    std::vector<double> got(static_cast<size_t>(cols), 0.0);
    auto tv = totals.values<float>();
    if (!tv) return fail(tv.error());
    for (size_t i = 0; i < tv->size(); ++i) got[i % cols] += (*tv)[i];
    double worst = 0;
    for (int c = 0; c < cols; ++c) worst = std::max(worst, std::abs(got[static_cast<size_t>(c)] - expected[static_cast<size_t>(c)]));
    std::printf("%d steps in %.3f s (%.0f group calls/s); largest deviation from the driver's own sum: %.2e -> %s\n",
                args.steps, secs, args.steps / secs, worst, worst < 1e-2 ? "ok" : "MISMATCH");
    return worst < 1e-2 ? 0 : 1;
  });
}

}  // namespace glint::launcher
