#include "actors/sampler_group.hpp"

#include "actors/detail/clients.hpp"
#include "actors/remote.hpp"
#include "placement/service.hpp"
#include "runtime/log.hpp"

#include <mutex>
#include <optional>
#include <random>

namespace glint::actors {

namespace {

using detail::done_of;

// The sampler group over CAF (local and cluster mode): each method is the
// one place its dispatch and collect modes are chosen.
class ActorSamplerBackend final : public SamplerBackend, public std::enable_shared_from_this<ActorSamplerBackend> {
public:
  ActorSamplerBackend(Runtime& rt, Group<sampler_actor> g, uint64_t sampling_seed)
      : rt_(rt), g_(std::move(g)), info_(g_.info()), seeds_(sampling_seed) {}

  const GroupInfo& info() const override { return info_; }
  const Group<sampler_actor>* actor_group() const override { return &g_; }
  Runtime* runtime() const override { return &rt_; }

  Future<std::vector<SampledSequence>> sample(const std::vector<SampleRequest>& requests, const SamplingParams& params,
                                              const std::string& adapter) override {
    return sample_with_failover(requests, with_call_seed(params), adapter);
  }
  Result<std::vector<SampledSequence>> sample_streaming(const std::vector<SampleRequest>& requests,
                                                        const SamplingParams& params, const std::string& adapter,
                                                        std::function<void(const SampleChunk&)> on_chunk) override {
    return actors::sample_streaming(rt_, g_.live(), requests, with_call_seed(params), adapter, std::move(on_chunk));
  }
  Future<void> update_weights(const NamedTensors& weights, const std::string& adapter, int64_t version,
                              components::UpdatePolicy policy) override {
    return done_of(
        g_.live().call<Collect::first>(Dispatch::all, update_weights_atom::value, weights,
                                           WeightUpdate{adapter, version, policy}));
  }
  Future<void> add_adapter(const std::string& name, const LoraConfig& lora) override {
    if (name.empty())
      return detail::failed<void>(make_error(errc::invalid_argument, "add_adapter needs a name for the adapter"));
    return done_of(g_.live().call<Collect::first>(Dispatch::all, add_adapter_atom::value, name, lora));
  }
  Future<void> load_adapter(const std::string& name, const std::string& dir) override {
    return done_of(g_.live().call<Collect::first>(Dispatch::all, load_adapter_atom::value, name, dir));
  }
  Future<void> remove_adapter(const std::string& name) override {
    return done_of(g_.live().call<Collect::first>(Dispatch::all, remove_adapter_atom::value, name));
  }
  Future<void> reset_prefix_cache() override {
    return done_of(g_.live().call<Collect::first>(Dispatch::all, reset_prefix_cache_atom::value));
  }
  Future<void> sleep() override { return done_of(g_.live().call<Collect::first>(Dispatch::all, sleep_atom::value)); }
  Future<void> wake() override { return done_of(g_.live().call<Collect::first>(Dispatch::all, wake_atom::value)); }
  Future<int64_t> abort() override { return g_.live().call<Collect::sum>(Dispatch::all, abort_atom::value); }
  Future<std::vector<Metrics>> stats() override { return g_.live().call<Collect::flatten>(Dispatch::all, stats_atom::value); }

private:
  /// `params` with a seed: a call without one gets the next of the group's
  /// own stream. Each rank keys a request's draws by (seed, request index,
  /// sample), so the sequences do not depend on which rank samples them.
  SamplingParams with_call_seed(const SamplingParams& params) {
    if (params.seed >= 0) return params;
    auto p = params;
    std::lock_guard<std::mutex> guard{seed_mx_};
    p.seed = static_cast<int64_t>(seeds_() & 0x7fffffffffffffffull);
    return p;
  }

  struct Call;
  /// Sends part `part` of the call to the next live rank from `from`.
  void send_part(const std::shared_ptr<Call>& call, size_t part, int from);

  /// Contiguous slices of the requests over the live ranks, joined in order.
  /// A rank that fails its slice with `unavailable` (its node process died,
  /// its actor stopped) is not used again by this call: its slice goes to
  /// the next live rank, and the call completes.
  Future<std::vector<SampledSequence>> sample_with_failover(const std::vector<SampleRequest>& requests,
                                                            const SamplingParams& params, const std::string& adapter);

