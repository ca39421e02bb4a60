// The README's driver: a group of two ranks, each summing its data-parallel
// half of a vector. Runs alone (local mode) or under `glint run --nproc 2`.
#include "actors/probe.hpp"
#include "placement/service.hpp"

#include <cstdio>

int main() {
  return glint::run_main([](glint::Runtime& rt) {
    using namespace glint;
    auto mesh = *placement::DeviceMesh::from_sizes({.dp = 2});
    auto group = placement::spawn_group<actors::probe_actor>(rt, placement::DeviceGroup::of("workers", 2), mesh,
                                                             actors::probe_type);
    if (!group) {
      std::fprintf(stderr, "%s\n", describe(group.error()).c_str());
      return 1;
    }
    std::vector<int64_t> xs{1, 2, 3, 4, 5, 6};
    Future<int64_t> total = group->call<Collect::sum>(Dispatch::slice_dp, actors::sum_atom::value, xs);
    auto r = total.get();
    std::printf("%s\n", r ? std::to_string(*r).c_str() : describe(r.error()).c_str());
    return r ? 0 : 1;
  });
}
