#pragma once
/// `glint::Group<Handle>`: one handle over all ranks of a device group.
///
///   auto g = Group<probe_actor>::spawn(rt, "model", "glint.probe", slots);
///   Future<double> loss = g->call<Collect::mean>(Dispatch::slice_dp, fwd_atom_v, batch);
///
/// A call sends one request per addressed rank and returns at once with a
/// Future; the answers complete it on the thread that delivers them. Every request has a timeout
/// (`with_timeout`, default Options::call_timeout). A rank that answers with
/// an error, times out, or dies (its node process was killed, its connection
/// broke) fails the whole call at once with an error that names the rank, its
/// group and its node; the other ranks' late answers are dropped. A Group is
/// a cheap, copyable view; the Runtime owns the actors.

#include "runtime/dispatch.hpp"
#include "runtime/runtime.hpp"

#include <caf/response_type.hpp>
#include <caf/send.hpp>

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <tuple>
#include <set>
#include <vector>

namespace glint {

/// Where the ranks of a group live, as a driver sees them in any mode (the
/// typed clients report it; a remote group reports the server's layout).
struct GroupInfo {
  std::string name;
  std::vector<RankContext> ranks;   ///< rank i's context: node, device, cpus, dp coordinate
  std::vector<std::string> labels;  ///< "rank 1 of group 'model' on node 1 (host, pid 42)"
  int size() const { return static_cast<int>(ranks.size()); }
  int dp_size() const { return ranks.empty() ? 0 : ranks.front().dp_size; }
};

/// How a supervised group replaces ranks it lost: at most `max_restarts`
/// respawns over the group's life (0: none; the group serves on the ranks
/// left), at least `backoff` apart.
struct RestartPolicy {
  int max_restarts = 0;
  std::chrono::milliseconds backoff{std::chrono::milliseconds(500)};
};

namespace detail {

/// Phrase the death of a rank's actor as an `unavailable` error.
caf::error rank_down_error(const std::string& label, const caf::error& reason);

/// The shared state of one call: the answers of its ranks (one slot each),
/// folded into the call's future when the last one comes, or the first
/// failure. Slot k is rank `first_rank + k`.
template <class R, class V, class Out>
struct Gather final : Replies {
  std::mutex mx;
  std::vector<std::optional<V>> results;
  size_t remaining = 0;
  bool done = false;
  FutureState<Out> out;
  Result<Out> (*finish)(std::vector<V>&&) = nullptr;
  std::shared_ptr<const std::vector<std::string>> labels;  ///< of every rank of the group
  int first_rank = 0;
  /// Which slots' answers are folded (empty: all): under slice_dp, one per
  /// data-parallel part (the others are awaited, their answers dropped).
  std::vector<char> folded;

  const std::string& label(size_t slot) const { return (*labels)[static_cast<size_t>(first_rank) + slot]; }

  void answer(size_t slot, caf::expected<caf::message>&& a) override {
    if (!a) {
      auto& e = a.error();
      if (e == caf::sec::request_receiver_down || e.category() == caf::atom("exit"))
        fail(rank_down_error(label(slot), e));
      else
        fail(with_context(e, label(slot)));
      return;
    }
    if constexpr (std::is_void_v<R>) {
      ok(slot, caf::unit);
    } else {
      if (!a->template match_elements<R>()) {
        fail(make_error(errc::internal, label(slot) + " answered " + caf::to_string(*a) +
                                            ", not the type its interface declares"));
        return;
      }
      ok(slot, std::move(a->template get_mutable_as<R>(0)));
    }
  }

  void ok(size_t i, V v) {
    std::vector<V> all;
    {
      std::lock_guard<std::mutex> guard{mx};
      if (done) return;
      results[i] = std::move(v);
      if (--remaining > 0) return;
      done = true;
      all.reserve(results.size());
      for (size_t k = 0; k < results.size(); ++k)
        if (folded.empty() || folded[k]) all.push_back(std::move(*results[k]));
    }
    out.set(finish(std::move(all)));
  }

