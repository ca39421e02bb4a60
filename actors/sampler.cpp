#include "actors/sampler.hpp"

#include "actors/detail/answer.hpp"
#include "actors/detail/pad.hpp"
#include "actors/detail/sync_group.hpp"
#include "components/sampler/engine.hpp"
#include "placement/service.hpp"

#include <caf/send.hpp>
#include <caf/typed_response_promise.hpp>

#include <algorithm>
#include <cmath>
#include <map>
#include <mutex>
#include <optional>

namespace glint::actors {

namespace {

using namespace glint::components;
using sequences_promise = caf::typed_response_promise<std::vector<SampledSequence>>;

/// The most sequences one call may ask for (requests x num_samples): each
/// costs memory before it is scheduled, and the count comes from the network.
constexpr size_t max_sequences_per_call = size_t{1} << 20;

/// One unanswered sample call. Its answer is laid out from the start:
/// out[r * n + k] is request r's sample k.
struct Call {
  sequences_promise promise;
  sample_listener listener;  ///< streams chunks here when valid
  size_t n = 1;         ///< num_samples
  std::vector<SampledSequence> out;
  std::vector<size_t> streamed;  ///< per sequence: tokens already sent to the listener
  std::vector<char> closed;      ///< per sequence: its finished chunk was sent
  size_t remaining = 0;          ///< requests still in the engine
};

/// The training input of a finished sequence (TrainBatch's convention:
/// position t predicts token t + 1). Prompts are never empty: the engine
/// refuses them.
void add_training_input(SampledSequence& s, const std::vector<int64_t>& prompt) {
  const size_t p = prompt.size(), c = s.tokens.size(), len = p + c;
  s.input_ids = prompt;
  s.input_ids.insert(s.input_ids.end(), s.tokens.begin(), s.tokens.end());
  s.loss_mask.assign(len, 0.f);
  s.old_logps.assign(len, 0.f);
  for (size_t j = 0; j < c; ++j) {
    s.loss_mask[p - 1 + j] = 1.f;
    if (j < s.logprobs.chosen.size()) s.old_logps[p - 1 + j] = s.logprobs.chosen[j];
  }
}

class SamplerState {
public:
  SamplerState(sampler_actor::pointer self, RankContext ctx, SamplerSpec spec)
      : self_(self), ctx_(std::move(ctx)), spec_(std::move(spec)) {}

  std::string where() const { return "rank " + std::to_string(ctx_.rank) + " of sampler group '" + ctx_.group + "'"; }
  caf::error fail(const caf::error& e) const { return with_context(e, where()); }

  void load() try {
    EngineConfig cfg{.block_size = spec_.block_size,
                     .cache_bytes = spec_.cache_bytes,
                     .max_num_seqs = spec_.max_num_seqs,
                     .max_num_batched_tokens = spec_.max_num_batched_tokens,
                     .max_model_len = spec_.max_model_len,
                     .enable_prefix_caching = spec_.enable_prefix_caching,
                     .seed = spec_.sampling_seed + static_cast<uint64_t>(ctx_.rank)};
    auto engine = [&]() -> Result<Engine> {
      if (!spec_.model_dir.empty()) return Engine::load(spec_.model_dir, cfg);
      auto mc = ModelConfig::parse(spec_.config_json, "SamplerSpec::config_json");
      if (!mc) return mc.error();
      auto lm = CausalLM::init_random(*mc, spec_.seed);
      if (!lm) return lm.error();
      return Engine::create(std::move(*lm), cfg);
    }();
    if (engine) engine_.emplace(std::move(*engine));
    else load_error_ = engine.error();
  } catch (const std::exception& e) {
    load_error_ = error_of_exception(e, "loading the sampler");
  }

  Result<Engine*> engine() {
    if (!engine_) return load_error_;
    return &*engine_;
  }

