#include "placement/service.hpp"

#include <caf/scoped_actor.hpp>
#include <caf/stateful_actor.hpp>
#include <caf/typed_event_based_actor.hpp>

namespace glint::placement {

namespace {

struct ServiceState {
  std::unique_ptr<Planner> planner;
  static inline const char* name = "glint.placement";
};

placement_actor::behavior_type service_fn(placement_actor::stateful_pointer<ServiceState> self,
                                          ClusterResources nodes, PlanOptions opts) {
  self->state.planner = std::make_unique<Planner>(std::move(nodes), opts);
  return {
      [self](place_atom, const DeviceGroup& g) -> caf::result<std::vector<RankSlot>> {
        auto slots = self->state.planner->place(g);
        if (!slots) return slots.error();
        return std::move(*slots);
      },
      [self](release_atom, const std::string& name) {
        self->state.planner->release(name);
        return true;
      },
      [self](replace_atom, const std::string& group, int32_t rank,
             const NodeSet& lost) -> caf::result<std::vector<RankSlot>> {
        auto slot = self->state.planner->replace(group, rank, std::set<int>(lost.begin(), lost.end()));
        if (!slot) return slot.error();
        return std::vector<RankSlot>{std::move(*slot)};
      },
      [self](topology_atom) { return self->state.planner->nodes(); },
  };
}

}  // namespace

topology_actor::behavior_type topology_probe(topology_actor::pointer, RankContext) {
  return {
      [](topology_atom) -> caf::result<MachineTopology> {
        auto m = discover_topology();
        if (!m) return m.error();
        // This process's share of the machine, by its local rank.
        auto env = ClusterEnv::from_environment();
        if (!env || env->source.empty()) return std::move(*m);
        return share_of(*m, env->local_rank, env->local_world_size);
      },
  };
}

Result<placement_actor> service(Runtime& rt, PlanOptions opts) {
  if (auto existing = rt.service("placement")) return caf::actor_cast<placement_actor>(existing);
  ClusterResources nodes;
  glint::detail::CallerThreadScope on_caller;  // before the scoped actor: it outlives it
  caf::scoped_actor self{rt.system()};
  for (int n = 0; n < rt.num_nodes(); ++n) {
    auto probe = rt.spawn<topology_actor>(n, "glint.topology", caf::make_message(RankContext{}));
    if (!probe) return with_context(probe.error(), "asking node " + std::to_string(n) + " for its topology");
    caf::error err;
    self->request(*probe, rt.options().spawn_timeout, topology_atom::value)
        .receive([&](MachineTopology& m) { nodes.push_back(std::move(m)); }, [&](caf::error& e) { err = e; });
    caf::anon_send_exit(*probe, caf::exit_reason::user_shutdown);
    if (err) return with_context(err, "asking " + rt.node(n).describe() + " for its topology");
  }
  auto svc = rt.system().spawn(service_fn, std::move(nodes), opts);
  rt.set_service("placement", caf::actor_cast<caf::actor>(svc));
  return svc;
}

namespace {

// One request to the placement service from the caller's thread, answered
// with a T or the service's error.
template <class T, class... Ts>
Result<T> ask(Runtime& rt, const placement_actor& svc, const Ts&... msg) {
  glint::detail::CallerThreadScope on_caller;  // before the scoped actor: it outlives it
  caf::scoped_actor self{rt.system()};
  Result<T> out{T{}};
  self->request(svc, rt.options().call_timeout, msg...)
      .receive([&](T& r) { out = std::move(r); }, [&](caf::error& e) { out = e; });
  return out;
}

}  // namespace

Result<ClusterResources> cluster_resources(Runtime& rt) {
  auto svc = service(rt);
  if (!svc) return svc.error();
  return ask<ClusterResources>(rt, *svc, topology_atom::value);
}

Result<std::vector<RankSlot>> place(Runtime& rt, const DeviceGroup& group, const DeviceMesh& mesh) {
  if (auto ok = group.validate(); !ok) return ok.error();
  if (group.size() != mesh.world_size())
    return make_error(errc::invalid_argument, "group '" + group.name + "' has " + std::to_string(group.size()) +
                                                  " ranks but its mesh " + mesh.describe() + " needs " +
                                                  std::to_string(mesh.world_size()));
  auto svc = service(rt);
  if (!svc) return svc.error();
  auto slots = ask<std::vector<RankSlot>>(rt, *svc, place_atom::value, group);
  if (!slots) return slots;
  if (auto ok = apply_mesh(group.name, mesh, *slots); !ok) return ok.error();
  return slots;
}

Result<RankSlot> replace(Runtime& rt, const std::string& group, int rank) {
  auto existing = rt.service("placement");
  if (!existing) return make_error(errc::not_found, "no placement service placed group '" + group + "'");
  NodeSet lost;
  for (const auto& n : rt.nodes())
    if (n.lost) lost.push_back(n.index);
  auto slot = ask<std::vector<RankSlot>>(rt, caf::actor_cast<placement_actor>(existing), replace_atom::value, group,
                                         static_cast<int32_t>(rank), lost);
  if (!slot) return slot.error();
  return std::move(slot->at(0));
}

GLINT_DEFINE_REGISTRATIONS(placement_service, types) {
  types.add_message_type<MachineTopology>("glint.machine_topology");
  types.add_message_type<std::vector<MachineTopology>>("glint.machine_topologies");
  types.add_message_type<DeviceGroup>("glint.device_group");
  types.add_message_type<std::vector<RankSlot>>("glint.rank_slots");
  types.add_message_type<NodeSet>("glint.node_set");
  types.add("glint.topology", topology_probe, ActorOptions{.detached = false});
}

}  // namespace glint::placement