  void fail(caf::error e) {
    {
      std::lock_guard<std::mutex> guard{mx};
      if (done) return;
      done = true;
    }
    out.set(std::move(e));
  }

  /// The call's future: shares ownership of this state.
  static Future<Out> future_of(const std::shared_ptr<Gather>& g) {
    return Future<Out>(std::shared_ptr<FutureState<Out>>(g, &g->out));
  }
};

/// The shared state of a call over `n` ranks from `first_rank`, folding
/// answers by policy C.
template <Collect C, class R, class V, class Out>
std::shared_ptr<Gather<R, V, Out>> make_gather(size_t n, std::shared_ptr<const std::vector<std::string>> labels,
                                               int first_rank) {
  auto g = std::make_shared<Gather<R, V, Out>>();
  g->results.resize(n);
  g->remaining = n;
  g->labels = std::move(labels);
  g->first_rank = first_rank;
  g->finish = [](std::vector<V>&& vs) -> Result<Out> {
    if constexpr (std::is_void_v<Out>) return {};
    else return collect<C, V>(std::move(vs));
  };
  return g;
}

template <class Handle, class... Ts>
struct call_result {
  using outputs = caf::response_type_t<typename Handle::signatures, std::decay_t<Ts>...>;
  static_assert(caf::detail::tl_size<outputs>::value <= 1, "glint calls return at most one value");
  using type = std::conditional_t<caf::detail::tl_size<outputs>::value == 0, void, caf::detail::tl_head_t<outputs>>;
};

}  // namespace detail

template <class Handle>
class Group {
public:
  /// One rank. The group holds its actor weakly: the Runtime owns the
  /// actors, so a Group kept past `shutdown()` cannot keep them alive (CAF
  /// waits for every detached actor to be released at exit).
  struct Rank {
    caf::weak_actor_ptr actor;
    RankContext ctx;
    std::string label;  ///< "rank 1 of group 'model' on node 1 (host, pid 42)"
    /// NodeInfo::restarts of its node when it was spawned: a restarted node
    /// process does not hold the ranks its predecessor did.
    int node_restarts = 0;
    /// A strong handle, or an invalid one once the actor is gone. Do not keep
    /// it past `Runtime::shutdown()`.
    Handle handle() const { return caf::actor_cast<Handle>(actor.lock()); }
  };

  Group() = default;

  /// Spawns the actor of rank `r` again on `node` from the spec it was
  /// first spawned with (its type and arguments), in a replacement group:
  /// rank r's context, label and node restart count are the new actor's;
  /// the other ranks are shared. `cpus` binds it (empty: unbound); `device`
  /// is its device index there. This group, and views taken of it, keep the
  /// old rank.
  Result<Group> respawned(int r, int node, int device, std::vector<int> cpus) const {
    if (!ranks_ || r < 0 || r >= size())
      return make_error(errc::invalid_argument, "group '" + name_ + "' has no rank " + std::to_string(r));
    if (!respawn_)
      return make_error(errc::failed_precondition, "group '" + name_ + "' was not spawned by Group::spawn; it cannot respawn a rank");
    auto ctx = rank(r).ctx;
    ctx.node = node;
    ctx.device = device;
    ctx.cpus = std::move(cpus);
    auto fresh = spawn_rank(*rt_, *respawn_, std::move(ctx));
    if (!fresh) return with_context(fresh.error(), "respawning rank " + std::to_string(r) + " of group '" + name_ + "'");
    auto ranks = std::make_shared<std::vector<Rank>>(*ranks_);
    (*ranks)[static_cast<size_t>(r)] = std::move(*fresh);
    Group g = *this;
    g.labels_ = labels_of(*ranks);
    g.ranks_ = std::move(ranks);
    return g;
  }

