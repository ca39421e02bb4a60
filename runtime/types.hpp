#pragma once
/// The small plain values and atoms of the runtime's own protocol.

#include <caf/atom.hpp>
#include <caf/meta/type_name.hpp>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace glint {

/// What a rank actor knows about itself; the first argument of every glint
/// actor function. Set by the placement of its group.
struct RankContext {
  std::string group;         ///< the device group's name
  int rank = 0;              ///< rank within the group
  int world_size = 1;        ///< ranks in the group
  int node = 0;              ///< process (node) index hosting this rank
  int device = -1;           ///< accelerator index on that node; -1 for CPU
  std::vector<int> cpus;     ///< OS CPU ids the actor's thread is bound to (empty: unbound)
  int dp_rank = 0;           ///< data-parallel coordinate in the group's mesh
  int dp_size = 1;           ///< data-parallel size of the group's mesh
  /// The group's mesh: its sizes by placement::Dim (pp, dp, fsdp, ep, cp,
  /// tp); empty: data parallel only, over dp_size. A component finds the
  /// other dimensions' groups from it and `rank`.
  std::vector<int32_t> mesh{};
  friend bool operator==(const RankContext&, const RankContext&) = default;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, RankContext& x) {
  return f(caf::meta::type_name("glint.rank_context"), x.group, x.rank, x.world_size, x.node, x.device, x.cpus,
           x.dp_rank, x.dp_size, x.mesh);
}

/// Where a rank should live: the output of placement.
/// Named numbers that calls answer and groups average: losses, gradient
/// norms, learning rates (registered as "glint.metrics").
using Metrics = std::map<std::string, double>;

struct RankSlot {
  int node = 0;
  int device = -1;
  std::vector<int> cpus;
  int dp_rank = 0;
  int dp_size = 1;
  std::vector<int32_t> mesh{};  ///< as RankContext::mesh
  friend bool operator==(const RankSlot&, const RankSlot&) = default;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, RankSlot& x) {
  return f(caf::meta::type_name("glint.rank_slot"), x.node, x.device, x.cpus, x.dp_rank, x.dp_size, x.mesh);
}

/// A node process introducing itself to the driver.
struct NodeHello {
  int process_rank = 0;
  int node_rank = 0;
  int local_rank = 0;
  int local_world_size = 1;
  std::string host;
  int32_t pid = 0;
  int cores = 0;
  /// The address the driver and the other processes reach this one by (its
  /// route to the driver); empty where it could not be found.
  std::string address;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, NodeHello& x) {
  return f(caf::meta::type_name("glint.node_hello"), x.process_rank, x.node_rank, x.local_rank, x.local_world_size,
           x.host, x.pid, x.cores, x.address);
}

// Atoms of the runtime protocol (CAF 0.17 atoms: at most 10 characters).
using join_atom = caf::atom_constant<caf::atom("gl_join")>;
using shutdown_atom = caf::atom_constant<caf::atom("gl_down")>;
using hello_atom = caf::atom_constant<caf::atom("gl_hello")>;

}  // namespace glint
