#pragma once
/// What a machine has, read with hwloc: NUMA nodes, cores (with the OS ids of
/// their hardware threads) and NVIDIA GPUs. Only cpus this process may use are
/// listed. hwloc stays inside topology.cpp.

#include "runtime/error.hpp"

#include <caf/meta/type_name.hpp>

#include <string>
#include <vector>

namespace glint::placement {

struct Core {
  int numa = 0;           ///< NUMA node index
  std::vector<int> pus;   ///< OS ids of the core's hardware threads
  friend bool operator==(const Core&, const Core&) = default;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, Core& x) {
  return f(caf::meta::type_name("glint.core"), x.numa, x.pus);
}

struct Gpu {
  int index = 0;          ///< CUDA-style index on this machine
  std::string pci;        ///< bus id, e.g. "0000:3b:00.0"
  std::string name;
  int numa = -1;
  friend bool operator==(const Gpu&, const Gpu&) = default;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, Gpu& x) {
  return f(caf::meta::type_name("glint.gpu"), x.index, x.pci, x.name, x.numa);
}

struct MachineTopology {
  std::string host;
  int numa_nodes = 1;
  std::vector<Core> cores;
  std::vector<Gpu> gpus;

  int num_pus() const;
  /// A few lines for `glint info`.
  std::string describe() const;
  friend bool operator==(const MachineTopology&, const MachineTopology&) = default;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, MachineTopology& x) {
  return f(caf::meta::type_name("glint.machine_topology"), x.host, x.numa_nodes, x.cores, x.gpus);
}

/// hwloc's version, e.g. "2.9.0".
std::string hwloc_version();

/// Reads this machine's topology.
Result<MachineTopology> discover_topology();

/// A synthetic machine for tests and planning: `cores` single-thread cores
/// split evenly over `numa` nodes, and `gpus` GPUs.
MachineTopology synthetic_topology(std::string host, int cores, int gpus = 0, int numa = 1);

/// The part of a machine that process `local_rank` of `local_world_size`
/// processes on it owns: a contiguous slice of its cores and every
/// local_world_size-th GPU (as torchrun gives LOCAL_RANK its GPU).
MachineTopology share_of(const MachineTopology& m, int local_rank, int local_world_size);

}  // namespace glint::placement