  /// Spawns one actor of registered type `type` per slot; rank i gets a
  /// RankContext built from slots[i], then `args...`. On failure, the ranks
  /// already spawned are stopped.
  template <class... Args>
  static Result<Group> spawn(Runtime& rt, std::string name, const std::string& type, std::vector<RankSlot> slots,
                             const Args&... args) {
    if (slots.empty())
      return make_error(errc::invalid_argument, "group '" + name + "' has no ranks; give it at least one");
    // How every rank is spawned, now and when a supervisor respawns one.
    auto spawner = std::make_shared<const Spawner>(
        [rt = &rt, type, args = std::make_tuple(args...)](const RankContext& ctx) -> Result<Handle> {
          auto msg = std::apply([&](const auto&... xs) { return caf::make_message(ctx, xs...); }, args);
          return rt->spawn<Handle>(ctx.node, type, std::move(msg));
        });
    auto ranks = std::make_shared<std::vector<Rank>>();
    int world = static_cast<int>(slots.size());
    for (int r = 0; r < world; ++r) {
      const auto& s = slots[static_cast<size_t>(r)];
      auto one = spawn_rank(rt, *spawner, RankContext{name, r, world, s.node, s.device, s.cpus, s.dp_rank, s.dp_size, s.mesh});
      if (!one) {
        for (auto& done : *ranks) caf::anon_send_exit(done.handle(), caf::exit_reason::user_shutdown);
        return with_context(one.error(), "rank " + std::to_string(r) + " of group '" + name + "'");
      }
      ranks->push_back(std::move(*one));
    }
    Group g;
    g.respawn_ = std::move(spawner);
    g.rt_ = &rt;
    g.name_ = std::move(name);
    g.labels_ = labels_of(*ranks);
    g.ranks_ = std::move(ranks);
    g.timeout_ = rt.options().call_timeout;
    return g;
  }

  const std::string& name() const { return name_; }
  /// The group's layout (a copy).
  GroupInfo info() const {
    GroupInfo out{name_, {}, {}};
    for (int r = 0; r < size(); ++r) {
      out.ranks.push_back(rank(r).ctx);
      out.labels.push_back(rank(r).label);
    }
    return out;
  }
  int size() const { return ranks_ ? static_cast<int>(ranks_->size()) : 0; }
  const Rank& rank(int r) const { return ranks_->at(static_cast<size_t>(r)); }
  Handle handle(int r) const { return rank(r).handle(); }
  std::chrono::milliseconds timeout() const { return timeout_; }

  /// The same group with another per-call timeout.
  Group with_timeout(std::chrono::milliseconds t) const {
    Group g = *this;
    g.timeout_ = t;
    return g;
  }
  /// The same group, slicing (Dispatch::slice, slice_dp) in whole units of
  /// `rows` rows: 2 keeps the pairs of a preference batch together.
  Group with_row_unit(int64_t rows) const {
    Group g = *this;
    g.row_unit_ = rows;
    return g;
  }

  /// Whether rank r's node process is alive and the one it was spawned in.
  bool alive(int r) const {
    const auto node = rt_->node(rank(r).ctx.node);
    return !node.lost && node.restarts == rank(r).node_restarts;
  }

  /// The same group without the ranks whose node process was lost (empty
  /// if none is left), also where a restarted process took its place.
  /// `rank(i)`, `handle(i)` and `call_rank(i)` of the view index its
  /// survivors by position. Ranks keep their numbers and labels; in a purely
  /// data-parallel group the survivors' dp coordinates are renumbered, so
  /// that Dispatch::slice_dp spreads a call over them.
  Group live() const {
    return subset([this](int r) { return alive(r); });
  }

