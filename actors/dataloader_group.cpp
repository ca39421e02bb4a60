#include "actors/dataloader_group.hpp"

#include "actors/detail/clients.hpp"

namespace glint::actors {

namespace {

// The dataloader over CAF: one rank, asked directly.
class ActorDataLoaderBackend final : public DataLoaderBackend {
public:
  explicit ActorDataLoaderBackend(Group<dataloader_actor> g) : g_(std::move(g)), info_(g_.info()) {}

  const GroupInfo& info() const override { return info_; }
  Future<DataBatch> next_batch() override { return g_.call<Collect::first>(Dispatch::first, next_batch_atom_v); }
  Future<LoaderState> state() override { return g_.call<Collect::first>(Dispatch::first, loader_state_atom_v); }
  Future<void> set_state(const LoaderState& state) override {
    return detail::done_of(g_.call<Collect::first>(Dispatch::first, set_loader_state_atom_v, state));
  }
  Future<LoaderInfo> loader_info() override { return g_.call<Collect::first>(Dispatch::first, loader_info_atom_v); }

private:
  Group<dataloader_actor> g_;
  GroupInfo info_;
};

}  // namespace

DataLoaderGroup dataloader_group_of(Group<dataloader_actor> group) {
  return DataLoaderGroup{std::make_shared<ActorDataLoaderBackend>(std::move(group))};
}

Result<DataLoaderGroup> open_dataloader(Runtime& rt, const placement::DeviceGroup& group, DataLoaderSpec spec) {
  // Remote mode too: the data is the tenant's, so its loader runs here, in
  // the driver's own (local) runtime.
  auto g = spawn_dataloader(rt, group, std::move(spec));
  if (!g) return g.error();
  return dataloader_group_of(std::move(*g));
}

}  // namespace glint::actors
