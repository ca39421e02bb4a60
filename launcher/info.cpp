#include "actors/probe.hpp"
#include "runtime/text.hpp"
#include "components/version.hpp"
#include "launcher/commands.hpp"
#include "placement/config.hpp"
#include "placement/service.hpp"
#include "runtime/group.hpp"

#include <caf/config.hpp>

#include <cstdio>

namespace glint::launcher {

namespace {

std::string caf_version() {
  int v = CAF_VERSION;
  return std::to_string(v / 10000) + "." + std::to_string(v / 100 % 100) + "." + std::to_string(v % 100);
}

}  // namespace

int info(const InfoArgs& args) {
  std::printf("glint 0.1.0: CAF %s, LibTorch %s, hwloc %s\n", caf_version().c_str(),
              components::torch_version().c_str(), placement::hwloc_version().c_str());
  auto topo = placement::discover_topology();
  if (!topo) {
    std::fprintf(stderr, "glint info: %s\n", describe(topo.error()).c_str());
    return 1;
  }
  std::printf("machine %s\n", topo->describe().c_str());
  auto types = join(ActorTypes::global().names());
  std::printf("actor types: %s\n", types.c_str());

  if (!args.config.empty()) {
    auto cfg = placement::JobConfig::load(args.config);
    if (!cfg) {
      std::fprintf(stderr, "glint info: %s\n", describe(cfg.error()).c_str());
      return 2;
    }
    if (args.nproc < 1) {
      std::fprintf(stderr, "glint info: --nproc must be at least 1\n");
      return 2;
    }
    placement::ClusterResources nodes;
    for (int i = 0; i < args.nproc; ++i) nodes.push_back(placement::share_of(*topo, i, args.nproc));
    auto plan = placement::plan_all(nodes, cfg->groups, cfg->options);
    std::printf("\nplacement plan for %s on %d process%s of this machine (strategy %s):\n", args.config.c_str(),
                args.nproc, args.nproc == 1 ? "" : "es", std::string{placement::to_string(cfg->options.strategy)}.c_str());
    if (!plan) {
      std::printf("  refused: %s\n", describe(plan.error()).c_str());
      return 3;
    }
    std::printf("%s", placement::describe_plan(nodes, cfg->groups, *plan).c_str());
  }

  if (args.probe) {
    auto rc = run_main([](Runtime& rt) {
      int n = rt.num_nodes();
      auto g = placement::spawn_group<actors::probe_actor>(rt, placement::DeviceGroup::of("probe", n),
                                                           actors::probe_type);
      if (!g) {
        std::fprintf(stderr, "glint info: %s\n", describe(g.error()).c_str());
        return 1;
      }
      auto where = g->call<Collect::flatten>(Dispatch::all, actors::where_atom::value).get();
      if (!where) {
        std::fprintf(stderr, "glint info: %s\n", describe(where.error()).c_str());
        return 1;
      }
      std::printf("\nprobes (%s mode, %d process%s):\n", std::string{to_string(rt.mode())}.c_str(), n,
                  n == 1 ? "" : "es");
      for (const auto& w : *where) {
        auto cpus = join(w.bound_cpus, ",");
        std::printf("  rank %d on node %d: %s pid %d, bound to cpus %s\n", w.ctx.rank, w.ctx.node, w.host.c_str(),
                    w.pid, cpus.c_str());
      }
      return 0;
    });
    if (rc != 0) return rc;
  }
  return 0;
}

}  // namespace glint::launcher