  /// The same group with only the ranks r for which keep(r) holds, indexed
  /// by position as live() is (dp coordinates renumbered in a purely
  /// data-parallel group).
  template <class Keep>
  Group subset(Keep keep) const {
    Group g = *this;
    if (!ranks_) return g;
    auto kept = std::make_shared<std::vector<Rank>>();
    for (int r = 0; r < size(); ++r)
      if (keep(r)) kept->push_back(rank(r));
    if (kept->size() == ranks_->size()) return g;
    bool pure_dp = true;
    for (const auto& r : *ranks_) pure_dp = pure_dp && r.ctx.dp_size == size();
    if (pure_dp)
      for (size_t k = 0; k < kept->size(); ++k) {
        (*kept)[k].ctx.dp_rank = static_cast<int>(k);
        (*kept)[k].ctx.dp_size = static_cast<int>(kept->size());
      }
    g.labels_ = labels_of(*kept);
    g.ranks_ = std::move(kept);
    return g;
  }

  /// Calls the ranks chosen by `d` with `xs...` and folds the answers by `C`.
  template <Collect C = Collect::none, class... Ts>
  auto call(Dispatch d, const Ts&... xs) const {
    using R = typename detail::call_result<Handle, Ts...>::type;
    using V = std::conditional_t<std::is_void_v<R>, caf::unit_t, R>;
    using Out = detail::collected_t<C, V>;
    using FutOut = std::conditional_t<std::is_same_v<Out, caf::unit_t>, void, Out>;
    static_assert(!(std::is_void_v<R> && C != Collect::none && C != Collect::first),
                  "this call answers nothing; use Collect::none");
    if (!ranks_) return Future<FutOut>::ready_with(make_error(errc::failed_precondition, "call on an empty group"));
    if (ranks_->empty())  // a live() view
      return Future<FutOut>::ready_with(
          make_error(errc::unavailable, "every rank of group '" + name_ + "' was lost with its node process"));
    std::vector<int> targets;
    if (d == Dispatch::first) targets = {0};
    else
      for (int r = 0; r < size(); ++r) targets.push_back(r);
    // Build every rank's arguments first, so a bad slice fails before anything is sent.
    std::vector<std::tuple<std::decay_t<Ts>...>> per_rank;
    per_rank.reserve(targets.size());
    for (size_t k = 0; k < targets.size(); ++k) {
      const auto& ctx = rank(targets[k]).ctx;
      int part = d == Dispatch::slice_dp ? ctx.dp_rank : static_cast<int>(k);
      int parts = d == Dispatch::slice_dp ? ctx.dp_size : static_cast<int>(targets.size());
      caf::error err;
      auto pick = [&](const auto& x) {
        using X = std::decay_t<decltype(x)>;
        if (d == Dispatch::all || d == Dispatch::first) return X{x};
        auto p = detail::part_of(x, part, parts, row_unit_);
        if (!p) {
          if (!err) err = p.error();
          return X{};
        }
        return std::move(*p);
      };
      std::tuple<std::decay_t<Ts>...> args{pick(xs)...};
      if (!err && ctx.node != 0) err = check_size(args, rank(targets[k]));
      if (err)
        return Future<FutOut>::ready_with(with_context(err, "dispatch " + std::string{to_string(d)} + " to " +
                                                                rank(targets[k]).label));
      per_rank.push_back(std::move(args));
    }
    auto g = detail::make_gather<C, R, V, FutOut>(targets.size(), labels_, targets.front());
    if (d == Dispatch::slice_dp && C != Collect::first) {
      // Ranks that share a part (tensor-parallel or pipeline ranks of one
      // data-parallel replica) answer for it together: the first of them
      // speaks for it, so a mean, sum or flatten counts each part once.
      std::vector<char> folded(targets.size(), 1);
      std::set<int> seen;
      for (size_t k = 0; k < targets.size(); ++k) folded[k] = seen.insert(rank(targets[k]).ctx.dp_rank).second;
      if (seen.size() < targets.size()) g->folded = std::move(folded);
    }
    for (size_t k = 0; k < targets.size(); ++k) send_one(rank(targets[k]), k, std::move(per_rank[k]), g);
    return g->future_of(g);
  }

