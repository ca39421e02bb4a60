#include "actors/sampler_group.hpp"

#include "actors/detail/chunk_stream.hpp"
#include "actors/detail/clients.hpp"
#include "actors/remote.hpp"
#include "placement/service.hpp"
#include "runtime/log.hpp"

#include <mutex>
#include <optional>
#include <random>
#include <set>

namespace glint::actors {

namespace {

using detail::done_of;

// The sampler group over CAF (local and cluster mode): each method is the
// one place its dispatch and collect modes are chosen. With a RestartPolicy
// it also supervises: heal() respawns lost ranks, which replay the group's
// adapter and weight history and take samples once they hold the current
// weights.
class ActorSamplerBackend final : public SamplerBackend, public std::enable_shared_from_this<ActorSamplerBackend> {
public:
  ActorSamplerBackend(Runtime& rt, Group<sampler_actor> g, uint64_t sampling_seed, RestartPolicy policy)
      : rt_(rt), g_(std::move(g)), info_(g_.info()), seeds_(sampling_seed), policy_(policy),
        waits_for_(static_cast<size_t>(g_.size())), down_(static_cast<size_t>(g_.size()), 0) {}

  const GroupInfo& info() const override { return info_; }
  std::optional<Group<sampler_actor>> actor_group() const override { return group(); }
  Runtime* runtime() const override { return &rt_; }

  Future<std::vector<SampledSequence>> sample(const std::vector<SampleRequest>& requests, const SamplingParams& params,
                                              const std::string& adapter) override {
    heal();
    return sample_with_failover(requests, with_call_seed(params), adapter);
  }
  Future<std::vector<SampledSequence>> sample_on(uint64_t key, const std::vector<SampleRequest>& requests,
                                                 const SamplingParams& params, const std::string& adapter) override {
    heal();
    return sample_with_failover(requests, with_call_seed(params), adapter, nullptr, key);
  }
  Result<std::vector<SampledSequence>> sample_streaming(const std::vector<SampleRequest>& requests,
                                                        const SamplingParams& params, const std::string& adapter,
                                                        std::function<void(const SampleChunk&)> on_chunk) override {
    heal();
    auto stream = detail::ChunkStream::open(rt_, requests, params, std::move(on_chunk));
    if (!stream) return stream.error();
    auto result = sample_with_failover(requests, with_call_seed(params), adapter, *stream).get();
    return (*stream)->finish(std::move(result), group().timeout());
  }
  Future<void> update_weights(const NamedTensors& weights, const std::string& adapter, int64_t version,
                              components::UpdatePolicy policy) override {
    WeightUpdate u{adapter, version, policy};
    return logged(done_of(reachable().call<Collect::first>(Dispatch::all, update_weights_atom::value, weights, u)),
                  Op{.kind = Op::update, .name = adapter, .weights = weights, .as = u});
  }
  Future<void> add_adapter(const std::string& name, const LoraConfig& lora) override {
    if (name.empty())
      return detail::failed<void>(make_error(errc::invalid_argument, "add_adapter needs a name for the adapter"));
    return logged(done_of(reachable().call<Collect::first>(Dispatch::all, add_adapter_atom::value, name, lora)),
                  Op{.kind = Op::add, .name = name, .lora = lora});
  }
  Future<void> load_adapter(const std::string& name, const std::string& dir) override {
    return logged(done_of(reachable().call<Collect::first>(Dispatch::all, load_adapter_atom::value, name, dir)),
                  Op{.kind = Op::load, .name = name, .dir = dir});
  }
  Future<void> remove_adapter(const std::string& name) override {
    return logged(done_of(reachable().call<Collect::first>(Dispatch::all, remove_adapter_atom::value, name)),
                  Op{.kind = Op::remove, .name = name});
  }
  Future<void> reset_prefix_cache() override {
    return done_of(reachable().call<Collect::first>(Dispatch::all, reset_prefix_cache_atom::value));
  }
  Future<void> sleep() override {
    return logged(done_of(reachable().call<Collect::first>(Dispatch::all, sleep_atom::value)), Op{.kind = Op::sleep});
  }
  Future<void> wake() override {
    return logged(done_of(reachable().call<Collect::first>(Dispatch::all, wake_atom::value)), Op{.kind = Op::wake});
  }
  Future<int64_t> abort() override { return reachable().call<Collect::sum>(Dispatch::all, abort_atom::value); }
  Future<std::vector<Metrics>> stats() override {
    return reachable().call<Collect::flatten>(Dispatch::all, stats_atom::value);
  }