  /// Starts a sample call: answered through the returned promise when its
  /// last request finishes (or at once when none was admitted).
  sequences_promise sample(const std::vector<SampleRequest>& requests, const SamplingParams& params,
                           const std::string& adapter, sample_listener listener) {
    auto rp = self_->make_response_promise<std::vector<SampledSequence>>();
    auto e = engine();
    if (!e) return rp.deliver(fail(e.error()));
    if ((*e)->sleeping())
      return rp.deliver(fail(make_error(errc::failed_precondition, "the sampler is asleep: call wake before sampling")));
    if (auto ok = params.validate(); !ok) return rp.deliver(fail(ok.error()));
    const auto n = static_cast<size_t>(params.num_samples);
    if (requests.size() > max_sequences_per_call / n)
      return rp.deliver(fail(make_error(
          errc::resource_exhausted, std::to_string(requests.size()) + " requests x " + std::to_string(n) +
                                        " samples exceed the limit of " + std::to_string(max_sequences_per_call) +
                                        " sequences per call; split the call")));
    // Chosen log-probabilities are always recorded: they are the old_logps.
    auto engine_params = params;
    engine_params.logprobs = std::max<int64_t>(params.logprobs, 0);
    const auto id = next_call_++;
    auto& call = calls_[id];
    call.promise = rp;
    call.listener = std::move(listener);
    call.n = n;
    call.out.resize(requests.size() * n);
    call.streamed.assign(call.out.size(), 0);
    call.closed.assign(call.out.size(), 0);
    try {
      for (size_t r = 0; r < requests.size(); ++r) {
        for (size_t k = 0; k < n; ++k) {
          auto& s = call.out[r * n + k];
          s.index = requests[r].index;
          s.sample = static_cast<int64_t>(k);
        }
        auto rid = (*e)->add_request(requests[r].prompt, engine_params, adapter);
        if (!rid) {
          refuse(call, r, describe(rid.error()));
          continue;
        }
        owner_[*rid] = {id, r};
        ++call.remaining;
      }
    } catch (const std::exception& ex) {
      drop(id, error_of_exception(ex, "adding the requests"));
      return rp;
    }
    if (call.remaining == 0) finish(id);
    else kick();
    return rp;
  }

  /// One step of step loop `loop`; then the next, while work is left.
  void step(uint64_t loop) {
    if (loop != loop_ || !stepping_ || !engine_) return;
    auto& e = *engine_;
    try {
      const auto steps_before = e.stats().steps;
      auto touched = e.step();
      // A failed step aborts its requests without naming them.
      if (touched) collect(*touched);
      else collect_all();
      if (e.has_unfinished() && !e.sleeping() && e.stats().steps == steps_before)
        fail_all(make_error(errc::internal, "the engine scheduled nothing while requests wait (a glint bug); "
                                            "their calls are failed"));
    } catch (const std::exception& ex) {
      fail_all(error_of_exception(ex, "the engine step"));
    }
    if (has_work()) send_step();
    else stepping_ = false;
  }

  Result<bool> update_weights(const NamedTensorList& w, const WeightUpdate& u) {
    const auto& adapter = u.adapter;
    const auto version = u.version;
    const auto p = u.policy;
    auto e = engine();
    if (!e) return e.error();
    // An enum from the wire can hold any number.
    if (p != UpdatePolicy::finish_old && p != UpdatePolicy::abort)
      return make_error(errc::invalid_argument, "update policy " + std::to_string(static_cast<int>(p)) +
                                                    " is neither finish_old nor abort");
    if (w.names.size() != w.tensors.size())
      return make_error(errc::invalid_argument, "the update has " + std::to_string(w.names.size()) + " names but " +
                                                    std::to_string(w.tensors.size()) + " tensors");
    // Staged buckets and this last one apply together, as one version.
    NamedTensors named;
    if (staged_version_ == version) named = std::move(staged_);
    staged_.clear();
    staged_version_ = -1;
    named.reserve(named.size() + w.names.size());
    for (size_t i = 0; i < w.names.size(); ++i) named.emplace_back(w.names[i], w.tensors[i]);
    if (auto ok = (*e)->update_weights(named, adapter, version, p); !ok) return ok.error();
    collect_all();  // with the abort policy, requests in flight have finished
    kick();         // a deferred update applies in a step
    return true;
  }

