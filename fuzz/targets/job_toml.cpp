// The job TOML (placement::JobConfig::parse, as `glint info --config` reads
// it): a config that parses is planned onto two synthetic machines.
#include "common.hpp"

#include "placement/config.hpp"

using namespace glint;
using namespace glint::placement;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > fuzz::kMaxInputBytes) return 0;
  auto cfg = JobConfig::parse(fuzz::text_of(data, size), "fuzz/job.toml");
  if (!cfg) {
    (void)describe(cfg.error());
    return 0;
  }
  // Planning is linear in the ranks; a job of millions of ranks is valid
  // but not worth a fuzz iteration.
  int64_t ranks = 0;
  for (const auto& g : cfg->groups) {
    GLINT_FUZZ_CHECK(g.group.validate(), g.group.name);
    GLINT_FUZZ_CHECK(g.mesh.world_size() == g.group.size(), g.group.name + ": mesh and group sizes differ");
    ranks += g.group.size();
  }
  if (ranks > 4096) return 0;
  static const ClusterResources nodes = {synthetic_topology("n0", 8, 2), synthetic_topology("n1", 4, 1, 2)};
  auto plan = plan_all(nodes, cfg->groups, cfg->options);
  if (!plan) {
    (void)describe(plan.error());
    return 0;
  }
  (void)describe_plan(nodes, cfg->groups, *plan);
  return 0;
}
