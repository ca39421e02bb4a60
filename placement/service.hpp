#pragma once
/// The placement service: an actor on the driver that knows every node's
/// resources and hands out rank slots, so groups spawned one after another
/// never fight over a GPU. `spawn_group` is how drivers create components:
///
///   auto model = glint::placement::spawn_group<probe_actor>(
///       rt, DeviceGroup::of("model", 2), *DeviceMesh::from_sizes({.dp = 2}), "glint.probe");
///
/// The service starts on first use: it asks each node process for its
/// hardware (a short-lived topology actor spawned there), takes that
/// process's share of the machine (processes on one machine split it by local
/// rank) and plans with the runtime's strategy.

#include "placement/config.hpp"
#include "placement/plan.hpp"
#include "runtime/group.hpp"
#include "runtime/registry.hpp"
#include "runtime/runtime.hpp"

#include <caf/replies_to.hpp>
#include <caf/stateful_actor.hpp>
#include <caf/typed_actor.hpp>
#include <caf/typed_event_based_actor.hpp>

namespace glint::placement {

using place_atom = caf::atom_constant<caf::atom("gl_place")>;
using release_atom = caf::atom_constant<caf::atom("gl_release")>;
using topology_atom = caf::atom_constant<caf::atom("gl_topo")>;
using replace_atom = caf::atom_constant<caf::atom("gl_replac")>;

/// Node indexes, for replace_atom (the lost ones).
using NodeSet = std::vector<int32_t>;

using placement_actor = caf::typed_actor<caf::replies_to<place_atom, DeviceGroup>::with<std::vector<RankSlot>>,
                                         caf::replies_to<release_atom, std::string>::with<bool>,
                                         caf::replies_to<replace_atom, std::string, int32_t, NodeSet>::with<std::vector<RankSlot>>,
                                         caf::replies_to<topology_atom>::with<std::vector<MachineTopology>>>;

/// Runs on each node: answers that node's share of its machine.
using topology_actor = caf::typed_actor<caf::replies_to<topology_atom>::with<MachineTopology>>;
topology_actor::behavior_type topology_probe(topology_actor::pointer self, RankContext ctx);

GLINT_REGISTRATIONS(placement_service);

/// The runtime's placement service, started on first use with `opts`
/// (later calls ignore `opts`).
Result<placement_actor> service(Runtime& rt, PlanOptions opts = {});

/// The resources of every node, as the service sees them.
Result<ClusterResources> cluster_resources(Runtime& rt);

/// Slots for `group`, dp coordinates from `mesh`.
Result<std::vector<RankSlot>> place(Runtime& rt, const DeviceGroup& group, const DeviceMesh& mesh);

/// A new slot for rank `rank` of `group`, placed earlier through the service,
/// planned again with the nodes the runtime counts lost left out (Planner::
/// replace): a supervised group respawns a lost rank there. `not_found` when
/// the service did not place the group (a group spawned by hand, or placed
/// before the service was dropped).
Result<RankSlot> replace(Runtime& rt, const std::string& group, int rank);

/// Places `group` and spawns one `type` actor per rank, each bound to its cpus.
template <class Handle, class... Args>
Result<Group<Handle>> spawn_group(Runtime& rt, const DeviceGroup& group, const DeviceMesh& mesh,
                                  const std::string& type, const Args&... args) {
  auto slots = place(rt, group, mesh);
  if (!slots) return slots.error();
  return Group<Handle>::spawn(rt, group.name, type, std::move(*slots), args...);
}

/// With a mesh of dp = group size.
template <class Handle, class... Args>
Result<Group<Handle>> spawn_group(Runtime& rt, const DeviceGroup& group, const std::string& type,
                                  const Args&... args) {
  auto mesh = DeviceMesh::from_sizes({.dp = std::max(1, group.size())});
  if (!mesh) return mesh.error();
  return spawn_group<Handle>(rt, group, *mesh, type, args...);
}

}  // namespace glint::placement