  Result<bool> stage_weights(const NamedTensorList& w, int64_t version) {
    auto e = engine();
    if (!e) return e.error();
    if (version != staged_version_) {
      staged_.clear();
      staged_version_ = version;
    }
    if (w.names.size() != w.tensors.size())
      return make_error(errc::invalid_argument, "the bucket has " + std::to_string(w.names.size()) + " names but " +
                                                    std::to_string(w.tensors.size()) + " tensors");
    for (size_t i = 0; i < w.names.size(); ++i) staged_.emplace_back(w.names[i], w.tensors[i]);
    return true;
  }

  Result<bool> sync_recv(const SyncManifest& m, const WeightUpdate& u, const SyncGroupAddress& at) {
    auto e = engine();
    if (!e) return e.error();
    if (m.names.size() != m.shapes.size() || m.names.size() != m.dtypes.size())
      return make_error(errc::invalid_argument, "the sync manifest's names, shapes and dtypes differ in number");
    NamedTensorList w;
    for (size_t i = 0; i < m.names.size(); ++i) {
      auto dtype = parse_dtype(m.dtypes[i]);
      if (!dtype) return with_context(dtype.error(), "the sync manifest's " + m.names[i]);
      auto t = Tensor::zeros(*dtype, m.shapes[i]);
      if (!t) return t.error();
      w.names.push_back(m.names[i]);
      w.tensors.push_back(std::move(*t));
    }
    auto pg = sync_.join(at.host, at.port, at.rank, at.world);
    if (!pg) return pg.error();
    if (auto got = (*pg)->broadcast_buckets(w.tensors, 0, at.bucket_bytes); !got) return got.error();
    return update_weights(w, u);
  }

  Result<int64_t> abort_all() {
    auto e = engine();
    if (!e) return e.error();
    const auto n = static_cast<int64_t>(owner_.size());
    for (const auto& [rid, where] : owner_) (*e)->abort(rid);
    collect_all();
    return n;
  }

  Result<bool> wake() {
    auto e = engine();
    if (!e) return e.error();
    if (auto ok = (*e)->wake(); !ok) return ok.error();
    kick();
    return true;
  }

  Result<Metrics> stats() {
    if (!engine_) return load_error_;
    Metrics m;
    const auto s = engine_->stats();
    auto put = [&](const char* k, auto v) { m[k] = static_cast<double>(v); };
    put("num_blocks", s.num_blocks);
    put("free_blocks", s.free_blocks);
    put("block_size", s.block_size);
    put("steps", s.steps);
    put("prompt_tokens", s.prompt_tokens);
    put("cached_tokens", s.cached_tokens);
    put("prefix_cache_hit_rate", s.prefix_cache_hit_rate());
    put("generated_tokens", s.generated_tokens);
    put("preemptions", s.preemptions);
    put("recomputed_tokens", s.recomputed_tokens);
    put("running", s.running);
    put("waiting", s.waiting);
    put("weight_version", engine_->weight_version());
    put("update_pending", engine_->update_pending());
    put("sleeping", engine_->sleeping());
    put("calls", calls_.size());
    return m;
  }

private:
  bool has_work() const {
    return engine_ && !engine_->sleeping() && (engine_->has_unfinished() || engine_->update_pending());
  }

  /// Starts the step loop unless it runs. Steps are messages to ourselves,
  /// queued behind whatever arrived meanwhile: calls join between steps.
  /// Each loop has its own id, so a stray step message cannot start a
  /// second one.
  void kick() {
    if (stepping_ || !has_work()) return;
    stepping_ = true;
    ++loop_;
    send_step();
  }
  void send_step() { self_->send(caf::actor_cast<sampler_actor>(self_), engine_step_atom::value, loop_); }

  void collect_all() {
    std::vector<uint64_t> ids;
    ids.reserve(owner_.size());
    for (const auto& [rid, where] : owner_) ids.push_back(rid);
    collect(ids);
  }

