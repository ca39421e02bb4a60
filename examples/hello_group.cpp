// The README's driver: a group of two ranks, each summing its data-parallel
// half of a vector. Runs alone (local mode) or under `glint run --nproc 2`.
#include "actors/probe_group.hpp"
#include "placement/service.hpp"

#include <cstdio>

int main() {
  return glint::run_main([](glint::Runtime& rt) {
    using namespace glint;
    auto mesh = placement::DeviceMesh::from_sizes({.dp = 2});
    if (!mesh) {
      std::fprintf(stderr, "%s\n", describe(mesh.error()).c_str());
      return 1;
    }
    auto group = actors::open_probe_group(rt, placement::DeviceGroup::of("workers", 2), *mesh);
    if (!group) {
      std::fprintf(stderr, "%s\n", describe(group.error()).c_str());
      return 1;
    }
    // Each data-parallel rank sums its half; the answers are added up.
    Future<int64_t> total = group->sum({1, 2, 3, 4, 5, 6});
    auto r = total.get();
    std::printf("%s\n", r ? std::to_string(*r).c_str() : describe(r.error()).c_str());
    return r ? 0 : 1;
  });
}
