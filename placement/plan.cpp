#include "placement/plan.hpp"
#include "runtime/text.hpp"

#include <algorithm>
#include <set>

namespace glint::placement {

std::string_view to_string(Strategy s) { return s == Strategy::spread ? "spread" : "pack"; }

Result<Strategy> parse_strategy(std::string_view s) {
  if (s == "pack" || s == "PACK") return Strategy::pack;
  if (s == "spread" || s == "SPREAD") return Strategy::spread;
  return make_error(errc::invalid_argument, "unknown placement strategy '" + std::string{s} + "'; expected pack or spread");
}

Planner::Planner(ClusterResources nodes, PlanOptions opts) : nodes_(std::move(nodes)), opts_(opts) {}

void Planner::release(const std::string& group) {
  for (auto i = gpu_owner_.begin(); i != gpu_owner_.end();)
    i = i->second == group ? gpu_owner_.erase(i) : std::next(i);
  for (auto i = listed_core_owner_.begin(); i != listed_core_owner_.end();)
    i = i->second == group ? listed_core_owner_.erase(i) : std::next(i);
  placed_.erase(group);
  requests_.erase(group);
}

Result<RankSlot> Planner::replace(const std::string& group, int rank, const std::set<int>& lost) {
  auto it = placed_.find(group);
  if (it == placed_.end())
    return make_error(errc::not_found, "group '" + group + "' was not placed by this placement service");
  auto& slots = it->second;
  if (rank < 0 || rank >= static_cast<int>(slots.size()))
    return make_error(errc::invalid_argument, "group '" + group + "' has no rank " + std::to_string(rank) + " (it has " +
                                                  std::to_string(slots.size()) + ")");
  const auto& request = requests_.at(group);
  const RankSlot old = slots[static_cast<size_t>(rank)];
  if (!lost.count(old.node)) return old;  // its node lives (or came back): the same slot
  if (!request.ranks.empty())
    return make_error(errc::failed_precondition,
                      "rank " + std::to_string(rank) + " of group '" + group + "' was put on node " +
                          std::to_string(old.node) + " by its explicit device list, and that node is lost");
  // The live nodes, those holding the fewest of the group's other ranks first.
  std::vector<int> count(nodes_.size(), 0);
  for (size_t r = 0; r < slots.size(); ++r)
    if (static_cast<int>(r) != rank) ++count[static_cast<size_t>(slots[r].node)];
  std::vector<int> order;
  for (int n = 0; n < static_cast<int>(nodes_.size()); ++n)
    if (!lost.count(n)) order.push_back(n);
  if (order.empty()) return make_error(errc::unavailable, "every node of the job is lost");
  std::stable_sort(order.begin(), order.end(),
                   [&](int a, int b) { return count[static_cast<size_t>(a)] < count[static_cast<size_t>(b)]; });
  RankSlot fresh = old;
  fresh.cpus.clear();
  if (old.device >= 0) {
    gpu_owner_.erase({old.node, old.device});
    fresh.node = -1;
    for (int n : order) {
      for (const auto& gpu : nodes_[static_cast<size_t>(n)].gpus)
        if (!gpu_owner_.count({n, gpu.index})) {
          fresh.node = n;
          fresh.device = gpu.index;
          break;
        }
      if (fresh.node >= 0) break;
    }
    if (fresh.node < 0) {
      gpu_owner_[{old.node, old.device}] = group;
      return make_error(errc::resource_exhausted, "no free cuda device on a live node for rank " +
                                                      std::to_string(rank) + " of group '" + group + "'");
    }
    gpu_owner_[{fresh.node, fresh.device}] = group;
  } else {
    fresh.node = order.front();
  }
  // The node's cores that the group's other ranks there are not bound to.
  std::set<int> taken;
  for (size_t r = 0; r < slots.size(); ++r)
    if (static_cast<int>(r) != rank && slots[r].node == fresh.node) taken.insert(slots[r].cpus.begin(), slots[r].cpus.end());
  for (const auto& core : nodes_[static_cast<size_t>(fresh.node)].cores) {
    bool free = true;
    for (int pu : core.pus) free = free && !taken.count(pu);
    if (free) fresh.cpus.insert(fresh.cpus.end(), core.pus.begin(), core.pus.end());
  }
  slots[static_cast<size_t>(rank)] = fresh;
  return fresh;
}

Result<std::vector<RankSlot>> Planner::place(const DeviceGroup& g) {
  if (auto ok = g.validate(); !ok) return ok.error();
  if (placed_.count(g.name))
    return make_error(errc::failed_precondition, "group '" + g.name + "' is already placed; release it first");
  if (nodes_.empty()) return make_error(errc::failed_precondition, "the cluster has no nodes");
  auto slots = g.device_type == DeviceType::cuda ? place_cuda(g) : place_cpu(g);
  if (!slots) return slots;
  assign_cpus(*slots);
  placed_[g.name] = *slots;
  requests_[g.name] = g;
  for (const auto& s : *slots)
    if (s.device >= 0) gpu_owner_[{s.node, s.device}] = g.name;
  if (g.device_type == DeviceType::cpu)
    for (int d : g.ranks) listed_core_owner_[d] = g.name;
  return slots;
}

Result<std::vector<RankSlot>> Planner::place_cuda(const DeviceGroup& g) {
  // Global GPU numbering: node 0's GPUs, then node 1's, ...
  std::vector<std::pair<int, int>> all;
  for (size_t n = 0; n < nodes_.size(); ++n)
    for (const auto& gpu : nodes_[n].gpus) all.emplace_back(static_cast<int>(n), gpu.index);
  std::vector<RankSlot> slots;
  if (!g.ranks.empty()) {
    for (int d : g.ranks) {
      if (d >= static_cast<int>(all.size()))
        return make_error(errc::invalid_argument, "group '" + g.name + "' asks for cuda device " + std::to_string(d) +
                                                      "; the cluster has " + std::to_string(all.size()) + " (0 to " +
                                                      std::to_string(static_cast<int>(all.size()) - 1) + ")");
      auto [node, gpu] = all[static_cast<size_t>(d)];
      if (auto o = gpu_owner_.find({node, gpu}); o != gpu_owner_.end())
        return make_error(errc::invalid_argument, "groups '" + g.name + "' and '" + o->second + "' both claim cuda device " +
                                                      std::to_string(d) + "; give them disjoint devices");
      RankSlot s;
      s.node = node;
      s.device = gpu;
      slots.push_back(s);
    }
    return slots;
  }
  std::vector<std::vector<int>> free(nodes_.size());
  size_t nfree = 0;
  for (auto [node, gpu] : all)
    if (!gpu_owner_.count({node, gpu})) {
      free[static_cast<size_t>(node)].push_back(gpu);
      ++nfree;
    }
  if (nfree < static_cast<size_t>(g.size())) {
    std::string msg = "group '" + g.name + "' needs " + std::to_string(g.size()) + " cuda devices; the cluster has " +
                      std::to_string(all.size());
    if (nfree != all.size()) {
      std::set<std::string> owners;
      for (const auto& [k, owner] : gpu_owner_) owners.insert("'" + owner + "'");
      auto who = join(owners);
      msg += " (" + std::to_string(nfree) + " free; the rest belong to group" + (owners.size() == 1 ? " " : "s ") + who + ")";
    }
    return make_error(errc::resource_exhausted, msg);
  }
  std::vector<size_t> next(nodes_.size(), 0);
  size_t node = 0;
  for (int r = 0; r < g.size(); ++r) {
    if (opts_.strategy == Strategy::pack) {
      while (next[node] >= free[node].size()) ++node;
    } else {
      while (next[node] >= free[node].size()) node = (node + 1) % nodes_.size();
    }
    RankSlot s;
    s.node = static_cast<int>(node);
    s.device = free[node][next[node]++];
    slots.push_back(s);
    if (opts_.strategy == Strategy::spread) node = (node + 1) % nodes_.size();
  }
  return slots;
}

Result<std::vector<RankSlot>> Planner::place_cpu(const DeviceGroup& g) {
  std::vector<std::pair<int, int>> all;  // global core numbering
  for (size_t n = 0; n < nodes_.size(); ++n)
    for (size_t c = 0; c < nodes_[n].cores.size(); ++c) all.emplace_back(static_cast<int>(n), static_cast<int>(c));
  if (all.empty()) return make_error(errc::failed_precondition, "the cluster reports no cpu cores");
  std::vector<RankSlot> slots;
  if (!g.ranks.empty()) {
    for (int d : g.ranks) {
      if (d >= static_cast<int>(all.size()))
        return make_error(errc::invalid_argument, "group '" + g.name + "' asks for cpu core " + std::to_string(d) +
                                                      "; the cluster has " + std::to_string(all.size()));
      if (auto o = listed_core_owner_.find(d); o != listed_core_owner_.end())
        return make_error(errc::invalid_argument, "groups '" + g.name + "' and '" + o->second + "' both list cpu core " +
                                                      std::to_string(d) + "; give them disjoint devices");
      RankSlot s;
      s.node = all[static_cast<size_t>(d)].first;
      s.cpus = nodes_[static_cast<size_t>(s.node)].cores[static_cast<size_t>(all[static_cast<size_t>(d)].second)].pus;
      slots.push_back(s);
    }
    return slots;
  }
  if (static_cast<size_t>(g.size()) > all.size() && !opts_.allow_cpu_oversubscribe)
    return make_error(errc::resource_exhausted, "group '" + g.name + "' needs " + std::to_string(g.size()) +
                                                    " cpu cores; the cluster has " + std::to_string(all.size()) +
                                                    " (allow oversubscription to share cores)");
  // pack: fill each node up to its core count before the next, wrapping
  // around when oversubscribed; spread: round-robin over nodes.
  std::vector<int> used(nodes_.size(), 0);
  size_t node = 0;
  for (int r = 0; r < g.size(); ++r) {
    RankSlot s;
    if (opts_.strategy == Strategy::pack) {
      size_t tries = 0;
      while (used[node] >= static_cast<int>(nodes_[node].cores.size()) && tries++ < nodes_.size())
        node = (node + 1) % nodes_.size();
      if (tries > nodes_.size()) {  // every node full: oversubscribe, again from node 0
        std::fill(used.begin(), used.end(), 0);
        node = 0;
      }
    }
    s.node = static_cast<int>(node);
    ++used[node];
    slots.push_back(s);
    if (opts_.strategy == Strategy::spread) node = (node + 1) % nodes_.size();
  }
  return slots;
}

void Planner::assign_cpus(std::vector<RankSlot>& slots) const {
  for (size_t n = 0; n < nodes_.size(); ++n) {
    std::vector<RankSlot*> here;
    for (auto& s : slots)
      if (s.node == static_cast<int>(n) && s.cpus.empty()) here.push_back(&s);
    const auto& cores = nodes_[n].cores;
    if (here.empty() || cores.empty()) continue;
    std::vector<const Core*> order;
    if (here.size() > cores.size() || here.front()->device < 0) {
      for (const auto& c : cores) order.push_back(&c);
    } else {
      // GPU ranks: prefer cores on the GPU's NUMA node by listing those first.
      for (const auto& c : cores) order.push_back(&c);
      std::stable_sort(order.begin(), order.end(), [&](const Core* a, const Core* b) { return a->numa < b->numa; });
    }
    size_t k = here.size(), m = order.size();
    for (size_t i = 0; i < k; ++i) {
      size_t begin = k <= m ? i * m / k : i % m;
      size_t end = k <= m ? (i + 1) * m / k : begin + 1;
      for (size_t c = begin; c < end; ++c)
        here[i]->cpus.insert(here[i]->cpus.end(), order[c]->pus.begin(), order[c]->pus.end());
    }
  }
}

Result<void> apply_mesh(const std::string& group, const DeviceMesh& mesh, std::vector<RankSlot>& slots) {
  if (mesh.world_size() != static_cast<int>(slots.size()))
    return make_error(errc::invalid_argument, "group '" + group + "' has " + std::to_string(slots.size()) +
                                                  " ranks but its mesh " + mesh.describe() + " needs " +
                                                  std::to_string(mesh.world_size()));
  for (size_t r = 0; r < slots.size(); ++r) {
    slots[r].dp_rank = mesh.data_rank(static_cast<int>(r));
    slots[r].dp_size = mesh.data_size();
    slots[r].mesh = mesh.sizes();
  }
  return {};
}

Result<std::map<std::string, std::vector<RankSlot>>> plan_all(const ClusterResources& nodes,
                                                              const std::vector<GroupRequest>& groups,
                                                              PlanOptions opts) {
  Planner p{nodes, opts};
  std::map<std::string, std::vector<RankSlot>> out;
  // Explicit device lists first, so counted groups take what is left.
  std::vector<const GroupRequest*> order;
  for (const auto& g : groups) order.push_back(&g);
  std::stable_sort(order.begin(), order.end(),
                   [](auto* a, auto* b) { return !a->group.ranks.empty() && b->group.ranks.empty(); });
  for (const auto* g : order) {
    if (out.count(g->group.name))
      return make_error(errc::invalid_argument, "two groups are named '" + g->group.name + "'");
    auto slots = p.place(g->group);
    if (!slots) return slots.error();
    if (auto ok = apply_mesh(g->group.name, g->mesh, *slots); !ok) return ok.error();
    out[g->group.name] = std::move(*slots);
  }
  return out;
}

std::string describe_plan(const ClusterResources& nodes, const std::vector<GroupRequest>& groups,
                          const std::map<std::string, std::vector<RankSlot>>& plan) {
  std::string out;
  for (const auto& g : groups) {
    auto i = plan.find(g.group.name);
    if (i == plan.end()) continue;
    out += "group '" + g.group.name + "': " + std::to_string(g.group.size()) + " " +
           std::string{to_string(g.group.device_type)} + " ranks, mesh " + g.mesh.describe() + "\n";
    for (size_t r = 0; r < i->second.size(); ++r) {
      const auto& s = i->second[r];
      auto cpus = join(s.cpus, ",");
      out += "  rank " + std::to_string(r) + " -> node " + std::to_string(s.node) + " (" +
             nodes[static_cast<size_t>(s.node)].host + ")" +
             (s.device >= 0 ? ", cuda:" + std::to_string(s.device) : std::string{", cpu"}) + ", cpus " +
             (cpus.empty() ? std::string{"-"} : cpus) + ", dp " + std::to_string(s.dp_rank) + "/" +
             std::to_string(s.dp_size) + "\n";
    }
  }
  return out;
}

}  // namespace glint::placement
