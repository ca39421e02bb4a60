#include "actors/probe_group.hpp"

#include "actors/detail/clients.hpp"

#include "placement/service.hpp"

namespace glint::actors {

namespace {

class ActorProbeBackend final : public ProbeBackend {
public:
  explicit ActorProbeBackend(Group<probe_actor> g) : g_(std::move(g)), info_(g_.info()) {}

  const GroupInfo& info() const override { return info_; }
  Future<int64_t> echo(int64_t x) override { return g_.call_rank(0, echo_atom::value, x); }
  Future<int64_t> sum(const std::vector<int64_t>& xs) override {
    return g_.call<Collect::sum>(Dispatch::slice_dp, sum_atom::value, xs);
  }
  Future<std::vector<ProbeInfo>> where() override { return g_.call<Collect::flatten>(Dispatch::all, where_atom::value); }

private:
  Group<probe_actor> g_;
  GroupInfo info_;
};

}  // namespace

ProbeGroup probe_group_of(Group<probe_actor> group) {
  return ProbeGroup{std::make_shared<ActorProbeBackend>(std::move(group))};
}

Result<ProbeGroup> open_probe_group(Runtime& rt, const placement::DeviceGroup& group,
                                    const placement::DeviceMesh& mesh) {
  if (auto err = detail::refuse_remote(rt, "open_probe_group")) return err;
  auto g = placement::spawn_group<probe_actor>(rt, group, mesh, probe_type);
  if (!g) return g.error();
  return probe_group_of(std::move(*g));
}

}  // namespace glint::actors
