#include "placement/topology.hpp"
#include "runtime/text.hpp"

#include <hwloc.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <memory>

namespace glint::placement {

int MachineTopology::num_pus() const {
  int n = 0;
  for (const auto& c : cores) n += static_cast<int>(c.pus.size());
  return n;
}

std::string MachineTopology::describe() const {
  std::string out = host + ": " + std::to_string(numa_nodes) + " NUMA node" + (numa_nodes == 1 ? "" : "s") + ", " +
                    std::to_string(cores.size()) + " core" + (cores.size() == 1 ? "" : "s") + ", " +
                    std::to_string(num_pus()) + " hardware thread" + (num_pus() == 1 ? "" : "s") + ", " +
                    std::to_string(gpus.size()) + " GPU" + (gpus.size() == 1 ? "" : "s");
  for (int n = 0; n < numa_nodes; ++n) {
    std::vector<int> ids;
    for (const auto& c : cores)
      if (c.numa == n) ids.insert(ids.end(), c.pus.begin(), c.pus.end());
    auto pus = join(ids, ",");
    out += "\n  numa " + std::to_string(n) + ": cpus " + (pus.empty() ? std::string{"-"} : pus);
  }
  for (const auto& g : gpus)
    out += "\n  gpu " + std::to_string(g.index) + ": " + g.name + " (" + g.pci + ", numa " + std::to_string(g.numa) + ")";
  return out;
}

namespace {

struct TopologyDeleter {
  void operator()(hwloc_topology* t) const { hwloc_topology_destroy(t); }
};

int numa_of(hwloc_obj_t obj) {
  if (!obj || !obj->nodeset) return 0;
  int first = hwloc_bitmap_first(obj->nodeset);
  return first < 0 ? 0 : first;
}

}  // namespace

std::string hwloc_version() {
  unsigned v = hwloc_get_api_version();
  return std::to_string(v >> 16) + "." + std::to_string((v >> 8) & 0xff) + "." + std::to_string(v & 0xff);
}

Result<MachineTopology> discover_topology() {
  hwloc_topology_t raw = nullptr;
  if (hwloc_topology_init(&raw) != 0) return make_error(errc::internal, "hwloc_topology_init failed");
  std::unique_ptr<hwloc_topology, TopologyDeleter> topo{raw};
  hwloc_topology_set_io_types_filter(raw, HWLOC_TYPE_FILTER_KEEP_IMPORTANT);
  if (hwloc_topology_load(raw) != 0)
    return make_error(errc::unavailable, "hwloc could not read this machine's topology");
  MachineTopology m;
  char host[256] = {0};
  gethostname(host, sizeof(host) - 1);
  m.host = host;
  m.numa_nodes = std::max(1, hwloc_get_nbobjs_by_type(raw, HWLOC_OBJ_NUMANODE));
  int ncores = hwloc_get_nbobjs_by_type(raw, HWLOC_OBJ_CORE);
  for (int i = 0; i < ncores; ++i) {
    auto* core = hwloc_get_obj_by_type(raw, HWLOC_OBJ_CORE, static_cast<unsigned>(i));
    Core c;
    c.numa = numa_of(core);
    unsigned id = 0;
    hwloc_bitmap_foreach_begin(id, core->cpuset) { c.pus.push_back(static_cast<int>(id)); }
    hwloc_bitmap_foreach_end();
    if (!c.pus.empty()) m.cores.push_back(std::move(c));
  }
  if (m.cores.empty()) {
    // Some VMs report no cores: fall back to one core per hardware thread.
    int npus = hwloc_get_nbobjs_by_type(raw, HWLOC_OBJ_PU);
    for (int i = 0; i < npus; ++i) {
      auto* pu = hwloc_get_obj_by_type(raw, HWLOC_OBJ_PU, static_cast<unsigned>(i));
      m.cores.push_back(Core{numa_of(pu), {static_cast<int>(pu->os_index)}});
    }
  }
  // NVIDIA GPUs: PCI class 0x0300 (VGA) or 0x0302 (3D) from vendor 0x10de.
  for (hwloc_obj_t pci = hwloc_get_next_pcidev(raw, nullptr); pci; pci = hwloc_get_next_pcidev(raw, pci)) {
    const auto& a = pci->attr->pcidev;
    if (a.vendor_id != 0x10de || (a.class_id != 0x0300 && a.class_id != 0x0302)) continue;
    Gpu g;
    g.index = static_cast<int>(m.gpus.size());
    char bus[32];
    std::snprintf(bus, sizeof(bus), "%04x:%02x:%02x.%01x", a.domain, a.bus, a.dev, a.func);
    g.pci = bus;
    g.name = pci->name ? pci->name : "NVIDIA GPU";
    auto* anc = hwloc_get_non_io_ancestor_obj(raw, pci);
    g.numa = numa_of(anc);
    m.gpus.push_back(std::move(g));
  }
  return m;
}

MachineTopology synthetic_topology(std::string host, int cores, int gpus, int numa) {
  MachineTopology m;
  m.host = std::move(host);
  m.numa_nodes = std::max(1, numa);
  for (int i = 0; i < cores; ++i) m.cores.push_back(Core{i * m.numa_nodes / std::max(1, cores), {i}});
  for (int i = 0; i < gpus; ++i) m.gpus.push_back(Gpu{i, "synthetic:" + std::to_string(i), "GPU", i * m.numa_nodes / gpus});
  return m;
}

MachineTopology share_of(const MachineTopology& m, int local_rank, int local_world_size) {
  if (local_world_size <= 1) return m;
  MachineTopology s = m;
  s.cores.clear();
  s.gpus.clear();
  int n = static_cast<int>(m.cores.size());
  if (n >= local_world_size) {
    int begin = local_rank * n / local_world_size, end = (local_rank + 1) * n / local_world_size;
    s.cores.assign(m.cores.begin() + begin, m.cores.begin() + end);
  } else if (n > 0) {
    s.cores.push_back(m.cores[static_cast<size_t>(local_rank % n)]);
  }
  for (const auto& g : m.gpus)
    if (g.index % local_world_size == local_rank) s.gpus.push_back(g);
  return s;
}

}  // namespace glint::placement