  Runtime& rt_;
  Group<sampler_actor> g_;
  GroupInfo info_;
  std::mutex seed_mx_;
  std::mt19937_64 seeds_;
};

struct ActorSamplerBackend::Call {
  std::mutex mx;
  std::vector<std::vector<SampleRequest>> parts;
  std::vector<std::optional<std::vector<SampledSequence>>> answers;
  std::vector<char> failed;  ///< per rank: failed a slice of this call with `unavailable`
  std::vector<std::string> why;  ///< those failures, for the error if no rank is left
  size_t remaining = 0;
  bool done = false;
  SamplingParams params;
  std::string adapter;
  std::shared_ptr<glint::detail::FutureState<std::vector<SampledSequence>>> out =
      std::make_shared<glint::detail::FutureState<std::vector<SampledSequence>>>();
};

void ActorSamplerBackend::send_part(const std::shared_ptr<Call>& call, size_t part, int from) {
  const int n = g_.size();
  int target = -1;
  {
    std::lock_guard<std::mutex> guard{call->mx};
    for (int k = 0; k < n && target < 0; ++k) {
      int r = (from + k) % n;
      if (!call->failed[static_cast<size_t>(r)] && g_.alive(r)) target = r;
    }
    if (target < 0) {
      if (call->done) return;
      call->done = true;
    }
  }
  if (target < 0) {
    std::string why;
    for (const auto& w : call->why) why += (why.empty() ? "" : "; ") + w;
    call->out->set(make_error(errc::unavailable, "no rank of sampler group '" + g_.name() +
                                                     "' is left to sample on: " + (why.empty() ? "all were lost" : why)));
    return;
  }
  auto f = g_.call_rank(target, sample_atom_v, call->parts[part], call->params, call->adapter);
  auto* src = f.state().get();
  auto keep = f.state();
  src->on_ready([self = shared_from_this(), this, call, part, target, keep]() {
    auto& r = *keep->value;
    if (!r && code_of(r.error()) == errc::unavailable) {
      {
        std::lock_guard<std::mutex> guard{call->mx};
        if (call->done) return;
        if (!call->failed[static_cast<size_t>(target)]) {
          call->failed[static_cast<size_t>(target)] = 1;
          call->why.push_back(describe(r.error()));
        }
      }
      log::warn("sampler group '" + g_.name() + "': " + describe(r.error()) + "; its " +
                std::to_string(call->parts[part].size()) + " requests go to another rank");
      send_part(call, part, target + 1);
      return;
    }
    std::vector<std::vector<SampledSequence>> all;
    {
      std::lock_guard<std::mutex> guard{call->mx};
      if (call->done) return;
      if (!r) {
        call->done = true;
      } else {
        call->answers[part] = std::move(*r);
        if (--call->remaining > 0) return;
        call->done = true;
        for (auto& a : call->answers) all.push_back(std::move(*a));
      }
    }
    if (!r) {
      call->out->set(r.error());
      return;
    }
    std::vector<SampledSequence> joined;
    for (auto& a : all) joined.insert(joined.end(), std::make_move_iterator(a.begin()), std::make_move_iterator(a.end()));
    call->out->set(std::move(joined));
  });
}

Future<std::vector<SampledSequence>> ActorSamplerBackend::sample_with_failover(
    const std::vector<SampleRequest>& requests, const SamplingParams& params, const std::string& adapter) {
  std::vector<int> live;
  for (int r = 0; r < g_.size(); ++r)
    if (g_.alive(r)) live.push_back(r);
  if (live.empty())
    return detail::failed<std::vector<SampledSequence>>(
        make_error(errc::unavailable, "every rank of sampler group '" + g_.name() + "' was lost"));
  auto call = std::make_shared<Call>();
  call->params = params;
  call->adapter = adapter;
  call->failed.assign(static_cast<size_t>(g_.size()), 0);
  const int parts = static_cast<int>(live.size());
  for (int k = 0; k < parts; ++k) {
    auto p = glint::detail::part_of(requests, k, parts);
    if (!p) return detail::failed<std::vector<SampledSequence>>(p.error());
    call->parts.push_back(std::move(*p));
  }
  call->answers.resize(call->parts.size());
  call->remaining = call->parts.size();
  Future<std::vector<SampledSequence>> out{call->out};
  for (int k = 0; k < parts; ++k) send_part(call, static_cast<size_t>(k), live[static_cast<size_t>(k)]);
  return out;
}

}  // namespace

SamplerGroup sampler_group_of(Runtime& rt, Group<sampler_actor> group, uint64_t sampling_seed) {
  return SamplerGroup{std::make_shared<ActorSamplerBackend>(rt, std::move(group), sampling_seed)};
}

Result<SamplerGroup> open_sampler_group(Runtime& rt, const placement::DeviceGroup& group,
                                        const placement::DeviceMesh& mesh, SamplerSpec spec) {
  if (rt.mode() == Mode::remote) {
    auto remote = remote_groups(rt, "open_sampler_group");
    if (!remote) return remote.error();
    return (*remote)->open_sampler(spec);
  }
  const auto seed = spec.sampling_seed;
  auto g = spawn_sampler_group(rt, group, mesh, std::move(spec));
  if (!g) return g.error();
  return sampler_group_of(rt, std::move(*g), seed);
}

}  // namespace glint::actors
