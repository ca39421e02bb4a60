#pragma once
/// Placement planning: which node, device and cpus each rank of each device
/// group gets. A pure function of the cluster's resources and the requests,
/// so it is tested without processes; the placement service actor wraps it.
///
/// Rules:
/// - cuda ranks each get a GPU of their own; groups never share a GPU. An
///   explicit device list names global GPU indices (node 0's GPUs first).
/// - cpu ranks get cores. Ranks of one group on one node split that node's
///   cores evenly; different groups may share cores (model and sampler groups
///   usually take turns). With `allow_cpu_oversubscribe` (the default) a group
///   larger than the cluster's cores wraps around; without it, it is refused.
/// - Explicit device lists of two groups must not overlap, cpu or cuda.
/// - pack fills node 0 first, then node 1, ...; spread deals ranks round-robin.
/// A refusal says what was asked and what there is.

#include "placement/device_mesh.hpp"
#include "placement/topology.hpp"
#include "runtime/types.hpp"

#include <map>
#include <set>
#include <string>
#include <vector>

namespace glint::placement {

enum class Strategy : uint8_t { pack, spread };
std::string_view to_string(Strategy s);
Result<Strategy> parse_strategy(std::string_view s);

struct PlanOptions {
  Strategy strategy = Strategy::pack;
  bool allow_cpu_oversubscribe = true;
};

/// The resources of each node (process) of the job, in node order.
using ClusterResources = std::vector<MachineTopology>;

/// Stateful planner: remembers the GPUs taken by earlier groups.
class Planner {
public:
  Planner(ClusterResources nodes, PlanOptions opts);

  /// Places one group; its slots are in rank order (dp coordinates unset).
  Result<std::vector<RankSlot>> place(const DeviceGroup& g);
  /// Frees a group's GPUs.
  void release(const std::string& group);
  /// A new slot for rank `rank` of placed group `group`, whose node is in
  /// `lost` or whose actor died (a supervised group respawning it): its own
  /// slot when its node is not lost; else the live node holding the fewest
  /// of the group's ranks (the lowest such node), on a free GPU of it for a
  /// cuda group, bound to the node's cores the group's other ranks there
  /// do not hold (unbound when they hold them all). Frees the old GPU. A
  /// rank that an explicit device list put on a lost node is not moved.
  Result<RankSlot> replace(const std::string& group, int rank, const std::set<int>& lost);

  const ClusterResources& nodes() const { return nodes_; }
  const PlanOptions& options() const { return opts_; }

private:
  Result<std::vector<RankSlot>> place_cuda(const DeviceGroup& g);
  Result<std::vector<RankSlot>> place_cpu(const DeviceGroup& g);
  /// Gives each rank on a node its slice of that node's cores.
  void assign_cpus(std::vector<RankSlot>& slots) const;

  ClusterResources nodes_;
  PlanOptions opts_;
  std::map<std::pair<int, int>, std::string> gpu_owner_;  // (node, gpu) -> group
  std::map<int, std::string> listed_core_owner_;          // global core -> group that listed it
  std::map<std::string, std::vector<RankSlot>> placed_;
  std::map<std::string, DeviceGroup> requests_;  // what each placed group asked for
};

/// Places every group at once; the result maps group name to slots, with
/// each rank's data-parallel coordinate from its mesh.
struct GroupRequest {
  DeviceGroup group;
  DeviceMesh mesh;
};
Result<std::map<std::string, std::vector<RankSlot>>> plan_all(const ClusterResources& nodes,
                                                              const std::vector<GroupRequest>& groups,
                                                              PlanOptions opts);

/// Sets dp coordinates from the mesh; the group and mesh sizes must agree.
Result<void> apply_mesh(const std::string& group, const DeviceMesh& mesh, std::vector<RankSlot>& slots);

/// A table for `glint info`.
std::string describe_plan(const ClusterResources& nodes, const std::vector<GroupRequest>& groups,
                          const std::map<std::string, std::vector<RankSlot>>& plan);

}  // namespace glint::placement