  /// Streams the new output of engine requests `ids` and hands over those
  /// that finished; answers the calls they complete.
  void collect(const std::vector<uint64_t>& ids) {
    auto& e = *engine_;
    for (auto rid : ids) {
      auto it = owner_.find(rid);
      if (it == owner_.end()) continue;
      const auto [cid, r] = it->second;
      auto& call = calls_.at(cid);
      const auto* o = e.output(rid);
      if (!o) continue;
      if (call.listener) stream(call, r, *o);
      if (!o->finished) continue;
      auto done = e.take(rid);
      owner_.erase(it);
      for (size_t k = 0; k < call.n; ++k) {
        auto& s = call.out[r * call.n + k];
        auto& seq = done->sequences[k];
        s.tokens = std::move(seq.tokens);
        s.logprobs = std::move(seq.logprobs);
        s.stop_reason = std::string{to_string(seq.stop_reason)};
        s.stop_token = seq.stop_token;
        s.stop_string = std::move(seq.stop_string);
        s.text = std::move(seq.text);
        s.weight_version = seq.weight_version;
        s.prompt_logprobs = done->prompt_logprobs;
        s.cached_tokens = done->cached_tokens;
        add_training_input(s, done->prompt);
      }
      if (--call.remaining == 0) finish(cid);
    }
  }

  /// Sends each sequence of request r what it produced since its last chunk.
  void stream(Call& call, size_t r, const RequestOutput& o) {
    for (size_t k = 0; k < call.n; ++k) {
      const auto i = r * call.n + k;
      const auto& seq = o.sequences[k];
      const bool finished = seq.stop_reason != StopReason::none;
      if (call.closed[i] || (seq.tokens.size() == call.streamed[i] && !finished)) continue;
      SampleChunk c;
      c.index = call.out[i].index;
      c.sample = static_cast<int64_t>(k);
      const auto from = call.streamed[i];
      c.tokens.assign(seq.tokens.begin() + static_cast<std::ptrdiff_t>(from), seq.tokens.end());
      if (seq.logprobs.chosen.size() >= seq.tokens.size())
        c.logprobs.assign(seq.logprobs.chosen.begin() + static_cast<std::ptrdiff_t>(from),
                          seq.logprobs.chosen.begin() + static_cast<std::ptrdiff_t>(seq.tokens.size()));
      c.finished = finished;
      if (finished) c.stop_reason = std::string{to_string(seq.stop_reason)};
      call.streamed[i] = seq.tokens.size();
      call.closed[i] = finished;
      self_->send(call.listener, std::move(c));
    }
  }

  /// Request r of `call` was refused: its sequences carry `why`.
  void refuse(Call& call, size_t r, const std::string& why) {
    for (size_t k = 0; k < call.n; ++k) {
      const auto i = r * call.n + k;
      call.out[i].error = why;
      if (!call.listener) continue;
      SampleChunk c;
      c.index = call.out[i].index;
      c.sample = static_cast<int64_t>(k);
      c.finished = true;
      c.error = why;
      call.closed[i] = 1;
      self_->send(call.listener, std::move(c));
    }
  }

  void finish(uint64_t cid) {
    auto it = calls_.find(cid);
    it->second.promise.deliver(std::move(it->second.out));
    calls_.erase(it);
  }

  /// Fails call `cid` with `err`, taking its requests out of the engine.
  void drop(uint64_t cid, const caf::error& err) {
    for (auto it = owner_.begin(); it != owner_.end();) {
      if (it->second.first != cid) {
        ++it;
        continue;
      }
      engine_->abort(it->first);
      (void)engine_->take(it->first);
      it = owner_.erase(it);
    }
    auto c = calls_.find(cid);
    c->second.promise.deliver(fail(err));
    calls_.erase(c);
  }

  void fail_all(const caf::error& err) {
    std::vector<uint64_t> ids;
    for (const auto& [cid, call] : calls_) ids.push_back(cid);
    for (auto cid : ids) drop(cid, err);
  }