  void heal() override;
  void synced(const std::string& target, const std::vector<int>& ranks) override {
    std::lock_guard<std::mutex> guard{mx_};
    synced_targets_.insert(target);
    // The sync sent everything `target` holds: earlier updates of it need no replay.
    std::erase_if(log_, [&](const Op& op) { return op.kind == Op::update && op.name == target; });
    for (int r : ranks)
      if (r >= 0 && static_cast<size_t>(r) < waits_for_.size()) waits_for_[static_cast<size_t>(r)].erase(target);
  }

private:
  /// A call that changed what every rank holds, replayed on a respawned rank.
  struct Op {
    enum Kind { add, load, remove, update, sleep, wake } kind;
    std::string name{};  ///< the adapter ("" for the base, in an update)
    LoraConfig lora{};
    std::string dir{};
    NamedTensors weights{};
    WeightUpdate as{};  ///< an update's adapter, version and policy
  };

  Group<sampler_actor> group() const {
    std::lock_guard<std::mutex> guard{mx_};
    return g_;
  }
  /// Whether rank r's node is alive and the rank holds the current weights.
  bool serves(const Group<sampler_actor>& g, int r) const {
    std::lock_guard<std::mutex> guard{mx_};
    return g.alive(r) && !down_[static_cast<size_t>(r)] && waits_for_[static_cast<size_t>(r)].empty();
  }
  /// Whether rank r of `g` is still the actor the group holds now (not one
  /// since respawned in its place). Under mx_.
  bool same_rank(const Group<sampler_actor>& g, int r) const {
    return g.rank(r).actor == g_.rank(r).actor;
  }
  /// The ranks that take samples, as a group view.
  Group<sampler_actor> serving() const;
  /// The ranks whose node is alive and whose actor was not seen down (those
  /// still catching up included): where calls to every rank go.
  Group<sampler_actor> reachable() const {
    auto g = group();
    return g.subset([&](int r) {
      std::lock_guard<std::mutex> guard{mx_};
      return g.alive(r) && !down_[static_cast<size_t>(r)];
    });
  }

  /// `f`, whose success records `op` for replay.
  Future<void> logged(Future<void> f, Op op) {
    return f.then([self = weak_from_this(), op = std::move(op)](const Result<void>& r) -> Result<void> {
      if (r)
        if (auto me = self.lock()) me->record(op);
      return r;
    });
  }
  void record(const Op& op) {
    std::lock_guard<std::mutex> guard{mx_};
    if (op.kind == Op::remove) {
      // A removed adapter is no sync target: a respawned rank waits for no
      // sync of it (and the set does not grow by one name per adapter).
      synced_targets_.erase(op.name);
      for (auto& w : waits_for_) w.erase(op.name);
    }
    if (policy_.max_restarts <= 0) return;  // nothing will replay it
    if (op.kind == Op::remove) {
      std::erase_if(log_, [&](const Op& o) { return o.name == op.name && o.kind != Op::sleep && o.kind != Op::wake; });
      return;
    }
    if (op.kind == Op::sleep || op.kind == Op::wake) {
      asleep_ = op.kind == Op::sleep;
      return;
    }
    if (op.kind == Op::update) {
      // Keep one copy of each tensor: an older update's tensors that this
      // one replaces need no replay.
      std::set<std::string> names;
      for (const auto& [name, t] : op.weights) names.insert(name);
      for (auto& o : log_)
        if (o.kind == Op::update && o.name == op.name)
          std::erase_if(o.weights, [&](const auto& w) { return names.count(w.first) > 0; });
      std::erase_if(log_, [&](const Op& o) { return o.kind == Op::update && o.weights.empty(); });
    }
    log_.push_back(op);
  }
  /// Replays the group's history on a new rank's actor.
  Result<void> replay(const Group<sampler_actor>& g, int r, const std::vector<Op>& log, bool asleep);
  /// Where a lost rank of a group the placement service did not place goes:
  /// its own node if a restarted process took its place there, else the live
  /// node holding the fewest of this group's ranks.
  int home_for(const Group<sampler_actor>& g, int r) const;

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
  /// Sends part `part` of the call to the next serving rank from `from`.
  void send_part(const std::shared_ptr<Call>& call, size_t part, int from);