  /// Calls one rank.
  template <class... Ts>
  auto call_rank(int r, const Ts&... xs) const {
    using R = typename detail::call_result<Handle, Ts...>::type;
    using V = std::conditional_t<std::is_void_v<R>, caf::unit_t, R>;
    using FutOut = R;
    if (!ranks_ || r < 0 || r >= size())
      return Future<FutOut>::ready_with(make_error(errc::invalid_argument, "group '" + name_ + "' has no rank " +
                                                                               std::to_string(r)));
    std::tuple<std::decay_t<Ts>...> args{xs...};
    if (rank(r).ctx.node != 0)
      if (auto err = check_size(args, rank(r))) return Future<FutOut>::ready_with(std::move(err));
    auto g = detail::make_gather<Collect::first, R, V, FutOut>(1, labels_, r);
    send_one(rank(r), 0, std::move(args), g);
    return g->future_of(g);
  }

  /// Stops every rank of the group.
  void stop() const {
    if (!ranks_) return;
    for (auto& r : *ranks_) caf::anon_send_exit(r.handle(), caf::exit_reason::user_shutdown);
  }

private:
  using Spawner = std::function<Result<Handle>(const RankContext&)>;

  /// Spawns the rank `ctx` describes and labels it with its node.
  static Result<Rank> spawn_rank(Runtime& rt, const Spawner& spawn, RankContext ctx) {
    const auto node = rt.node(ctx.node);  // before the spawn: a restart in between must not count as its home
    auto h = spawn(ctx);
    if (!h) return h.error();
    auto label = "rank " + std::to_string(ctx.rank) + " of group '" + ctx.group + "' on " + node.describe();
    auto strong = caf::actor_cast<caf::strong_actor_ptr>(*h);
    return Rank{caf::weak_actor_ptr{strong.get()}, std::move(ctx), std::move(label), node.restarts};
  }
  static std::shared_ptr<const std::vector<std::string>> labels_of(const std::vector<Rank>& ranks) {
    auto labels = std::make_shared<std::vector<std::string>>();
    for (const auto& r : ranks) labels->push_back(r.label);
    return labels;
  }

  /// Refuses a message to another process that its decoder would reject.
  template <class Tuple>
  caf::error check_size(const Tuple& args, const Rank& target) const {
    uint64_t bytes = std::apply([](const auto&... xs) { return (uint64_t{0} + ... + detail::payload_bytes(xs)); }, args);
    auto limit = rt_->options().max_message_bytes;
    if (bytes <= limit) return caf::none;
    return make_error(errc::resource_exhausted, "a message of " + std::to_string(bytes) + " bytes to " + target.label +
                                                    " exceeds the limit of " + std::to_string(limit) +
                                                    " bytes (Options::max_message_bytes); send it in smaller parts");
  }

  template <class Tuple, class G>
  void send_one(const Rank& target, size_t slot, Tuple args, const std::shared_ptr<G>& g) const {
    auto handle = target.handle();
    if (!handle) {
      g->fail(make_error(errc::unavailable, target.label + " is gone: its actor stopped or the runtime shut down"));
      return;
    }
    auto msg = std::apply([](auto&&... xs) { return caf::make_message(std::move(xs)...); }, std::move(args));
    rt_->request(caf::actor_cast<caf::strong_actor_ptr>(handle), std::move(msg), timeout_, detail::Reply{g, slot});
  }

  Runtime* rt_ = nullptr;
  /// Spawns one rank of this group again from its spec (Group::spawn's type
  /// and arguments) with the context given.
  std::shared_ptr<const Spawner> respawn_;
  std::string name_;
  int64_t row_unit_ = 1;
  std::shared_ptr<const std::vector<Rank>> ranks_;
  std::shared_ptr<const std::vector<std::string>> labels_;  ///< ranks_[i].label, shared with calls
  std::chrono::milliseconds timeout_{std::chrono::minutes(5)};
};

}  // namespace glint