  sampler_actor::pointer self_;
  RankContext ctx_;
  SamplerSpec spec_;
  std::optional<Engine> engine_;
  detail::SyncGroup sync_;  ///< for sync_recv
  NamedTensors staged_;  ///< buckets of a weight update not yet applied
  int64_t staged_version_ = -1;  ///< the version they belong to
  caf::error load_error_;
  std::map<uint64_t, Call> calls_;
  uint64_t next_call_ = 0;
  std::map<uint64_t, std::pair<uint64_t, size_t>> owner_;  ///< engine request id -> (call, request)
  uint64_t loop_ = 0;    ///< the id of the current step loop
  bool stepping_ = false;  ///< a step message of loop_ is on its way
};

}  // namespace

std::vector<SampleRequest> requests_of(const std::vector<std::vector<int64_t>>& prompts) {
  std::vector<SampleRequest> out;
  out.reserve(prompts.size());
  for (size_t i = 0; i < prompts.size(); ++i) out.push_back({static_cast<int64_t>(i), prompts[i]});
  return out;
}

Result<Batch> training_batch(const std::vector<SampledSequence>& seqs, const TrainingBatchOptions& o) {
  if (seqs.empty()) return make_error(errc::invalid_argument, "no sequences to make a training batch of");
  for (const auto& s : seqs)
    if (!s.error.empty())
      return make_error(errc::invalid_argument, "sequence " + std::to_string(s.sample) + " of request " +
                                                    std::to_string(s.index) + " was not sampled: " + s.error);
  if (!o.advantages.empty() && o.advantages.size() != seqs.size())
    return make_error(errc::invalid_argument, std::to_string(o.advantages.size()) + " advantages for " +
                                                  std::to_string(seqs.size()) + " sequences; give one per sequence");
  for (size_t i = 0; i < o.advantages.size(); ++i)
    if (!std::isfinite(o.advantages[i]))
      return make_error(errc::invalid_argument, "advantage " + std::to_string(i) + " is not finite");
  auto batch = detail::pad_rows(seqs, o.pad_id,
                                {{"loss_mask", &SampledSequence::loss_mask}, {"old_logps", &SampledSequence::old_logps}});
  if (o.advantages.empty()) return batch;
  std::vector<float> adv(o.advantages.begin(), o.advantages.end());
  auto t = Tensor::from_values(adv, {static_cast<int64_t>(adv.size())});
  if (!t) return t.error();
  batch.tensors["advantages"] = std::move(*t);
  return batch;
}

sampler_actor::behavior_type sampler_rank(sampler_actor::pointer self, RankContext ctx, SamplerSpec spec) {
  auto st = std::make_shared<SamplerState>(self, std::move(ctx), std::move(spec));
  st->load();
  auto answer = [st](auto&& run) { return detail::answer(*st, run); };
  // Runs `act` on the engine and answers true.
  auto on_engine = [st, answer](auto&& act) {
    return answer([&]() -> Result<bool> {
      auto e = st->engine();
      if (!e) return e.error();
      if (auto ok = act(**e); !ok) return ok.error();
      return true;
    });
  };
  return {
      [st](sample_atom, const std::vector<SampleRequest>& requests, const SamplingParams& params,
           const std::string& adapter) -> caf::result<std::vector<SampledSequence>> {
        return st->sample(requests, params, adapter, sample_listener{});
      },
      [st](sample_stream_atom, const std::vector<SampleRequest>& requests, const SamplingParams& params,
           const std::string& adapter, const sample_listener& listener) -> caf::result<std::vector<SampledSequence>> {
        if (!listener)
          return st->fail(make_error(errc::invalid_argument, "sample_stream needs a listener actor for its chunks"));
        return st->sample(requests, params, adapter, listener);
      },
      [st, answer](update_weights_atom, const NamedTensorList& w, const WeightUpdate& u) -> caf::result<bool> {
        return answer([&] { return st->update_weights(w, u); });
      },
      [st, answer](sync_recv_atom, const SyncManifest& m, const WeightUpdate& u,
                   const SyncGroupAddress& at) -> caf::result<bool> {
        return answer([&] { return st->sync_recv(m, u, at); });
      },
      [st, answer](stage_weights_atom, const NamedTensorList& w, int64_t version) -> caf::result<bool> {
        return answer([&] { return st->stage_weights(w, version); });
      },
      [on_engine](add_adapter_atom, const std::string& name, const LoraConfig& c) -> caf::result<bool> {
        return on_engine([&](Engine& e) { return e.add_adapter(name, c); });
      },
      [on_engine](load_adapter_atom, const std::string& name, const std::string& dir) -> caf::result<bool> {
        return on_engine([&](Engine& e) { return e.load_adapter(name, dir); });
      },
      [on_engine](remove_adapter_atom, const std::string& name) -> caf::result<bool> {
        return on_engine([&](Engine& e) -> Result<void> {
          if (name.empty()) return make_error(errc::invalid_argument, "the base model is not an adapter to remove");
          return e.remove_adapter(name);
        });
      },
      [on_engine](reset_prefix_cache_atom) -> caf::result<bool> {
        return on_engine([](Engine& e) -> Result<void> {
          e.reset_prefix_cache();
          return {};
        });
      },
      [on_engine](sleep_atom) -> caf::result<bool> { return on_engine([](Engine& e) { return e.sleep(); }); },
      [st, answer](wake_atom) -> caf::result<bool> { return answer([&] { return st->wake(); }); },
      [st, answer](abort_atom) -> caf::result<int64_t> { return answer([&] { return st->abort_all(); }); },
      [st, answer](stats_atom) -> caf::result<Metrics> { return answer([&] { return st->stats(); }); },
      [st](engine_step_atom, uint64_t loop) { st->step(loop); },
  };
}

Result<Group<sampler_actor>> spawn_sampler_group(Runtime& rt, const placement::DeviceGroup& group,
                                                 const placement::DeviceMesh& mesh, SamplerSpec spec) {
  return placement::spawn_group<sampler_actor>(rt, group, mesh, sampler_type, spec);
}

Result<std::vector<SampledSequence>> sample_streaming(Runtime& rt, const Group<sampler_actor>& sampler,
                                                      const std::vector<SampleRequest>& requests,
                                                      const SamplingParams& params, const std::string& adapter,
                                                      std::function<void(const SampleChunk&)> on_chunk) {
  // Shared by this thread and the listener. The callback runs under `mx`, so
  // once `closed` is set under it, no callback runs or will run.
  struct Listener {
    std::mutex mx;
    std::function<void(const SampleChunk&)> on_chunk;
    bool closed = false;
    std::string failure;  ///< what the callback threw
    size_t finished = 0, expected = 0;
    Future<bool> all_seen;
  };
  auto l = std::make_shared<Listener>();
  l->on_chunk = std::move(on_chunk);
  l->expected = requests.size() * static_cast<size_t>(std::max<int64_t>(params.num_samples, 0));
  if (l->expected == 0) l->all_seen.state()->set(true);
  // Detached: the callback is user code, and must not hold up CAF's workers.
  auto listener = rt.system().spawn<caf::detached>([l](sample_listener::pointer) -> sample_listener::behavior_type {
    return {[l](const SampleChunk& c) {
      std::lock_guard<std::mutex> guard{l->mx};
      if (l->closed) return;
      try {
        l->on_chunk(c);
      } catch (const std::exception& e) {
        l->failure = e.what();
        l->closed = true;
        l->all_seen.state()->set(true);
        return;
      }
      if (c.finished && ++l->finished == l->expected) l->all_seen.state()->set(true);
    }};
  });
  auto result = sampler.call<Collect::flatten>(Dispatch::slice_dp, sample_stream_atom_v, requests, params, adapter,
                                               listener)
                    .get();
  // The answer and the chunks travel on different paths: wait for the last chunks.
  bool all_seen = !result || l->all_seen.wait_for(sampler.timeout());
  {
    std::lock_guard<std::mutex> guard{l->mx};
    l->closed = true;
  }
  caf::anon_send_exit(listener, caf::exit_reason::user_shutdown);
  if (!result) return result.error();
  if (!l->failure.empty())
    return make_error(errc::aborted, "the chunk callback of a streamed sample call threw: " + l->failure);
  if (!all_seen)
    return make_error(errc::deadline_exceeded, "a streamed sample call was answered but " +
                                                   std::to_string(l->expected - l->finished) + " of its " +
                                                   std::to_string(l->expected) + " sequences sent no last chunk within " +
                                                   std::to_string(sampler.timeout().count()) + " ms");
  return result;
}

}  // namespace glint::actors