  /// Contiguous slices of the requests over the serving ranks, joined in
  /// order. A rank that fails its slice with `unavailable` (its node process
  /// died, its actor stopped) is not used again by this call: its slice goes
  /// to the next serving rank, and the call completes. With a `stream`,
  /// each attempt streams its chunks to a listener of its own, and the
  /// stream hands each sequence's tokens on once.
  Future<std::vector<SampledSequence>> sample_with_failover(const std::vector<SampleRequest>& requests,
                                                            const SamplingParams& params, const std::string& adapter,
                                                            std::shared_ptr<detail::ChunkStream> stream = nullptr,
                                                            std::optional<uint64_t> key = std::nullopt);

  Runtime& rt_;
  mutable std::mutex mx_;  ///< guards g_ and the supervision state below
  Group<sampler_actor> g_;
  GroupInfo info_;
  std::mutex seed_mx_;
  std::mt19937_64 seeds_;
  RestartPolicy policy_;
  std::mutex heal_mx_;  ///< one heal() at a time
  int restarts_ = 0;
  std::chrono::steady_clock::time_point last_respawn_{};
  bool told_exhausted_ = false;
  bool told_unplaceable_ = false;
  /// Per rank: the sync targets whose next weight sync it waits for before
  /// it takes samples (empty: it serves).
  std::vector<std::set<std::string>> waits_for_;
  /// Per rank: its actor went down (a slice failed with `unavailable`) while
  /// its node may live on: a crashed rank, respawned like a lost one.
  std::vector<char> down_;
  std::set<std::string> synced_targets_;  ///< every target a weight sync reached
  std::vector<Op> log_;
  bool asleep_ = false;
};

Group<sampler_actor> ActorSamplerBackend::serving() const {
  auto g = group();
  return g.subset([&](int r) { return serves(g, r); });
}

int ActorSamplerBackend::home_for(const Group<sampler_actor>& g, int r) const {
  const auto own = rt_.node(g.rank(r).ctx.node);
  if (!own.lost) return own.index;
  int best = -1, best_count = 0;
  for (const auto& n : rt_.nodes()) {
    if (n.lost) continue;
    int count = 0;
    for (int k = 0; k < g.size(); ++k) count += g.alive(k) && g.rank(k).ctx.node == n.index;
    if (best < 0 || count < best_count) {
      best = n.index;
      best_count = count;
    }
  }
  return best;
}

Result<void> ActorSamplerBackend::replay(const Group<sampler_actor>& g, int r, const std::vector<Op>& log, bool asleep) {
  for (const auto& op : log) {
    Result<void> done;
    switch (op.kind) {
      case Op::add: done = done_of(g.call_rank(r, add_adapter_atom::value, op.name, op.lora)).take(); break;
      case Op::load: done = done_of(g.call_rank(r, load_adapter_atom::value, op.name, op.dir)).take(); break;
      case Op::update: done = done_of(g.call_rank(r, update_weights_atom::value, op.weights, op.as)).take(); break;
      case Op::remove:
      case Op::sleep:
      case Op::wake: break;
    }
    if (!done) return with_context(done.error(), "replaying the group's history on " + g.rank(r).label);
  }
  if (asleep)
    if (auto slept = done_of(g.call_rank(r, sleep_atom::value)).take(); !slept) return slept.error();
  return {};
}

void ActorSamplerBackend::heal() {
  if (policy_.max_restarts <= 0) return;
  std::lock_guard<std::mutex> one{heal_mx_};
  for (;;) {
    auto g = group();
    int lost = -1;
    {
      std::lock_guard<std::mutex> guard{mx_};
      for (int r = 0; r < g.size() && lost < 0; ++r)
        if (!g.alive(r) || down_[static_cast<size_t>(r)]) lost = r;
    }
    if (lost < 0) return;
    if (restarts_ >= policy_.max_restarts) {
      if (!told_exhausted_)
        log::warn("sampler group '" + g.name() + "': " + g.rank(lost).label + " was lost and the group used its " +
                  std::to_string(policy_.max_restarts) + " restarts; it serves on the ranks left");
      told_exhausted_ = true;
      return;
    }
    if (std::chrono::steady_clock::now() < last_respawn_ + policy_.backoff) return;
    // Where: the placement service plans the rank again (its own slot while
    // its node lives, else a live node, with the devices and cores free
    // there); a group the service did not place goes home or to the live
    // node with the fewest of its ranks.
    const auto& old = g.rank(lost).ctx;
    RankSlot slot;
    if (auto planned = placement::replace(rt_, g.name(), lost)) {
      slot = *planned;
    } else if (code_of(planned.error()) == errc::not_found) {
      slot.node = home_for(g, lost);
      if (slot.node < 0) return;
      if (slot.node == old.node) {
        slot.device = old.device;
        slot.cpus = old.cpus;
      }
    } else {
      // Tried again after the backoff, and said once until it works.
      last_respawn_ = std::chrono::steady_clock::now();
      if (!told_unplaceable_)
        log::warn("sampler group '" + g.name() + "': " + g.rank(lost).label + " was lost and cannot be placed again: " +
                  describe(planned.error()));
      told_unplaceable_ = true;
      return;
    }
    told_unplaceable_ = false;
    last_respawn_ = std::chrono::steady_clock::now();
    ++restarts_;
    auto fresh = g.respawned(lost, slot.node, slot.device, slot.cpus);
    std::vector<Op> log;
    bool asleep = false;
    std::set<std::string> waits;
    {
      std::lock_guard<std::mutex> guard{mx_};
      log = log_;
      asleep = asleep_;
      waits = synced_targets_;
    }
    if (fresh) {
      if (auto ok = replay(*fresh, lost, log, asleep); !ok) {
        caf::anon_send_exit(fresh->handle(lost), caf::exit_reason::user_shutdown);
        fresh = ok.error();
      }
    }
    if (!fresh) {
      log::warn("sampler group '" + g.name() + "': " + describe(fresh.error()) + " (restart " +
                std::to_string(restarts_) + " of " + std::to_string(policy_.max_restarts) + ")");
      return;
    }
    log::warn("sampler group '" + g.name() + "': " + g.rank(lost).label + " was lost; respawned as " +
              fresh->rank(lost).label + " (restart " + std::to_string(restarts_) + " of " +
              std::to_string(policy_.max_restarts) + ")" +
              (waits.empty() ? "" : "; it samples once the next weight sync reaches it"));
    std::lock_guard<std::mutex> guard{mx_};
    g_ = std::move(*fresh);
    waits_for_[static_cast<size_t>(lost)] = std::move(waits);
    down_[static_cast<size_t>(lost)] = 0;
  }
}

struct ActorSamplerBackend::Call {
  Group<sampler_actor> group;  ///< the group as it stood when the call began
  std::mutex mx;
  std::vector<std::vector<SampleRequest>> parts;
  std::vector<std::optional<std::vector<SampledSequence>>> answers;
  std::vector<char> failed;  ///< per rank: failed a slice of this call with `unavailable`
  std::vector<std::string> why;  ///< those failures, for the error if no rank is left
  size_t remaining = 0;
  bool done = false;
  SamplingParams params;
  std::string adapter;
  std::shared_ptr<detail::ChunkStream> stream;  ///< a streamed call's chunks; null otherwise
  std::shared_ptr<glint::detail::FutureState<std::vector<SampledSequence>>> out =
      std::make_shared<glint::detail::FutureState<std::vector<SampledSequence>>>();
};

void ActorSamplerBackend::send_part(const std::shared_ptr<Call>& call, size_t part, int from) {
  const auto& g = call->group;
  const int n = g.size();
  int target = -1;
  {
    std::lock_guard<std::mutex> guard{call->mx};
    for (int k = 0; k < n && target < 0; ++k) {
      int r = (from + k) % n;
      if (!call->failed[static_cast<size_t>(r)] && serves(g, r)) target = r;
    }
    if (call->done) return;  // answered (or failed) meanwhile: nothing to send
    if (target < 0) call->done = true;
  }
  if (target < 0) {
    std::string why;
    for (const auto& w : call->why) why += (why.empty() ? "" : "; ") + w;
    call->out->set(make_error(errc::unavailable, "no rank of sampler group '" + g.name() +
                                                     "' is left to sample on: " + (why.empty() ? "all were lost" : why)));
    return;
  }
  auto f = call->stream ? g.call_rank(target, sample_stream_atom_v, call->parts[part], call->params, call->adapter,
                                      call->stream->listener())
                        : g.call_rank(target, sample_atom_v, call->parts[part], call->params, call->adapter);
  auto* src = f.state().get();
  auto keep = f.state();
  src->on_ready([self = shared_from_this(), this, call, part, target, keep]() {
    const auto& g = call->group;
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
      {
        // The rank's actor is gone, whether or not its node is: later calls
        // skip it, and a supervised group respawns it.
        std::lock_guard<std::mutex> guard{mx_};
        if (same_rank(g, target)) down_[static_cast<size_t>(target)] = 1;
      }
      log::warn("sampler group '" + g.name() + "': " + describe(r.error()) + "; its " +
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
    const std::vector<SampleRequest>& requests, const SamplingParams& params, const std::string& adapter,
    std::shared_ptr<detail::ChunkStream> stream, std::optional<uint64_t> key) {
  auto call = std::make_shared<Call>();
  call->stream = std::move(stream);
  call->group = group();
  const auto& g = call->group;
  std::vector<int> live;
  for (int r = 0; r < g.size(); ++r)
    if (serves(g, r)) live.push_back(r);
  if (live.empty())
    return detail::failed<std::vector<SampledSequence>>(
        make_error(errc::unavailable, "every rank of sampler group '" + g.name() + "' was lost"));
  call->params = params;
  call->adapter = adapter;
  call->failed.assign(static_cast<size_t>(g.size()), 0);
  // With a key, one part on the key's rank (failing over as any part does).
  if (key) live = {live[static_cast<size_t>(*key % live.size())]};
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

SamplerGroup sampler_group_of(Runtime& rt, Group<sampler_actor> group, uint64_t sampling_seed, RestartPolicy restart) {
  return SamplerGroup{std::make_shared<ActorSamplerBackend>(rt, std::move(group), sampling_seed, restart)};
}

Result<SamplerGroup> open_sampler_group(Runtime& rt, const placement::DeviceGroup& group,
                                        const placement::DeviceMesh& mesh, SamplerSpec spec, RestartPolicy restart) {
  if (restart.max_restarts < 0 || restart.backoff.count() < 0)
    return make_error(errc::invalid_argument, "a restart policy needs max_restarts >= 0 and a backoff >= 0");
  if (rt.mode() == Mode::remote) {
    if (restart.max_restarts > 0)
      return make_error(errc::invalid_argument, "open_sampler_group: a restart policy applies to groups this runtime "
                                                "spawns; in remote mode the server supervises its samplers");
    auto remote = remote_groups(rt, "open_sampler_group");
    if (!remote) return remote.error();
    return (*remote)->open_sampler(spec);
  }
  const auto seed = spec.sampling_seed;
  auto g = spawn_sampler_group(rt, group, mesh, std::move(spec));
  if (!g) return g.error();
  return sampler_group_of(rt, std::move(*g), seed, restart);
}

}  // namespace glint::actors
