#include "actors/sampler_group.hpp"

#include "actors/detail/clients.hpp"
#include "actors/remote.hpp"
#include "placement/service.hpp"

namespace glint::actors {

namespace {

using detail::done_of;

// The sampler group over CAF (local and cluster mode): each method is the
// one place its dispatch and collect modes are chosen.
class ActorSamplerBackend final : public SamplerBackend {
public:
  ActorSamplerBackend(Runtime& rt, Group<sampler_actor> g) : rt_(rt), g_(std::move(g)), info_(g_.info()) {}

  const GroupInfo& info() const override { return info_; }
  const Group<sampler_actor>* actor_group() const override { return &g_; }
  Runtime* runtime() const override { return &rt_; }

  Future<std::vector<SampledSequence>> sample(const std::vector<SampleRequest>& requests, const SamplingParams& params,
                                              const std::string& adapter) override {
    // Contiguous slices per dp rank, joined in rank order: the answer keeps the call's order.
    return g_.call<Collect::flatten>(Dispatch::slice_dp, sample_atom_v, requests, params, adapter);
  }
  Result<std::vector<SampledSequence>> sample_streaming(const std::vector<SampleRequest>& requests,
                                                        const SamplingParams& params, const std::string& adapter,
                                                        std::function<void(const SampleChunk&)> on_chunk) override {
    return actors::sample_streaming(rt_, g_, requests, params, adapter, std::move(on_chunk));
  }
  Future<void> update_weights(const NamedTensors& weights, const std::string& adapter, int64_t version,
                              components::UpdatePolicy policy) override {
    return done_of(
        g_.call<Collect::first>(Dispatch::all, update_weights_atom::value, weights,
                                           WeightUpdate{adapter, version, policy}));
  }
  Future<void> add_adapter(const std::string& name, const LoraConfig& lora) override {
    if (name.empty())
      return detail::failed<void>(make_error(errc::invalid_argument, "add_adapter needs a name for the adapter"));
    return done_of(g_.call<Collect::first>(Dispatch::all, add_adapter_atom::value, name, lora));
  }
  Future<void> load_adapter(const std::string& name, const std::string& dir) override {
    return done_of(g_.call<Collect::first>(Dispatch::all, load_adapter_atom::value, name, dir));
  }
  Future<void> remove_adapter(const std::string& name) override {
    return done_of(g_.call<Collect::first>(Dispatch::all, remove_adapter_atom::value, name));
  }
  Future<void> reset_prefix_cache() override {
    return done_of(g_.call<Collect::first>(Dispatch::all, reset_prefix_cache_atom::value));
  }
  Future<void> sleep() override { return done_of(g_.call<Collect::first>(Dispatch::all, sleep_atom::value)); }
  Future<void> wake() override { return done_of(g_.call<Collect::first>(Dispatch::all, wake_atom::value)); }
  Future<int64_t> abort() override { return g_.call<Collect::sum>(Dispatch::all, abort_atom::value); }
  Future<std::vector<Metrics>> stats() override { return g_.call<Collect::flatten>(Dispatch::all, stats_atom::value); }

private:
  Runtime& rt_;
  Group<sampler_actor> g_;
  GroupInfo info_;
};

}  // namespace

SamplerGroup sampler_group_of(Runtime& rt, Group<sampler_actor> group) {
  return SamplerGroup{std::make_shared<ActorSamplerBackend>(rt, std::move(group))};
}

Result<SamplerGroup> open_sampler_group(Runtime& rt, const placement::DeviceGroup& group,
                                        const placement::DeviceMesh& mesh, SamplerSpec spec) {
  if (rt.mode() == Mode::remote) {
    auto remote = remote_groups(rt, "open_sampler_group");
    if (!remote) return remote.error();
    return (*remote)->open_sampler(spec);
  }
  auto g = spawn_sampler_group(rt, group, mesh, std::move(spec));
  if (!g) return g.error();
  return sampler_group_of(rt, std::move(*g));
}

}  // namespace glint::actors
